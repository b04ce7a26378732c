// The actor runtime, first slice: builds a topology in one process — devices
// (serial executors), pipeline-rank actors running a schedule's op list,
// ZeRO-1 optimizer-shard actors and a coordinator that also loads the data —
// and runs training steps on it. The math is the single-process
// model::Trainer's (same init, data order, loss scaling, AdamW, LR schedule,
// clipping); see context.hpp for the message protocol.
//
// Equivalence with model::Trainer (tests/actors/runtime_equivalence_test.cpp):
//   bitwise  when every gradient element receives its additions in the same
//            order as in the Trainer: schedule sequential or 1f1b, one
//            optimizer shard, data_parallel = 1, untied embeddings (with
//            tied embeddings and PP > 1 the first and last stages both add
//            into the embedding: they are summed at the shard instead of
//            micro-batch by micro-batch);
//   <= 1e-5  relative otherwise (replica sums, per-shard squared norms summed
//            at the coordinator, tied embeddings across stages, dualpipe's
//            two copies).
// No CAF in this header.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "actors/device/trace.hpp"
#include "actors/options.hpp"
#include "actors/test_hooks.hpp"
#include "model/trainer.hpp"

namespace troupe::runtime {

struct Plan;  // actors/plan.hpp

// Checks the topology against the model and schedule; throws
// std::invalid_argument naming the rule that was broken.
void validate(const RuntimeOptions& options);

// An engine of the one training loop (model/training_loop.hpp).
class Runtime final : public model::TrainingEngine {
 public:
  // `plan`: make_plan(options) when the caller made it already (launch's
  // RunPlan, the plan `troupe validate` lists), so the spec's plan is made
  // once; null: the runtime makes it. Throws std::invalid_argument for
  // options validate() rejects.
  explicit Runtime(const RuntimeOptions& options, const Plan* plan = nullptr);
  ~Runtime();
  Runtime(const Runtime&) = delete;
  Runtime& operator=(const Runtime&) = delete;

  // One optimizer step through the actors. Throws std::runtime_error when an
  // actor reported an error (the message names the actor and the cause).
  model::StepMetrics step() override;
  // With a loss head (RuntimeOptions::loss_head): one optimizer step on
  // `batch` (its sizes are checked: std::invalid_argument). A step replayed
  // after a fault runs on the same batch.
  model::StepMetrics step_on(FedBatch batch);
  // The loss head's per-token report of the last step, in batch order
  // ([batch_size * seq_len * report_columns]).
  std::vector<double> head_report() const;
  int64_t steps_done() const override;
  // Validation loss (+ task accuracy) of the current parameters, computed by
  // model::Trainer's evaluation code started in memory from state() (the
  // runtime's micro-batch split per replica, so the figures equal the
  // Trainer's for the same parameters).
  model::EvalMetrics evaluate(bool accuracy) override;
  // Checkpoint of state().
  void save(const std::string& dir) override;
  // The flat parameter buffer, assembled from the optimizer shards.
  std::vector<float> parameters();
  // Everything a checkpoint holds: the parameters and the shards' AdamW
  // moments, assembled in the flat layout, with the step and data cursor
  // (one batch per step, as model::Trainer saves them).
  model::TrainingState state();
  // Expert load of the last step, summed over its micro-batches and
  // replicas: [layer][expert] assignments routed (before capacity dropping,
  // as model::Trainer counts them) and [layer] assignments dropped. MoE
  // layers only; empty for dense models.
  std::vector<std::vector<int64_t>> expert_load();
  std::vector<int64_t> expert_dropped();
  // The names the live actors give themselves (each asked), in spawn order:
  // coordinator, optimizer shards, pipeline ranks, expert shards. They are
  // the plan's names (actors/plan.hpp), as `troupe validate` lists them.
  std::vector<std::string> actor_names();
  // Step messages their receivers dropped because the bytes were damaged in
  // flight ([[faults]] kind "corrupt").
  uint64_t damaged_messages();
  // [[faults]] kind "slow": device closures run slowed so far, the seconds
  // that added, and every closure run (this process's devices).
  struct Slowdown {
    uint64_t slowed = 0, completed = 0;
    double seconds = 0.0;
    std::vector<std::pair<uint64_t, uint64_t>> per_device;  // (slowed, completed) by device index
  };
  Slowdown slowdown() const;
  // Faults injected, recovered, time lost, goodput and MTTR per role so far.
  FaultSummary fault_summary() const;
  // Scale events so far, in order (see RuntimeOptions::on_rescale).
  std::vector<RescaleReport> rescales() const;
  // Expert shards per MoE layer now (after the last scale event).
  int expert_shards() const;
  // Restarts so far, in order (see RuntimeOptions::on_restart).
  std::vector<RestartEvent> restarts() const;
  // Kills the actor `target` ("stage:K", "stage:K/replica:R", "optimizer:K",
  // "expert:L/S", "expert:L/S/replica:R") now,
  // with exit_reason::kill, and returns once the supervisor has handled it
  // (restarted it, and replayed the step if one was running). Throws
  // std::runtime_error for an unknown target or when the restart escalated.
  void kill(const std::string& target);
  // With tracing on (options.trace set or record_trace): waits for the devices
  // to go idle and writes their events so far as Chrome trace JSON
  // (actors/device/trace.hpp). Throws std::logic_error when tracing is off.
  void write_trace(const std::string& path);
  // The same events in memory, one entry per device of this process (what
  // write_trace writes; `troupe calibrate` reads op times from them). Throws
  // std::logic_error when tracing is off.
  std::vector<DeviceTrace> device_traces();
  // Processes other than 0 of a multi-process run: serves this process's
  // actors until process 0 ends the run. Throws std::runtime_error when the
  // run ended in a failure (process 0 lost, or it reported a lost peer).
  void serve();

 private:
  friend uint64_t testing::dropped_messages(Runtime&);   // test_hooks.hpp
  friend uint32_t testing::inject_stale_messages(Runtime&);
  friend class testing::DeterministicRuntime;

  // One optimizer step through the actors on the data the coordinator takes
  // (loaded, or the batch step_on fed).
  model::StepMetrics run_step();
  // state() after the last step, gathered once for an evaluation and a save.
  const model::TrainingState& current_state();

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// model::train's loop (model/training_loop.hpp) with the runtime as its
// engine: evaluations and checkpoints at the same steps. With
// train.resume_from set, the run continues from that checkpoint
// (model::Trainer's checks; its seed, step and data cursor) up to
// train.steps, bitwise as if it had not stopped. With options.trace set,
// writes the device trace there after the last step. Processes other than 0
// of a multi-process run serve their actors until process 0 ends the run.
// `plan` as for Runtime's constructor.
model::TrainSummary train(const RuntimeOptions& options, model::TrainObserver& observer, const Plan* plan = nullptr);

}  // namespace troupe::runtime
