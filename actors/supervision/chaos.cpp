// The seeded nemesis schedule and the fault summary (see chaos.hpp).
#include "actors/supervision/chaos.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "actors/plan.hpp"

namespace troupe::runtime {

namespace {

// splitmix64: small, fixed and the same on every platform, so a seed names
// one schedule everywhere.
struct Rng {
  uint64_t x;
  uint64_t next() {
    uint64_t z = (x += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  size_t pick(size_t n) { return static_cast<size_t>(next() % n); }
};

// (actor, step): one fault per actor and step. The actor is keyed by its
// parsed target, so the alias "rank:K" is the same actor as "stage:K"; RL
// actors have one spelling each.
using Slot = std::pair<std::string, int64_t>;
Slot slot_of(const FaultSpec& f) {
  const auto t = parse_fault_target(f.target);
  if (!t) return {f.target, f.at_step};
  return {std::to_string(static_cast<int>(t->role)) + "/" + std::to_string(t->index) + "/" + std::to_string(t->replica) +
              "/" + std::to_string(t->shard),
          f.at_step};
}

FaultSpec fault_of(FaultKind kind, const std::string& target, int64_t step) {
  FaultSpec f;
  f.at_step = step;
  f.target = target;
  f.kind = kind;
  switch (kind) {
    case FaultKind::kill: break;  // a seeded point of the step
    case FaultKind::drop: f.count = 1; break;
    case FaultKind::duplicate: f.count = 2; break;
    case FaultKind::delay: f.count = 2, f.delay_ms = 20; break;
    case FaultKind::pause: f.duration_ms = 50; break;
    case FaultKind::corrupt: f.count = 1; break;
    case FaultKind::slow: f.factor = 4, f.steps = 1; break;
    case FaultKind::partition: f.duration_ms = 50; break;
    case FaultKind::stop: break;  // process targets only; never drawn (not in kFaultKinds)
  }
  return f;
}

}  // namespace

std::optional<Role> parse_role(const std::string& name) {
  if (name == "stage") return Role::Rank;
  if (name == "optimizer") return Role::Optimizer;
  if (name == "expert") return Role::Expert;
  if (name == "generator") return Role::Generator;
  if (name == "reward" || name == "reward_model") return Role::Reward;
  return std::nullopt;
}

namespace {

// The draw both schedules share: Poisson arrivals over the steps (gaps with
// mean mean_steps_between_faults), a kind drawn from `kinds`, then up to 8
// tries of pick(rng, kind, step) for an actor that can take it in that step
// and has no fault there yet (else the arrival is skipped).
template <class Pick>
std::vector<FaultSpec> draw_schedule(const ChaosOptions& c, const std::vector<FaultKind>& kinds, int64_t steps,
                                     const std::vector<FaultSpec>& taken, Pick pick) {
  std::vector<FaultSpec> out;
  std::set<Slot> busy;
  for (const FaultSpec& f : taken) busy.insert(slot_of(f));
  Rng rng{c.seed};
  double t = 0.0;
  for (;;) {
    t += -c.mean_steps_between_faults * std::log1p(-rng.uniform());
    const double step_real = std::floor(t) + 1.0;
    if (!(step_real <= static_cast<double>(steps))) break;
    const auto step = static_cast<int64_t>(step_real);
    const FaultKind kind = kinds[rng.pick(kinds.size())];
    for (int attempt = 0; attempt < 8; ++attempt) {
      const std::optional<std::string> name = pick(rng, kind, step);
      if (!name) continue;
      FaultSpec f = fault_of(kind, *name, step);
      if (!busy.insert(slot_of(f)).second) continue;
      out.push_back(std::move(f));
      break;
    }
  }
  return out;
}

}  // namespace

std::vector<FaultSpec> chaos_schedule(const ChaosOptions& c, const Plan& plan, int64_t steps,
                                      const std::vector<FaultSpec>& taken) {
  if (c.mean_steps_between_faults <= 0 || steps < 1) return {};
  std::vector<FaultKind> kinds = c.kinds;
  if (kinds.empty()) kinds.assign(std::begin(kFaultKinds), std::end(kFaultKinds));
  // The actors of each role the run has, in plan order.
  std::vector<Role> roles = c.roles.empty() ? std::vector<Role>{Role::Rank, Role::Optimizer, Role::Expert} : c.roles;
  std::vector<std::vector<std::string>> actors;
  for (Role r : roles) {
    std::vector<std::string> names;
    for (const ActorPlan& a : plan.actors)
      if (a.role == r) names.push_back(a.name);
    if (!names.empty()) actors.push_back(std::move(names));  // validation rejects an explicit role the run lacks
  }
  if (actors.empty()) return {};
  return draw_schedule(c, kinds, steps, taken, [&](Rng& rng, FaultKind, int64_t) -> std::optional<std::string> {
    const auto& names = actors[rng.pick(actors.size())];
    return names[rng.pick(names.size())];
  });
}

std::vector<FaultSpec> rl_chaos_schedule(const ChaosOptions& c, int generators, int reward_actors, bool reward_model,
                                         int64_t steps, const std::vector<FaultSpec>& taken) {
  if (c.mean_steps_between_faults <= 0 || steps < 1) return {};
  std::vector<FaultKind> kinds = c.kinds;
  if (kinds.empty()) kinds.assign(std::begin(kRlChaosKinds), std::end(kRlChaosKinds));
  std::vector<Role> roles = c.roles.empty() ? std::vector<Role>{Role::Generator, Role::Reward} : c.roles;
  roles.erase(std::remove_if(roles.begin(), roles.end(), [&](Role r) {
                return !((r == Role::Generator && generators > 0) || (r == Role::Reward && reward_actors > 0));
              }), roles.end());
  if (roles.empty()) return {};
  // Step s (1-based) is dealt to generator (s - 1) % generators and scored by
  // reward actor (s - 1) % reward_actors: the fault goes to the one that
  // handles its step, so it fires there; a drop (a lost weight sync) only
  // hits generators.
  return draw_schedule(c, kinds, steps, taken, [&](Rng& rng, FaultKind kind, int64_t step) -> std::optional<std::string> {
    const Role r = roles[rng.pick(roles.size())];
    if (r == Role::Generator) return "generator:" + std::to_string((step - 1) % generators);
    if (kind == FaultKind::drop) return std::nullopt;
    return rl_reward_actor_name(reward_model, static_cast<int>((step - 1) % reward_actors));
  });
}

std::string describe(const FaultSpec& f) {
  char extra[96] = "";
  switch (f.kind) {
    case FaultKind::kill:
      if (f.target.rfind("process:", 0) == 0) std::snprintf(extra, sizeof extra, " (SIGKILL of the whole process)");
      else if (f.at_message > 0) std::snprintf(extra, sizeof extra, " (on message %lld)", static_cast<long long>(f.at_message));
      break;
    case FaultKind::drop:
    case FaultKind::duplicate:
    case FaultKind::corrupt:
      // A drop on a generator loses weight syncs (actors/rl/); elsewhere, messages.
      std::snprintf(extra, sizeof extra,
                    f.kind == FaultKind::drop && f.target.rfind("generator:", 0) == 0 ? " (its next %lld weight sync(s))"
                                                                                      : " (%lld message(s))",
                    static_cast<long long>(f.count));
      break;
    case FaultKind::delay:
      std::snprintf(extra, sizeof extra, " (%lld message(s) by %g ms)", static_cast<long long>(f.count), f.delay_ms);
      break;
    case FaultKind::pause: std::snprintf(extra, sizeof extra, " (%g ms)", f.duration_ms); break;
    case FaultKind::partition: std::snprintf(extra, sizeof extra, " (its device cut off for %g ms)", f.duration_ms); break;
    case FaultKind::slow:
      if (f.duration_ms > 0) std::snprintf(extra, sizeof extra, " (%gx for %g ms)", f.factor, f.duration_ms);
      else std::snprintf(extra, sizeof extra, " (%gx for %lld step(s))", f.factor, static_cast<long long>(f.steps));
      break;
    case FaultKind::stop: std::snprintf(extra, sizeof extra, " (SIGSTOP: hung until detected, then SIGKILL)"); break;
  }
  return "step " + std::to_string(f.at_step) + ": " + fault_kind_name(f.kind) + " " + f.target + extra;
}

int64_t FaultSummary::total_injected() const {
  int64_t n = 0;
  for (const auto& [kind, k] : injected) n += k;
  return n;
}

std::string FaultSummary::str() const {
  std::string s = "faults: " + std::to_string(total_injected()) + " injected (";
  bool first = true;
  std::vector<FaultKind> kinds(std::begin(kFaultKinds), std::end(kFaultKinds));
  kinds.push_back(FaultKind::stop);
  for (FaultKind k : kinds) {
    auto it = injected.find(fault_kind_name(k));
    if (it == injected.end()) continue;
    s += (first ? "" : ", ") + std::to_string(it->second) + " " + it->first;
    first = false;
  }
  char line[256];
  std::snprintf(line, sizeof line,
                "), %lld recovered; %lld restart(s), %lld replayed attempt(s) (%lld on a deadline, %lld on a "
                "sequence gap), %lld damaged message(s) dropped\n",
                static_cast<long long>(recovered), static_cast<long long>(restarts), static_cast<long long>(replays),
                static_cast<long long>(suspicions), static_cast<long long>(gaps), static_cast<long long>(damaged));
  s += line;
  std::snprintf(line, sizeof line, "time: %lld step(s) in %.3f s, %.3f s lost to faults, goodput %.1f%%\n",
                static_cast<long long>(steps), wall_seconds, lost_seconds(), 100.0 * goodput());
  s += line;
  if (partitioned > 0) {
    std::snprintf(line, sizeof line, "partitions held %lld message(s) until their windows ended\n",
                  static_cast<long long>(partitioned));
    s += line;
  }
  if (processes_lost > 0) {
    std::snprintf(line, sizeof line, "processes lost: %lld, detected %.3f s (mean) after their step started\n",
                  static_cast<long long>(processes_lost), detect_seconds / static_cast<double>(processes_lost));
    s += line;
  }
  s += "MTTR:";
  if (repairs.empty()) s += " no repairs";
  for (const auto& [role, r] : repairs) {
    std::snprintf(line, sizeof line, " %s %.1f ms (%lld, max %.1f ms)", role.c_str(), 1e3 * r.mean(),
                  static_cast<long long>(r.count), 1e3 * r.max_seconds);
    s += line;
  }
  return s;
}

}  // namespace troupe::runtime
