// Load-aware contiguous expert placement (moe/placement.hpp): incremental
// boundary moves lower the hottest shard's load, never empty a shard, and
// stop when no single move helps.
#include <gtest/gtest.h>

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

}  // namespace
}  // namespace troupe::moe
