// eplb's migration-cost gate and incremental moves (actors/supervision/
// runtime.cpp plan_change, elastic.cpp rescale_experts): a layer's moves are
// made only when their predicted gain over the next rebalance_every steps
// beats their cost, measured on the run's past migrations; a rebalance
// replaces only the shards whose experts change. The decision is driven
// both ways deterministically through migration_cost_scale (0: no cost;
// 1e12: any measured cost wins), never through a wall-clock threshold; the
// math stays bitwise the static placement's either way.
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "actors/runtime.hpp"
#include "tests/actors/runtime_elastic_util.hpp"
#include "tests/actors/runtime_test_options.hpp"

namespace troupe::test {
namespace {

runtime::RuntimeOptions options(const std::string& schedule, int dp, uint64_t seed) {
  runtime::RuntimeOptions o = elastic_options(schedule, dp, 4, seed, 8);
  o.train.model.n_experts = 8;  // 4 shards of 2 experts: room to move
  o.train.model.balance = troupe::moe::Balance::none;  // loads drift apart
  return o;
}

using Outcome = ElasticOutcome;
ElasticOutcome run(const runtime::RuntimeOptions& o) { return run_elastic(o); }

void expect_bitwise_equal(const Outcome& ref, const Outcome& got, const std::string& what) {
  EXPECT_TRUE(same_bits(ref.state.params, got.state.params)) << what << ": parameters differ";
  EXPECT_TRUE(same_bits(ref.state.adam_m, got.state.adam_m)) << what << ": AdamW m differs";
  EXPECT_TRUE(same_bits(ref.state.adam_v, got.state.adam_v)) << what << ": AdamW v differs";
  ASSERT_EQ(ref.losses.size(), got.losses.size()) << what;
  for (size_t i = 0; i < ref.losses.size(); ++i)
    EXPECT_EQ(std::memcmp(&ref.losses[i], &got.losses[i], sizeof(double)), 0) << what << ": loss of step " << i + 1;
}

// Bytes of one expert's weights (gate, up, down) over all replicas.
int64_t expert_bytes(const runtime::RuntimeOptions& o) {
  return 3 * o.train.model.expert_hidden * o.train.model.d_model * 4 * o.data_parallel;
}

TEST(RuntimeElasticGate, NoCostMovesAndOnlyChangedShardsAreReplaced) {
  for (const std::string schedule : {"1f1b", "dualpipe"})
    for (int dp : {1, 2}) {
      const std::string what = schedule + " dp" + std::to_string(dp);
      const runtime::RuntimeOptions base = options(schedule, dp, 41);
      const Outcome ref = run(base);
      runtime::RuntimeOptions o = base;
      o.expert_policy = runtime::ExpertPolicy::eplb;
      o.rebalance_every = 1;
      o.migration_cost_scale = 0;
      const Outcome got = run(o);
      expect_bitwise_equal(ref, got, what);
      // The even split of 8 experts over 4 shards, then each report's bounds.
      std::vector<int64_t> prev;
      for (int l = 0; l < 4; ++l) prev.insert(prev.end(), {0, 2, 4, 6, 8});
      int measured_moves = 0;
      ASSERT_FALSE(got.rescales.empty()) << what;
      for (const runtime::RescaleReport& r : got.rescales) {
        std::cout << "  " << what << ": " << r.str() << "\n";
        ASSERT_TRUE(r.policy) << what;
        EXPECT_TRUE(r.made) << what;
        EXPECT_EQ(r.layers_skipped, 0) << what << ": nothing costs, a layer with a gain moves";
        EXPECT_EQ(r.predicted_cost_seconds, 0.0) << what;
        EXPECT_GT(r.predicted_gain_seconds, 0.0) << what;
        measured_moves += r.cost_measured;
        // Incremental: exactly the shards whose range changed were replaced,
        // and their experts' weights are the bytes loaded.
        ASSERT_EQ(r.bounds.size(), prev.size()) << what;
        int changed = 0;
        int64_t experts = 0;
        for (size_t l = 0; l < 4; ++l)
          for (size_t k = 0; k < 4; ++k) {
            const size_t at = l * 5 + k;
            if (r.bounds[at] != prev[at] || r.bounds[at + 1] != prev[at + 1]) {
              ++changed;
              experts += r.bounds[at + 1] - r.bounds[at];
            }
          }
        EXPECT_GE(changed, 2) << what;  // a move changes two neighbours
        EXPECT_LT(changed, 16) << what;  // ... not every shard
        EXPECT_EQ(r.spawned, changed * dp) << what;
        EXPECT_EQ(r.retired, changed * dp) << what;
        EXPECT_EQ(r.bytes, experts * expert_bytes(o)) << what;
        prev = r.bounds;
      }
      EXPECT_GT(measured_moves, 0) << what << ": no move was made after the first measured one";
    }
}

// A huge cost factor: the first move is made (no migration measured yet,
// nothing to weigh), every later one is skipped — recorded, the placement
// unchanged, nothing spawned or loaded — and the math is still the static one.
TEST(RuntimeElasticGate, MeasuredCostSkipsMoves) {
  for (int dp : {1, 2}) {
    const std::string what = "1f1b dp" + std::to_string(dp);
    const runtime::RuntimeOptions base = options("1f1b", dp, 41);
    const Outcome ref = run(base);
    runtime::RuntimeOptions o = base;
    o.expert_policy = runtime::ExpertPolicy::eplb;
    o.rebalance_every = 1;
    o.migration_cost_scale = 1e12;
    const Outcome got = run(o);
    expect_bitwise_equal(ref, got, what);
    ASSERT_GE(got.rescales.size(), 2u) << what;
    const runtime::RescaleReport& first = got.rescales.front();
    EXPECT_TRUE(first.made) << what;
    EXPECT_FALSE(first.cost_measured) << what;
    EXPECT_GT(first.bytes, 0) << what;
    for (size_t i = 1; i < got.rescales.size(); ++i) {
      const runtime::RescaleReport& r = got.rescales[i];
      std::cout << "  " << what << ": " << r.str() << "\n";
      EXPECT_TRUE(r.cost_measured) << what;
      EXPECT_FALSE(r.made) << what;
      EXPECT_EQ(r.layers_moved, 0) << what;
      EXPECT_GT(r.layers_skipped, 0) << what;
      EXPECT_GT(r.predicted_cost_seconds, r.predicted_gain_seconds) << what;
      EXPECT_EQ(r.bytes, 0) << what;
      EXPECT_EQ(r.spawned, 0) << what;
      EXPECT_EQ(r.moved_experts, 0) << what;
      EXPECT_EQ(r.bounds, first.bounds) << what << ": a skipped rebalance changed the placement";
      EXPECT_EQ(r.imbalance_before, r.imbalance_after) << what;
    }
  }
}

// eplb after a shrink ([experts] on_failure = "shrink"): expert:0/1 killed
// in steps 2 and 3 with max_restarts_expert = 1 leaves 3 shards per layer;
// the rebalances after it keep that count (their boundaries are of 3
// shards), and the math is still the static placement's.
TEST(RuntimeElasticGate, RebalancesKeepTheShrunkCount) {
  const runtime::RuntimeOptions base = options("1f1b", 1, 42);
  const Outcome ref = run(base);
  runtime::RuntimeOptions o = base;
  o.expert_policy = runtime::ExpertPolicy::eplb;
  o.rebalance_every = 1;
  o.migration_cost_scale = 0;
  o.expert_on_failure = runtime::ExpertOnFailure::shrink;
  o.max_restarts = 10;
  o.max_restarts_expert = 1;
  o.faults.push_back({2, "expert:0/1", runtime::FaultKind::kill, 0});
  o.faults.push_back({3, "expert:0/1", runtime::FaultKind::kill, 0});
  const Outcome got = run(o);
  expect_bitwise_equal(ref, got, "eplb after a shrink");
  int after = 0;
  for (const runtime::RescaleReport& r : got.rescales) {
    std::cout << "  " << r.str() << "\n";
    if (r.step <= 3) continue;
    ++after;
    EXPECT_EQ(r.old_shards, 3);
    EXPECT_EQ(r.new_shards, 3);
    EXPECT_EQ(r.bounds.size(), 4u * 4u);  // 4 layers x (3 + 1) boundaries
  }
  EXPECT_GT(after, 0) << "no rebalance after the shrink";
}

}  // namespace
}  // namespace troupe::test
