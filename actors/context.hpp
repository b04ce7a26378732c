// Internals of the runtime shared by its actors (CAF; include only from
// actors/*.cpp). The protocol of one step s:
//   coordinator -> first-stage rank   Envelope(Activations, tag.stage = kDataStage,
//                                     tokenIds + targets) per micro-batch
//   coordinator -> every rank         (start, s, loss_scale, aux_scale)
//   rank -> rank                      Envelope(Activations | Gradients) as the
//                                     schedule's op list says; targets ride
//                                     along with activations to the last stage
//   rank -> coordinator               (loss, s, replica, mb, stage, loss_sum, aux)
//   rank -> shard                     Envelope(GradSlice) after its last op, one
//                                     per (owned range piece, shard)
//   shard -> coordinator              (gnorm, s, shard, sum of squares): the
//                                     shards reduce the replicas' slices in a
//                                     fixed (replica, rank, offset) order first
//   coordinator -> every shard        (clip, s, global norm) = sqrt of the sum of
//                                     the shards' partials, in shard order: the
//                                     global-norm reduction across shards; sent
//                                     once every loss report is in too. With
//                                     balance = "bias" it is preceded by
//                                     (load, s, attempt, loads): the step's expert loads,
//                                     with which the shards holding router-bias
//                                     entries update them after AdamW
//   shard -> every rank               Envelope(ParamSlice) after clip + AdamW
//   rank -> coordinator               (stepok, s, replica, rank) when all slices
//                                     are loaded; the step ends when all did.
// With expert shards (opt.expert_shards > 0), a stage at a MoE layer also:
//   rank -> expert shard              Envelope(Dispatch) per shard of the layer
//                                     (forward: token rows; backward: dOut rows)
//   expert shard -> rank              Envelope(Combine) with the same MoeId
//   rank -> coordinator               (load, s, attempt, replica, mb, stage, loads):
//                                     per MoE layer of the stage, E routed
//                                     counts then the dropped count
// and each expert shard is a gradient producer like a rank (GradSlice with
// stage = kExpertProducerBase + producer, ParamSlices back, stepok); see
// actors/experts/expert_shard.hpp.
// Receivers key what they store by (step, kind, direction, stage, mb) or
// (step, replica, rank, offset) and drop duplicates and stale steps.
// Every message also carries the step's attempt (replay generation): a step
// that lost an actor is discarded and run again with attempt + 1, and
// receivers drop anything of an older (step, attempt). Supervision and replay
// (actors/supervision/supervisor.hpp):
//   shard -> coordinator              (snapshot, s, attempt, shard, p, m, v)
//                                     after each update: the state the step
//                                     after s starts from
//   coordinator -> target             (arm, s, k): die on the k-th message
//   dying actor -> coordinator        (fault, name, phase) just before it quits
//   any receiver -> coordinator       (corrupt, name, why) a damaged Envelope dropped
//   coordinator -> every shard        (restore, s, attempt, p, m, v): back to
//                                     the snapshot the step s started from
//   coordinator -> every rank and     (restore, s, attempt), then one
//     expert shard                    (restore, ParamSlice) per shard: abort to
//                                     the start of step s with its parameters;
//                                     then the data and (start ...) again.
// Compute runs on Devices: a closure ends by sending (done, ticket) to its
// actor, which then runs the continuation registered under that ticket.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include <caf/all.hpp>

#include "actors/transport/caf_types.hpp"
#include "actors/transport/ring_transport.hpp"
#include "actors/device/device.hpp"
#include "actors/plan.hpp"
#include "actors/supervision/chaos.hpp"
#include "actors/supervision/fault_injector.hpp"
#include "actors/supervision/interposer.hpp"
#include "actors/runtime.hpp"
#include "actors/test_hooks.hpp"
#include "actors/schedule/schedule.hpp"
#include "model/params.hpp"

