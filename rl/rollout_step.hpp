// One RL step's rollouts as a value that can leave the trainer: what a
// generator samples for all groups of a step (with the policy version that
// sampled every token), what the reward side makes of it, and a generator's
// own copy of the policy. The synchronous loop (rl/trainer.hpp) and the
// decoupled actors (actors/rl/) both go through these functions, so a step's
// rollouts are the same bits whoever samples them: that is what makes
// rl.sync = "fixed_lag" with max_staleness 0 equal the synchronous loop.
// Plain library code: no actors.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kernels/backend.hpp"
#include "model/config.hpp"
#include "model/kv_generate.hpp"
#include "rl/config.hpp"
#include "rl/group.hpp"
#include "rl/rollout.hpp"
#include "rl/task.hpp"

namespace troupe::rl {

// The sampled groups of one RL step, group-major (member k of group g at
// g * group_size + k). Every completion token carries its behaviour log-prob
// and the policy version that sampled it (model::Completion::versions).
struct StepRollouts {
  int64_t step = 0;     // 0-based RL step that trains on them
  int64_t version = 0;  // policy version that sampled them (updates applied before)
  std::vector<GroupId> ids;                    // [prompts_per_step] the ledger's keys
  std::vector<Prompt> prompts;                 // [prompts_per_step]
  std::vector<model::Completion> completions;  // [prompts_per_step * group_size]
  double gen_seconds = 0.0;
  int64_t tokens() const;
};

// Samples step `step`'s groups with weights `w` (policy version `version`):
// prompts and sampler seeds are pure functions of (seed, step, group, member)
// (rl/group.hpp), decoding runs step-wise through the KV cache with `version`
// recorded on every token.
StepRollouts sample_step(model::BatchGenerator& gen, const model::ModelWeights& w, const Task& task, const RlConfig& rl,
                         uint64_t seed, int64_t step, int64_t version);

// The rule verifier's verdicts, rewards, advantages and per-token layout of a
// step's rollouts (score_groups over its groups).
ScoredBatch score_step(const Task& task, const RlConfig& rl, const StepRollouts& rollouts);

// One step's generation in progress, decoded one token per sequence at a
// time so the weights may change between decode steps (rl.sync = "latest").
// begin() lays out the step's prompts and sampler seeds exactly as
// sample_step does; sample_step is begin, decode until false, end.
struct StepDecode {
  StepRollouts out;
  std::vector<model::SamplerRng> rngs;  // [prompts_per_step * group_size]; the generator reads them in place
  bool live = false;
};
void begin_step(StepDecode& d, model::BatchGenerator& gen, const Task& task, const RlConfig& rl, uint64_t seed,
                int64_t step, int64_t version);
// Finishes the step: the completions (each token with the version that
// sampled it) and the seconds since begin_step.
StepRollouts end_step(StepDecode& d, model::BatchGenerator& gen, double seconds);

// A generator's copy of the policy: its own backend, parameter buffer and KV
// cache. load() is the fence at which it switches versions: between
// generations (fixed_lag), or between two decode steps of one (latest),
// never inside a decode step.
class PolicyCopy {
 public:
  PolicyCopy(const model::ModelConfig& config, const kernels::BackendOptions& backend);
  ~PolicyCopy();
  PolicyCopy(const PolicyCopy&) = delete;
  PolicyCopy& operator=(const PolicyCopy&) = delete;

  // Copies `params` (the flat buffer of model::build_param_layout) in as
  // version `version`. Throws std::invalid_argument on a size mismatch.
  void load(std::span<const float> params, int64_t version);
  int64_t version() const { return version_; }
  StepRollouts sample(const Task& task, const RlConfig& rl, uint64_t seed, int64_t step);

  // Step-wise: begin a step with the loaded version, then decode() one token
  // per live sequence with whatever version is loaded at that moment (the
  // caller may load() a newer one between calls) until it returns false,
  // then end(). The bits equal sample() when no load() comes in between.
  void begin(const Task& task, const RlConfig& rl, uint64_t seed, int64_t step);
  bool decode();
  // After a load() mid-generation: recompute the cached keys and values of
  // the tokens so far under the loaded weights (model::BatchGenerator::recompute).
  void recompute();
  bool generating() const { return decoding_.live; }
  StepRollouts end(double seconds);

 private:
  model::ModelConfig config_;
  std::unique_ptr<kernels::Backend> be_;
  kernels::Tensor params_;
  model::ModelWeights w_;
  std::unique_ptr<model::BatchGenerator> gen_;
  int64_t version_ = -1;  // nothing loaded yet
  StepDecode decoding_;
};

}  // namespace troupe::rl
