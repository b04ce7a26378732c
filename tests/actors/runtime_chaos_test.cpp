// The seeded nemesis ([chaos], actors/supervision/chaos.hpp): its schedule is
// reproducible from the seed and keeps to one fault per actor and step; a run
// with more than 50 faults of every kind across every role (pipeline stages,
// optimizer shards, expert shards) ends with parameters, AdamW moments and
// losses bitwise equal to the fault-free run, and its fault summary counts
// what was injected. Nothing here asserts wall-clock figures or how many
// deadline replays happened (a loaded machine may fire a deadline
// spuriously): only correctness and the counts fixed by the schedule.
#include <cstring>
#include <iostream>
#include <map>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include <gtest/gtest.h>

#include "actors/plan.hpp"
#include "actors/runtime.hpp"
#include "tests/actors/runtime_test_options.hpp"

namespace troupe::test {
namespace {

using runtime::FaultKind;
using runtime::FaultSpec;

runtime::RuntimeOptions chaos_base(int64_t steps) {
  runtime::RuntimeOptions o = tiny_moe_options(21, steps);
  o.schedule = troupe::sched::Kind::one_f_one_b;
  o.stages = 2;
  o.devices = 2;
  o.optimizer_shards = 2;
  o.expert_shards = 2;
  return o;
}

std::string key(const FaultSpec& f) {
  return std::to_string(f.at_step) + " " + runtime::fault_kind_name(f.kind) + " " + f.target + " " +
         std::to_string(f.count) + " " + std::to_string(f.delay_ms) + " " + std::to_string(f.duration_ms) + " " +
         std::to_string(f.factor) + " " + std::to_string(f.steps);
}

std::vector<std::string> keys(const std::vector<FaultSpec>& v) {
  std::vector<std::string> out;
  for (const auto& f : v) out.push_back(key(f));
  return out;
}

TEST(ChaosSchedule, ReproducibleFromTheSeedOneFaultPerActorAndStep) {
  const runtime::RuntimeOptions o = chaos_base(30);
  const runtime::Plan plan = runtime::make_plan(o);
  runtime::ChaosOptions c;
  c.seed = 7;
  c.mean_steps_between_faults = 0.5;
  const auto a = runtime::chaos_schedule(c, plan, 30), b = runtime::chaos_schedule(c, plan, 30);
  EXPECT_EQ(keys(a), keys(b));
  c.seed = 8;
  EXPECT_NE(keys(a), keys(runtime::chaos_schedule(c, plan, 30)));
  // About steps / mean faults (Poisson), in step order, inside the run, on
  // actors the plan has, never two on one actor in one step.
  EXPECT_GT(a.size(), 30u);
  EXPECT_LT(a.size(), 120u);
  std::set<std::pair<std::string, int64_t>> seen;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_GE(a[i].at_step, 1);
    EXPECT_LE(a[i].at_step, 30);
    if (i > 0) EXPECT_GE(a[i].at_step, a[i - 1].at_step);
    const auto t = runtime::parse_fault_target(a[i].target);
    ASSERT_TRUE(t) << a[i].target;
    EXPECT_NE(plan.target(*t), nullptr) << a[i].target;
    EXPECT_TRUE(seen.emplace(a[i].target, a[i].at_step).second) << runtime::describe(a[i]);
  }
  // Kinds and roles are kept to what is asked; taken slots are left alone.
  c.kinds = {FaultKind::drop, FaultKind::slow};
  c.roles = {runtime::Role::Optimizer};
  const std::vector<FaultSpec> taken = {{3, "optimizer:0", FaultKind::kill, 0}, {3, "optimizer:1", FaultKind::kill, 0}};
  for (const auto& f : runtime::chaos_schedule(c, plan, 30, taken)) {
    EXPECT_TRUE(f.kind == FaultKind::drop || f.kind == FaultKind::slow) << runtime::describe(f);
    EXPECT_EQ(f.target.rfind("optimizer:", 0), 0u) << runtime::describe(f);
    EXPECT_NE(f.at_step, 3) << runtime::describe(f) << ": both optimizer shards are taken in step 3";
  }
  // Off: nothing.
  c.mean_steps_between_faults = 0;
  EXPECT_TRUE(runtime::chaos_schedule(c, plan, 30).empty());
}

struct ChaosOutcome {
  model::TrainingState state;
  std::vector<double> losses, norms;
  runtime::FaultSummary summary;
};

ChaosOutcome run(const runtime::RuntimeOptions& o) {
  runtime::Runtime rt(o);
  ChaosOutcome out;
  for (int64_t s = 0; s < o.train.steps; ++s) {
    const model::StepMetrics m = rt.step();
    out.losses.push_back(m.loss);
    out.norms.push_back(m.grad_norm);
  }
  out.state = rt.state();
  out.summary = rt.fault_summary();
  return out;
}

// More than 50 seeded faults, every kind on every role: bitwise equal to the
// fault-free run. Lost messages (drop, corrupt) are found by a small
// explicit step deadline; max_restarts is generous so that a deadline fired
// spuriously on a loaded machine only costs a replay.
TEST(ChaosRun, FiftyFaultsOfEveryKindOnEveryRoleEndBitwiseEqual) {
  runtime::RuntimeOptions base = chaos_base(36);
  base.step_deadline = 0.3;
  base.max_restarts = 1000;
  base.restart_window = 1;
  const ChaosOutcome ref = run(base);

  runtime::ChaosOptions c;
  c.seed = 18;  // a seed whose schedule hits every (kind, role) pair
  c.mean_steps_between_faults = 0.5;
  runtime::RuntimeOptions o = base;
  o.faults = runtime::chaos_schedule(c, runtime::make_plan(base), base.train.steps);
  ASSERT_GE(o.faults.size(), 50u);
  std::map<std::string, int64_t> per_kind;
  std::set<std::string> roles;
  std::set<std::pair<std::string, std::string>> kind_role;
  for (const auto& f : o.faults) {
    ++per_kind[runtime::fault_kind_name(f.kind)];
    const std::string role = f.target.substr(0, f.target.find(':'));
    roles.insert(role);
    kind_role.emplace(runtime::fault_kind_name(f.kind), role);
  }
  for (FaultKind k : runtime::kFaultKinds) EXPECT_GT(per_kind[runtime::fault_kind_name(k)], 0) << runtime::fault_kind_name(k);
  EXPECT_EQ(roles, (std::set<std::string>{"stage", "optimizer", "expert"}));
  EXPECT_EQ(kind_role.size(), 24u) << "every kind on every role";
  std::cout << "  " << o.faults.size() << " faults, " << kind_role.size() << " of 24 (kind, role) pairs\n";

  const ChaosOutcome got = run(o);
  EXPECT_TRUE(same_bits(ref.state.params, got.state.params)) << "parameters differ";
  EXPECT_TRUE(same_bits(ref.state.adam_m, got.state.adam_m)) << "AdamW m differs";
  EXPECT_TRUE(same_bits(ref.state.adam_v, got.state.adam_v)) << "AdamW v differs";
  ASSERT_EQ(ref.losses.size(), got.losses.size());
  for (size_t i = 0; i < ref.losses.size(); ++i) {
    EXPECT_EQ(std::memcmp(&ref.losses[i], &got.losses[i], sizeof(double)), 0) << "loss of step " << i + 1;
    EXPECT_EQ(std::memcmp(&ref.norms[i], &got.norms[i], sizeof(double)), 0) << "norm of step " << i + 1;
  }

  // The summary: every fault was injected and recovered; each corrupted
  // message was dropped by its receiver as damaged; the fault-free run has
  // nothing to report.
  const runtime::FaultSummary& s = got.summary;
  std::cout << s.str() << "\n";
  EXPECT_EQ(s.injected, per_kind);
  EXPECT_EQ(s.total_injected(), static_cast<int64_t>(o.faults.size()));
  EXPECT_EQ(s.recovered, s.total_injected());
  EXPECT_EQ(s.damaged, per_kind["corrupt"]);
  EXPECT_GT(s.partitioned, 0) << "the partitions held no message";
  EXPECT_EQ(s.steps, base.train.steps);
  EXPECT_GE(s.restarts, 1);
  EXPECT_LE(s.restarts, per_kind["kill"]);
  EXPECT_GE(s.replays, per_kind["drop"] > 0 ? 1 : 0);
  EXPECT_GE(s.wall_seconds, s.useful_seconds);
  EXPECT_GT(s.useful_seconds, 0.0);
  EXPECT_FALSE(s.repairs.empty());
  EXPECT_EQ(ref.summary.total_injected(), 0);
  EXPECT_EQ(ref.summary.damaged, 0);
}

}  // namespace
}  // namespace troupe::test
