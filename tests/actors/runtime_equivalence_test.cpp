// The runtime's invariant: for the same seed and spec, training through the
// actors (pipeline ranks, optimizer shards, data-parallel replicas) gives the
// parameters and losses of the single-process model::Trainer.
//   bitwise  schedule sequential / 1f1b / zb1p, 1 optimizer shard, data_parallel 1,
//            untied embeddings: every gradient element gets the same float
//            additions in the same order, the norm is one squared_norm of the
//            whole buffer, AdamW is elementwise;
//   1e-5     relative otherwise: replica gradients are summed at the shards
//            (a different float addition order), the shards' squared norms
//            are summed at the coordinator, tied embeddings add the first and
//            last stages' contributions at the shard, dualpipe sums its two
//            copies' gradients at the shard, dualpipev runs micro-batches'
//            backwards in another order than the Trainer.
// No sleeps, no wall-clock: a step returns when every actor has finished it.
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "actors/runtime.hpp"
#include "tests/actors/runtime_test_options.hpp"
#include "model/params.hpp"
#include "model/trainer.hpp"
#include "model/weights.hpp"

namespace troupe::test {
namespace {

runtime::RuntimeOptions base_options(bool tied) {
  runtime::RuntimeOptions o = tiny_moe_options(11, 3);
  o.train.model.tie_embeddings = tied;
  return o;
}

struct Case {
  std::string schedule;
  int stages, shards, dp, devices;
  bool tied;
  bool bitwise;
};

std::string name(const Case& c) {
  return c.schedule + "_pp" + std::to_string(c.stages) + "_zero" + std::to_string(c.shards) + "_dp" +
         std::to_string(c.dp) + "_dev" + std::to_string(c.devices) + (c.tied ? "_tied" : "_untied");
}

class RuntimeEquivalence : public ::testing::TestWithParam<Case> {};

TEST_P(RuntimeEquivalence, MatchesTrainer) {
  const Case c = GetParam();
  runtime::RuntimeOptions o = base_options(c.tied);
  o.schedule = troupe::sched::parse_kind(c.schedule);
  o.stages = c.stages;
  o.optimizer_shards = c.shards;
  o.data_parallel = c.dp;
  o.devices = c.devices;

  model::Trainer ref(o.train);
  runtime::Runtime rt(o);
  for (int s = 0; s < o.train.steps; ++s) {
    const model::StepMetrics a = ref.step(), b = rt.step();
    if (c.bitwise) {
      EXPECT_EQ(a.loss, b.loss) << "step " << s;
      EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << s;
    } else {
      EXPECT_NEAR(a.loss, b.loss, 1e-5 * std::abs(a.loss)) << "step " << s;
      EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-5 * std::abs(a.grad_norm)) << "step " << s;
    }
    EXPECT_NEAR(a.aux_loss, b.aux_loss, 1e-9 + 1e-9 * std::abs(a.aux_loss)) << "step " << s;
    EXPECT_EQ(a.lr, b.lr);
  }
  const std::vector<float> pa = ref.parameters(), pb = rt.parameters();
  ASSERT_EQ(pa.size(), pb.size());
  const std::vector<float> init = model::init_params(model::build_param_layout(o.train.model), o.train.model, o.train.seed);
  size_t moved = 0;
  for (size_t i = 0; i < pa.size(); ++i) moved += pa[i] != init[i];
  EXPECT_GT(moved, pa.size() / 2);  // training really changed the parameters
  if (c.bitwise) {
    EXPECT_EQ(std::memcmp(pa.data(), pb.data(), pa.size() * sizeof(float)), 0);
  } else {
    // Relative in the 2-norm over the whole buffer. Single elements can
    // differ more: AdamW divides by sqrt(v), so an element whose gradient
    // nearly cancels between replicas moves by ~lr whatever its tiny value,
    // and a different summation order changes that value's low bits.
    double diff = 0.0, ref_norm = 0.0, worst = 0.0;
    for (size_t i = 0; i < pa.size(); ++i) {
      const double d = static_cast<double>(pa[i]) - pb[i];
      diff += d * d;
      ref_norm += static_cast<double>(pa[i]) * pa[i];
      worst = std::max(worst, std::abs(d));
    }
    EXPECT_LE(std::sqrt(diff / ref_norm), 1e-5) << "worst element difference " << worst;
  }
  EXPECT_EQ(runtime::testing::dropped_messages(rt), 0u);
}

INSTANTIATE_TEST_SUITE_P(
    Topologies, RuntimeEquivalence,
    ::testing::Values(Case{"sequential", 1, 1, 1, 1, false, true}, Case{"sequential", 2, 1, 1, 2, false, true},
                      Case{"1f1b", 2, 1, 1, 2, false, true}, Case{"1f1b", 4, 1, 1, 2, false, true},
                      Case{"1f1b", 4, 2, 1, 2, false, false}, Case{"1f1b", 2, 2, 2, 2, false, false},
                      Case{"1f1b", 2, 1, 2, 1, true, false}, Case{"sequential", 4, 2, 2, 2, true, false},
                      Case{"1f1b", 1, 2, 1, 1, true, false}, Case{"dualpipev", 2, 1, 1, 2, false, false},
                      Case{"dualpipe", 2, 2, 1, 2, false, false}, Case{"zb1p", 2, 1, 1, 2, false, true},
                      Case{"dualpipev", 2, 2, 1, 2, true, false}),
    [](const auto& info) { return name(info.param); });

TEST(RuntimeValidation, RejectsBadTopologies) {
  runtime::RuntimeOptions o = base_options(false);
  o.stages = 5;  // 4 layers
  EXPECT_THROW(runtime::validate(o), std::invalid_argument);
  o = base_options(false);
  o.data_parallel = 3;  // 4 microbatches
  EXPECT_THROW(runtime::validate(o), std::invalid_argument);
  o = base_options(false);
  // Schedule names become sched::Kind where a spec is parsed: an unknown one
  // is rejected there.
  EXPECT_THROW(sched::parse_kind("nope"), std::invalid_argument);
  o = base_options(false);
  o.schedule = sched::Kind::dualpipe;
  o.stages = 2;
  o.train.microbatches = 2;  // dualpipe needs >= 2 * PP chunks
  o.train.data.batch_size = 8;
  EXPECT_THROW(runtime::validate(o), std::invalid_argument);
  EXPECT_NO_THROW(runtime::validate(base_options(true)));
}

}  // namespace
}  // namespace troupe::test
