// Single-process training loop on one backend: AdamW (no decay on norms and
// non-trainable entries), linear warmup + cosine decay, global grad-norm
// clipping, gradient accumulation over microbatches, aux-loss-free router
// bias updates, periodic validation and checkpoints, bitwise resume.
// `train` is what the `troupe run` CLI calls; `Trainer` is the same loop one
// step at a time (tests, benchmarks).
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "model/config.hpp"

namespace troupe::model {

struct TrainOptions {
  ModelConfig model;
  OptimConfig optim;
  DataConfig data;
  uint64_t seed = 1;               // parameter init and training data order
  int64_t steps = 200;             // total optimizer steps (the LR schedule spans them)
  int64_t microbatches = 1;        // batch_size sequences split evenly
  int64_t eval_every = 50;         // validation every N steps (and after the last), 0 = never
  int64_t eval_batches = 4;        // validation batches of data.batch_size sequences
  int64_t checkpoint_every = 0;    // save to checkpoint_dir every N steps, 0 = never
  std::string checkpoint_dir;      // also saved after the last step when set
  std::string resume_from;         // checkpoint directory to continue from ("" = fresh)
  kernels::BackendOptions backend;
  bool eval_accuracy = true;       // score the task (exact match) at each evaluation
  // Set from outside (a SIGINT/SIGTERM handler): the loop stops after the
  // running step and saves a checkpoint there (model/training_loop.hpp).
  const std::atomic<bool>* stop = nullptr;
};

struct StepMetrics {
  int64_t step = 0;        // optimizer steps completed (1 after the first)
  double loss = 0.0;       // mean cross-entropy over the batch's counted tokens
  double aux_loss = 0.0;   // load-balancing loss (sum over layers, mean over microbatches)
  double lr = 0.0;
  double grad_norm = 0.0;  // global norm before clipping
  int64_t tokens = 0;      // tokens processed (batch_size * seq_len)
  double step_seconds = 0.0;
  std::vector<std::vector<int64_t>> expert_load;  // [layer][expert] assignments this step
  std::vector<int64_t> dropped;  // [layer] assignments dropped by the capacity limit this step
  std::vector<std::vector<int64_t>> shard_load;  // [layer][expert shard] assignments (runtime with expert shards)
};

struct EvalMetrics {
  int64_t step = 0;
  double val_loss = 0.0;
  double accuracy = 0.0;  // exact match on the task; NaN if the data source has no task
  int64_t problems = 0;   // task problems scored (0 without a task)
  std::vector<double> digit_accuracy;    // TaskScore::digit_accuracy (empty without a task)
  std::vector<double> context_accuracy;  // TaskScore::context_accuracy (empty without a task)
  std::vector<double> size_accuracy;     // TaskScore::size_accuracy (empty unless the task sizes its problems)
};

class TrainObserver {
 public:
  virtual ~TrainObserver() = default;
  virtual void on_step(const StepMetrics&) {}
  virtual void on_eval(const EvalMetrics&) {}
  virtual void on_checkpoint(int64_t step, const std::string& dir) {}
};

struct TrainSummary {
  int64_t steps_done = 0;     // steps run by this call (not counting resumed ones)
  double final_loss = 0.0;    // training loss of the last step
  double final_val_loss = 0.0;  // NaN when no evaluation ran
  double accuracy = 0.0;        // of the last evaluation; NaN without a task or evaluation
  bool interrupted = false;     // stopped early on request (TrainOptions::stop)
};

// Runs options.steps - (resumed step) optimizer steps through the one loop
// (model/training_loop.hpp) on a Trainer. Throws
// std::invalid_argument / std::runtime_error with a clear message on a bad
// configuration, data source or checkpoint.
TrainSummary train(const TrainOptions& options, TrainObserver& observer);

// Learning rate for optimizer step `step` (0-based) of `total`: linear warmup
// from lr/warmup to lr over warmup_steps, then cosine (or constant) to
// lr * min_lr_ratio at the last step.
double learning_rate(const OptimConfig& optim, int64_t step, int64_t total);

class DataSource;
struct TrainingState;  // model/checkpoint.hpp

// What the one training loop (model/training_loop.hpp) drives in
// pretraining: model::Trainer in one process, runtime::Runtime on actors.
// Both read batch steps_done() of the one data order
// (DataSource::train_batch) and apply the one set of update rules
// (model/update_rules.hpp).
class TrainingEngine {
 public:
  virtual ~TrainingEngine() = default;
  virtual int64_t steps_done() const = 0;          // optimizer steps completed (resumed ones included)
  virtual StepMetrics step() = 0;                  // one optimizer step
  virtual EvalMetrics evaluate(bool accuracy) = 0;  // validation loss (+ task accuracy)
  virtual void save(const std::string& dir) = 0;   // checkpoint of the current state
};

// The single-process engine, one step at a time.
class Trainer final : public TrainingEngine {
 public:
  explicit Trainer(const TrainOptions& options);
  // Runs on the given backend instead of make_backend(options.backend) (a
  // profiling wrapper, a device owned by the caller).
  Trainer(const TrainOptions& options, std::unique_ptr<kernels::Backend> backend);
  // Starts from `state` as if resumed from a checkpoint holding it (the same
  // checks; options.resume_from is ignored): how the actor runtime evaluates
  // its parameter vector without writing a checkpoint.
  Trainer(const TrainOptions& options, const TrainingState& state);
  ~Trainer();
  Trainer(const Trainer&) = delete;
  Trainer& operator=(const Trainer&) = delete;

  StepMetrics step() override;
  EvalMetrics evaluate(bool accuracy) override;
  void save(const std::string& dir) override;
  int64_t steps_done() const override;
  std::vector<float> parameters() const;   // the flat buffer, on the host
  kernels::Backend& backend();
  const DataSource& data() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Loss and task accuracy of a saved model on held-out data.
EvalMetrics evaluate(const std::string& checkpoint_dir, const DataConfig& data,
                     int64_t eval_batches, const kernels::BackendOptions& backend);

}  // namespace troupe::model
