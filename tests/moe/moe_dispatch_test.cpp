// Dispatch plan (ordering, capacity dropping, inverse slots, bad ids) and the
// load-balancing math (aux loss value/gradient row, router bias update).
#include <cmath>
#include <numeric>
#include <stdexcept>
#include <vector>

#include <gtest/gtest.h>

#include "moe/balance.hpp"
#include "moe/dispatch.hpp"

namespace troupe::moe {
namespace {

TEST(DispatchPlan, GroupsByExpertInTokenOrderWithInverseSlots) {
  // T=4, k=2, E=3.
  const std::vector<int32_t> ids = {2, 0, 0, 1, 2, 1, 0, 2};
  const DispatchPlan p = build_dispatch_plan(ids, 4, 2, 3, 0.0);
  EXPECT_EQ(p.capacity, -1);
  EXPECT_EQ(p.rows(), 8);
  EXPECT_EQ(p.dropped, 0);
  EXPECT_EQ(p.offsets, (std::vector<int64_t>{0, 3, 5, 8}));
  EXPECT_EQ(p.routed, (std::vector<int64_t>{3, 2, 3}));
  // expert 0: tokens 0,1,3; expert 1: 1,2; expert 2: 0,2,3.
  EXPECT_EQ(p.token_index, (std::vector<int32_t>{0, 1, 3, 1, 2, 0, 2, 3}));
  for (int64_t t = 0; t < 4; ++t)
    for (int64_t j = 0; j < 2; ++j) {
      const int32_t row = p.slots[t * 2 + j];
      ASSERT_GE(row, 0);
      EXPECT_EQ(p.token_index[row], t);
      const int32_t e = ids[t * 2 + j];
      EXPECT_GE(row, p.offsets[e]);
      EXPECT_LT(row, p.offsets[e + 1]);
    }
}

TEST(DispatchPlan, CapacityDropsLaterTokensFirst) {
  // Every token picks expert 0 first: capacity ceil(0.5*4*2/2) = 2.
  const std::vector<int32_t> ids = {0, 1, 0, 1, 0, 1, 1, 0};
  const DispatchPlan p = build_dispatch_plan(ids, 4, 2, 2, 0.5);
  EXPECT_EQ(p.capacity, 2);
  EXPECT_EQ(p.routed, (std::vector<int64_t>{4, 4}));
  EXPECT_EQ(p.count(0), 2);
  EXPECT_EQ(p.count(1), 2);
  EXPECT_EQ(p.dropped, 4);
  // Kept: tokens 0 and 1 on both experts; tokens 2 and 3 dropped everywhere.
  EXPECT_EQ(p.slots, (std::vector<int32_t>{0, 2, 1, 3, -1, -1, -1, -1}));
  EXPECT_EQ(p.token_index, (std::vector<int32_t>{0, 1, 0, 1}));
}

TEST(DispatchPlan, CapacityFormula) {
  EXPECT_EQ(expert_capacity(10, 2, 4, 1.0), 5);
  EXPECT_EQ(expert_capacity(10, 2, 4, 1.25), 7);  // ceil(6.25)
  EXPECT_EQ(expert_capacity(10, 2, 4, 0.0), -1);
}

TEST(DispatchPlan, BadIdsAreClearErrors) {
  EXPECT_THROW(build_dispatch_plan(std::vector<int32_t>{0, 5}, 1, 2, 4, 0.0), std::invalid_argument);
  EXPECT_THROW(build_dispatch_plan(std::vector<int32_t>{-1, 0}, 1, 2, 4, 0.0), std::invalid_argument);
  EXPECT_THROW(build_dispatch_plan(std::vector<int32_t>{1, 1}, 1, 2, 4, 0.0), std::invalid_argument);
  EXPECT_THROW(build_dispatch_plan(std::vector<int32_t>{1, 2, 3}, 1, 2, 4, 0.0), std::invalid_argument);
  EXPECT_THROW(build_dispatch_plan(std::vector<int32_t>{}, 0, 5, 4, 0.0), std::invalid_argument);
}

TEST(Balance, AuxLossValueAndGradientRow) {
  // T=2, k=1, E=2: both tokens to expert 0; probs columns sum to 1.5 and 0.5.
  const std::vector<float> ps = {1.5f, 0.5f};
  const std::vector<int64_t> routed = {2, 0};
  // alpha * E * (f0 P0 + f1 P1) = 0.1 * 2 * (1 * 0.75 + 0) = 0.15
  EXPECT_NEAR(aux_loss_value(ps, routed, 2, 1, 0.1), 0.15, 1e-7);
  const auto row = aux_loss_grad_row(routed, 2, 1, 0.1, 2.0);
  // scale * alpha * E * f_i / T
  EXPECT_NEAR(row[0], 2.0 * 0.1 * 2 * 1.0 / 2, 1e-7);
  EXPECT_EQ(row[1], 0.0f);
  // Uniform routing and uniform probabilities give alpha (the minimum of the top-k form).
  EXPECT_NEAR(aux_loss_value(std::vector<float>{2.f, 2.f, 2.f, 2.f},
                             std::vector<int64_t>{4, 4, 4, 4}, 8, 2, 0.01), 0.01, 1e-9);
}

TEST(Balance, BiasMovesTowardTheMeanLoad) {
  std::vector<float> bias = {0.0f, 0.0f, 0.5f};
  update_router_bias(bias, std::vector<int64_t>{10, 4, 4}, 0.01);  // mean 6
  EXPECT_FLOAT_EQ(bias[0], -0.01f);
  EXPECT_FLOAT_EQ(bias[1], 0.01f);
  EXPECT_FLOAT_EQ(bias[2], 0.51f);
  update_router_bias(bias, std::vector<int64_t>{3, 3, 3}, 0.01);  // balanced: unchanged
  EXPECT_FLOAT_EQ(bias[0], -0.01f);
  EXPECT_THROW(update_router_bias(bias, std::vector<int64_t>{1, 2}, 0.1), std::invalid_argument);
}

TEST(Balance, ParseNames) {
  EXPECT_EQ(parse_balance("bias"), Balance::bias);
  EXPECT_EQ(parse_balance("aux_loss"), Balance::aux_loss);
  EXPECT_EQ(parse_balance("none"), Balance::none);
  EXPECT_THROW(parse_balance("aux"), std::invalid_argument);
}

}  // namespace
}  // namespace troupe::moe
