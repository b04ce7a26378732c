// The synchronous (on-policy) RL loop in one process: each step samples
// groups of completions with the KV-cache generator, scores them with the
// task's verifier, turns rewards into group-relative advantages, and trains
// the policy with the configured GRPO-family loss through the policy-gradient
// head, then AdamW. `RlTrainer` is the loop one step at a time (tests,
// benchmarks); `train` is what `troupe run` calls for run.mode = "rl".
//
// Determinism: step s draws the prompts and sampler seeds of its groups from
// (seed, s, group, member) alone (rl/group.hpp), so a run is a pure function
// of its spec and seed, and a resumed run continues bit for bit. The frozen
// reference policy is the `init` checkpoint's parameters (or the fresh
// initialisation when there is none); a resumed run reloads it from `init`.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "model/config.hpp"
#include "rl/config.hpp"
#include "rl/policy_updater.hpp"

namespace troupe::rl {

class Task;
struct StepRollouts;
struct ScoredBatch;

struct RlTrainOptions {
  model::ModelConfig model;
  model::OptimConfig optim;
  model::DataConfig data;        // the task's source (addition) and eval_problems
  RlConfig rl;
  uint64_t seed = 1;
  int64_t steps = 100;           // RL steps (each is updates_per_batch optimizer steps)
  int64_t eval_every = 0;        // held-out evaluation every N steps (and after the last); 0 = only the last
  int64_t checkpoint_every = 0;  // save every N steps; 0 = only after the last (when checkpoint_dir is set)
  std::string checkpoint_dir;
  std::string resume_from;       // checkpoint of this RL run to continue from ("" = start at step 0)
  kernels::BackendOptions backend;
  // The in-process loop data-parallel over this many devices (each its own
  // backend with backend.threads): a step's sequences are dealt over the
  // devices' continuous batches (the same rollouts as on one), its training
  // rows over their policy heads, and the gradients summed in device order
  // before the optimizer step on device 0. 1: one device. Not with make_updater.
  int64_t devices = 1;
  const std::atomic<bool>* stop = nullptr;  // set (SIGINT/SIGTERM): stop after the running step, saving there
  // Empty: the policy update runs on the trainer's own backend. Otherwise it
  // builds the updater that runs it (the actor runtime's pipeline, expert
  // and optimizer shards: actors/rl/runtime_policy.hpp); rows are then
  // padded to its fixed length.
  PolicyUpdaterFactory make_updater;
  // Every rollouts_every-th step (0: never), the step's rollouts and their
  // scores as they are trained on, for people to read (`troupe run` writes
  // them to rollouts.jsonl: launch/observe/rollouts_log.hpp). Called on the
  // trainer's thread; an exception from it fails the step.
  int64_t rollouts_every = 0;
  std::function<void(const StepRollouts&, const ScoredBatch&)> on_rollouts;
};

struct RlStepMetrics {
  int64_t step = 0;  // RL steps completed (1 after the first)
  int64_t sampled_version = 0;  // policy version that sampled the step's rollouts (step - 1 when synchronous)
  double loss = 0.0, pg_loss = 0.0;
  double reward_mean = 0.0, reward_std = 0.0;
  double correct = 0.0;               // share of completions that are exactly right
  int64_t groups = 0, zero_variance_groups = 0;
  double zero_variance_share = 0.0;
  double kl_ref = 0.0;                // mean k3 estimate of KL(policy || reference) over trained tokens
  double kl_ref_max = 0.0;            // the largest one token's k3 (the k3 tail: one token can carry the mean)
  double kl_ref_k1 = 0.0;             // mean log pi - log ref over trained tokens (k1: unbiased, light-tailed)
  double kl_ref_weighted = 0.0;       // k3 weighted by pi / mu, self-normalised (the behaviour policy's lag corrected)
  double entropy = 0.0;               // mean per-token entropy of the policy over trained tokens
  double clip_low = 0.0, clip_high = 0.0;
  double ratio_min = 0.0, ratio_mean = 0.0, ratio_max = 0.0;
  double weight_min = 0.0, weight_mean = 0.0, weight_max = 0.0;  // behaviour weight pi_prox / mu
  double approx_kl = 0.0;
  double response_length = 0.0;       // mean new tokens per completion
  double finished = 0.0;              // share of completions that ended with EOS
  double grad_norm = 0.0, lr = 0.0, aux_loss = 0.0;
  int64_t gen_tokens = 0, train_tokens = 0;
  double gen_seconds = 0.0, reward_seconds = 0.0, train_seconds = 0.0, step_seconds = 0.0;
  double gen_tokens_per_s = 0.0, train_tokens_per_s = 0.0;
  // Where each device's time went (the data-parallel loop, devices > 1;
  // empty on one device): its idle seconds within gen_seconds (waiting for
  // the slowest device's last sequence) and within train_seconds (waiting at
  // a join, or while device 0 runs the serial parts: the loss, the gradient
  // sum, AdamW, the parameter copy). Devices 1.. also idle through
  // reward_seconds (scoring runs on device 0).
  std::vector<double> gen_idle_seconds, train_idle_seconds;
  // train_seconds outside the devices' parallel work (any device count):
  // what does not shrink with more devices.
  double train_serial_seconds = 0.0;
  // Each device's idle share of this step (gen + reward + train seconds).
  std::vector<double> device_idle_shares() const;
};

struct RlEvalMetrics {
  int64_t step = 0;
  int64_t problems = 0;
  double exact_match = 0.0;   // greedy decoding
  double mean_reward = 0.0;   // greedy decoding, the verifier's reward
  int64_t k = 0;              // group_size
  double pass_at_k = 0.0;     // share of problems with >= 1 exact completion among k samples
  // The same scores on the SFT side of the data's target split (the held-out
  // problems SFT trained on: rl/task.hpp make_sft_side_task), so forgetting
  // shows while RL runs. sft_problems = 0 when the data has no such split.
  int64_t sft_problems = 0;
  double sft_exact_match = 0.0, sft_mean_reward = 0.0, sft_pass_at_k = 0.0;
  double seconds = 0.0;
};

class RlObserver {
 public:
  virtual ~RlObserver() = default;
  virtual void on_step(const RlStepMetrics&) {}
  virtual void on_eval(const RlEvalMetrics&) {}
  virtual void on_checkpoint(int64_t /*step*/, const std::string& /*dir*/) {}
};

struct RlSummary {
  int64_t steps_done = 0;
  double final_reward = 0.0;
  RlEvalMetrics first_eval, last_eval;  // before the first step (fresh runs) and after the last
  bool interrupted = false;             // stopped early on request (RlTrainOptions::stop)
};

class RlTrainer {
 public:
  // The task defaults to the built-in one named by rl.task over `data`; tests
  // pass their own. Throws model::CheckpointError for a bad init or resume
  // checkpoint, std::invalid_argument for a model that disagrees with it or a
  // bad configuration.
  explicit RlTrainer(const RlTrainOptions& options, std::unique_ptr<Task> task = nullptr);
  ~RlTrainer();
  RlTrainer(const RlTrainer&) = delete;
  RlTrainer& operator=(const RlTrainer&) = delete;