namespace troupe::runtime {

// tag.stage of the data loader's micro-batches (no stage sent them).
inline constexpr uint32_t kDataStage = 0xFFFFFFFFu;

struct Peers {
  std::vector<std::vector<caf::actor>> ranks;  // [replica][rank]
  std::vector<caf::actor> shards;
  // Expert shards: [replica][producer], producer = moe layer index * expert_shards + shard.
  std::vector<std::vector<caf::actor>> experts;
  caf::actor coordinator;
};

// Everything the actors share, immutable once the actors run (the peers are
// filled in before the first message is sent), except the rank and shard
// handles: the supervisor replaces a restarted actor's handle, so they are
// read through rank_of / shard_of / all_ranks / all_shards, under peers_mu.
// The coordinator is never replaced and is read directly.
struct Shared {
  RuntimeOptions opt;
  std::shared_ptr<const TestHooks> hooks;  // test_hooks.hpp: null outside tests
  model::ParamLayout layout;
  // The topology (actors/plan.hpp): schedule layout, stage layers, every
  // actor's ranges, names, placement and per-step message counts, as the
  // run started. Everything but the expert shards is fixed for the run; the
  // expert shards follow the [[elastic]] events: read them (expert_shards,
  // expert_owned, the expert actors, placement.expert_*, and the message
  // counts that depend on them) from live_plan().
  Plan plan;
  // The plan in force (replaced by the coordinator between steps, under
  // peers_mu, when a scale event changes the expert shards).
  mutable std::shared_ptr<const Plan> live;
  std::vector<float> init;                                // initial flat parameters (resumed: the saved ones)
  // Resumed from a checkpoint (RuntimeOptions.train.resume_from): the saved
  // AdamW moments (empty: zeros) and the steps already done, where every
  // actor's step counter starts (LR schedule and bias correction follow it).
  std::vector<float> init_m, init_v;
  uint64_t start_step = 0;
  mutable Peers peers;
  mutable std::mutex peers_mu;
  // Spawns the actor of a role/index (replica for ranks) on its device; the
  // supervisor respawns with it (one placement rule, in runtime.cpp).
  std::function<caf::actor(caf::actor_system&, Role, int replica, int index)> spawn;
  // Spawns expert shard `producer` of replica `replica` as `plan` places it
  // (spawn(Role::Expert, ...) uses the live plan; a scale event spawns the
  // next plan's shards before publishing it). await_restore: its weights
  // come from (restore ...) messages sent right after (no copy of init).
  std::function<caf::actor(caf::actor_system&, const Plan& plan, int replica, int producer, bool await_restore)>
      spawn_expert;
  // Across processes (null in one process): an actor of another process is
  // about to be stopped on purpose (an expert shard a placement change
  // retires), so the cluster stops watching it and its exit is not taken for
  // a lost process. Call it before stopping the actor.
  std::function<void(const caf::actor&)> forget_remote;
  // Bit p: process p was lost and its actors were recovered on this one
  // (coordinator.cpp, on_process_lost); a placement change then spawns what
  // it would put there on this process's devices.
  mutable std::atomic<uint32_t> lost_processes{0};
  std::function<void(const RestartEvent&)> on_restart;    // runtime.cpp records, then the user's
  // This process's devices by plan index (null: another process's), for the
  // coordinator's [[faults]] kind "slow"; they outlive every actor.
  std::vector<Device*> devices;
  // What the faults cost so far (Runtime::fault_summary); the coordinator writes it.
  mutable std::mutex stats_mu;
  mutable FaultSummary stats;
  // When the run last did something, and whether a device has work (one
  // process; null across processes): the coordinator's adaptive message
  // deadline reads it (actors/device/activity.hpp).
  std::shared_ptr<ActivityClock> activity;
  // The test seam on step messages (actors/supervision/interposer.hpp); null in production.
  std::shared_ptr<Interposer> interposer;
  // Faults on messages in flight ([[faults]] drop/duplicate/delay/pause), part
  // of the interposer chain; null when the run has none.
  std::shared_ptr<FaultInjector> injector;
  // Finds a lost step message by the gap it leaves in its receiver's
  // numbers (interposer.hpp); part of the chain when it has an injector.
  std::shared_ptr<LossDetector> loss;
  // With a loss head (RuntimeOptions::loss_head): the batch of the next step
  // (Runtime::step_on sets it, the coordinator reads it at every attempt),
  // and the last finished step's head report, [global micro-batch] in order
  // (the coordinator writes it as the step ends).
  mutable std::mutex fed_mu;
  mutable std::shared_ptr<const FedBatch> fed;
  mutable std::vector<std::vector<double>> head_report;
};

// The plan in force (see Shared::live); Shared::plan when none was set (a
// Shared built by hand, as the actor tests do; it lives as long as `sh`).
inline std::shared_ptr<const Plan> live_plan(const Shared& sh) {
  std::lock_guard<std::mutex> lock(sh.peers_mu);
  return sh.live ? sh.live : std::shared_ptr<const Plan>(std::shared_ptr<const Plan>{}, &sh.plan);
}

// An invalid handle (sends to it are no-ops) once the runtime is torn down.
inline caf::actor rank_of(const Shared& sh, int replica, int rank) {
  std::lock_guard<std::mutex> lock(sh.peers_mu);
  const auto r = static_cast<size_t>(replica), k = static_cast<size_t>(rank);
  return r < sh.peers.ranks.size() && k < sh.peers.ranks[r].size() ? sh.peers.ranks[r][k] : caf::actor{};
}
inline caf::actor shard_of(const Shared& sh, size_t shard) {
  std::lock_guard<std::mutex> lock(sh.peers_mu);
  return shard < sh.peers.shards.size() ? sh.peers.shards[shard] : caf::actor{};
}
inline std::vector<caf::actor> all_ranks(const Shared& sh) {
  std::lock_guard<std::mutex> lock(sh.peers_mu);
  std::vector<caf::actor> out;
  for (const auto& rep : sh.peers.ranks) out.insert(out.end(), rep.begin(), rep.end());
  return out;
}
inline std::vector<caf::actor> all_shards(const Shared& sh) {
  std::lock_guard<std::mutex> lock(sh.peers_mu);
  return sh.peers.shards;
}
inline caf::actor expert_of(const Shared& sh, int replica, int producer) {
  std::lock_guard<std::mutex> lock(sh.peers_mu);
  const auto r = static_cast<size_t>(replica), k = static_cast<size_t>(producer);
  return r < sh.peers.experts.size() && k < sh.peers.experts[r].size() ? sh.peers.experts[r][k] : caf::actor{};
}
inline std::vector<caf::actor> all_experts(const Shared& sh) {
  std::lock_guard<std::mutex> lock(sh.peers_mu);
  std::vector<caf::actor> out;
  for (const auto& rep : sh.peers.experts) out.insert(out.end(), rep.begin(), rep.end());
  return out;
}

// The sender's device for post() when it has none (the coordinator).
inline constexpr int kNoDevice = -1;

// Sends a step message, through the run's interposer when it has one (the
// test seam: actors/supervision/interposer.hpp). `from_device`: the
// sender's device (kNoDevice for the coordinator); a partition fault holds
// the messages that cross between a cut-off device and the rest. To another
// process on this host the message takes the shared-memory ring
// (actors/transport/ring_transport.hpp).
template <class... Ts>
void post(const Shared& sh, int from_device, const caf::actor& to, const Ts&... xs) {
  if (sh.activity) sh.activity->event();
  if (sh.interposer) sh.interposer->send(from_device, to, caf::make_message(xs...), Link{});
  else send_anon(to, caf::make_message(xs...));
}

// Fault injection on the target's side: armed by (arm, step, k), the actor
// dies on the k-th message it receives after that (before handling it),
// telling the coordinator where in the step it was.
struct KillSwitch {
  uint32_t left = 0;  // messages until death; 0 = not armed
};

// An injected kill: tells the coordinator where in the step the actor was
// (its restart report names the phase), then dies with exit_reason::kill.
template <class State>
void die_injected(caf::stateful_actor<State>* self, const std::string& phase) {
  caf::anon_send(self->state.sh->peers.coordinator, rt::fault_atom_v, self->state.name, phase);
  self->quit(caf::exit_reason::kill);
}

// Call first in every step-message handler; true: the actor is now quitting.
template <class State>
bool kill_switch_fires(caf::stateful_actor<State>* self, const std::string& phase) {
  auto& ks = self->state.kill;
  if (ks.left == 0 || --ks.left > 0) return false;
  die_injected(self, phase);
  return true;
}

// Call next in every Envelope handler: an Envelope whose bytes were damaged
// on the way (it failed to decode: CRC-32, header or lengths; see
// damaged_in_flight) is a lost message, not an attack or a bug — the peer
// sending it is a supervised actor of this run. It is dropped, counted and
// reported to the coordinator, which replays the step at once (as the
// step's deadline would for a loss nobody noticed). A message that decodes but breaks the protocol (validation,
// ranges, unknown ids) still fails the run loudly where it is checked.
template <class State>
bool drop_if_damaged(caf::stateful_actor<State>* self, const Envelope& e) {
  if (e.empty() || e.ok() || !damaged_in_flight(e.error())) return false;
  ++self->state.dropped;
  caf::anon_send(self->state.sh->peers.coordinator, rt::corrupt_atom_v, self->state.name,
                 std::string(to_string(*envelope_error_code(e.error()))));
  return true;
}

// Continuations of submitted device work, keyed by ticket (actor thread only).
struct Tickets {
  uint64_t next = 0;
  std::map<uint64_t, std::function<void()>> pending;
};

// Submits `work` to `dev`; when it has run, (done, ticket) comes back to
// `self` and `then` runs on the actor. An exception in `work` goes to the
// coordinator as (fail, "who: what").
template <class State>
void submit(caf::stateful_actor<State>* self, Device& dev, Device::Work work,
            std::function<void()> then, TraceLabel label = {}) {
  const uint64_t ticket = ++self->state.tickets.next;
  self->state.tickets.pending.emplace(ticket, std::move(then));
  caf::actor me = caf::actor_cast<caf::actor>(self);
  caf::actor coord = self->state.sh->peers.coordinator;
  std::string who = self->state.name;
  dev.submit(
      [work = std::move(work), me, ticket](kernels::Backend& be) {
        work(be);
        caf::anon_send(me, rt::done_atom_v, ticket);
      },
      [coord, who](const std::string& what) { caf::anon_send(coord, rt::fail_atom_v, who + ": " + what); },
      label);
}

// (restore, ParamSlice) from the supervisor's snapshot, for a rank or an
// expert shard: on the actor's device, uploads the part of the slice that
// falls in `ranges` (the flat parameter ranges the actor holds, laid out back
// to back in comp->params), or with no ranges (a rank, whose slices come in
// its own coordinates) the whole slice at its offset. comp->params is only
// read on the device: it may still be being made there. A malformed slice is
// reported to the coordinator.
template <class State, class Compute>
void restore_params(caf::stateful_actor<State>* self, const Envelope& e, std::shared_ptr<Compute> comp,
                    std::vector<Range> ranges, TraceLabel label) {
  auto& s = self->state;
  auto p = e.read<schemas::ParamSlice>();
  if (!p) {
    caf::anon_send(s.sh->peers.coordinator, rt::fail_atom_v, s.name + ": bad restore slice: " + to_string(p.error()));
    return;
  }
  const Range got{static_cast<int64_t>((*p)->getRange().getOffset()), static_cast<int64_t>((*p)->getRange().getCount())};
  submit(self, *s.dev, [comp, e, ranges = std::move(ranges), got](kernels::Backend& be) {
    auto r = e.read<schemas::ParamSlice>();
    const auto v = tensor_f32((*r)->getParams());
    if (ranges.empty()) return be.upload_f32(comp->params.view(got.offset, {got.count}), v);
    int64_t base = 0;
    for (const Range& own : ranges) {
      const Range piece = intersect(own, got);
      if (piece.count > 0)
        be.upload_f32(comp->params.view(base + piece.offset - own.offset, {piece.count}),
                      v.subspan(static_cast<size_t>(piece.offset - got.offset), static_cast<size_t>(piece.count)));
      base += own.count;
    }
  }, [] {}, label);
}

// Trace label of a pipeline chunk's compute.
inline TraceLabel chunk_label(TraceLabel::Kind kind, const sched::Chunk& c, int rank) {
  TraceLabel l;
  l.kind = kind;
  l.mb = static_cast<int16_t>(c.mb);
  l.stage = static_cast<int16_t>(c.stage);
  l.chunk = static_cast<int16_t>(c.dir);
  l.owner = static_cast<int16_t>(rank);
  return l;
}

// Trace label of other work of a rank or shard.
inline TraceLabel owner_label(TraceLabel::Kind kind, int owner) {
  TraceLabel l;
  l.kind = kind;
  l.owner = static_cast<int16_t>(owner);
  return l;
}

// Runs the continuation of `ticket` (the done handler of every actor).
inline void run_ticket(Tickets& t, uint64_t ticket) {
  auto it = t.pending.find(ticket);
  if (it == t.pending.end()) return;  // duplicate completion: nothing to do
  auto f = std::move(it->second);
  t.pending.erase(it);
  f();
}

// Actor bodies (pipeline/rank_actor.cpp, optimizer_actor.cpp, coordinator.cpp).
caf::actor spawn_rank(caf::actor_system& sys, std::shared_ptr<const Shared> sh, Device& dev,
                      int replica, int rank);
caf::actor spawn_shard(caf::actor_system& sys, std::shared_ptr<const Shared> sh, Device& dev,
                       int shard);
caf::actor spawn_coordinator(caf::actor_system& sys, std::shared_ptr<const Shared> sh);

// The actor a fault target names (an invalid handle when there is none).
inline caf::actor target_actor(const Shared& sh, const FaultTarget& t) {
  switch (t.role) {
    case Role::Rank: return rank_of(sh, t.replica, t.index);
    case Role::Optimizer: return shard_of(sh, static_cast<size_t>(t.index));
    case Role::Expert: return expert_of(sh, t.replica, live_plan(sh)->expert_producer(t.index, t.shard));
    case Role::Coordinator: {
      std::lock_guard<std::mutex> lock(sh.peers_mu);
      return sh.peers.coordinator;
    }
    case Role::Generator:
    case Role::Reward:
    case Role::RlCoordinator:
    case Role::Buffer:
    case Role::Trainer: return {};  // RL actors (actors/rl/): not in this runtime
  }
  return {};
}

}  // namespace troupe::runtime
