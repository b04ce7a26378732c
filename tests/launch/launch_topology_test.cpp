// Topology resolution: every actor the spec implies, on the right device and
// process, with layer / expert / parameter ranges that cover everything once;
// and the runtime spawns exactly those actors under the same names.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "actors/runtime.hpp"
#include "launch/run_plan.hpp"
#include "model/params.hpp"

using namespace troupe::launch;
using troupe::runtime::ActorPlan;
using troupe::runtime::Plan;
using troupe::runtime::Role;

namespace {

Spec spec_with(int64_t devices, int64_t stages, int64_t shards, int64_t opt, int64_t dp, int64_t procs,
               const std::string& schedule) {
  Spec s;
  s.source = "test";
  s.topology.devices = devices;
  s.topology.stages = stages;
  s.topology.expert_shards = shards;
  s.topology.optimizer_shards = opt;
  s.topology.data_parallel = dp;
  s.topology.processes = procs;
  s.topology.schedule = troupe::sched::parse_kind(schedule);
  return s;
}

std::vector<const ActorPlan*> of_role(const Plan& t, Role role) {
  std::vector<const ActorPlan*> out;
  for (const auto& a : t.actors)
    if (a.role == role) out.push_back(&a);
  return out;
}

}  // namespace

TEST(Topology, SplitEvenCoversEverythingOnce) {
  for (int64_t n : {1, 4, 7, 30})
    for (int64_t parts = 1; parts <= n; ++parts) {
      const auto r = split_even(n, parts);
      ASSERT_EQ(static_cast<int64_t>(r.size()), parts);
      EXPECT_EQ(r.front().first, 0);
      EXPECT_EQ(r.back().second, n);
      for (size_t i = 1; i < r.size(); ++i) EXPECT_EQ(r[i].first, r[i - 1].second);
      for (const auto& [b, e] : r) EXPECT_GE(e - b, n / parts);
    }
}

TEST(Topology, SingleDeviceDefault) {
  const Spec s = spec_with(1, 1, 1, 1, 1, 1, "sequential");
  const Plan t = resolve_topology(s);
  EXPECT_EQ(t.parameters, troupe::model::build_param_layout(s.model).total());
  EXPECT_EQ(of_role(t, Role::Rank).size(), 1u);
  EXPECT_EQ(of_role(t, Role::Expert).size(), 0u);  // one shard: the experts run in the stage
  EXPECT_EQ(of_role(t, Role::Optimizer).size(), 1u);
  EXPECT_EQ(of_role(t, Role::Coordinator).size(), 1u);
  EXPECT_EQ(of_role(t, Role::Rank)[0]->detail, "layers 0..3 +embedding +head +experts");
  std::set<std::string> ids;
  for (const auto& a : t.actors) EXPECT_TRUE(ids.insert(a.name).second) << "duplicate name " << a.name;
}

// One actor per pipeline rank; a DualPipe rank holds stage d of copy A and
// stage PP-1-d of copy B (was: one listing entry per stage, "stage:dA").
TEST(Topology, DualPipeHoldsTwoStagesPerDeviceMirrored) {
  Spec s = spec_with(4, 4, 2, 2, 1, 2, "dualpipe");
  s.model.n_layers = 8;
  s.topology.microbatches = 8;  // dualpipe: even and >= 2 * ranks
  const Plan t = resolve_topology(s);
  const auto ranks = of_role(t, Role::Rank);
  ASSERT_EQ(ranks.size(), 4u);
  for (int d = 0; d < 4; ++d) {
    const ActorPlan& a = *ranks[static_cast<size_t>(d)];
    EXPECT_EQ(a.name, "stage:" + std::to_string(d));
    EXPECT_EQ(a.device, d);
    ASSERT_EQ(a.stages.size(), 2u);
    EXPECT_EQ(a.stages[0].dir, 0);
    EXPECT_EQ(a.stages[0].stage, d);
    EXPECT_EQ(a.stages[1].dir, 1);
    EXPECT_EQ(a.stages[1].stage, 3 - d);
    EXPECT_NE(a.detail.find("stage " + std::to_string(d) + "A "), std::string::npos) << a.detail;
    EXPECT_NE(a.detail.find("stage " + std::to_string(3 - d) + "B "), std::string::npos) << a.detail;
  }
  // Devices 0,1 on process 0; 2,3 on process 1.
  for (const auto& dev : t.devices) EXPECT_EQ(dev.process, dev.index / 2);
}

