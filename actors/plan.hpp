// The topology plan: one value, computed once from validated runtime options
// (launch/run_plan.cpp maps a spec onto them), that names every actor of a
// run and says where it lives and what it owns. `troupe validate` prints it,
// the runtime spawns from it, the supervisor names its children and draws
// kill points from its message counts, the optimizer shards count expected
// gradient slices from its ranges, and the cluster registers actors under its
// names. Nothing else re-derives these facts. Pure C++: no CAF, no devices.
//
// Words: a pipeline *rank* is an actor (and its device) running one op list;
// a model *stage* is a contiguous block of layers. A rank holds one stage
// (sequential, 1f1b, zb1p), two (dualpipe: stage k of copy A and stage
// PP-1-k of copy B; dualpipev: stages k and 2PP-1-k of the V).
//
// Actor names (one scheme everywhere: fault targets, logs, validate,
// restart events, the cluster's registry):
//   coordinator                the driver, data loader and supervisor
//   optimizer:K                ZeRO-1 optimizer shard K
//   stage:K[/replica:R]        pipeline rank K (of replica R when
//                              data_parallel > 1); "rank:K[/replica:R]" is
//                              accepted as an alias where a name is parsed
//   expert:L/S[/replica:R]     expert shard S of MoE layer L
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "actors/placement.hpp"
#include "actors/options.hpp"
#include "actors/schedule/schedule.hpp"
#include "model/params.hpp"
#include "moe/placement.hpp"

namespace troupe::rl {
struct RlConfig;
}

