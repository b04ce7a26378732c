// The one training loop. Every way troupe trains — the single-process
// model::Trainer, the actor runtime (runtime::Runtime) and the synchronous RL
// loop (rl::RlTrainer) — is an engine that knows how to run one step,
// evaluate and save; this loop owns the rest: how many steps, when to
// evaluate and when to checkpoint (the same rule for every engine), reporting
// to the observer, and stopping early on request (SIGINT/SIGTERM) after the
// running step with a final checkpoint, so an interrupted run can resume.
// No actors here: the runtime plugs in through the TrainingEngine interface.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>

#include "model/trainer.hpp"

namespace troupe::model {

// When the loop evaluates and saves. Shared by every engine so that the
// cadence is one rule: evaluate after step s when eval_every > 0 and
// (s % eval_every == 0 or s is the last step); save after step s when
// checkpoint_dir is set and (checkpoint_every > 0 and s % checkpoint_every
// == 0, or s is the last step, or the run stops early).
struct LoopOptions {
  int64_t steps = 0;               // total steps (resumed ones included)
  int64_t eval_every = 0;          // 0: never evaluate
  bool eval_at_start = false;      // also evaluate before the first step of a fresh run
  int64_t checkpoint_every = 0;    // 0: only after the last step
  std::string checkpoint_dir;      // "": never save
  const std::atomic<bool>* stop = nullptr;  // set (e.g. by a signal handler): stop after the running step

  bool eval_due(int64_t step) const { return eval_every > 0 && (step % eval_every == 0 || step == steps); }
  bool save_due(int64_t step) const {
    return !checkpoint_dir.empty() && ((checkpoint_every > 0 && step % checkpoint_every == 0) || step == steps);
  }
  bool stop_requested() const { return stop != nullptr && stop->load(std::memory_order_relaxed); }
};

// What the loop drives. step/evaluate report their own metrics (each engine
// has its own metric types); the loop decides when each is called.
class LoopEngine {
 public:
  virtual ~LoopEngine() = default;
  virtual int64_t steps_done() const = 0;  // resumed steps included
  virtual void step() = 0;
  virtual void evaluate() = 0;
  virtual void save(const std::string& dir) = 0;
};

struct LoopOutcome {
  int64_t steps_done = 0;    // steps this call ran
  bool interrupted = false;  // stopped early on request
};

// Runs engine steps until options.steps are done or a stop is requested.
// on_checkpoint(step, dir) follows every save.
LoopOutcome run_loop(LoopEngine& engine, const LoopOptions& options,
                     const std::function<void(int64_t, const std::string&)>& on_checkpoint);

// The loop options of pretraining: eval every options.eval_every steps when
// there are eval batches, checkpoints as options say.
LoopOptions loop_options(const TrainOptions& options);

// Pretraining on any engine: steps, evaluations and checkpoints through
// run_loop, reported to `observer`, summarised.
TrainSummary run_training(TrainingEngine& engine, const TrainOptions& options, TrainObserver& observer);

}  // namespace troupe::model