TEST(Topology, DualPipeVSplitsLayersIntoTwiceAsManyChunks) {
  Spec s = spec_with(2, 2, 1, 1, 1, 1, "dualpipev");
  s.model.n_layers = 8;
  s.topology.microbatches = 4;  // dualpipev: >= 2 * ranks
  const Plan t = resolve_topology(s);
  const auto ranks = of_role(t, Role::Rank);
  ASSERT_EQ(ranks.size(), 2u);
  // Device 0 holds chunks 0 and 3 (the V), device 1 holds chunks 1 and 2.
  EXPECT_EQ(ranks[0]->name, "stage:0");
  EXPECT_EQ(ranks[0]->detail, "stage 0 layers 0..1 +embedding +experts, stage 3 layers 6..7 +head +experts");
  EXPECT_EQ(ranks[0]->device, 0);
  EXPECT_EQ(ranks[1]->detail, "stage 1 layers 2..3 +experts, stage 2 layers 4..5 +experts");
  EXPECT_EQ(ranks[1]->device, 1);
}

TEST(Topology, ExpertShardsCoverAllExpertsOfEveryLayer) {
  Spec s = spec_with(4, 2, 4, 1, 2, 1, "1f1b");
  const Plan t = resolve_topology(s);
  const auto experts = of_role(t, Role::Expert);
  // 2 replicas x 4 layers x 4 shards.
  ASSERT_EQ(experts.size(), 32u);
  for (const auto* a : experts) EXPECT_EQ(a->detail.rfind("experts ", 0), 0u);
  // Every expert of every layer once per replica.
  std::map<std::pair<int, int>, std::vector<int>> covered;  // (replica, layer) -> count per expert
  for (const auto* a : experts) {
    auto& v = covered[{a->replica, a->layer}];
    v.resize(static_cast<size_t>(s.model.n_experts), 0);
    for (int64_t e = a->experts.begin; e < a->experts.end; ++e) ++v[static_cast<size_t>(e)];
  }
  EXPECT_EQ(covered.size(), 8u);
  for (const auto& [key, v] : covered)
    for (int n : v) EXPECT_EQ(n, 1);
  // Replica 0's ranks run on devices 0-1, replica 1's on devices 2-3.
  for (const auto* a : of_role(t, Role::Rank))
    EXPECT_EQ(a->device >= 2, a->name.find("/replica:1") != std::string::npos) << a->name;
}

TEST(Topology, OptimizerShardsPartitionTheParameters) {
  Spec s = spec_with(2, 1, 1, 3, 1, 1, "sequential");
  const Plan t = resolve_topology(s);
  const auto opt = of_role(t, Role::Optimizer);
  ASSERT_EQ(opt.size(), 3u);
  const auto ranges = split_even(t.parameters, 3);
  for (size_t i = 0; i < 3; ++i)
    EXPECT_EQ(opt[i]->detail, "AdamW on params [" + std::to_string(ranges[i].first) + ", " +
                                  std::to_string(ranges[i].second) + ")");
  EXPECT_EQ(opt[1]->device, 1);
  EXPECT_EQ(opt[2]->device, 0);
}

TEST(Topology, FormatListsEveryActor) {
  Spec s = spec_with(2, 2, 2, 2, 1, 2, "1f1b");
  const Plan t = resolve_topology(s);
  const std::string text = format_topology(s, t);
  for (const auto& a : t.actors) EXPECT_NE(text.find(a.name), std::string::npos) << a.name;
  EXPECT_NE(text.find("process 1"), std::string::npos);
}

