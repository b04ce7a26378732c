// Length buckets for the policy update (rl/row_buckets.hpp): the fewest
// padded tokens, against every partition of small cases; rows of one length
// still give k buckets of about equal size (so every data-parallel device
// gets rows); the devices' padded tokens balanced; bad sizes handled.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>

#include "rl/row_buckets.hpp"

namespace troupe::rl {
namespace {

int64_t padded_tokens(const std::vector<int64_t>& padded, const std::vector<std::pair<int64_t, int64_t>>& spans) {
  int64_t t = 0;
  for (const auto& [i, j] : spans) t += (j - i) * padded[static_cast<size_t>(j - 1)];
  return t;
}

// The fewest padded tokens over every split of `padded` into exactly k
// non-empty consecutive buckets (brute force over boundary sets).
int64_t brute_force(const std::vector<int64_t>& padded, int64_t k) {
  const int64_t n = static_cast<int64_t>(padded.size());
  int64_t best = -1;
  for (uint32_t mask = 0; mask < (1u << (n - 1)); ++mask) {
    if (__builtin_popcount(mask) != k - 1) continue;
    std::vector<std::pair<int64_t, int64_t>> spans;
    int64_t begin = 0;
    for (int64_t j = 1; j < n; ++j)
      if (mask & (1u << (j - 1))) {
        spans.emplace_back(begin, j);
        begin = j;
      }
    spans.emplace_back(begin, n);
    const int64_t t = padded_tokens(padded, spans);
    if (best < 0 || t < best) best = t;
  }
  return best;
}

TEST(RowBuckets, FewestPaddedTokensOverEveryPartition) {
  std::mt19937 rng(7);
  for (int trial = 0; trial < 200; ++trial) {
    const int64_t n = 1 + static_cast<int64_t>(rng() % 12), k = 1 + static_cast<int64_t>(rng() % 5);
    std::vector<int64_t> padded(static_cast<size_t>(n));
    for (auto& x : padded) x = 8 * (1 + static_cast<int64_t>(rng() % (trial % 2 ? 3 : 30)));  // few or many lengths
    std::sort(padded.begin(), padded.end());
    const auto spans = length_buckets(padded, k);
    ASSERT_EQ(static_cast<int64_t>(spans.size()), std::min(k, n)) << "trial " << trial;
    int64_t expect_begin = 0;
    for (const auto& [i, j] : spans) {
      ASSERT_EQ(i, expect_begin);
      ASSERT_LT(i, j);
      expect_begin = j;
    }
    ASSERT_EQ(expect_begin, n) << "the buckets cover every row once, in order";
    EXPECT_EQ(padded_tokens(padded, spans), brute_force(padded, std::min(k, n))) << "trial " << trial;
  }
}

TEST(RowBuckets, ALongTailGetsABucketOfItsOwn) {
  std::vector<int64_t> padded(60, 40);
  padded.insert(padded.end(), {48, 56, 64, 248});
  const auto spans = length_buckets(padded, 4);
  ASSERT_EQ(spans.size(), 4u);
  EXPECT_EQ(spans.back(), std::make_pair(int64_t{63}, int64_t{64})) << "the 248-token row alone";
  // Equal row counts would pad 16 rows to 248.
  EXPECT_LT(padded_tokens(padded, spans), padded_tokens(padded, {{0, 16}, {16, 32}, {32, 48}, {48, 64}}));
}

TEST(RowBuckets, RowsOfOneLengthStillSplitEvenly) {
  const std::vector<int64_t> padded(64, 16);  // 5-token answers: one length
  const auto two = length_buckets(padded, 2);
  ASSERT_EQ(two.size(), 2u);
  EXPECT_EQ(two[0], std::make_pair(int64_t{0}, int64_t{32}));
  EXPECT_EQ(two[1], std::make_pair(int64_t{32}, int64_t{64}));
  const auto three = length_buckets(std::vector<int64_t>(5, 8), 8);
  EXPECT_EQ(three.size(), 5u) << "never more buckets than rows";
  EXPECT_TRUE(length_buckets({}, 4).empty());
  EXPECT_EQ(length_buckets({8, 16}, 0).size(), 1u) << "k < 1 is one bucket";
}

TEST(RowBuckets, DevicesGetAboutTheSamePaddedTokens) {
  // A snake over these (0, 1, 1, 0) gives device 0 the shortest and the
  // longest bucket: 640 + 1920 against 832 + 1024.
  const std::vector<int64_t> costs{640, 832, 1024, 1920};
  const std::vector<int64_t> dev = deal_buckets(costs, 2);
  int64_t load[2] = {0, 0};
  for (size_t g = 0; g < costs.size(); ++g) load[dev[g]] += costs[g];
  EXPECT_EQ(dev[3], 0) << "the costliest first, to device 0";
  EXPECT_EQ(std::max(load[0], load[1]), 2496) << "1920 alone, then 1024 + 832 + 640 on device 1";
  EXPECT_EQ(deal_buckets(costs, 1), std::vector<int64_t>(4, 0));
  // Equal costs: round robin over the devices, in bucket order.
  EXPECT_EQ(deal_buckets({5, 5, 5, 5}, 2), (std::vector<int64_t>{0, 1, 0, 1}));
}

}  // namespace
}  // namespace troupe::rl