  RlStepMetrics step();
  // One step on rollouts sampled elsewhere (a generator actor with a copy of
  // some policy version): rollouts.step must equal steps_done(), `scored` is
  // score_step(task(), rl, rollouts) (rl/rollout_step.hpp). step() is
  // sample_step with the trainer's own weights, then exactly this.
  RlStepMetrics train_on(const StepRollouts& rollouts, const ScoredBatch& scored, double reward_seconds = 0.0);
  RlEvalMetrics evaluate();
  void save(const std::string& dir);
  int64_t steps_done() const;
  std::vector<float> parameters() const;
  const Task& task() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The one training loop (model/training_loop.hpp) with an RlTrainer as its
// engine: evaluates before the first step (fresh runs), then runs
// options.steps - (resumed) steps with evaluations and checkpoints as
// configured.
RlSummary train(const RlTrainOptions& options, RlObserver& observer);

// The same loop with each step taken by `step_fn` (empty: trainer.step());
// the decoupled trainer actor (actors/rl/) trains on rollouts from its buffer.
// `after_save` (optional) runs after each checkpoint is written to a
// directory (the decoupled trainer adds the policy versions still needed:
// rl/version_store.hpp).
RlSummary run_rl_loop(RlTrainer& trainer, const RlTrainOptions& options, RlObserver& observer,
                      const std::function<RlStepMetrics()>& step_fn,
                      const std::function<void(const std::string&)>& after_save = {});

// The built-in task named by rl.task ("addition") over `data`, scored by
// rl.verifier, with rl.sft_fraction of its training prompts from the SFT side
// of the split (make_mixed_task). Throws std::invalid_argument for another
// name, or an sft_fraction > 0 without a target split at one column.
std::unique_ptr<Task> make_task(const RlConfig& rl, const model::DataConfig& data, uint64_t seed);

}  // namespace troupe::rl