namespace troupe::runtime {

// A contiguous range of the flat parameter buffer.
struct Range {
  int64_t offset = 0, count = 0;
};

// Intersection of two ranges (count 0 when disjoint).
inline Range intersect(Range a, Range b) {
  const int64_t lo = std::max(a.offset, b.offset);
  const int64_t hi = std::min(a.offset + a.count, b.offset + b.count);
  return hi > lo ? Range{lo, hi - lo} : Range{lo, 0};
}

// Global expert ids [begin, end) of one expert shard.
struct ExpertRange {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};

// Contiguous, balanced split of n_experts over `shards`: the first
// n_experts % shards shards take one more. Throws std::invalid_argument when
// shards < 1 or shards > n_experts.
ExpertRange expert_split(int64_t n_experts, int shards, int shard);
// The shard of `expert` under expert_split.
int expert_owner(int64_t n_experts, int shards, int64_t expert);

// The flat-buffer ranges {gate, up, down} of experts `r` of layer `layer`
// (each contiguous: all gate_proj of a layer are consecutive [F,D] blocks).
// Throws std::out_of_range when the layer has no routed experts.
std::array<Range, 3> expert_param_ranges(const model::ParamLayout& layout, const model::ModelConfig& c,
                                         int layer, ExpertRange r);

// The same for any sorted set of experts (a shard's range plus its copies):
// part-major, {gate, up, down} of each contiguous run of ids, in id order —
// a shard's weights laid out as [gate of its experts | up | down].
std::vector<Range> expert_set_ranges(const model::ParamLayout& layout, const model::ModelConfig& c, int layer,
                                     const std::vector<int64_t>& experts);

// Role (actors/names.hpp): Coordinator, Optimizer, Rank, Expert.
// "coordinator", "optimizer", "stage" (a pipeline rank), "expert".
const char* role_name(Role role);

// One model stage held by a pipeline rank.
struct StageSlot {
  int dir = 0;    // schedule direction (1: DualPipe's copy B)
  int stage = 0;  // index in the layout's stages of that direction
  int64_t layer_begin = 0, layer_end = 0;
};

struct ActorPlan {
  std::string name;  // canonical (see the top of this file)
  Role role = Role::Coordinator;
  int replica = 0;   // ranks and expert shards
  int index = 0;     // optimizer shard, pipeline rank, or expert producer (moe layer index * shards + shard)
  int device = -1;   // -1: a control actor with no device
  int process = 0;
  std::vector<StageSlot> stages;  // ranks: the stages they hold, in schedule order of first use
  int layer = -1;                 // expert shards: the global layer
  int shard = -1;                 // expert shards: the shard within the layer
  ExpertRange experts;            // expert shards: the experts they own
  std::vector<int64_t> copies;    // expert shards: second copies of other shards' experts (sorted)
  // Parameter ranges: a rank's or expert shard's gradient ranges (merged, in
  // offset order), an optimizer shard's slice.
  std::vector<Range> params;
  // Messages the actor handles in one step when nothing fails (the range of a
  // seeded kill point); 0 for the coordinator.
  uint32_t messages_per_step = 0;
  // What it owns, for listings: "layers 0..3 +embedding", "experts 0..1", ...
  std::string detail;
};

struct DevicePlan {
  int index = 0;
  int process = 0;
};

struct Plan {
  sched::Layout sl;   // the schedule's layout (ranks, stages, directions)
  int chunks = 0;     // micro-batches per replica and step
  int64_t mb_batch = 0;  // sequences per micro-batch
  int data_parallel = 1;
  int expert_shards = 0;  // per MoE layer; 0: the ranks compute their experts
  int64_t parameters = 0;  // elements of the flat parameter buffer
  std::vector<std::pair<int64_t, int64_t>> stage_layers;  // [stage] layer range
  std::vector<Range> shard_ranges;              // [optimizer shard] its slice of the buffer
  std::vector<std::vector<Range>> rank_owned;   // [rank] gradient ranges (the same in every replica)
  std::vector<int> moe_layers;                  // global index of each MoE layer (expert shards only)
  std::vector<std::vector<Range>> expert_owned; // [producer] gate, up, down ranges (expert shards only)
  std::vector<std::vector<ExpertRange>> layer_experts;  // [moe layer index][shard] the experts it holds
  // [moe layer index][shard] the sorted experts of other ranges it holds a
  // copy of (RuntimeOptions::expert_copies); all empty without replicas.
  std::vector<std::vector<std::vector<int64_t>>> layer_copies;
  // [moe layer][expert] the weights its rows are split by over its holders
  // (moe::share_rows; empty: evenly). RuntimeOptions::expert_shares.
  std::vector<std::vector<std::vector<int>>> layer_shares;
  Placement placement;          // processes and devices (actors/placement.hpp)
  std::vector<DevicePlan> devices;
  // Every actor in spawn order: coordinator, optimizer shards, pipeline ranks
  // (replica-major), expert shards (replica-major, producer order).
  std::vector<ActorPlan> actors;
  // A decoupled RL run's actors (plan_rl_actors; empty otherwise):
  // rl_coordinator, rollout_buffer, trainer, generator:K, reward:K (or
  // reward_model:K). When the trainer runs on the actor runtime, `actors`
  // above are its pipeline ranks, expert and optimizer shards.
  std::vector<ActorPlan> rl_actors;

