// Supervision of the rank and shard actors, run by the coordinator (CAF 0.17
// has monitors but no supervisors). Strategy ([run] supervision) one_for_one:
// an actor that goes down is respawned alone, with the same role and index on
// the same device (one_for_all: every child with it; rest_for_one: it and the
// children started after it; siblings());
// every child is permanent (restarted whatever the exit reason, except a
// shutdown). Restart intensity: more than max_restarts restarts within
// restart_window steps, or within restart_period seconds (when set), or more
// than a role's own budget (max_restarts_stage / _optimizer / _expert) of
// that role's restarts within either window, escalate to the top of the tree
// — the step fails, and the run stops cleanly, with an error naming the
// actor, the cause and the budget it broke.
//
// Snapshots: the supervisor keeps, per shard, the state (parameters, AdamW m
// and v, as three ParamSlice envelopes) the current step starts from — the
// initial state, then what each shard sends after its update, committed when
// the step ends. A replayed step restores every shard and every rank from it;
// a fresh rank gets its parameters from it too. Internal to actors/*.cpp.
#pragma once

#include <array>
#include <chrono>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "actors/context.hpp"

namespace troupe::runtime {

class Supervisor {
 public:
  explicit Supervisor(std::shared_ptr<const Shared> sh);

  // Monitors every rank and shard (once; the coordinator calls it before the
  // first step).
  void watch(caf::event_based_actor* self);

  struct Child {
    Role role = Role::Rank;
    int replica = 0, index = 0;
    std::string name;
  };
  // The child a down message is about; nullptr for an actor we do not supervise.
  const Child* find(const caf::actor_addr& who) const;
  // The children living on another node than `here`, in a fixed order
  // (role, replica, index): what a lost process held.
  std::vector<Child> children_off(const caf::node_id& here) const;
  // What `strategy` restarts besides `failed` (actors/names.hpp, Strategy), in
  // start order, with their current handles: nothing for one_for_one.
  std::vector<std::pair<Child, caf::actor>> siblings(const Child& failed, Strategy strategy) const;

  // Records a restart of `child` in (1-based) step `step`; returns the
  // escalation message when the restart intensity is exceeded, else "".
  std::string admit_restart(const Child& child, const std::string& cause, int64_t step);
  // Spawns the child again, monitors it, sends it the restore messages for
  // step `step`, attempt `attempt`, and only then publishes its handle: a
  // peer still in the failed attempt that looks the handle up afterwards
  // queues its messages behind the restore, so the fresh actor sees them as
  // stale instead of as work of a step it has not reached. Returns the handle.
  caf::actor respawn(caf::event_based_actor* self, const Child& child, uint64_t step, uint32_t attempt);

  // A scale event between steps (elastic.cpp): spawns `next`'s expert
  // shards, restores them to the start of step `step` from the committed
  // snapshot, then publishes them (peer table, live plan) and makes them the
  // children in place of the previous ones, which are stopped. A shard whose
  // experts and device do not change (keeps_expert_shard) is kept, not
  // replaced. Returns the new shards, replica-major.
  struct NewShard {
    int replica = 0, producer = 0;
    caf::actor actor;
  };
  std::vector<NewShard> rescale_experts(caf::event_based_actor* self, const Plan& next, uint64_t step,
                                          uint32_t attempt);

  // [experts] on_failure = "shrink" (elastic.cpp): expert shard `dead`
  // broke its restart budget. Its slot is removed from every MoE layer (its
  // experts join a neighbour, moe::remove_shard_bounds), the smaller plan's
  // shards are spawned and restored to step `step`, attempt `attempt` from
  // the committed snapshot as in rescale_experts, and the expert restarts
  // counted so far are forgotten (the shard they were charged to is gone).
  // Returns the new shards; `shards` gets the count before and after.
  std::vector<NewShard> shrink_experts(caf::event_based_actor* self, const Child& dead, uint64_t step,
                                         uint32_t attempt, std::pair<int, int>* shards);

  // [experts] on_failure = "shrink" around a lost process (elastic.cpp;
  // coordinator.cpp, on_process_lost): the slots of the expert shards in
  // `lost` (children that lived on it) are removed from their MoE layers —
  // each layer's experts there join a surviving neighbour, moe::
  // remove_shard_bounds — and the smaller plan's shards are spawned here and
  // restored as in shrink_experts. The plan keeps one shard count for every
  // layer, so this needs every layer to have lost the same number of slots
  // (over all replicas) and keep one: otherwise nothing changes, `why` says
  // so, and the caller respawns the lost shards instead.
  std::optional<std::vector<NewShard>> shrink_lost_experts(caf::event_based_actor* self, const std::vector<Child>& lost,
                                                           uint64_t step, uint32_t attempt, std::pair<int, int>* shards,
                                                           std::string* why);

  // Snapshots: a shard's post-update state of the running step; all of them
  // staged -> commit() when the step ends.
  // False (nothing kept) for an unknown shard or one already staged.
  bool stage(uint32_t shard, Envelope p, Envelope m, Envelope v);
  bool all_staged() const { return staged_.size() == committed_.size(); }
  void clear_staged() { staged_.clear(); }
  void commit();

  // Sends (restore ...) so that step `step`, attempt `attempt` starts from the
  // committed snapshot, to every shard, rank and expert shard but `skip` (a
  // replay; respawn() restored the fresh actor already).
  void restore_all(caf::event_based_actor* self, uint64_t step, uint32_t attempt, const caf::actor& skip = {}) const;
  // The same, skipping every actor in `skip` (several respawned at once, or
  // shards a shrink restored already).
  void restore_all(caf::event_based_actor* self, uint64_t step, uint32_t attempt,
                   const std::vector<caf::actor>& skip) const;

 private:
  void restore_shard(caf::event_based_actor* self, const caf::actor& to, size_t shard, uint64_t step,
                     uint32_t attempt) const;
  void restore_rank(caf::event_based_actor* self, const caf::actor& rank, uint64_t step, uint32_t attempt) const;

  std::shared_ptr<const Shared> sh_;
  bool watching_ = false;
  std::map<caf::actor_addr, Child> children_;
  struct Past {
    int64_t step;
    std::chrono::steady_clock::time_point when;
    Role role;
  };
  std::deque<Past> history_;  // recent restarts, oldest first
  std::vector<std::array<Envelope, 3>> committed_;  // [shard] p, m, v
  std::map<uint32_t, std::array<Envelope, 3>> staged_;
};

}  // namespace troupe::runtime
