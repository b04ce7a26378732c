// Elastic experts ([[elastic]] scale events): the supervisor's side of a
// change of expert shards at a step boundary. The coordinator calls
// Supervisor::rescale_experts between steps (no step running, every actor
// idle): the next plan's expert shards are spawned on the devices it places
// them on, sent the committed snapshot (restore messages, like a respawn)
// BEFORE their handles are published, then the peer table, the live plan
// and the supervisor's children switch to them at once, and the previous
// shards are stopped. The weights come from the optimizer shards' committed
// parameters; the AdamW state never moves (it lives in the optimizer
// shards), so a scale event changes no number of the training. Across
// processes the spawn callback places a shard on its device's process (that
// process's directory spawns it) and the Runtime hands the other processes
// the new plan afterwards (runtime_cluster.hpp); shrink_lost_experts
// removes the slots of a lost process's shards.
#include <algorithm>
#include <cstdio>
#include <set>
#include <stdexcept>

#include "actors/supervision/supervisor.hpp"
#include "moe/placement.hpp"

namespace troupe::runtime {

std::string RescaleReport::str() const {
  char head[160];
  std::snprintf(head, sizeof head, "step %lld: expert shards %d -> %d (%d spawned, %d retired), %lld bytes in %.3f ms",
                static_cast<long long>(step), old_shards, new_shards, spawned, retired, static_cast<long long>(bytes),
                1e3 * migration_seconds);
  std::string out = head;
  if (policy) {
    char gate[200];
    std::snprintf(gate, sizeof gate, "; gate: %s, %d layer(s) moved, %d skipped, predicted gain %.3f ms vs cost %.3f ms%s",
                  made ? "made" : "skipped", layers_moved, layers_skipped, 1e3 * predicted_gain_seconds,
                  1e3 * predicted_cost_seconds, cost_measured ? "" : " (no migration measured yet)");
    out += std::string(" (eplb") + (threshold ? ", imbalance threshold passed" : "") + ": " +
           std::to_string(moved_experts) + " expert(s) moved" + gate + ")";
  }
  auto list = [](const std::vector<double>& v) {
    std::string s;
    for (double x : v) {
      char b[32];
      std::snprintf(b, sizeof b, "%s%.3f", s.empty() ? "" : " ", x);
      s += b;
    }
    return s;
  };
  int copied = 0;
  for (const auto& layer : replicas)
    for (int h : layer) copied += h > 1;
  if (copied > 0) out += "; " + std::to_string(copied) + " expert(s) with copies";
  if (!imbalance_after.empty())
    out += "; max/mean shard load per layer " + list(imbalance_before) + " -> " + list(imbalance_after);
  return out;
}

std::vector<Supervisor::NewShard> Supervisor::rescale_experts(caf::event_based_actor* self, const Plan& next, uint64_t step,
                                                    uint32_t attempt) {
  if (!next.expert_parallel()) throw std::invalid_argument("rescale_experts: the next plan has no expert shards");
  auto plan = std::make_shared<const Plan>(next);
  const auto now = live_plan(*sh_);
  std::vector<std::vector<caf::actor>> current;
  {
    std::lock_guard<std::mutex> lock(sh_->peers_mu);
    current = sh_->peers.experts;
  }
  std::vector<std::vector<caf::actor>> fresh(static_cast<size_t>(plan->data_parallel));
  std::vector<NewShard> spawned;
  for (int r = 0; r < plan->data_parallel; ++r)
    for (int x = 0; x < plan->num_producers(); ++x) {
      // Incremental: a shard whose experts and device stay is kept as it is
      // (its weights are the committed ones: it loaded them after its last
      // update), so a rebalance touches only the shards whose experts change.
      const caf::actor* keep =
          keeps_expert_shard(*now, *plan, r, x) && static_cast<size_t>(r) < current.size() &&
                  static_cast<size_t>(x) < current[static_cast<size_t>(r)].size() &&
                  current[static_cast<size_t>(r)][static_cast<size_t>(x)]
              ? &current[static_cast<size_t>(r)][static_cast<size_t>(x)]
              : nullptr;
      if (keep) {
        fresh[static_cast<size_t>(r)].push_back(*keep);
        continue;
      }
      caf::actor a = sh_->spawn_expert(self->system(), *plan, r, x, true);
      self->monitor(a);
      // Restored before anyone can address it: a rank's first dispatch,
      // sent after the handle is published, queues behind these.
      restore_rank(self, a, step, attempt);
      children_[a.address()] = {Role::Expert, r, x, plan->expert(r, x).name};
      fresh[static_cast<size_t>(r)].push_back(a);
      spawned.push_back({r, x, std::move(a)});
    }
  std::vector<std::vector<caf::actor>> old;
  {
    std::lock_guard<std::mutex> lock(sh_->peers_mu);
    old = std::move(sh_->peers.experts);
    sh_->peers.experts = fresh;
    sh_->live = plan;
  }
  for (size_t r = 0; r < old.size(); ++r)
    for (size_t x = 0; x < old[r].size(); ++x) {
      const caf::actor& a = old[r][x];
      if (!a) continue;
      if (r < fresh.size() && std::find(fresh[r].begin(), fresh[r].end(), a) != fresh[r].end()) continue;  // kept
      children_.erase(a.address());
      self->demonitor(a);  // a retired shard going down is no failure
      if (a->node() != self->node() && sh_->forget_remote) sh_->forget_remote(a);  // nor its process lost
      self->send_exit(a, caf::exit_reason::user_shutdown);
    }
  return spawned;
}

std::vector<Supervisor::NewShard> Supervisor::shrink_experts(caf::event_based_actor* self, const Child& dead, uint64_t step,
                                                   uint32_t attempt, std::pair<int, int>* shards) {
  const auto now = live_plan(*sh_);
  if (now->expert_shards < 2) throw std::invalid_argument("shrink: the last expert shard of a layer cannot be removed");
  const int slot = now->placement.expert_ids.at(static_cast<size_t>(dead.index)).second;
  RuntimeOptions o = sh_->opt;
  o.expert_shards = now->expert_shards - 1;
  o.expert_bounds.clear();
  o.expert_copies.clear();  // the copies go (every expert keeps its home shard); eplb places them again
  o.expert_shares.clear();
  for (const auto& layer : now->layer_experts) {
    std::vector<int64_t> b{0};
    for (const ExpertRange& r : layer) b.push_back(r.end);
    o.expert_bounds.push_back(moe::remove_shard_bounds(b, slot));
  }
  if (shards) *shards = {now->expert_shards, o.expert_shards};
  // The budget was broken by the removed shard: the survivors start afresh.
  history_.erase(std::remove_if(history_.begin(), history_.end(), [](const Past& p) { return p.role == Role::Expert; }),
                 history_.end());
  return rescale_experts(self, make_plan(o), step, attempt);
}

std::optional<std::vector<Supervisor::NewShard>> Supervisor::shrink_lost_experts(
    caf::event_based_actor* self, const std::vector<Child>& lost, uint64_t step, uint32_t attempt,
    std::pair<int, int>* shards, std::string* why) {
  const auto now = live_plan(*sh_);
  const int S = now->expert_shards;
  const size_t L = now->layer_experts.size();
  std::vector<std::set<int>> slots(L);  // [moe layer index] the slots lost in any replica
  for (const Child& c : lost)
    if (c.role == Role::Expert && c.index >= 0 && c.index < now->num_producers())
      slots[static_cast<size_t>(c.index / S)].insert(now->placement.expert_ids[static_cast<size_t>(c.index)].second);
  for (size_t li = 0; li < L; ++li) {
    const std::string lost_here = "MoE layer " + std::to_string(now->moe_layers[li]) + " lost " +
                                  std::to_string(slots[li].size()) + " of " + std::to_string(S) + " expert shard slot(s)";
    if (static_cast<int>(slots[li].size()) >= S) {
      *why = lost_here + ", none left to hold its experts";
      return std::nullopt;
    }
    if (slots[li].size() != slots[0].size()) {
      *why = lost_here + ", MoE layer " + std::to_string(now->moe_layers[0]) + " " + std::to_string(slots[0].size()) +
             " (the plan keeps one shard count for every layer)";
      return std::nullopt;
    }
  }
  if (slots.empty() || slots[0].empty()) {
    *why = "no expert shard was lost";
    return std::nullopt;
  }
  RuntimeOptions o = sh_->opt;
  o.expert_shards = S - static_cast<int>(slots[0].size());
  o.expert_bounds.clear();
  o.expert_copies.clear();  // as shrink_experts: every expert keeps its home shard
  o.expert_shares.clear();
  for (size_t li = 0; li < L; ++li) {
    std::vector<int64_t> b{0};
    for (const ExpertRange& r : now->layer_experts[li]) b.push_back(r.end);
    for (auto k = slots[li].rbegin(); k != slots[li].rend(); ++k) b = moe::remove_shard_bounds(b, *k);  // highest first
    o.expert_bounds.push_back(std::move(b));
  }
  if (shards) *shards = {S, o.expert_shards};
  history_.erase(std::remove_if(history_.begin(), history_.end(), [](const Past& p) { return p.role == Role::Expert; }),
                 history_.end());
  return rescale_experts(self, make_plan(o), step, attempt);
}

}  // namespace troupe::runtime
