// Supervisor (see supervisor.hpp): child bookkeeping, restart intensity,
// respawn, the shards' step-start snapshots and the restore messages of a
// replay. Child names come from the plan.
#include "actors/supervision/supervisor.hpp"

#include <algorithm>
#include <cstdio>
#include <tuple>
#include <stdexcept>


namespace troupe::runtime {

namespace {

Envelope slice_of(uint32_t shard, Range range, std::span<const float> v) {
  return Envelope::build<schemas::ParamSlice>([&](schemas::ParamSlice::Builder b) {
    b.setShard(shard);
    b.initRange().setOffset(static_cast<uint64_t>(range.offset));
    b.getRange().setCount(static_cast<uint64_t>(range.count));
    const int64_t shape[1] = {range.count};
    set_tensor_f32(b.initParams(), shape, v);
  });
}

}  // namespace

Supervisor::Supervisor(std::shared_ptr<const Shared> sh) : sh_(std::move(sh)) {
  // The state before the first step: initial parameters, zero moments (or,
  // resumed, the checkpoint's parameters and moments).
  for (size_t i = 0; i < sh_->plan.shard_ranges.size(); ++i) {
    const Range r = sh_->plan.shard_ranges[i];
    const std::vector<float> zeros(static_cast<size_t>(r.count), 0.0f);
    const auto shard = static_cast<uint32_t>(i);
    auto part = [&](const std::vector<float>& v) {
      return v.empty() ? std::span<const float>(zeros)
                       : std::span<const float>(v.data() + r.offset, static_cast<size_t>(r.count));
    };
    committed_.push_back({slice_of(shard, r, part(sh_->init)), slice_of(shard, r, part(sh_->init_m)),
                          slice_of(shard, r, part(sh_->init_v))});
  }
}

void Supervisor::watch(caf::event_based_actor* self) {
  if (watching_) return;
  watching_ = true;
  std::lock_guard<std::mutex> lock(sh_->peers_mu);
  const Plan* plan = sh_->live ? sh_->live.get() : &sh_->plan;  // the expert shards in force (live_plan() would relock)
  for (size_t r = 0; r < sh_->peers.ranks.size(); ++r)
    for (size_t k = 0; k < sh_->peers.ranks[r].size(); ++k) {
      const caf::actor& a = sh_->peers.ranks[r][k];
      self->monitor(a);
      children_[a.address()] = {Role::Rank, static_cast<int>(r), static_cast<int>(k),
                                sh_->plan.rank(static_cast<int>(r), static_cast<int>(k)).name};
    }
  for (size_t i = 0; i < sh_->peers.shards.size(); ++i) {
    const caf::actor& a = sh_->peers.shards[i];
    self->monitor(a);
    children_[a.address()] = {Role::Optimizer, 0, static_cast<int>(i), sh_->plan.shard(static_cast<int>(i)).name};
  }
  for (size_t r = 0; r < sh_->peers.experts.size(); ++r)
    for (size_t x = 0; x < sh_->peers.experts[r].size(); ++x) {
      const caf::actor& a = sh_->peers.experts[r][x];
      self->monitor(a);
      children_[a.address()] = {Role::Expert, static_cast<int>(r), static_cast<int>(x),
                                plan->expert(static_cast<int>(r), static_cast<int>(x)).name};
    }
}

const Supervisor::Child* Supervisor::find(const caf::actor_addr& who) const {
  auto it = children_.find(who);
  return it == children_.end() ? nullptr : &it->second;
}

std::vector<Supervisor::Child> Supervisor::children_off(const caf::node_id& here) const {
  std::vector<Child> out;
  for (const auto& [addr, c] : children_)
    if (addr.node() != here) out.push_back(c);
  std::sort(out.begin(), out.end(), [](const Child& a, const Child& b) {
    return std::tie(a.role, a.replica, a.index) < std::tie(b.role, b.replica, b.index);
  });
  return out;
}

std::vector<std::pair<Supervisor::Child, caf::actor>> Supervisor::siblings(const Child& failed, Strategy strategy) const {
  std::vector<std::pair<Child, caf::actor>> order;  // every child, in start order (Runtime's spawn_local)
  {
    std::lock_guard<std::mutex> lock(sh_->peers_mu);
    auto add = [&](const caf::actor& a) {
      if (auto it = children_.find(a.address()); a && it != children_.end()) order.emplace_back(it->second, a);
    };
    for (const caf::actor& a : sh_->peers.shards) add(a);
    for (const auto& rep : sh_->peers.ranks)
      for (const caf::actor& a : rep) add(a);
    for (const auto& rep : sh_->peers.experts)
      for (const caf::actor& a : rep) add(a);
  }
  auto same = [&](const Child& c) { return c.role == failed.role && c.replica == failed.replica && c.index == failed.index; };
  std::vector<std::pair<Child, caf::actor>> out;
  bool after = false;
  for (const auto& entry : order) {
    if (same(entry.first)) {
      after = true;
      continue;
    }
    if (strategy == Strategy::one_for_all || (strategy == Strategy::rest_for_one && after)) out.push_back(entry);
  }
  return out;
}

std::string Supervisor::admit_restart(const Child& child, const std::string& cause, int64_t step) {
  const auto& o = sh_->opt;
  const int window = std::max(1, o.restart_window);
  const auto now = std::chrono::steady_clock::now();
  const auto period = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(o.restart_period));
  history_.push_back({step, now, child.role});
  // Kept while inside either window.
  auto in_steps = [&](const Past& p) { return p.step > step - window; };
  auto in_time = [&](const Past& p) { return o.restart_period > 0 && now - p.when <= period; };
  while (!history_.empty() && !in_steps(history_.front()) && !in_time(history_.front())) history_.pop_front();
  const int budget = child.role == Role::Rank        ? o.max_restarts_stage
                     : child.role == Role::Optimizer ? o.max_restarts_optimizer
                     : child.role == Role::Expert    ? o.max_restarts_expert
                                                     : -1;
  const std::string role = role_name(child.role);
  // Each limit: how many restarts count in its window, and what it allows.
  struct Limit {
    bool role_only;
    bool seconds;
    int allowed;
    std::string key;
  };
  std::vector<Limit> limits = {{false, false, o.max_restarts, "max_restarts"}};
  if (o.restart_period > 0) limits.push_back({false, true, o.max_restarts, "max_restarts"});
  if (budget >= 0) {
    limits.push_back({true, false, budget, "max_restarts_" + role});
    if (o.restart_period > 0) limits.push_back({true, true, budget, "max_restarts_" + role});
  }
  for (const Limit& l : limits) {
    int n = 0;
    for (const Past& p : history_)
      n += (l.seconds ? in_time(p) : in_steps(p)) && (!l.role_only || p.role == child.role);
    if (n <= l.allowed) continue;
    char span[64];
    if (l.seconds) std::snprintf(span, sizeof span, "%g s", o.restart_period);
    else std::snprintf(span, sizeof span, "%d step(s)", window);
    return child.name + " went down (" + cause + ") in step " + std::to_string(step) + ": " + std::to_string(n) +
           " restarts" + (l.role_only ? " of " + role + " actors" : "") + " within " + span + ", more than " +
           l.key + " = " + std::to_string(l.allowed) + "; giving up";
  }
  return "";
}

