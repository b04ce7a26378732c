// The optimizer shard's host gradient reduction (actors/optimizer/slice_sum):
// bitwise the "zeros, then add every slice in order" sum for disjoint,
// repeated (data-parallel replicas), partly overlapping and gapped slices.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>

#include "actors/optimizer/slice_sum.hpp"

namespace troupe::runtime {
namespace {

std::vector<float> reference(int64_t count, const std::vector<GradPart>& parts) {
  std::vector<float> acc(static_cast<size_t>(count), 0.0f);
  for (const GradPart& p : parts)
    for (size_t i = 0; i < p.values.size(); ++i) acc[static_cast<size_t>(p.offset) + i] += p.values[i];
  return acc;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

TEST(SliceSum, EqualsZerosThenAddInOrder) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> val(0.25f, 2.0f);  // no zeros: the sign of 0 is the one difference
  for (int trial = 0; trial < 400; ++trial) {
    const int64_t count = 1 + static_cast<int64_t>(rng() % 300);
    const int n = static_cast<int>(rng() % 7);
    std::vector<std::vector<float>> store(static_cast<size_t>(n));
    std::vector<GradPart> parts;
    for (int k = 0; k < n; ++k) {
      const int64_t off = static_cast<int64_t>(rng() % static_cast<uint32_t>(count));
      const int64_t len = static_cast<int64_t>(rng() % static_cast<uint32_t>(count - off + 1));
      auto& v = store[static_cast<size_t>(k)];
      for (int64_t i = 0; i < len; ++i) v.push_back((rng() % 2 ? 1.0f : -1.0f) * val(rng));
      parts.push_back({off, v});
    }
    std::vector<float> got(static_cast<size_t>(count), std::nanf(""));  // stale memory: every element must be written
    sum_parts_into(got.data(), count, parts);
    ASSERT_TRUE(bitwise_equal(got, reference(count, parts))) << "trial " << trial;
  }
}

TEST(SliceSum, ReplicasDisjointRangesAndGaps) {
  // Two replicas of three disjoint slices with a gap: each element is the
  // sum of its two producers in order; the gap and the tail are zero.
  const std::vector<float> a{1, 2, 3}, b{4, 5}, c{6};
  const std::vector<float> a2{0.5f, 0.25f, 0.125f}, b2{8, 16}, c2{32};
  const std::vector<GradPart> parts{{0, a}, {3, b}, {7, c}, {0, a2}, {3, b2}, {7, c2}};
  std::vector<float> got(9, 99.0f);
  sum_parts_into(got.data(), 9, parts);
  const std::vector<float> want{1.5f, 2.25f, 3.125f, 12, 21, 0, 0, 38, 0};
  EXPECT_EQ(got, want);
  EXPECT_TRUE(bitwise_equal(got, reference(9, parts)));
}

TEST(SliceSum, AFirstMinusZeroStaysMinusZero) {
  const std::vector<float> g{-0.0f, 1.0f};
  std::vector<float> got(2, 5.0f);
  sum_parts_into(got.data(), 2, {{0, g}});
  EXPECT_TRUE(std::signbit(got[0]));
  EXPECT_EQ(got[1], 1.0f);
}

}  // namespace
}  // namespace troupe::runtime
