// What a run of the actor runtime is asked to do: RuntimeOptions (topology,
// expert placement policy, supervision, elastic events, cluster, tracing,
// callbacks), the scale-event report its callback receives, and the batch a
// runtime with a loss head is fed. The plan (plan.hpp) is computed from these
// and the facade (runtime.hpp) runs them. Test-only switches are not here:
// they are TestHooks (test_hooks.hpp). No CAF in this header.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "actors/cluster/auth.hpp"
#include "actors/cluster/process_loss.hpp"
#include "actors/names.hpp"
#include "actors/schedule/schedule.hpp"
#include "actors/supervision/chaos.hpp"
#include "actors/supervision/elastic.hpp"
#include "actors/supervision/suspicion.hpp"
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
  bool record_trace = false;        // record device events without train() writing them (calibrate, benches)
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
  // 0: adaptive (in one process; across processes 0 means none: peer_timeout
  // covers them). Two deadlines learn from the run (suspicion.hpp):
  //  - the message deadline: the run is silent (no step message posted, no
  //    device with work) for longer than message_suspicion allows, learnt
  //    from the longest silence of each fault-free step; a lost message or a
  //    frozen actor shows as silence within a few of the run's message gaps;
  //  - the step deadline: the attempt is older than step_suspicion allows,
  //    learnt from the fault-free steps' lengths (what silence cannot see:
  //    a device that computes forever).
  // Until they have samples: no message deadline on the first step, then 2 x
  // the slowest step so far; a step deadline of 120 s on the first step
  // (OpenCL kernels may compile), then max(3 s, 4 x the slowest step). Each
  // replay of a step on a deadline doubles that deadline for its next attempt
  // (a long pause or partition is waited out, not replayed forever); message
  // deadline replays do not count against max_restarts, step deadline ones do.
  double step_deadline = 0.0;
  SuspicionOptions message_suspicion{256, 8, 8.0, 0.25, 2.0, 0.020, 0.0};
  SuspicionOptions step_suspicion{256, 8, 8.0, 0.25, 4.0, 1.0, 0.0};
  std::function<void(const RestartEvent&)> on_restart;  // called on the coordinator's thread
  // train() ends (or fails) with the fault summary (chaos.hpp) of the run.
  std::function<void(const FaultSummary&)> on_fault_summary;
  // Across processes (actors/cluster/runtime_cluster.hpp): with processes > 1 each
  // process creates only the devices and actors actors/placement.hpp gives
  // it; process 0 drives training, the others serve() until told to stop.
  int processes = 1;
  std::string interface = "127.0.0.1";  // address CAF ports bind to
  double peer_timeout = 3.0;            // seconds without traffic before a peer counts as lost
  // Sooner than that, process 0 suspects a process whose heartbeats (every
  // heartbeat_interval seconds) stop for longer than peer_suspicion allows,
  // learnt from the gaps between the heartbeats it has seen (suspicion.hpp);
  // at most peer_timeout. A stopped process is then found in well under a
  // second; CAF's own heartbeat and peer_timeout remain the backstop.
  double heartbeat_interval = 0.05;
  SuspicionOptions peer_suspicion{256, 2, 8.0, 0.25, 3.0, 0.5, 0.0};
  ProcessLoss process_loss = ProcessLoss::recover;  // 2 processes: restart process 1's actors on process 0
  // Between processes: mutual TLS with one cluster key (cluster_tls.hpp), read
  // from auth_dir, or made by process 0 and sent over MPI when auth_dir is "".
  ClusterAuth auth = ClusterAuth::tls;
  std::string auth_dir;
  int64_t bulk_shm_bytes = 1 << 16;     // all processes on one host: envelopes this large go through
                                        // shared memory (actors/transport/envelope_shm.hpp); 0 = never
  int64_t ring_bytes = 1 << 22;         // all processes on one host: each pair's step messages go through a
                                        // shared-memory ring of this many bytes (ring_transport.hpp); 0 = CAF's TCP
  int64_t ring_spin_us = 50;            // a ring's receiver spins this long on an empty ring before it sleeps
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

}  // namespace troupe::runtime
