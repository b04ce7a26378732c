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
#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "kernels/backend.hpp"
#include "model/config.hpp"
#include "model/continuous_batch.hpp"
#include "model/kv_generate.hpp"
#include "model/params.hpp"
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
  // Data-parallel generation (sample_step_parallel over D > 1 devices): each
  // device's idle seconds within gen_seconds (waiting for the slowest
  // device's last sequence, or for the step's layout). Empty on one device.
  std::vector<double> device_idle_seconds;
  int64_t tokens() const;
};

// Samples step `step`'s groups with weights `w` (policy version `version`):
// prompts and sampler seeds are pure functions of (seed, step, group, member)
// (rl/group.hpp), decoding runs through the continuous batch (its slots:
// rl.slots) with `version` recorded on every token. Whatever the slots, the
// bits are the same on the host backend (model/continuous_batch.hpp).
StepRollouts sample_step(model::ContinuousBatch& gen, const model::ModelWeights& w, const Task& task,
                         const RlConfig& rl, uint64_t seed, int64_t step, int64_t version);

// sample_step with the step's sequences dealt over several continuous
// batches, one per device (sequence i to batch i mod D), each decoding its
// share with its own copy of the weights (ws[d], version `version`) on its
// own thread: the synchronous loop data-parallel over devices. On the host
// backend the bits equal sample_step's (a sequence's bits do not depend on
// its batch or slot).
StepRollouts sample_step_parallel(std::span<model::ContinuousBatch* const> gens,
                                  std::span<const model::ModelWeights* const> ws, const Task& task,
                                  const RlConfig& rl, uint64_t seed, int64_t step, int64_t version);

// The rule verifier's verdicts, rewards, advantages and per-token layout of a
// step's rollouts (score_groups over its groups).
ScoredBatch score_step(const Task& task, const RlConfig& rl, const StepRollouts& rollouts);

// One step's generation in progress. begin_step lays out the step's prompts
// and sampler seeds and queues them on `gen`; sample_step is begin, step until
// done, end.
struct StepDecode {
  StepRollouts out;
  std::vector<model::SamplerRng> rngs;  // [prompts_per_step * group_size]; the batch reads them in place
};
void begin_step(StepDecode& d, model::ContinuousBatch& gen, const Task& task, const RlConfig& rl, uint64_t seed,
                int64_t step, int64_t version);
// Finishes the step: the completions (each token with the version that
// sampled it) and `seconds` as its generation time.
StepRollouts end_step(StepDecode& d, model::ContinuousBatch& gen, double seconds);

// A generator's copy of the policy: its own backend, the weights of the
// versions its jobs use, and up to two jobs (RL steps) decoding side by side
// in one set of rl.slots slots. A job begins once the previous one has every
// sequence in a slot, so the next step's prompts take the slots the previous
// step's finished sequences free (its tail no longer leaves them idle). Each
// job decodes with its own version's weights (fixed_lag: two versions at
// once at most; latest: adopt_newest moves every job to the newest). The
// slot and the job mix never change a sequence's bits on the host backend.
class PolicyCopy {
 public:
  PolicyCopy(const model::ModelConfig& config, const kernels::BackendOptions& backend, int64_t slots);
  ~PolicyCopy();
  PolicyCopy(const PolicyCopy&) = delete;
  PolicyCopy& operator=(const PolicyCopy&) = delete;

  // Copies `params` (the flat buffer of model::build_param_layout) in as
  // version `version`, the newest. Jobs running with older versions keep
  // theirs. Throws std::invalid_argument on a size mismatch.
  void load(std::span<const float> params, int64_t version);
  int64_t version() const;  // the newest loaded (-1: none)
  // One whole step with the newest version, alone (the job slots are free).
  StepRollouts sample(const Task& task, const RlConfig& rl, uint64_t seed, int64_t step);

  // Step-wise. can_begin: fewer than two jobs, and the newest one has no
  // sequence waiting for a slot. begin starts step `step` with the newest
  // loaded version. decode runs one step of every unfinished job (oldest
  // first, the newer one gets the slots the older leaves) and returns whether
  // any job still has sequences; a finished job waits in take_finished.
  bool can_begin() const;
  // Returns the job's ticket (0, 1, 2, ... per copy): a step dealt twice
  // (after a restart elsewhere) may run twice, so the step does not name a job.
  int64_t begin(const Task& task, const RlConfig& rl, uint64_t seed, int64_t step);
  bool decode();
  // latest: every running job continues with the newest version from the
  // next decode step; with `recompute`, their cached keys and values are
  // recomputed under it. Returns how many jobs switched.
  int64_t adopt_newest(bool recompute);
  bool generating() const { return !jobs_.empty(); }
  int64_t running_steps() const { return static_cast<int64_t>(jobs_.size()); }
  // The oldest finished job's ticket and rollouts, gen_seconds its time
  // since begin; nullopt while none is finished.
  struct Finished {
    int64_t ticket = 0;
    StepRollouts rollouts;
  };
  std::optional<Finished> take_finished();

 private:
  struct Weights;
  struct Job;
  model::ModelConfig config_;
  int64_t slots_;
  std::unique_ptr<kernels::Backend> be_;
  model::ParamLayout layout_;
  // Every parameter buffer of this copy (three at most: two running steps'
  // versions and a newer one); a job holds the one it decodes with.
  std::vector<std::shared_ptr<Weights>> buffers_;
  std::shared_ptr<Weights> newest_;
  int64_t tickets_ = 0;
  std::deque<std::unique_ptr<Job>> jobs_;        // oldest first
  std::vector<std::unique_ptr<model::ContinuousBatch>> free_batches_;  // of finished jobs, cache kept
};

}  // namespace troupe::rl