caf::actor Supervisor::respawn(caf::event_based_actor* self, const Child& child, uint64_t step, uint32_t attempt) {
  const Child c = child;  // `child` lives in children_, which changes below
  caf::actor fresh = sh_->spawn(self->system(), c.role, c.replica, c.index);
  self->monitor(fresh);
  if (c.role == Role::Optimizer) restore_shard(self, fresh, static_cast<size_t>(c.index), step, attempt);
  else restore_rank(self, fresh, step, attempt);
  std::lock_guard<std::mutex> lock(sh_->peers_mu);
  caf::actor& slot = c.role == Role::Rank
                         ? sh_->peers.ranks[static_cast<size_t>(c.replica)][static_cast<size_t>(c.index)]
                     : c.role == Role::Expert
                         ? sh_->peers.experts[static_cast<size_t>(c.replica)][static_cast<size_t>(c.index)]
                         : sh_->peers.shards[static_cast<size_t>(c.index)];
  children_.erase(slot.address());
  slot = fresh;
  children_[fresh.address()] = c;
  return fresh;
}

bool Supervisor::stage(uint32_t shard, Envelope p, Envelope m, Envelope v) {
  if (shard >= committed_.size() || staged_.count(shard)) return false;
  staged_[shard] = {std::move(p), std::move(m), std::move(v)};
  return true;
}

void Supervisor::commit() {
  for (auto& [shard, snap] : staged_) committed_[shard] = std::move(snap);
  staged_.clear();
}

void Supervisor::restore_shard(caf::event_based_actor* self, const caf::actor& to, size_t shard, uint64_t step,
                               uint32_t attempt) const {
  const auto& c = committed_[shard];
  // Restores take the step messages' path (post), so they arrive before the
  // step that follows them.
  send_anon(to, caf::make_message(rt::restore_atom_v, step, attempt, c[0], c[1], c[2]));
}

void Supervisor::restore_rank(caf::event_based_actor* self, const caf::actor& rank, uint64_t step,
                              uint32_t attempt) const {
  send_anon(rank, caf::make_message(rt::restore_atom_v, step, attempt));
  for (const auto& c : committed_) send_anon(rank, caf::make_message(rt::restore_atom_v, c[0]));
}

// Expert shards take the same messages as ranks: (restore, s, attempt), then
// every shard's parameter slice, of which they load their experts' part.
void Supervisor::restore_all(caf::event_based_actor* self, uint64_t step, uint32_t attempt, const caf::actor& skip) const {
  restore_all(self, step, attempt, std::vector<caf::actor>{skip});
}

void Supervisor::restore_all(caf::event_based_actor* self, uint64_t step, uint32_t attempt,
                             const std::vector<caf::actor>& skip) const {
  auto skipped = [&](const caf::actor& a) { return std::find(skip.begin(), skip.end(), a) != skip.end(); };
  for (size_t i = 0; i < committed_.size(); ++i)
    if (const caf::actor to = shard_of(*sh_, i); !skipped(to)) restore_shard(self, to, i, step, attempt);
  for (const caf::actor& r : all_ranks(*sh_))
    if (!skipped(r)) restore_rank(self, r, step, attempt);
  for (const caf::actor& x : all_experts(*sh_))
    if (!skipped(x)) restore_rank(self, x, step, attempt);
}

}  // namespace troupe::runtime