  bool expert_parallel() const { return !expert_owned.empty(); }
  const ActorPlan& coordinator() const { return actors.front(); }
  const ActorPlan& shard(int i) const;
  const ActorPlan& rank(int replica, int rank) const;
  const ActorPlan& expert(int replica, int producer) const;
  int num_shards() const { return static_cast<int>(shard_ranges.size()); }
  // Expert shards per replica (producer ids 0..n-1).
  int num_producers() const { return static_cast<int>(expert_owned.size()); }
  // The experts shard `shard` of global layer `layer` holds (the split may
  // be uneven: RuntimeOptions::expert_bounds). Throws std::out_of_range.
  ExpertRange experts_of(int layer, int shard) const;
  // The copies shard `shard` of global layer `layer` holds (sorted; empty
  // without replicas), and everything it holds: its range and its copies,
  // sorted (the order of its weights and of its dispatch rows).
  const std::vector<int64_t>& copies_of(int layer, int shard) const;
  std::vector<int64_t> held_experts(int layer, int shard) const;
  // The shards of global layer `layer` holding `expert`, ascending: its
  // rows are split over them by moe::copy_rows.
  std::vector<int> holders(int layer, int64_t expert) const;
  // The rows [first, end) of `rows` routed to `expert` that its holder
  // number `copy` (of holders(layer, expert)) takes: moe::share_rows with
  // the expert's shares.
  std::pair<int64_t, int64_t> expert_rows(int layer, int64_t expert, int holders, int copy, int64_t rows) const;
  // MoE layer index `li`'s copies and shares, as moe::place_copies gives them.
  moe::Replication layer_replication(size_t li) const { return {layer_copies.at(li), layer_shares.at(li)}; }
  bool replicated() const;  // any copy in any layer
  // The producer index of expert shard `shard` of global layer `layer`; -1 when none.
  int expert_producer(int layer, int shard) const;
  // Gradient slices an optimizer shard owning `r` takes from one replica:
  // one per producer range piece (rank or expert shard) that meets it.
  uint32_t gradient_slices(Range r) const;
  // Optimizer shards whose slice meets any of `owned` (the ParamSlices a
  // producer owning `owned` waits for).
  uint32_t meeting_shards(const std::vector<Range>& owned) const;
  // The actor a fault target names; nullptr when the run has none.
  const ActorPlan* target(const FaultTarget& t) const;
  // The actor named `name` (canonical or alias); nullptr when none.
  const ActorPlan* find(const std::string& name) const;
};

// Incremental placement changes: expert shard `producer` of `replica` is the
// same actor in both plans — same shard count, same layer and shard, same
// experts and copies, same device — so a change from `from` to `to` keeps it loaded
// instead of replacing it.
bool keeps_expert_shard(const Plan& from, const Plan& to, int replica, int producer);

// Computes the plan; throws std::invalid_argument when the numbers do not
// make a topology (what validate() checks about the layout and placement).
Plan make_plan(const RuntimeOptions& o);

// Decoupled RL (rl.sync = "fixed_lag" / "latest"): its actors and where they
// sit, computed from the [rl] values and the device count, for
// Plan::rl_actors. The trainer is on device 0 (on devices
// 0..trainer_devices-1 when it runs on the actor runtime: trainer_devices =
// its device count, 0 = one in-process trainer actor); generators go
// round-robin on the devices after the trainer's (rl_generator_device), on
// the trainer's own when there are none; the coordinator, the buffer and the
// reward actors (rule verifiers, microseconds per group) are control actors
// with no device. On host devices a device is a thread, so with 2 devices
// generation and training run side by side. generator_process: the process
// of each generator (empty: all on process 0); everything else is on
// process 0.
std::vector<ActorPlan> plan_rl_actors(const rl::RlConfig& c, int devices, int trainer_devices = 0,
                                      const std::vector<int>& generator_process = {});
// The device of generator `generator` (trainer_devices as above, at least 1).
int rl_generator_device(int generator, int devices, int trainer_devices = 1);

// Across processes a policy version is one envelope, at most this long
// (DecodeLimits::max_message_bytes; rl_wire.cpp checks they agree).
inline constexpr uint64_t kRlMaxMessageBytes = 256ull << 20;

// A plan's expert placement as flat numbers, the form a placement change
// travels in (Runtime -> coordinator, coordinator -> another process's
// directory): `shards` per MoE layer; `bounds`, shards + 1 rising boundaries
// per MoE layer (empty: the even split); `copies`, (MoE layer index, shard,
// expert) triples (empty: none); `shares`, the copied experts' row shares as
// (MoE layer index, expert, n, n weights) runs (empty: even splits).
struct ExpertLayout {
  int32_t shards = 0;
  std::vector<int64_t> bounds, copies, shares;
};
ExpertLayout expert_layout(const Plan& p);
// `o` with the expert placement `x` (o's shard count, bounds, copies and
// shares replaced) for a model with `moe_layers` MoE layers; make_plan() of the
// result is the plan `x` describes. Throws std::invalid_argument on
// malformed numbers.
RuntimeOptions with_expert_layout(RuntimeOptions o, const ExpertLayout& x, size_t moe_layers);

}  // namespace troupe::runtime
