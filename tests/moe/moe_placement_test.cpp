// Load-aware contiguous expert placement (moe/placement.hpp): incremental
// boundary moves lower the hottest shard's load, never empty a shard, and
// stop when no single move helps.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "moe/placement.hpp"

namespace troupe::moe {
namespace {

TEST(MoePlacement, EvenBoundsMatchTheStaticSplit) {
  EXPECT_EQ(even_bounds(8, 2), (std::vector<int64_t>{0, 4, 8}));
  EXPECT_EQ(even_bounds(7, 3), (std::vector<int64_t>{0, 3, 5, 7}));
  EXPECT_THROW(even_bounds(4, 5), std::invalid_argument);
}

TEST(MoePlacement, MovesTheHotShardsEdgeExperts) {
  // Shard 0 holds the two hot experts: one move hands expert 1 to shard 1.
  const std::vector<double> loads = {10, 10, 1, 1};
  int moves = -1;
  const auto b = rebalance_bounds(loads, {0, 2, 4}, 4, &moves);
  EXPECT_EQ(b, (std::vector<int64_t>{0, 1, 4}));
  EXPECT_EQ(moves, 1);
  EXPECT_DOUBLE_EQ(bounds_imbalance(loads, {0, 2, 4}), 20.0 * 2 / 22.0);
  EXPECT_LT(bounds_imbalance(loads, b), bounds_imbalance(loads, {0, 2, 4}));
}

// Shrink: a removed shard's experts join the neighbour with fewer experts
// (ties left); the edge shards have one neighbour; the others keep theirs.
TEST(MoePlacement, RemoveShardMergesIntoTheSmallerNeighbour) {
  EXPECT_EQ(remove_shard_bounds({0, 1, 2, 3, 4}, 0), (std::vector<int64_t>{0, 2, 3, 4}));
  EXPECT_EQ(remove_shard_bounds({0, 1, 2, 3, 4}, 3), (std::vector<int64_t>{0, 1, 2, 4}));
  EXPECT_EQ(remove_shard_bounds({0, 1, 2, 3, 4}, 2), (std::vector<int64_t>{0, 1, 3, 4}));  // tie: left
  EXPECT_EQ(remove_shard_bounds({0, 3, 4, 5, 8}, 2), (std::vector<int64_t>{0, 3, 5, 8}));  // left has 1
  EXPECT_EQ(remove_shard_bounds({0, 3, 4, 5, 8}, 1), (std::vector<int64_t>{0, 3, 5, 8}));  // right has 1
  EXPECT_EQ(remove_shard_bounds({0, 1, 4, 8}, 1), (std::vector<int64_t>{0, 4, 8}));        // left has 1
  EXPECT_EQ(remove_shard_bounds({0, 2, 4}, 1), (std::vector<int64_t>{0, 4}));
  EXPECT_THROW(remove_shard_bounds({0, 4}, 0), std::invalid_argument);
  EXPECT_THROW(remove_shard_bounds({0, 2, 4}, 2), std::invalid_argument);
}

TEST(MoePlacement, IncrementalAndBounded) {
  const std::vector<double> loads = {1, 1, 1, 1, 1, 1, 9, 9};
  int moves = 0;
  const auto one = rebalance_bounds(loads, {0, 2, 4, 6, 8}, 1, &moves);
  EXPECT_EQ(moves, 1);  // at most max_moves experts change shard
  EXPECT_EQ(one, (std::vector<int64_t>{0, 2, 4, 7, 8}));
  const auto all = rebalance_bounds(loads, {0, 2, 4, 6, 8}, 100, &moves);
  for (size_t s = 1; s < all.size(); ++s) EXPECT_GT(all[s], all[s - 1]);  // no shard left empty
  EXPECT_LE(bounds_imbalance(loads, all), bounds_imbalance(loads, one));
  // Balanced already: nothing moves.
  const std::vector<double> flat(8, 2.0);
  EXPECT_EQ(rebalance_bounds(flat, {0, 2, 4, 6, 8}, 10, &moves), (std::vector<int64_t>{0, 2, 4, 6, 8}));
  EXPECT_EQ(moves, 0);
  EXPECT_THROW(rebalance_bounds(flat, {0, 4, 4, 8}, 1), std::invalid_argument);
}

// ---- EPLB with replicas ----

// Zipf(s) loads over n experts in a seeded random order (the skewed case).
std::vector<double> zipf_loads(size_t n, double s, uint32_t seed) {
  std::vector<double> w(n);
  for (size_t i = 0; i < n; ++i) w[i] = 1000.0 / std::pow(static_cast<double>(i + 1), s);
  std::mt19937 rng(seed);
  std::shuffle(w.begin(), w.end(), rng);
  return w;
}

// Every invariant of a replicated placement of `loads` on D x S slots.
void expect_valid(const ReplicatedPlacement& p, const std::vector<double>& loads, size_t D, size_t S) {
  ASSERT_EQ(p.slots.size(), D);
  ASSERT_EQ(p.replicas.size(), loads.size());
  std::vector<int> copies(loads.size(), 0);
  double total = 0, most = 0;
  for (size_t d = 0; d < D; ++d) {
    EXPECT_EQ(p.slots[d].size(), S) << "device " << d;
    double sum = 0;
    for (int64_t e : p.slots[d]) {
      ++copies[static_cast<size_t>(e)];
      sum += loads[static_cast<size_t>(e)] / p.replicas[static_cast<size_t>(e)];
    }
    EXPECT_NEAR(p.device_load[d], sum, 1e-9 * (1 + sum));
    total += sum;
    most = std::max(most, sum);
  }
  for (size_t e = 0; e < loads.size(); ++e) {
    EXPECT_GE(p.replicas[e], 1);
    EXPECT_EQ(copies[e], p.replicas[e]) << "expert " << e;
  }
  EXPECT_NEAR(p.max_load, most, 1e-9 * (1 + most));
  EXPECT_NEAR(p.mean_load, total / static_cast<double>(D), 1e-9 * (1 + total));
}

TEST(MoeEplb, ReplicatesTheHottestFirst) {
  // Two extra slots: expert 0 (8) gets one (8/2 = 4), then 0 and 3 tie at 4: the lowest index wins.
  EXPECT_EQ(replicate_hottest(std::vector<double>{8, 2, 2, 4}, 6, 4), (std::vector<int>{3, 1, 1, 1}));
  // Capped at 2 replicas: the second extra goes to expert 3.
  EXPECT_EQ(replicate_hottest(std::vector<double>{8, 2, 2, 4}, 6, 2), (std::vector<int>{2, 1, 1, 2}));
  EXPECT_EQ(replicate_hottest(std::vector<double>{1, 1}, 2, 4), (std::vector<int>{1, 1}));
  EXPECT_THROW(replicate_hottest(std::vector<double>{1, 1, 1}, 2, 4), std::invalid_argument);
}

TEST(MoeEplb, HandCheckedPacking) {
  // Replicas {2,1,1,2}: copies 4,4 (e0), 2 (e1), 2 (e2), 2,2 (e3), packed
  // heaviest first onto the least loaded device that lacks the expert.
  const std::vector<double> loads = {8, 2, 2, 4};
  const ReplicatedPlacement p = eplb_placement(loads, 2, 3);
  EXPECT_EQ(p.replicas, (std::vector<int>{2, 1, 1, 2}));
  EXPECT_EQ(p.slots[0], (std::vector<int64_t>{0, 1, 3}));
  EXPECT_EQ(p.slots[1], (std::vector<int64_t>{0, 2, 3}));
  EXPECT_DOUBLE_EQ(p.max_load, 8.0);
  EXPECT_DOUBLE_EQ(p.imbalance(), 1.0);
  expect_valid(p, loads, 2, 3);
  // The static split puts 8+2 on device 0 and 2+4 on device 1: max/mean 10/8.
  const ReplicatedPlacement c = contiguous_placement(loads, 2);
  EXPECT_DOUBLE_EQ(c.imbalance(), 1.25);
  EXPECT_THROW(eplb_placement(loads, 1, 3), std::invalid_argument);  // 3 slots for 4 experts
  EXPECT_THROW(eplb_placement(loads, 2, 5), std::invalid_argument);  // 5 distinct experts per device out of 4
}

TEST(MoeEplb, InvariantsAndNeverWorseThanContiguousOnSkewedLoads) {
  for (uint32_t seed = 1; seed <= 8; ++seed)
    for (auto [E, D, S] : {std::tuple<size_t, int, int>{64, 8, 8}, {64, 8, 9}, {256, 32, 10}, {60, 16, 4}}) {
      const std::vector<double> loads = zipf_loads(E, 1.0 + 0.1 * seed, seed);
      const ReplicatedPlacement p = eplb_placement(loads, D, S);
      expect_valid(p, loads, static_cast<size_t>(D), static_cast<size_t>(S));
      const int64_t sum_r = std::accumulate(p.replicas.begin(), p.replicas.end(), int64_t{0});
      EXPECT_EQ(sum_r, static_cast<int64_t>(D) * S);
      const ReplicatedPlacement c = contiguous_placement(loads, D);
      EXPECT_LE(p.imbalance(), c.imbalance() + 1e-12) << "seed " << seed << " E " << E << " D " << D << " S " << S;
      EXPECT_NEAR(c.mean_load, p.mean_load, 1e-9 * p.mean_load);  // same tokens, spread differently
    }
}

TEST(MoeEplb, IncrementalKeepsWhatStillFits) {
  const std::vector<double> loads = zipf_loads(128, 1.2, 3);
  const ReplicatedPlacement p = eplb_placement(loads, 16, 10);
  // Same loads, a tolerance the placement meets: nothing moves.
  const ReplicatedPlacement same = eplb_incremental(loads, p, p.imbalance() - 1.0 + 1e-9);
  EXPECT_EQ(copies_moved(p, same), 0);
  expect_valid(same, loads, 16, 10);
  // Drift: every load changes by -20%..+20%. A fresh placement re-sorts
  // everything; the incremental one keeps most copies where they are and is
  // still far better balanced than the static split.
  std::vector<double> drifted = loads;
  for (size_t e = 0; e < drifted.size(); ++e) drifted[e] *= 0.8 + 0.04 * static_cast<double>((e * 37) % 11);
  const ReplicatedPlacement inc = eplb_incremental(drifted, p, 0.05);
  const ReplicatedPlacement full = eplb_placement(drifted, 16, 10);
  expect_valid(inc, drifted, 16, 10);
  const int64_t inc_moves = copies_moved(p, inc), full_moves = copies_moved(p, full);
  EXPECT_GT(inc_moves, 0);
  EXPECT_LT(2 * inc_moves, full_moves);
  EXPECT_LE(inc.imbalance(), 1.10);
  EXPECT_LT(inc.imbalance(), contiguous_placement(drifted, 16).imbalance());
}

// Copies on top of contiguous ranges (the actor runtime's replicas).
TEST(MoeCopies, CopyRowsSplitInContiguousBlocks) {
  EXPECT_EQ(copy_rows(7, 2, 0), (std::pair<int64_t, int64_t>{0, 3}));
  EXPECT_EQ(copy_rows(7, 2, 1), (std::pair<int64_t, int64_t>{3, 7}));
  EXPECT_EQ(copy_rows(7, 1, 0), (std::pair<int64_t, int64_t>{0, 7}));
  EXPECT_EQ(copy_rows(1, 2, 0), (std::pair<int64_t, int64_t>{0, 0}));
  for (int64_t n = 0; n < 20; ++n)
    for (int h = 1; h <= 4; ++h) {
      int64_t at = 0;
      for (int j = 0; j < h; ++j) {
        const auto [a, b] = copy_rows(n, h, j);
        EXPECT_EQ(a, at);
        EXPECT_LE(b - a, n / h + 1);
        at = b;
      }
      EXPECT_EQ(at, n);
    }
  EXPECT_THROW(copy_rows(5, 2, 2), std::invalid_argument);
}

TEST(MoeCopies, ShareRowsSplitByWeightsInContiguousBlocks) {
  const std::vector<int> w{1024, 3072};
  EXPECT_EQ(share_rows(8, w, 2, 0), (std::pair<int64_t, int64_t>{0, 2}));
  EXPECT_EQ(share_rows(8, w, 2, 1), (std::pair<int64_t, int64_t>{2, 8}));
  EXPECT_EQ(share_rows(7, {}, 2, 1), copy_rows(7, 2, 1));  // no weights: even
  const std::vector<int> three{0, 4000, 96};
  for (int64_t n = 0; n < 50; ++n) {
    int64_t at = 0;
    for (int j = 0; j < 3; ++j) {
      const auto [a, b] = share_rows(n, three, 3, j);
      EXPECT_EQ(a, at);
      at = b;
    }
    EXPECT_EQ(at, n);
    EXPECT_EQ(share_rows(n, three, 3, 0).second, 0) << "a zero weight takes no rows";
  }
  EXPECT_THROW(share_rows(5, std::vector<int>{1, 2}, 2, 0), std::invalid_argument);     // sum
  EXPECT_THROW(share_rows(5, std::vector<int>{4097, -1}, 2, 0), std::invalid_argument);  // negative
  EXPECT_THROW(share_rows(5, w, 3, 0), std::invalid_argument);                           // one per holder
}

TEST(MoeCopies, SharedExpertsBalanceTheShards) {
  // Shard 0 holds 0..1, shard 1 holds 2..3; expert 0 is hot: one copy of
  // it on shard 1, with shares 40:20 of its 60, balances them exactly.
  const std::vector<double> loads{60, 10, 20, 10};
  const std::vector<int64_t> b{0, 2, 4};
  const Replication r = place_copies(loads, b, 1);
  ASSERT_EQ(r.copies.size(), 2u);
  EXPECT_TRUE(r.copies[0].empty());
  EXPECT_EQ(r.copies[1], (std::vector<int64_t>{0}));
  EXPECT_EQ(expert_holders(b, r.copies, 0), (std::vector<int>{0, 1}));
  ASSERT_EQ(r.shares[0].size(), 2u);
  EXPECT_NEAR(r.shares[0][0], kShareTotal * 40.0 / 60.0, 1.0);
  EXPECT_TRUE(r.shares[1].empty() && r.shares[3].empty());
  const std::vector<double> per = replicated_shard_loads(loads, b, r);
  EXPECT_NEAR(per[0], 50.0, 0.05);
  EXPECT_NEAR(per[1], 50.0, 0.05);
  EXPECT_LT(replicated_imbalance(loads, b, r), 1.001);
  EXPECT_NEAR(bounds_imbalance(loads, b), 1.4, 1e-12);
  // Balanced shards get no copy.
  const std::vector<double> even{30, 20, 25, 25};
  EXPECT_EQ(place_copies(even, b, 2).copies, (std::vector<std::vector<int64_t>>{{}, {}}));
  // Four shards, two hot experts: S - 1 = 3 copies balance them to the
  // shares' grain, fewer copies less so, and never on an expert's own shard.
  const std::vector<double> skew{50, 5, 5, 5, 5, 5, 40, 5};
  const std::vector<int64_t> four{0, 2, 4, 6, 8};
  double last = bounds_imbalance(skew, four);
  for (int redundant = 1; redundant <= 3; ++redundant) {
    const Replication c = place_copies(skew, four, redundant);
    int n = 0;
    for (size_t s = 0; s < c.copies.size(); ++s)
      for (int64_t e : c.copies[s]) {
        ++n;
        EXPECT_FALSE(e >= four[s] && e < four[s + 1]);
      }
    EXPECT_LE(n, redundant);
    const double imb = replicated_imbalance(skew, four, c);
    EXPECT_LT(imb, last) << redundant << " copies";
    last = imb;
  }
  EXPECT_LT(last, 1.001);
  // Random loads over 16 experts and 4 shards: 3 copies come close, 8
  // balance them.
  std::mt19937 rng(3);
  std::exponential_distribution<double> ex(1.0);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<double> l(16);
    for (double& x : l) x = ex(rng) * ex(rng);
    const std::vector<int64_t> q{0, 4, 8, 12, 16};
    EXPECT_LT(replicated_imbalance(l, q, place_copies(l, q, 3)), std::min(1.25, bounds_imbalance(l, q))) << "trial " << trial;
    EXPECT_LT(replicated_imbalance(l, q, place_copies(l, q, 8)), 1.002) << "trial " << trial;
  }
  EXPECT_THROW(place_copies(skew, four, 9), std::invalid_argument);
  EXPECT_THROW(place_copies(loads, {0, 4}, 1), std::invalid_argument);
}

TEST(MoeEplb, CopiesMovedCountsNewCopiesPerDevice) {
  ReplicatedPlacement a, b;
  a.slots = {{0, 1}, {2, 0}};
  b.slots = {{1, 0}, {2, 2}};  // device 0 keeps both; device 1 keeps 2 and needs a second copy of 2
  EXPECT_EQ(copies_moved(a, b), 1);
  EXPECT_EQ(copies_moved(a, a), 0);
  EXPECT_EQ(copies_moved(b, a), 1);
}

}  // namespace
}  // namespace troupe::moe