// The ranks' and expert shards' gradient ranges cover every parameter once
// (untied embeddings: tied, the first and last stage share it), and the
// plan's lookups find every actor by its name.
TEST(Topology, RangesCoverTheParametersAndNamesResolve) {
  Spec s = spec_with(4, 2, 2, 3, 2, 1, "1f1b");
  s.topology.microbatches = 2;
  s.model.tie_embeddings = false;
  const Plan t = resolve_topology(s);
  std::vector<int> hits(static_cast<size_t>(t.parameters), 0);
  for (const auto& a : t.actors)
    if (a.replica == 0 && (a.role == Role::Rank || a.role == Role::Expert))
      for (const auto& r : a.params)
        for (int64_t i = r.offset; i < r.offset + r.count; ++i) ++hits[static_cast<size_t>(i)];
  for (size_t i = 0; i < hits.size(); ++i) ASSERT_EQ(hits[i], 1) << "parameter " << i;
  for (const auto& a : t.actors) {
    const ActorPlan* found = t.find(a.name);
    ASSERT_NE(found, nullptr) << a.name;
    EXPECT_EQ(found, &a);
    if (a.role != Role::Coordinator) {
      EXPECT_GT(a.messages_per_step, 0u) << a.name;
    }
  }
  EXPECT_EQ(t.find("stage:9"), nullptr);
  EXPECT_EQ(t.find("rank:1/replica:1"), &t.rank(1, 1));  // the alias of stage:1/replica:1
}

// `troupe validate` lists the plan; the runtime built from the same spec
// spawns exactly those actors, and each goes by the listed name.
TEST(Topology, RuntimeActorsAreTheListedOnes) {
  struct Case { int64_t devices, stages, shards, opt, dp; const char* schedule; int64_t mbs; };
  for (const Case& c : {Case{1, 1, 1, 1, 1, "sequential", 1}, Case{2, 2, 2, 2, 1, "dualpipe", 4},
                        Case{4, 2, 2, 3, 2, "1f1b", 2}}) {
    Spec s = spec_with(c.devices, c.stages, c.shards, c.opt, c.dp, 1, c.schedule);
    s.topology.microbatches = c.mbs;
    s.data.batch_size = 8;
    s.run.steps = 1;
    const Plan plan = resolve_topology(s);
    std::vector<std::string> listed;
    for (const auto& a : plan.actors) listed.push_back(a.name);
    const std::string text = format_topology(s, plan);
    troupe::runtime::Runtime rt(runtime_options(s));
    const std::vector<std::string> live = rt.actor_names();
    EXPECT_EQ(live, listed) << c.schedule;
    for (const std::string& n : live) EXPECT_NE(text.find("    " + n + " "), std::string::npos) << n;
  }
}

// Decoupled RL: its actors are in the run's one plan (Plan::rl_actors), with
// the training actors' type and names; the trainer holds device 0 and the
// generators go round-robin on the devices after it. A pre-training run has
// none.
TEST(Topology, DecoupledRlActorsAreInTheOnePlan) {
  Spec s = spec_with(3, 1, 1, 1, 1, 1, "sequential");
  EXPECT_TRUE(make_run_plan(s).plan.rl_actors.empty());
  s.run.mode = RunMode::rl;
  s.rl.sync = troupe::rl::SyncMode::fixed_lag;
  s.rl_section.sync = s.rl.sync;
  s.rl.generators = 3;
  s.rl.reward_actors = 2;
  const Plan p = make_run_plan(s).plan;
  std::vector<std::string> names;
  std::map<std::string, int> device;
  std::map<Role, int> roles;
  for (const ActorPlan& a : p.rl_actors) {
    names.push_back(a.name);
    device[a.name] = a.device;
    ++roles[a.role];
    EXPECT_EQ(a.process, 0) << a.name;
    EXPECT_FALSE(a.detail.empty()) << a.name;
  }
  EXPECT_EQ(names, (std::vector<std::string>{"rl_coordinator", "rollout_buffer", "trainer", "generator:0", "generator:1",
                                             "generator:2", "reward:0", "reward:1"}));
  EXPECT_EQ(roles[Role::Generator], 3);
  EXPECT_EQ(roles[Role::Reward], 2);
  EXPECT_EQ(device["rl_coordinator"], -1);
  EXPECT_EQ(device["reward:1"], -1);
  EXPECT_EQ(device["trainer"], 0);
  EXPECT_EQ(device["generator:0"], 1);
  EXPECT_EQ(device["generator:1"], 2);
  EXPECT_EQ(device["generator:2"], 1);
  EXPECT_STREQ(troupe::runtime::role_name(Role::Buffer), "rollout_buffer");
}
