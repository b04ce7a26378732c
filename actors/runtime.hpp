// The actor runtime, first slice: builds a topology in one process — devices
// (serial executors), pipeline-rank actors running a schedule's op list,
// ZeRO-1 optimizer-shard actors and a coordinator that also loads the data —
// and runs training steps on it. The math is the single-process
// model::Trainer's (same init, data order, loss scaling, AdamW, LR schedule,
// clipping); see context.hpp for the message protocol.
//
// Equivalence with model::Trainer (tests/runtime_equivalence_test.cpp):
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
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "actors/cluster/auth.hpp"
#include "actors/cluster/process_loss.hpp"
#include "actors/device/trace.hpp"
#include "actors/schedule/schedule.hpp"
#include "actors/supervision/chaos.hpp"
#include "actors/supervision/elastic.hpp"
#include "actors/supervision/faults.hpp"
#include "model/checkpoint.hpp"
#include "model/loss_head.hpp"
#include "model/trainer.hpp"

namespace troupe::runtime {

struct ClusterComm;  // actors/cluster/runtime_cluster.hpp: how processes find each other (MPI in launch/)

// What one scale event did (RuntimeOptions::on_rescale; metrics.jsonl's
// {"type":"rescale"} line). The loads are the event step's routed loads
// summed per shard, under the old and under the new split.
struct RescaleReport {
  int64_t step = 0;                // the 1-based step that first ran on the new placement
  int old_shards = 0, new_shards = 0;
  int64_t bytes = 0;               // expert weights loaded into the new shards (all replicas)
  int spawned = 0, retired = 0;    // expert-shard actors
  bool policy = false;             // made by the eplb policy (else an [[elastic]] event)
  bool threshold = false;          // eplb: tried between periodic rebalances (imbalance_threshold passed)
  int moved_experts = 0;           // eplb: experts that changed shard (all layers)
  std::vector<int64_t> bounds;     // eplb: the new boundaries, per MoE layer (expert_shards + 1 each)
  // eplb with redundant_experts: the new copies, flat (moe layer index,
  // shard, expert) triples; and [moe layer][expert] holders (1 = no copy)
  // after the change.
  std::vector<int64_t> copies;
  std::vector<std::vector<int>> replicas;
  // eplb with redundant_experts: the row shares of the copied experts, flat
  // (moe layer index, expert, n, then n weights out of moe::kShareTotal).
  std::vector<int64_t> shares;
  double migration_seconds = 0.0;  // from the first spawn until every new shard had its weights
  double step_seconds = 0.0;       // of the event step, the migration included
  // [moe layer] max / mean of the per-shard loads (1 = balanced).
  std::vector<double> imbalance_before, imbalance_after;
  // eplb's migration-cost gate: a layer's moves are made only when their
  // predicted gain over the next rebalance_every steps beats their cost.
  // made = false: every layer was skipped, the placement did not change
  // (bytes, spawned, retired 0; the report is still written).
  bool made = true;
  int layers_moved = 0, layers_skipped = 0;
  double predicted_gain_seconds = 0.0;  // over rebalance_every steps, the layers moved and skipped
  double predicted_cost_seconds = 0.0;  // their bytes x the measured seconds per byte of past migrations
  bool cost_measured = false;           // false: no migration measured yet, the move is made (and measured)
  double neighbour_seconds = 0.0;       // moving average of the step times without a placement change before it
  std::string str() const;         // one line for the log
};

struct RuntimeOptions {
  model::TrainOptions train;        // model, optimizer, data, seed, steps, microbatches, backend
  sched::Kind schedule = sched::Kind::one_f_one_b;  // B+W run as one backward in zb1p / dualpipe
  int stages = 1;                   // pipeline ranks per replica (PP)
  int devices = 1;                  // serial executors; ranks and shards are placed round-robin
  int optimizer_shards = 1;         // ZeRO-1 shards of the flat parameter buffer
  int data_parallel = 1;            // replicas; each takes microbatches / data_parallel of them
  // Expert parallelism (MoE models): 0 = every stage computes its layers'
  // experts itself; n >= 1 = each replica has n expert-shard actors per MoE
  // layer (contiguous expert ranges), and the stages reach the experts only
  // through Dispatch/Combine Envelopes.
  int expert_shards = 0;
  // The experts of each shard, per MoE layer: expert_shards + 1 rising
  // boundaries from 0 to n_experts (shard k holds [b_k, b_k+1)); empty: the
  // even split (expert_split). Set by the "eplb" policy's moves.
  std::vector<std::vector<int64_t>> expert_bounds;
  // Second copies of hot experts on top of the split, per MoE layer: per
  // shard, the sorted experts of other shards' ranges it also holds (an
  // expert's rows are split over its holders, moe::copy_rows; their weight
  // gradients are summed by the optimizer shards in shard order). Empty:
  // none. Set by the eplb policy with redundant_experts > 0.
  std::vector<std::vector<std::vector<int64_t>>> expert_copies;
  // How each copied expert's rows are split over its holders, per MoE
  // layer: per expert, one weight per holder (ascending shard) summing to
  // moe::kShareTotal; an empty list (or none at all): evenly. Set by the
  // eplb policy with its copies (moe::place_copies).
  std::vector<std::vector<std::vector<int>>> expert_shares;
  // Automatic placement ([experts] policy): static keeps the split; eplb
  // moves experts between neighbouring shards every rebalance_every steps
  // by their measured load (moe/placement.hpp), at most expert_shards moves
  // per layer and rebalance.
  ExpertPolicy expert_policy = ExpertPolicy::static_split;
  int rebalance_every = 0;
  // eplb's input: per expert, avg = load_decay * avg + (1 - load_decay) *
  // the step's routed load; 0 = the last step's alone. In [0, 1).
  double load_decay = 0.8;
  // eplb: between the periodic rebalances, one is also tried (gated as
  // usual) after any step whose moving-average loads put a MoE layer's
  // max/mean shard load above this; 0 = periodic only. 0 or >= 1.
  double imbalance_threshold = 0.0;
  // eplb: at each rebalance at most this many copies per MoE layer, placed
  // by moving-average load so the busiest shard hands load to the least busy
  // through a shared expert with weighted row shares (moe::place_copies);
  // 0: none. 0..n_experts, needs expert_shards >= 2.
  int redundant_experts = 0;
  // eplb's gate weighs a move's predicted gain against its migration cost,
  // measured on this run's past placement changes (seconds per byte loaded)
  // and multiplied by this factor: 1 = as measured, 0 = no cost (moves
  // whenever the predicted gain is positive), very large = skip (tests).
  double migration_cost_scale = 1.0;
  // An expert shard over its restart budget (max_restarts_expert, or the
  // shared max_restarts): stop the run, or shrink (elastic.hpp). Shrinking
  // needs >= 2 shards in force; with 1 left the run stops as before.
  ExpertOnFailure expert_on_failure = ExpertOnFailure::stop;
  // With expert shards: while one part of an FB op (DualPipe's pairs) waits
  // for its experts, the device runs the other part, and while every running
  // part waits, the rank's next op may start (one backward at a time).
  // false runs the ops and the parts of an FB op one after the other (same
  // results; for measuring).
  bool overlap = true;
  std::string trace;                // Chrome trace file written by train(); empty: no tracing
  bool record_trace = false;        // record device events without train() writing them (tests)
  // B/W split (zb1p, dualpipe, dualpipev): a B op runs the input-gradient
  // pass and its W the deferred weight pass. false: every B runs the full
  // backward and W is empty (the runtime before the split; for A/B benches).
  bool split_backward = true;
  // Supervision (actors/supervision/supervisor.hpp): a rank or shard actor that goes down
  // is respawned on its device and the running step is replayed; more than
  // max_restarts restarts within restart_window steps fail the step.
  std::vector<FaultSpec> faults;    // failure injection ([[faults]])
  // Scale events ([[elastic]]): at_step strictly increasing, in [1, steps];
  // need expert_shards > 0 and one process.
  std::vector<ElasticEvent> elastic;
  std::function<void(const RescaleReport&)> on_rescale;  // called on the thread calling step()
  int max_restarts = 3;
  int restart_window = 10;          // steps
  // The same intensity counted in seconds as well (Erlang's supervisors: at
  // most max_restarts in restart_period seconds; its default is 1 in 5 s):
  // more than max_restarts restarts within this many seconds escalate too.
  // 0: steps only.
  double restart_period = 0.0;
  // Per-role budgets: more than this many restarts of the role's actors
  // (stage ranks, optimizer shards, expert shards) within either window
  // escalate, whatever the others did; -1: only the shared max_restarts.
  int max_restarts_stage = -1, max_restarts_optimizer = -1, max_restarts_expert = -1;
  Strategy strategy = Strategy::one_for_one;  // supervision: what else is restarted with a dead actor
  // A step that has not finished this many seconds after it started (a lost
  // message, a frozen actor) is discarded and replayed; more than
  // max_restarts replays of one step fail the run naming what it waited for.
  // 0: max(3 s, 4 x the slowest step so far), 120 s for the first step (OpenCL kernels may compile) (in
  // one process; across processes 0 means none: peer_timeout covers them).
  double step_deadline = 0.0;
  std::function<void(const RestartEvent&)> on_restart;  // called on the coordinator's thread
  // train() ends (or fails) with the fault summary (chaos.hpp) of the run.
  std::function<void(const FaultSummary&)> on_fault_summary;
  // Test switches, applied through the one test seam on step messages
  // (actors/supervision/interposer.hpp), never inside an actor:
  bool duplicate_sends = false;     // send every step message twice (receivers must drop the copies)
  bool corrupt_combine = false;     // expert shard 0 of replica 0's first forward Combine does not echo
                                    // its Dispatch (the stage must reject it)
  bool replay_stale = false;        // keep each step's messages for inject_stale_messages()
  // A new expert shard of a placement change (event, rebalance) named
  // kill_while_loading ("expert:L/S") dies while it loads its weights, the
  // first kill_while_loading_times times it is spawned for that change
  // (respawns included): the retry path of a failed migration.
  std::string kill_while_loading;
  int kill_while_loading_times = 0;
  // Across processes (actors/cluster/runtime_cluster.hpp): with processes > 1 each
  // process creates only the devices and actors actors/cluster/placement.hpp gives
  // it; process 0 drives training, the others serve() until told to stop.
  int processes = 1;
  std::string interface = "127.0.0.1";  // address CAF ports bind to
  double peer_timeout = 3.0;            // seconds without traffic before a peer counts as lost
  ProcessLoss process_loss = ProcessLoss::recover;  // 2 processes: restart process 1's actors on process 0
  // Between processes: mutual TLS with one cluster key (cluster_tls.hpp), read
  // from auth_dir, or made by process 0 and sent over MPI when auth_dir is "".
  ClusterAuth auth = ClusterAuth::tls;
  std::string auth_dir;
  int64_t bulk_shm_bytes = 1 << 16;     // all processes on one host: envelopes this large go through
                                        // shared memory (actors/transport/envelope_shm.hpp); 0 = never
  std::vector<int> device_process;      // explicit process of each device; empty: contiguous blocks
  std::shared_ptr<ClusterComm> comm;    // required when processes > 1
  // A custom loss head on the last stage instead of the cross-entropy (RL's
  // policy gradient: rl/policy_stage_head.hpp). Each step's batch is then
  // fed by Runtime::step_on with the head's per-token inputs (they ride to
  // the last stage in Activations.tokenData), not loaded from train.data;
  // the head's per-token report comes back (Runtime::head_report). One
  // process only.
  std::shared_ptr<const model::LossHead> loss_head;
  // Start from this state (parameters, AdamW moments, step; its seed is
  // ignored) instead of a fresh initialisation or train.resume_from: a
  // policy being post-trained, or a resumed RL run. Its step is where every
  // actor's step counter (LR schedule, bias correction) starts.
  std::shared_ptr<const model::TrainingState> start_state;
};

// One step's batch for a runtime with a loss head (Runtime::step_on): rows
// of train.model.seq_len tokens, train.data.batch_size rows (the
// micro-batches and replicas split them in order as they split a loaded
// batch), and loss_head->columns() doubles per token.
struct FedBatch {
  std::vector<int32_t> inputs, targets;  // [batch_size * seq_len]
  std::vector<double> token_data;        // [batch_size * seq_len * columns]
};

// Expert shards per MoE layer during 1-based step `step`: the last
// [[elastic]] event at or before it, else options.expert_shards.
int expert_shards_at(const RuntimeOptions& options, int64_t step);

// Checks the topology against the model and schedule; throws
// std::invalid_argument naming the rule that was broken.
void validate(const RuntimeOptions& options);

// An engine of the one training loop (model/training_loop.hpp).
class Runtime final : public model::TrainingEngine {
 public:
  explicit Runtime(const RuntimeOptions& options);
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
  // Messages dropped as duplicates or stale, over all actors (for tests).
  uint64_t dropped_messages();
  // Step messages their receivers dropped because the bytes were damaged in
  // flight ([[faults]] kind "corrupt"); each is also in dropped_messages().
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
  // Test hook, between steps (after at least one; needs
  // options.replay_stale): sends every step message of the finished step
  // again, through the test seam, to its receiver (ranks, shards, the
  // coordinator), which must drop and count it; returns how many were sent.
  // Each receiver has handled them once the next step() returned.
  uint32_t inject_stale_messages();
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
model::TrainSummary train(const RuntimeOptions& options, model::TrainObserver& observer);

}  // namespace troupe::runtime
