// The one training loop (see training_loop.hpp).
#include "model/training_loop.hpp"

#include <limits>
#include <stdexcept>
#include <string>

namespace troupe::model {

LoopOutcome run_loop(LoopEngine& engine, const LoopOptions& o,
                     const std::function<void(int64_t, const std::string&)>& on_checkpoint) {
  LoopOutcome out;
  if (engine.steps_done() >= o.steps)
    throw std::invalid_argument("nothing to train: the run starts at step " + std::to_string(engine.steps_done()) +
                                " (resumed) and ends at step " + std::to_string(o.steps) +
                                "; raise the number of steps to continue it");
  if (o.eval_at_start && o.eval_every > 0 && engine.steps_done() == 0) engine.evaluate();
  while (engine.steps_done() < o.steps) {
    engine.step();
    ++out.steps_done;
    const int64_t step = engine.steps_done();
    out.interrupted = step < o.steps && o.stop_requested();
    if (o.eval_due(step)) engine.evaluate();
    if (o.save_due(step) || (out.interrupted && !o.checkpoint_dir.empty())) {
      engine.save(o.checkpoint_dir);
      if (on_checkpoint) on_checkpoint(step, o.checkpoint_dir);
    }
    if (out.interrupted) break;
  }
  return out;
}

LoopOptions loop_options(const TrainOptions& t) {
  LoopOptions o;
  o.steps = t.steps;
  o.eval_every = t.eval_batches > 0 ? t.eval_every : 0;
  o.checkpoint_every = t.checkpoint_every;
  o.checkpoint_dir = t.checkpoint_dir;
  o.stop = t.stop;
  return o;
}

namespace {

// A pretraining engine seen by the loop: its metrics go to the observer and
// into the summary.
class Reporting final : public LoopEngine {
 public:
  Reporting(TrainingEngine& engine, const TrainOptions& o, TrainObserver& obs, TrainSummary& s)
      : engine_(engine), opt_(o), obs_(obs), s_(s) {}
  int64_t steps_done() const override { return engine_.steps_done(); }
  void step() override {
    const StepMetrics m = engine_.step();
    s_.final_loss = m.loss;
    obs_.on_step(m);
  }
  void evaluate() override {
    const EvalMetrics e = engine_.evaluate(opt_.eval_accuracy);
    s_.final_val_loss = e.val_loss;
    s_.accuracy = e.accuracy;
    obs_.on_eval(e);
  }
  void save(const std::string& dir) override { engine_.save(dir); }

 private:
  TrainingEngine& engine_;
  const TrainOptions& opt_;
  TrainObserver& obs_;
  TrainSummary& s_;
};

}  // namespace

TrainSummary run_training(TrainingEngine& engine, const TrainOptions& o, TrainObserver& obs) {
  TrainSummary s;
  s.final_val_loss = std::numeric_limits<double>::quiet_NaN();
  s.accuracy = std::numeric_limits<double>::quiet_NaN();
  Reporting reporting(engine, o, obs, s);
  const LoopOutcome out = run_loop(reporting, loop_options(o), [&obs](int64_t step, const std::string& dir) {
    obs.on_checkpoint(step, dir);
  });
  s.steps_done = out.steps_done;
  s.interrupted = out.interrupted;
  return s;
}

}  // namespace troupe::model
