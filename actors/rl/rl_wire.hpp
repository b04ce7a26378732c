// The decoupled RL messages as Cap'n Proto envelopes (schemas/rl.capnp), for
// generators on another process (rl_remote.cpp). In one process the actors
// pass them by reference (rl_messages.hpp); these functions are the only
// place they are encoded or decoded.
//
// Decoding checks what only the receiver knows, on top of the envelope's own
// validation (envelope_validate.cpp): the parameter count of the model, the
// run's seed, step range, group layout, vocabulary, token budget and version
// range. A violation is an envelope error (schema_violation) whose text says
// what and where; nothing throws into the caller.
#pragma once

#include <caf/expected.hpp>

#include "actors/rl/rl_messages.hpp"
#include "actors/transport/envelope.hpp"
#include "model/config.hpp"
#include "rl/config.hpp"
#include "rl/task.hpp"

namespace troupe::runtime::rlwire {

Envelope encode_weights(const rlmsg::Weights& w);
// `parameters`: the model's flat parameter count.
caf::expected<rlmsg::Weights> decode_weights(const Envelope& env, size_t parameters);

Envelope encode_rollout(const rlmsg::Rollout& r);

// What the coordinator expects of a generator's rollout.
struct RolloutBounds {
  uint64_t seed = 0;
  int64_t first_step = 0, steps = 0;  // steps [first_step, steps)
  int64_t prompts_per_step = 0, group_size = 0, max_new_tokens = 0;
  int64_t vocab = 0, seq_len = 0;
  int generators = 0;
  // When set, every prompt must be the task's training prompt of its group
  // (index, tokens and answer): the verifier scores against the answer the
  // rollout carries, so a wrong one would be trained on.
  const rl::Task* task = nullptr;
};
RolloutBounds rollout_bounds(const model::ModelConfig& model, const rl::RlConfig& rl, uint64_t seed, int64_t first_step,
                             int64_t steps);
caf::expected<rlmsg::Rollout> decode_rollout(const Envelope& env, const RolloutBounds& b);

}  // namespace troupe::runtime::rlwire
