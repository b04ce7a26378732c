// Topology resolution: every actor the spec implies, on the right device and
// process, with layer / expert / parameter ranges that cover everything once.
#include <gtest/gtest.h>

#include <map>
#include <set>

#include "launch/topology.hpp"
#include "model/params.hpp"

using namespace troupe::launch;

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
  s.topology.schedule = schedule;
  return s;
}

std::vector<const ActorPlan*> of_kind(const Topology& t, const std::string& kind) {
  std::vector<const ActorPlan*> out;
  for (const auto& a : t.actors)
    if (a.kind == kind) out.push_back(&a);
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
  const Topology t = resolve_topology(s);
  EXPECT_EQ(t.parameters, troupe::model::build_param_layout(s.model).total());
  EXPECT_EQ(of_kind(t, "stage").size(), 1u);
  EXPECT_EQ(of_kind(t, "experts").size(), 0u);  // one shard: the experts run in the stage
  EXPECT_EQ(of_kind(t, "optimizer").size(), 1u);
  EXPECT_EQ(of_kind(t, "coordinator").size(), 1u);
  EXPECT_EQ(of_kind(t, "stage")[0]->detail, "layers 0..3 +embedding +head +experts");
  std::set<std::string> ids;
  for (const auto& a : t.actors) EXPECT_TRUE(ids.insert(a.id).second) << "duplicate id " << a.id;
}

TEST(Topology, DualPipeHoldsTwoStagesPerDeviceMirrored) {
  Spec s = spec_with(4, 4, 2, 2, 1, 2, "dualpipe");
  s.model.n_layers = 8;
  const Topology t = resolve_topology(s);
  const auto stages = of_kind(t, "stage");
  ASSERT_EQ(stages.size(), 8u);
  std::map<int64_t, std::vector<std::string>> by_device;
  for (const auto* a : stages) by_device[a->device].push_back(a->id);
  for (int64_t d = 0; d < 4; ++d) {
    ASSERT_EQ(by_device[d].size(), 2u);
    EXPECT_EQ(by_device[d][0], "stage:" + std::to_string(d) + "A");
    EXPECT_EQ(by_device[d][1], "stage:" + std::to_string(3 - d) + "B");
  }
  // Devices 0,1 on process 0; 2,3 on process 1.
  for (const auto& dev : t.devices) EXPECT_EQ(dev.process, dev.index / 2);
}

TEST(Topology, DualPipeVSplitsLayersIntoTwiceAsManyChunks) {
  Spec s = spec_with(2, 2, 1, 1, 1, 1, "dualpipev");
  s.model.n_layers = 8;
  const Topology t = resolve_topology(s);
  const auto stages = of_kind(t, "stage");
  ASSERT_EQ(stages.size(), 4u);
  // Device 0 holds chunks 0 and 3 (the V), device 1 holds chunks 1 and 2.
  EXPECT_EQ(stages[0]->id, "stage:0");
  EXPECT_EQ(stages[0]->detail, "layers 0..1 +embedding +experts");
  EXPECT_EQ(stages[1]->id, "stage:3");
  EXPECT_EQ(stages[1]->detail, "layers 6..7 +head +experts");
  EXPECT_EQ(stages[1]->device, 0);
  EXPECT_EQ(stages[2]->device, 1);
  EXPECT_EQ(stages[3]->device, 1);
}

TEST(Topology, ExpertShardsCoverAllExpertsOfEveryLayer) {
  Spec s = spec_with(4, 2, 4, 1, 2, 1, "1f1b");
  const Topology t = resolve_topology(s);
  const auto experts = of_kind(t, "experts");
  // 2 replicas x 4 layers x 4 shards.
  ASSERT_EQ(experts.size(), 32u);
  for (const auto* a : experts) EXPECT_EQ(a->detail.rfind("experts ", 0), 0u);
  // Replica 0's stages run on devices 0-1, replica 1's on devices 2-3.
  for (const auto* a : of_kind(t, "stage"))
    EXPECT_EQ(a->device >= 2, a->id.rfind("stage:r1:", 0) == 0) << a->id;
}

TEST(Topology, OptimizerShardsPartitionTheParameters) {
  Spec s = spec_with(2, 1, 1, 3, 1, 1, "sequential");
  const Topology t = resolve_topology(s);
  const auto opt = of_kind(t, "optimizer");
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
  const Topology t = resolve_topology(s);
  const std::string text = format_topology(s, t);
  for (const auto& a : t.actors) EXPECT_NE(text.find(a.id), std::string::npos) << a.id;
  EXPECT_NE(text.find("process 1"), std::string::npos);
}
