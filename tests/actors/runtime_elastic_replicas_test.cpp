// Redundant experts (replicas) in the actor runtime: a hot expert gets a
// second copy on another expert shard; its rows are split over the two
// copies (moe::copy_rows: two contiguous blocks in token order) and the
// optimizer shards sum the copies' weight gradients in shard order. The sum
// of two partial GEMMs is not the one-GEMM sum bit for bit, so the runs are
// compared with static placement within 1e-5 relative (parameters, AdamW
// moments, losses, norms) — and bitwise with themselves, which a kill of a
// shard holding a copy must not change. Also: the eplb policy places the
// copies by the measured loads (redundant_experts), a skewed workload's
// max/mean shard load is lower with them than without (from the runtime's
// own metrics), and bad replica options are rejected. No sleeps, no
// wall-clock.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "actors/plan.hpp"
#include "actors/runtime.hpp"
#include "tests/actors/runtime_elastic_util.hpp"
#include "tests/actors/runtime_test_options.hpp"

namespace troupe::test {
namespace {

runtime::RuntimeOptions replica_options(const std::string& schedule, int dp, uint64_t seed) {
  runtime::RuntimeOptions o = elastic_options(schedule, dp, 2, seed);
  o.train.model.balance = troupe::moe::Balance::none;  // skewed: the copies matter
  return o;
}

// Fixed copies for every MoE layer of a 2-shard split of 4 experts
// (shard 0: 0..1, shard 1: 2..3): shard 0 also holds 3, shard 1 holds 0.
std::vector<std::vector<std::vector<int64_t>>> fixed_copies(int layers) {
  return std::vector<std::vector<std::vector<int64_t>>>(static_cast<size_t>(layers), {{3}, {0}});
}

using Outcome = ElasticOutcome;
ElasticOutcome run(const runtime::RuntimeOptions& o) { return run_elastic(o); }

// ||a - b|| / ||a|| (2-norm; 0 when both are 0).
double rel_diff(const std::vector<float>& a, const std::vector<float>& b) {
  double d = 0.0, n = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    d += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
    n += static_cast<double>(a[i]) * a[i];
  }
  return n > 0.0 ? std::sqrt(d / n) : std::sqrt(d);
}

void expect_close(const Outcome& ref, const Outcome& got, const std::string& what) {
  ASSERT_EQ(ref.state.params.size(), got.state.params.size());
  const double dp = rel_diff(ref.state.params, got.state.params);
  const double dm = rel_diff(ref.state.adam_m, got.state.adam_m);
  const double dv = rel_diff(ref.state.adam_v, got.state.adam_v);
  std::cout << "  " << what << ": relative difference to static: params " << dp << ", m " << dm << ", v " << dv << "\n";
  EXPECT_LE(dp, 1e-5) << what << ": parameters";
  EXPECT_LE(dm, 1e-5) << what << ": AdamW m";
  EXPECT_LE(dv, 1e-5) << what << ": AdamW v";
  ASSERT_EQ(ref.losses.size(), got.losses.size());
  for (size_t i = 0; i < ref.losses.size(); ++i) {
    EXPECT_NEAR(ref.losses[i], got.losses[i], 1e-5 * std::abs(ref.losses[i])) << what << ": loss of step " << i + 1;
    EXPECT_NEAR(ref.norms[i], got.norms[i], 1e-5 * std::abs(ref.norms[i])) << what << ": norm of step " << i + 1;
    EXPECT_EQ(ref.loads[i], got.loads[i]) << what << ": expert loads of step " << i + 1;
  }
}

void expect_bitwise(const Outcome& ref, const Outcome& got, const std::string& what) {
  EXPECT_TRUE(same_bits(ref.state.params, got.state.params)) << what << ": parameters differ";
  EXPECT_TRUE(same_bits(ref.state.adam_m, got.state.adam_m)) << what << ": AdamW m differs";
  EXPECT_TRUE(same_bits(ref.state.adam_v, got.state.adam_v)) << what << ": AdamW v differs";
  ASSERT_EQ(ref.losses.size(), got.losses.size());
  for (size_t i = 0; i < ref.losses.size(); ++i)
    EXPECT_EQ(std::memcmp(&ref.losses[i], &got.losses[i], sizeof(double)), 0) << what << ": loss of step " << i + 1;
}

// The plan expresses the copies: each shard's held experts, each expert's
// holders, the weight ranges (part-major runs) and the gradient slices the
// optimizer shards expect (one more producer piece per copy).
TEST(RuntimeReplicas, PlanHoldsTheCopies) {
  runtime::RuntimeOptions o = replica_options("1f1b", 1, 30);
  const runtime::Plan flat = runtime::make_plan(o);
  o.expert_copies = fixed_copies(4);
  const runtime::Plan p = runtime::make_plan(o);
  EXPECT_TRUE(p.replicated());
  EXPECT_FALSE(flat.replicated());
  EXPECT_EQ(p.held_experts(1, 0), (std::vector<int64_t>{0, 1, 3}));
  EXPECT_EQ(p.held_experts(1, 1), (std::vector<int64_t>{0, 2, 3}));
  EXPECT_EQ(p.holders(1, 0), (std::vector<int>{0, 1}));
  EXPECT_EQ(p.holders(1, 1), (std::vector<int>{0}));
  EXPECT_EQ(p.holders(1, 3), (std::vector<int>{0, 1}));
  // Shard 0 of a layer: runs {0,1} and {3} -> 2 ranges per part.
  const int x = p.expert_producer(1, 0);
  ASSERT_EQ(p.expert_owned[static_cast<size_t>(x)].size(), 6u);
  const int64_t per = o.train.model.expert_hidden * o.train.model.d_model;
  int64_t total = 0;
  for (const runtime::Range& r : p.expert_owned[static_cast<size_t>(x)]) total += r.count;
  EXPECT_EQ(total, 3 * 3 * per);
  // The gate block of expert 3 is one expert past the gate run 0..1 (its own range).
  EXPECT_EQ(p.expert_owned[static_cast<size_t>(x)][1].offset, p.expert_owned[static_cast<size_t>(x)][0].offset + 3 * per);
  uint32_t a = 0, b = 0;
  for (const runtime::Range& r : p.shard_ranges) a += flat.gradient_slices(r), b += p.gradient_slices(r);
  // 4 layers x 2 copies x {gate, up, down}, one more for each copy range an
  // optimizer shard boundary cuts (2 optimizer shards: one boundary).
  EXPECT_GE(b - a, 4u * 2u * 3u);
  EXPECT_LE(b - a, 4u * 2u * 3u + 1u);
  EXPECT_FALSE(runtime::keeps_expert_shard(flat, p, 0, x));
  EXPECT_NE(p.expert(0, x).detail.find("+copies 3"), std::string::npos) << p.expert(0, x).detail;
  // Bad copies: its own range, unsorted, a layer list of the wrong size.
  o.expert_copies[0] = {{1}, {}};
  EXPECT_THROW(runtime::make_plan(o), std::invalid_argument);
  o.expert_copies[0] = {{3, 2}, {}};
  EXPECT_THROW(runtime::make_plan(o), std::invalid_argument);
  o.expert_copies[0] = {{3}};
  EXPECT_THROW(runtime::make_plan(o), std::invalid_argument);
  // Shares: one weight per holder summing to moe::kShareTotal, per expert.
  o.expert_copies = fixed_copies(4);
  o.expert_shares.assign(4, std::vector<std::vector<int>>(4));
  o.expert_shares[0][0] = {1024, 3072};
  const runtime::Plan shared = runtime::make_plan(o);
  EXPECT_EQ(shared.expert_rows(shared.moe_layers[0], 0, 2, 0, 8), (std::pair<int64_t, int64_t>{0, 2}));
  EXPECT_EQ(shared.expert_rows(shared.moe_layers[0], 0, 2, 1, 8), (std::pair<int64_t, int64_t>{2, 8}));
  EXPECT_EQ(shared.expert_rows(shared.moe_layers[0], 3, 2, 1, 8), (std::pair<int64_t, int64_t>{4, 8}));  // no shares: even
  o.expert_shares[0][0] = {1024, 3000};
  EXPECT_THROW(runtime::make_plan(o), std::invalid_argument);
  o.expert_shares[0][0] = {4096};
  EXPECT_THROW(runtime::make_plan(o), std::invalid_argument);
  o.expert_shares[0][0] = {};
  o.expert_shares[0][1] = {2048, 2048};  // expert 1 has one holder
  EXPECT_THROW(runtime::make_plan(o), std::invalid_argument);
}

// A fixed set of copies from the first step: the dispatch split and the
// gradient reduction, against static placement, 1F1B and DualPipe, data
// parallel 1 and 2; and the same run twice is bitwise the same.
TEST(RuntimeReplicas, FixedCopiesMatchStaticPlacement) {
  for (const std::string schedule : {"1f1b", "dualpipe"})
    for (int dp : {1, 2}) {
      const std::string what = schedule + " dp" + std::to_string(dp) + " fixed copies";
      const runtime::RuntimeOptions base = replica_options(schedule, dp, 31);
      const Outcome ref = run(base);
      runtime::RuntimeOptions o = base;
      o.expert_copies = fixed_copies(4);
      const Outcome got = run(o);
      expect_close(ref, got, what);
      // The copies took rows: shard 1 of every layer got its block of expert 0's.
      for (size_t s = 0; s < got.shard_loads.size(); ++s)
        for (size_t l = 0; l < got.shard_loads[s].size(); ++l) {
          const auto& e = got.loads[s][l];
          const auto& sh = got.shard_loads[s][l];
          ASSERT_EQ(sh.size(), 2u);
          EXPECT_EQ(sh[0] + sh[1], e[0] + e[1] + e[2] + e[3]) << what;
          EXPECT_EQ(sh[1], e[0] - e[0] / 2 + e[2] + e[3] - e[3] / 2) << what;
        }
      if (dp == 1) expect_bitwise(got, run(o), what + ", run twice");
      // Weighted shares: shard 1 takes 3/4 of expert 0's rows, shard 0 3/4
      // of expert 3's.
      o.expert_shares.assign(4, std::vector<std::vector<int>>(4));
      for (auto& layer : o.expert_shares) layer[0] = {1024, 3072}, layer[3] = {3072, 1024};
      const Outcome weighted = run(o);
      expect_close(ref, weighted, what + ", weighted shares");
      for (size_t s = 0; s < weighted.shard_loads.size(); ++s)
        for (size_t l = 0; l < weighted.shard_loads[s].size(); ++l) {
          const auto& e = weighted.loads[s][l];
          const auto& sh = weighted.shard_loads[s][l];
          EXPECT_EQ(sh[1], e[0] - e[0] * 1024 / 4096 + e[2] + e[3] - e[3] * 3072 / 4096) << what << ", weighted shares";
        }
    }
}

// A kill of a shard holding a copy (in its step's dispatches) and of the
// shard whose expert it copies: the step replays bitwise like the run
// without the kill.
TEST(RuntimeReplicas, KillOfAShardHoldingACopyReplaysBitwise) {
  for (const std::string schedule : {"1f1b", "dualpipe"}) {
    runtime::RuntimeOptions o = replica_options(schedule, 1, 32);
    o.expert_copies = fixed_copies(4);
    const Outcome ref = run(o);
    for (const auto& [step, target] : {std::pair<int64_t, std::string>{2, "expert:1/1"}, {3, "expert:2/0"}}) {
      runtime::RuntimeOptions k = o;
      k.faults.push_back({step, target, runtime::FaultKind::kill, 0});
      const Outcome got = run(k);
      const std::string what = schedule + " kill " + target + " in step " + std::to_string(step);
      ASSERT_EQ(got.restarts.size(), 1u) << what;
      EXPECT_EQ(got.restarts[0].actor, target) << what;
      std::cout << "  " << what << ": " << got.restarts[0].str() << "\n";
      expect_bitwise(ref, got, what);
    }
  }
}

// Shrink past the restart budget of a shard holding a copy (expert:1/1
// holds expert 0's second copy): its slot goes, the copies go with the
// shrunk plan (every expert keeps its home shard, so none is left without
// weights), the step is replayed on one shard per layer and the run ends
// within 1e-5 of the static placement.
TEST(RuntimeReplicas, ShrinkOfAShardHoldingACopyDropsTheCopies) {
  for (const std::string schedule : {"1f1b", "dualpipe"}) {
    const runtime::RuntimeOptions base = replica_options(schedule, 1, 36);
    const Outcome ref = run(base);
    runtime::RuntimeOptions o = base;
    o.expert_copies = fixed_copies(4);
    o.max_restarts = 10;
    o.max_restarts_expert = 1;
    o.expert_on_failure = runtime::ExpertOnFailure::shrink;
    o.faults.push_back({2, "expert:1/1", runtime::FaultKind::kill, 0});
    o.faults.push_back({3, "expert:1/1", runtime::FaultKind::kill, 0});
    const Outcome got = run(o);
    const std::string what = schedule + " shrink with copies";
    ASSERT_EQ(got.restarts.size(), 2u) << what;
    EXPECT_TRUE(got.restarts[1].shrink) << what;
    std::cout << "  " << what << ": " << got.restarts[1].str() << "\n";
    // Steps 3-5 ran on one shard per layer holding all 4 experts, no copies.
    for (size_t s = 2; s < got.shard_loads.size(); ++s)
      for (const auto& layer : got.shard_loads[s]) EXPECT_EQ(layer.size(), 1u) << what;
    expect_close(ref, got, what);
  }
}

// The eplb policy with redundant_experts: at each rebalance the hottest
// experts get a second copy, loaded from the optimizer shards through the
// one placement-change path; the math stays within 1e-5 of static
// placement; the reports say which experts have copies.
TEST(RuntimeReplicas, EplbPlacesCopiesAndKeepsTheMath) {
  for (const std::string schedule : {"1f1b", "dualpipe"})
    for (int dp : {1, 2}) {
      const std::string what = schedule + " dp" + std::to_string(dp) + " eplb + copies";
      runtime::RuntimeOptions base = replica_options(schedule, dp, 33);
      base.train.steps = 6;
      const Outcome ref = run(base);
      runtime::RuntimeOptions o = base;
      o.expert_policy = runtime::ExpertPolicy::eplb;
      o.rebalance_every = 2;
      o.migration_cost_scale = 0;  // no cost weighed: moves depend on the loads only
      o.redundant_experts = 1;
      const Outcome got = run(o);
      expect_close(ref, got, what);
      int with_copies = 0;
      for (const runtime::RescaleReport& r : got.rescales) {
        std::cout << "  " << what << ": " << r.str() << "\n";
        ASSERT_TRUE(r.policy) << what;
        if (!r.made) continue;
        ASSERT_EQ(r.replicas.size(), 4u) << what;
        for (const auto& layer : r.replicas) {
          int copied = 0;
          for (int h : layer) copied += h - 1;
          EXPECT_LE(copied, 1) << what << ": at most one expert per layer with a second copy";
          with_copies += copied;
        }
        EXPECT_LE(r.copies.size(), 4u * 3u) << what;
      }
      EXPECT_GT(with_copies, 0) << what << ": no copy was ever loaded";
    }
}

// Skewed loads (balance = "none", 4 shards of 8 experts): with two copies
// per layer, the max/mean shard load of the steps after the first
// rebalance (the runtime's own per-shard loads of those steps, averaged
// over steps and layers) is lower than with eplb's moves alone.
TEST(RuntimeReplicas, CopiesLowerTheMaxMeanLoad) {
  runtime::RuntimeOptions base = replica_options("1f1b", 1, 34);
  base.train.model.n_experts = 8;
  base.train.data.batch_size = 32;  // 4 micro-batches of 8 sequences: steadier loads
  base.expert_shards = 4;
  base.train.steps = 15;
  base.expert_policy = runtime::ExpertPolicy::eplb;
  base.rebalance_every = 2;
  base.migration_cost_scale = 0;
  auto mean_after = [](const Outcome& r) {
    double sum = 0.0;
    int n = 0;
    for (size_t s = 2; s < r.shard_loads.size(); ++s)
      for (const auto& layer : r.shard_loads[s]) {
        int64_t total = 0, most = 0;
        for (int64_t x : layer) total += x, most = std::max(most, x);
        sum += total > 0 ? static_cast<double>(most) * static_cast<double>(layer.size()) / static_cast<double>(total) : 0.0;
        ++n;
      }
    return sum / n;
  };
  const Outcome moves = run(base);
  runtime::RuntimeOptions o = base;
  o.redundant_experts = 3;  // S - 1 shared experts
  const Outcome copies = run(o);
  const double a = mean_after(moves), b = mean_after(copies);
  std::cout << "  max/mean shard load after the first rebalance: eplb " << a << ", eplb + 3 copies " << b << "\n";
  double after = 0.0;
  int made = 0;
  for (const runtime::RescaleReport& r : copies.rescales) {
    std::cout << "  " << r.str() << "\n";
    if (!r.made) continue;
    for (double x : r.imbalance_after) after += x, ++made;
  }
  EXPECT_GT(a, 1.0);
  EXPECT_LT(b, a);
  // On the rebalance steps' own loads the shared experts leave little
  // imbalance (the policy balances the moving average exactly; the step's
  // loads differ from it by the router's drift).
  ASSERT_GT(made, 0);
  std::cout << "  mean max/mean on the rebalance steps under the new placement: " << after / made << "\n";
  EXPECT_LT(after / made, a);
}

// imbalance_threshold: with the period longer than the run, a rebalance is
// tried only after a step whose moving-average loads put a layer above the
// threshold; the reports say so, and without a threshold none is tried.
TEST(RuntimeReplicas, ImbalanceThresholdTriggersRebalancesBetweenPeriods) {
  runtime::RuntimeOptions base = replica_options("1f1b", 1, 36);
  base.train.model.n_experts = 8;
  base.expert_shards = 4;
  base.train.steps = 6;
  base.expert_policy = runtime::ExpertPolicy::eplb;
  base.rebalance_every = 100;  // never within the run
  base.migration_cost_scale = 0;
  base.redundant_experts = 3;
  EXPECT_TRUE(run(base).rescales.empty());
  runtime::RuntimeOptions o = base;
  o.imbalance_threshold = 1.05;
  const Outcome got = run(o);
  ASSERT_FALSE(got.rescales.empty()) << "skewed loads (balance none, 8 experts on 4 shards) pass 1.05";
  for (const runtime::RescaleReport& r : got.rescales) {
    EXPECT_TRUE(r.policy && r.threshold) << r.str();
    EXPECT_NE(r.str().find("imbalance threshold passed"), std::string::npos);
    std::cout << "  " << r.str() << "\n";
  }
  expect_close(run(base), got, "threshold-triggered rebalances");
  o.imbalance_threshold = 0.5;
  expect_invalid(o, "imbalance_threshold must be 0 (off) or >= 1");
}

TEST(RuntimeReplicas, BadReplicaOptionsAreRejected) {
  runtime::RuntimeOptions o = replica_options("1f1b", 1, 35);
  o.redundant_experts = 1;
  expect_invalid(o, "redundant_experts needs expert policy eplb");
  o.expert_policy = runtime::ExpertPolicy::eplb;
  o.rebalance_every = 2;
  o.redundant_experts = 5;
  expect_invalid(o, "must be at most n_experts (4)");
  o.redundant_experts = -1;
  expect_invalid(o, "redundant_experts must be >= 0");
  o.redundant_experts = 1;
  o.expert_shards = 1;
  expect_invalid(o, "expert_shards >= 2");
}

}  // namespace
}  // namespace troupe::test
