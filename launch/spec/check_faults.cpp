// The spec checks of failure injection: [[faults]] (actor, message and
// process faults; their RL targets) and [chaos].
#include "launch/spec/parser.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>

#include "actors/names.hpp"
#include "actors/schedule/schedule.hpp"
#include "launch/phases.hpp"
#include "launch/spec/keys.hpp"
#include "launch/run_plan.hpp"
#include "model/checkpoint.hpp"
#include "model/data.hpp"
#include "model/params.hpp"
#include "rl/task.hpp"


namespace troupe::launch::spec_detail {

// A [[faults]] entry on "process:P" (kind kill or stop): what the
// recovery across processes supports (docs/faults.md "Losing a process").
void check_process_fault(const Spec& s, SpecSites& p, size_t i, int proc) {
  const FaultConfig& f = s.faults[i];
  auto v = [](int64_t x) { return std::to_string(x); };
  const Pos at = p.fault_where(i, "target");
  const int64_t n = s.topology.processes;
  if (f.kind != runtime::FaultKind::kill && f.kind != runtime::FaultKind::stop)
    p.error(p.fault_where(i, "kind"), std::string("[[faults]] kind = \"") + runtime::fault_kind_name(f.kind) +
                                         "\" does not apply to a process: a process target takes \"kill\" (SIGKILL) "
                                         "or \"stop\" (SIGSTOP)");
  if (f.at_message != 0)
    p.error(p.fault_where(i, "at_message"), "[[faults]] at_message applies to actor kills; a process is hit as its step starts");
  if (f.at_step < 1 || f.at_step > s.run.steps)
    p.error(p.fault_where(i, "at_step"), "[[faults]] at_step = " + v(f.at_step) + " is out of range (allowed 1 .. [run] steps = " +
                                            v(s.run.steps) + ")");
  if (!uses_runtime(s) || s.topology.device_kind == DeviceKind::sim || s.run.mode != RunMode::pretrain) {
    p.error(at, "[[faults]] target = \"" + f.target + "\" needs a multi-process run of the actor runtime (real devices, run.mode = \"pretrain\")");
    return;
  }
  if (n < 2) {
    p.error(at, "[[faults]] target = \"" + f.target + "\": a process fault needs [topology] processes = 2 (this run has 1 "
                "process; to kill an actor name it, e.g. \"stage:1\")");
    return;
  }
  if (proc >= n) {
    p.error(at, "[[faults]] target = \"" + f.target + "\" does not exist: [topology] processes = " + v(n) +
                    " (processes 0.." + v(n - 1) + ")");
    return;
  }
  if (proc == 0) {
    p.error(at, "[[faults]] target = \"process:0\" cannot be recovered: process 0 holds the coordinator (the "
                "supervisor, the committed snapshot and the run's output); only process 1 of a 2-process run can be lost and recovered");
    return;
  }
  if (n > 2)
    p.error(at, "[[faults]] target = \"" + f.target + "\": recovering a lost process is built for 2 processes only "
                "([topology] processes = " + v(n) + "): the other survivors would keep stale handles to the lost actors");
  if (s.topology.process_loss != runtime::ProcessLoss::recover)
    p.error(at, "[[faults]] target = \"" + f.target + "\" with [topology] process_loss = \"fail\": the run would just "
                "stop; set process_loss = \"recover\"");
}

// The parameters fault `i`'s kind needs, reported at its kind key (one rule
// for actor runtime and RL faults alike).
void check_fault_parameters(const FaultConfig& f, SpecSites& p, size_t i) {
  if (f.kind == runtime::FaultKind::delay && f.delay_ms <= 0)
    p.error(p.fault_where(i, "kind"), "[[faults]] kind = \"delay\" needs delay_ms (how late each message arrives, ms)");
  if (f.kind == runtime::FaultKind::pause && f.duration_ms <= 0)
    p.error(p.fault_where(i, "kind"), "[[faults]] kind = \"pause\" needs duration_ms (how long the actor receives nothing)");
  if (f.kind == runtime::FaultKind::partition && f.duration_ms <= 0)
    p.error(p.fault_where(i, "kind"), "[[faults]] kind = \"partition\" needs duration_ms (how long the target's device is cut off from the rest)");
  if (f.kind == runtime::FaultKind::slow && f.factor <= 1)
    p.error(p.fault_where(i, "kind"), "[[faults]] kind = \"slow\" needs factor > 1 (how many times slower its device runs)");
}

void check_faults(const Spec& s, SpecSites& p) {
  if (s.run.mode == RunMode::rl) return check_rl_faults(s, p);
  // An RL actor (generator:K, reward:K, rollout_buffer) named in a run that
  // has none: reported once here, skipped below.
  std::vector<bool> rl_target(s.faults.size(), false);
  for (size_t i = 0; i < s.faults.size(); ++i) {
    int n = 0;
    if (!p.fault_ok(i) || runtime::parse_fault_target(s.faults[i].target) ||
        runtime::parse_process_target(s.faults[i].target, n))
      continue;
    rl_target[i] = true;
    p.error(p.fault_where(i, "target"), "[[faults]] target = \"" + s.faults[i].target + "\" is an actor of a decoupled "
                                        "RL run (run.mode = \"rl\" with rl.sync = \"fixed_lag\" or \"latest\"); this "
                                        "run has mode = \"" + run_mode_name(s.run.mode) + "\": its actors are stage:K, "
                                        "optimizer:K, expert:L/S and process:P");
  }
  if (s.run.mode == RunMode::reward_model) {
    for (size_t i = 0; i < s.faults.size(); ++i)
      if (p.fault_ok(i))
        p.error(p.fault_where(i, ""), "[[faults]] in a reward-model run: it trains in one process, with no actors to kill");
    return;
  }
  auto v = [](int64_t x) { return std::to_string(x); };
  // One actor, one step, one fault: a second entry would silently collapse
  // into the first (the supervisor kills an actor once per step attempt).
  // A process target counts as role -1.
  std::map<std::tuple<int, int, int, int, int64_t>, size_t> seen;
  for (size_t i = 0; i < s.faults.size(); ++i) {
    if (!p.fault_ok(i) || rl_target[i]) continue;
    int proc = 0;
    const bool is_proc = runtime::parse_process_target(s.faults[i].target, proc);
    const auto t = is_proc ? runtime::FaultTarget{runtime::Role::Coordinator, proc, 0, 0}
                           : *runtime::parse_fault_target(s.faults[i].target);
    const auto key = std::make_tuple(is_proc ? -1 : static_cast<int>(t.role), t.index, t.replica, t.shard, s.faults[i].at_step);
    const auto [it, fresh] = seen.emplace(key, i);
    if (!fresh) {
      const Pos first = p.fault_where(it->second, "");
      p.error(p.fault_where(i, ""), "[[faults]] entry repeats the one at line " + std::to_string(first.line) +
                                       " (target \"" + s.faults[i].target + "\", at_step = " + v(s.faults[i].at_step) +
                                       "): one actor takes at most one fault per step");
    }
  }
  // Whether a target exists is the plan's answer (the actors the runtime
  // would spawn, by their one naming scheme); the message says which
  // setting leaves it out. No plan: the topology itself is invalid and is
  // reported on its keys.
  const runtime::Plan* plan = uses_runtime(s) && !s.faults.empty() ? p.topology_plan(s) : nullptr;
  for (size_t i = 0; i < s.faults.size(); ++i) {
    if (!p.fault_ok(i) || rl_target[i]) continue;  // reported while parsing
    const FaultConfig& f = s.faults[i];
    if (int proc = 0; runtime::parse_process_target(f.target, proc)) {
      check_process_fault(s, p, i, proc);
      continue;
    }
    if (f.kind == runtime::FaultKind::stop) {
      p.error(p.fault_where(i, "kind"), "[[faults]] kind = \"stop\" stops a whole process: its target must be "
                                       "\"process:P\" (to freeze one actor use kind = \"pause\")");
      continue;
    }
    if (!uses_runtime(s)) {
      p.error(p.fault_where(i, ""), "[[faults]] needs the actor runtime (supervised actors); this single-device sequential "
                                   "spec runs in the single-process trainer (use e.g. [topology] schedule = \"1f1b\")");
      continue;
    }
    if (s.topology.device_kind == DeviceKind::sim) {
      p.error(p.fault_where(i, ""), "[[faults]] needs real devices: sim devices ([topology] device_kind = \"sim\") run "
                                   "no supervised actors, so a fault would be silently ignored");
      continue;
    }
    check_fault_parameters(f, p, i);
    if (s.topology.processes > 1)
      p.error(p.fault_where(i, ""), "[[faults]] runs in one process only for now: the supervisor restarts actors on its "
                                   "own devices ([topology] processes = " + v(s.topology.processes) + "); a whole process can be hit: target = \"process:1\"");
    if (f.at_step < 1 || f.at_step > s.run.steps)
      p.error(p.fault_where(i, "at_step"), "[[faults]] at_step = " + v(f.at_step) + " is out of range (allowed 1 .. [run] steps = " +
                                              v(s.run.steps) + ")");
    const auto t = runtime::parse_fault_target(f.target);
    // With [[elastic]] events an expert shard must exist in the fault's step.
    std::optional<runtime::Plan> at_step;
    if (plan && t->role == runtime::Role::Expert && !s.elastic.empty()) {
      try {
        at_step = plan_at_step(s, f.at_step);
      } catch (const std::exception&) {  // a bad event: reported on its keys
      }
    }
    const runtime::Plan* pl = at_step ? &*at_step : plan;
    if (!pl || pl->target(*t)) continue;
    const Pos at = p.fault_where(i, "target");
    const std::string gone = "[[faults]] target = \"" + f.target + "\" does not exist: ";
    const int dp = plan->data_parallel;
    if (t->role == runtime::Role::Expert) {
      const bool moe_layer = std::find(plan->moe_layers.begin(), plan->moe_layers.end(), t->index) != plan->moe_layers.end();
      if (!plan->expert_parallel())
        p.error(at, gone + "expert-shard actors need [model] ffn = \"moe\" and [topology] expert_shards > 1 (expert_shards = " +
                        v(s.topology.expert_shards) + ")");
      else if (!moe_layer)
        p.error(at, gone + "[model] n_layers = " + v(s.model.n_layers) + " (MoE layers 0.." + v(s.model.n_layers - 1) + ")");
      else if (t->shard >= pl->expert_shards)
        p.error(at, gone + (at_step ? "in step " + v(f.at_step) + " (after [[elastic]]) there are " + v(pl->expert_shards) +
                                          " expert shard(s) per layer"
                                    : "[topology] expert_shards = " + v(pl->expert_shards)) +
                        " (shards 0.." + v(pl->expert_shards - 1) + " per layer)");
      else
        p.error(at, gone + "[topology] data_parallel = " + v(dp) + " (replicas 0.." + v(dp - 1) + ")");
      continue;
    }
    const bool rank = t->role == runtime::Role::Rank;  // a pipeline rank, named "stage:K"
    const int n = rank ? plan->sl.num_ranks : plan->num_shards();
    if (t->index >= n)
      p.error(at, gone + "[topology] " + (rank ? "stages = " : "optimizer_shards = ") + v(n) + " (indices 0.." + v(n - 1) + ")");
    else
      p.error(at, gone + "[topology] data_parallel = " + v(dp) + " (replicas 0.." + v(dp - 1) + ")");
  }
}

// [[faults]] of an RL run: kills of the decoupled actors (actors/rl/), which
// only rl.sync = "fixed_lag" / "latest" have, and lost weight syncs (drop) on
// generators.
void check_rl_faults(const Spec& s, SpecSites& p) {
  auto v = [](int64_t x) { return std::to_string(x); };
  const RlSection& r = s.rl_section;
  std::map<std::pair<std::string, int64_t>, size_t> seen;
  for (size_t i = 0; i < s.faults.size(); ++i) {
    if (!p.fault_ok(i)) continue;  // reported while parsing
    const FaultConfig& f = s.faults[i];
    if (!rl::decoupled(r.sync)) {
      p.error(p.fault_where(i, ""), "[[faults]] in an RL run need [rl] sync = \"fixed_lag\" or \"latest\" (generator and reward actors "
                                    "under a supervisor); the synchronous loop has no actors to kill");
      continue;
    }
    bool gen = false;
    int index = 0;
    if (is_trainer_fault_target(f.target)) {
      // The trainer's runtime actors (rl.trainer = "actors"): their existence
      // is the runtime's check (check_rl_trainer).
      if (!rl_trainer_on_actors(s))
        p.error(p.fault_where(i, "target"), "[[faults]] target = \"" + f.target + "\" is an actor of the trainer's "
                                            "runtime, which this run has only with [rl] trainer = \"actors\" (the "
                                            "trainer is one actor here)");
      else if (f.kind == runtime::FaultKind::stop)
        p.error(p.fault_where(i, "kind"), "[[faults]] kind = \"stop\" stops a whole process: its target must be "
                                          "\"process:P\" (to freeze one actor use kind = \"pause\")");
      else
        check_fault_parameters(f, p, i);
    } else if (runtime::is_rl_buffer_target(f.target)) {
      if (f.kind != runtime::FaultKind::kill)
        p.error(p.fault_where(i, "kind"), std::string("[[faults]] kind = \"") + runtime::fault_kind_name(f.kind) +
                                          "\" on rollout_buffer: the buffer takes kills only");
    } else if (int proc = 0; runtime::parse_process_target(f.target, proc)) {
      // A generator process lost: it SIGKILLs itself at its first job of
      // at_step or later; its generators restart on process 0.
      const int64_t n = s.topology.processes;
      if (f.kind != runtime::FaultKind::kill)
        p.error(p.fault_where(i, "kind"), std::string("[[faults]] kind = \"") + runtime::fault_kind_name(f.kind) +
                                          "\" on " + f.target + ": in an RL run a process takes \"kill\" (SIGKILL)");
      else if (f.at_message != 0)
        p.error(p.fault_where(i, "at_message"), "[[faults]] at_message applies to actor kills; a generator process is "
                                                "hit at its first job of at_step or later");
      else if (n < 2 || proc < 1 || proc >= n)
        p.error(p.fault_where(i, "target"), "[[faults]] target = \"" + f.target + "\": in an RL run only a generator "
                                            "process can be lost, process 1.." + v(n - 1) + " ([topology] processes = " +
                                            v(n) + ")");
      else if (s.topology.process_loss != runtime::ProcessLoss::recover)
        p.error(p.fault_where(i, "target"), "[[faults]] target = \"" + f.target + "\" with [topology] process_loss = "
                                            "\"fail\": the run would just stop; set process_loss = \"recover\"");
      if (f.at_step < 1 || f.at_step > s.run.steps)
        p.error(p.fault_where(i, "at_step"), "[[faults]] at_step = " + v(f.at_step) + " is out of range (allowed 1 .. [run] steps = " +
                                                v(s.run.steps) + ")");
      continue;
    } else if (!runtime::parse_rl_fault_target(f.target, gen, index)) {
      p.error(p.fault_where(i, "target"), "[[faults]] target = \"" + f.target + "\" is not an actor of an RL run: write "
                                          "\"generator:K\", \"reward:K\" (\"reward_model:K\" with rl.reward = \"model\") "
                                          "or \"rollout_buffer\"");
      continue;
    }
    if (is_trainer_fault_target(f.target)) {
      // checked above
    } else if (runtime::is_rl_buffer_target(f.target)) {
      if (f.kind == runtime::FaultKind::kill && f.at_message > runtime::kRlKillPoints)
        p.error(p.fault_where(i, "at_message"), "[[faults]] at_message = " + v(f.at_message) + " is out of range for " +
                                                f.target + ": 0 (a seeded point) or 1 (on receiving an admission), 2 "
                                                "(after storing it, before telling the coordinator) or 3 (after)");
    } else {
      const bool rm = r.reward == rl::RewardSource::model;
      const int64_t n = gen ? r.generators : r.reward_actors;
      if (!gen && f.target != runtime::rl_reward_actor_name(rm, index))
        p.error(p.fault_where(i, "target"), "[[faults]] target = \"" + f.target + "\": the reward actors of this run are " +
                                            (rm ? "reward_model:K (rl.reward = \"model\")" : "reward:K (the rule verifier)"));
      else if (index >= n)
        p.error(p.fault_where(i, "target"), "[[faults]] target = \"" + f.target + "\" does not exist: [rl] " +
                                            (gen ? "generators = " : "reward_actors = ") + v(n) + " (" +
                                            (gen ? "generator:0.." : runtime::rl_reward_actor_name(rm, 0) + "..") + v(n - 1) + ")");
      if (f.kind == runtime::FaultKind::drop && !gen)
        p.error(p.fault_where(i, "kind"), "[[faults]] kind = \"drop\" on " + f.target + ": drops act on weight syncs, "
                                          "which only generators receive; use \"kill\" on reward actors");
      else if (!runtime::rl_fault_kind(f.kind))
        p.error(p.fault_where(i, "kind"), std::string("[[faults]] kind = \"") + runtime::fault_kind_name(f.kind) +
                                          "\" is not supported on RL actors yet: use \"kill\", \"duplicate\", \"delay\", "
                                          "\"pause\" (or \"drop\": a generator loses its next `count` weight syncs)");
      else
        check_fault_parameters(f, p, i);
      if (f.kind == runtime::FaultKind::kill && f.at_message > runtime::kRlKillPoints)
        p.error(p.fault_where(i, "at_message"), "[[faults]] at_message = " + v(f.at_message) + " is out of range for " +
                                                f.target + ": 0 (a seeded point) or 1 (on receiving its job), 2 (after "
                                                "computing, before sending) or 3 (after sending)");
    }
    if (f.at_step < 1 || f.at_step > s.run.steps)
      p.error(p.fault_where(i, "at_step"), "[[faults]] at_step = " + v(f.at_step) + " is out of range (allowed 1 .. [run] steps = " +
                                              v(s.run.steps) + ")");
    const auto [it, fresh] = seen.emplace(std::make_pair(f.target, f.at_step), i);
    if (!fresh)
      p.error(p.fault_where(i, ""), "[[faults]] entry repeats the one at line " + std::to_string(p.fault_where(it->second, "").line) +
                                       " (target \"" + f.target + "\", at_step = " + v(f.at_step) +
                                       "): one actor takes at most one fault per step");
  }
}

// [chaos] in an RL run: decoupled (the synchronous loop has no actors) and
// only the roles and kinds its actors take.
void check_rl_chaos(const Spec& s, SpecSites& p, const Pos& at) {
  if (!rl::decoupled(s.rl_section.sync)) {  // [rl] as written: convert_rl runs after the checks
    p.error(at, "[chaos] needs supervised actors: this RL run is the synchronous loop in one process (rl.sync = "
                "\"synchronous\"); use rl.sync = \"fixed_lag\" or \"latest\" for generator and reward actors");
    return;
  }
  const runtime::ChaosOptions c = chaos_options(s);
  for (runtime::Role r : c.roles)
    if (r != runtime::Role::Generator && r != runtime::Role::Reward)
      p.error(p.where("chaos.roles"), std::string("[chaos] roles names \"") + runtime::role_name(r) +
                                          "\", which an RL run has no actors of (its roles: generator, reward)");
  bool drops_only = !c.kinds.empty();
  for (runtime::FaultKind k : c.kinds) {
    drops_only = drops_only && k == runtime::FaultKind::drop;
    if (!runtime::rl_fault_kind(k))
      p.error(p.where("chaos.kinds"), std::string("[chaos] kinds names \"") + runtime::fault_kind_name(k) +
                                          "\", which RL actors do not take yet (kill, drop, duplicate, delay, pause)");
  }
  if (drops_only && c.roles.size() == 1 && c.roles[0] == runtime::Role::Reward)
    p.error(p.where("chaos.kinds"), "[chaos] kinds = \"drop\" with roles = \"reward\": drops act on weight syncs, "
                                    "which only generators receive");
}

// [chaos]: the kinds and roles are known, the run can take faults, and
// every role named has actors in this topology.
void check_chaos(const Spec& s, SpecSites& p) {
  const ChaosConfig& c = s.chaos;
  std::string why;
  try {
    (void)chaos_options(s);
  } catch (const std::invalid_argument& e) {
    why = e.what();
  }
  if (!why.empty()) {
    p.error(p.where(why.rfind("roles", 0) == 0 ? "chaos.roles" : "chaos.kinds"), "[chaos] " + why);
    return;
  }
  if (c.mean_steps_between_faults <= 0) return;
  const Pos at = p.where("chaos.mean_steps_between_faults");
  if (s.topology.device_kind == DeviceKind::sim) {
    p.error(at, "[chaos] needs real devices: sim devices ([topology] device_kind = \"sim\") run no supervised actors");
    return;
  }
  if (s.run.mode == RunMode::rl) {
    check_rl_chaos(s, p, at);
    return;
  }
  if (!uses_runtime(s)) {
    p.error(at, "[chaos] needs the actor runtime (supervised actors); this single-device sequential spec runs in the "
                "single-process trainer (use e.g. [topology] schedule = \"1f1b\")");
    return;
  }
  if (s.topology.processes > 1) {
    p.error(at, "[chaos] runs in one process only for now, like [[faults]] ([topology] processes = " +
                    std::to_string(s.topology.processes) + ")");
    return;
  }
  const runtime::Plan* plan = p.topology_plan(s);
  if (!plan) return;  // the topology itself is reported on its keys
  for (runtime::Role r : chaos_options(s).roles) {
    if (r == runtime::Role::Expert && !s.elastic.empty()) {
      p.error(p.where("chaos.roles"), "[chaos] roles names \"expert\", but [[elastic]] scale events change the expert "
                                      "shards during the run; the nemesis cannot aim at them yet (leave \"expert\" out)");
      continue;
    }
    bool any = false;
    for (const auto& a : plan->actors) any = any || a.role == r;
    if (!any)
      p.error(p.where("chaos.roles"), std::string("[chaos] roles names \"") + runtime::role_name(r) +
                                          "\", which this topology has no actors of" +
                                          (r == runtime::Role::Expert ? " (expert-shard actors need [model] ffn = \"moe\" and [topology] expert_shards > 1)" : ""));
  }
}

}  // namespace troupe::launch::spec_detail
