// Expert parallelism in the actor runtime: the stages reach the experts only
// through Dispatch/Combine Envelopes to expert-shard actors (1, 2 or 4 per
// MoE layer and replica), and training still gives the parameters, losses
// and expert loads of the single-process model::Trainer, with the aux loss
// or with aux-loss-free balancing (the router bias follows each step's
// loads, updated at the optimizer shards that hold it; also without shards).
//   bitwise  sequential / 1f1b, one optimizer shard, one replica, untied
//            embeddings: every expert's gradient is accumulated by its shard
//            over the micro-batches in the Trainer's order (one stage sends a
//            layer's backward dispatches, in micro-batch order), and the
//            optimizer receives it from that one producer;
//   1e-5     relative otherwise (dualpipe: the two copies' gradients are
//            summed at the shards and the optimizer; more optimizer shards:
//            the global norm is a sum of partial norms).
// No sleeps, no wall-clock: a step returns when every actor has finished it.
#include <cmath>
#include <cstring>
#include <iostream>
#include <ostream>
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

runtime::RuntimeOptions base_options() {
  runtime::RuntimeOptions o = tiny_moe_options(5, 3);
  auto& m = o.train.model;
  m.shared_experts = 1;
  m.capacity_factor = 1.0;  // drops some assignments: capacity must match exactly
  m.tie_embeddings = false;
  return o;
}

struct Case {
  std::string schedule;
  int stages, experts, devices, optimizer_shards;
  bool bitwise;
  int dp = 1;
  std::string balance = "aux_loss";
};

std::string name(const Case& c) {
  return c.schedule + "_pp" + std::to_string(c.stages) + "_ep" + std::to_string(c.experts) + "_dev" +
         std::to_string(c.devices) + "_zero" + std::to_string(c.optimizer_shards) + "_dp" + std::to_string(c.dp) + "_" +
         c.balance;
}

void PrintTo(const Case& c, std::ostream* os) { *os << name(c); }

class RuntimeExperts : public ::testing::TestWithParam<Case> {};

TEST_P(RuntimeExperts, MatchesTrainer) {
  const Case c = GetParam();
  runtime::RuntimeOptions o = base_options();
  o.schedule = troupe::sched::parse_kind(c.schedule);
  o.stages = c.stages;
  o.devices = c.devices;
  o.optimizer_shards = c.optimizer_shards;
  o.expert_shards = c.experts;
  o.data_parallel = c.dp;
  o.train.model.balance = troupe::moe::parse_balance(c.balance);
  o.train.model.bias_update_rate = 0.01;  // large enough to change the routing within the run

  model::Trainer ref(o.train);
  runtime::Runtime rt(o);
  int64_t dropped = 0;
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
    // Routing, capacity and dropping behave exactly as in the Trainer.
    if (c.bitwise) {
      EXPECT_EQ(a.expert_load, b.expert_load) << "step " << s;
      EXPECT_EQ(a.dropped, b.dropped) << "step " << s;
    }
    for (int64_t d : b.dropped) dropped += d;
    // Per-shard loads add up to the per-expert loads.
    ASSERT_EQ(b.expert_load.size(), static_cast<size_t>(o.train.model.n_layers));
    ASSERT_EQ(b.shard_load.size(), c.experts > 0 ? b.expert_load.size() : 0u);
    for (size_t l = 0; l < b.shard_load.size(); ++l) {
      ASSERT_EQ(b.shard_load[l].size(), static_cast<size_t>(c.experts));
      int64_t se = 0, ss = 0;
      for (int64_t v : b.expert_load[l]) se += v;
      for (int64_t v : b.shard_load[l]) ss += v;
      EXPECT_EQ(se, ss);
      EXPECT_EQ(se, o.train.data.batch_size * o.train.model.seq_len * o.train.model.top_k);
    }
  }
  EXPECT_GT(dropped, 0) << "the capacity limit should drop some assignments in this config";
  const std::vector<float> pa = ref.parameters(), pb = rt.parameters();
  ASSERT_EQ(pa.size(), pb.size());
  const model::ParamLayout layout = model::build_param_layout(o.train.model);
  const std::vector<float> init = model::init_params(layout, o.train.model, o.train.seed);
  size_t moved = 0, experts_moved = 0;
  for (size_t i = 0; i < pa.size(); ++i) moved += pa[i] != init[i];
  for (const model::ParamEntry& e : layout.entries())
    if (e.name.find(".mlp.experts.") != std::string::npos)
      for (int64_t i = 0; i < e.numel; ++i) experts_moved += pb[e.offset + i] != init[e.offset + i];
  size_t bias_moved = 0;
  for (const model::ParamEntry& e : layout.entries())
    if (e.name.find("e_score_correction_bias") != std::string::npos)
      for (int64_t i = 0; i < e.numel; ++i) bias_moved += pb[e.offset + i] != init[e.offset + i];
  EXPECT_EQ(bias_moved > 0, c.balance == "bias");  // the router bias followed the loads
  EXPECT_GT(moved, pa.size() / 2);  // training really changed the parameters
  EXPECT_GT(experts_moved, 0u);     // ... the experts' too (their shards' gradients arrived)
  if (c.bitwise) {
    EXPECT_EQ(std::memcmp(pa.data(), pb.data(), pa.size() * sizeof(float)), 0);
  } else {
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
    Topologies, RuntimeExperts,
    ::testing::Values(Case{"sequential", 1, 1, 1, 1, true}, Case{"sequential", 1, 2, 2, 1, true},
                      Case{"sequential", 1, 4, 2, 1, true}, Case{"sequential", 2, 2, 2, 1, true},
                      Case{"1f1b", 1, 4, 1, 1, true}, Case{"1f1b", 2, 1, 2, 1, true},
                      Case{"1f1b", 2, 2, 2, 1, true}, Case{"1f1b", 2, 4, 2, 1, true},
                      Case{"1f1b", 2, 4, 2, 2, false}, Case{"dualpipe", 2, 1, 2, 1, false},
                      Case{"dualpipe", 2, 2, 2, 1, false}, Case{"dualpipe", 2, 4, 2, 1, false},
                      Case{"sequential", 2, 4, 2, 1, true}, Case{"dualpipev", 2, 2, 2, 1, false},
                      Case{"1f1b", 2, 2, 2, 1, false, 2}, Case{"sequential", 1, 4, 2, 2, false, 2},
                      // Aux-loss-free balancing: the router bias follows the step's loads, with
                      // the experts in the stages (0 shards) or in shard actors.
                      Case{"sequential", 1, 0, 1, 1, true, 1, "bias"}, Case{"1f1b", 2, 0, 2, 1, true, 1, "bias"},
                      Case{"1f1b", 2, 4, 2, 1, true, 1, "bias"}, Case{"sequential", 1, 2, 2, 3, false, 1, "bias"},
                      Case{"dualpipe", 2, 4, 2, 2, false, 1, "bias"}),
    [](const auto& info) { return name(info.param); });

// DualPipe's FB pairs overlap (one part runs while the other's tokens are
// at the experts) or not: the interleaving on the device changes, the math
// does not. Every run of the same spec gives bitwise the same parameters.
TEST(RuntimeExperts, OverlapDoesNotChangeResults) {
  runtime::RuntimeOptions o = base_options();
  o.schedule = sched::Kind::dualpipe;
  o.stages = 2;
  o.devices = 2;
  o.expert_shards = 4;
  o.optimizer_shards = 2;
  std::vector<std::vector<float>> params;
  std::vector<double> losses;
  for (bool overlap : {true, true, false}) {
    o.overlap = overlap;
    runtime::Runtime rt(o);
    for (int s = 0; s < o.train.steps; ++s) losses.push_back(rt.step().loss);
    params.push_back(rt.parameters());
    EXPECT_EQ(runtime::testing::dropped_messages(rt), 0u);
  }
  for (size_t r = 1; r < params.size(); ++r) {
    ASSERT_EQ(params[r].size(), params[0].size());
    EXPECT_EQ(std::memcmp(params[r].data(), params[0].data(), params[0].size() * sizeof(float)), 0) << "run " << r;
    for (int s = 0; s < o.train.steps; ++s)
      EXPECT_EQ(losses[r * o.train.steps + s], losses[s]) << "run " << r << " step " << s;
  }
}

// A malformed Combine (test switch: expert shard 0 answers its first forward
// Dispatch with an id that does not echo it) is rejected by the stage that
// waits for it: the step fails with an error naming that stage and the
// broken rule, later steps fail with the same error, and the runtime shuts
// down cleanly (no hang waiting for the exchange that never completes).
TEST(RuntimeExperts, MalformedCombineStopsTheRunNamingTheStage) {
  for (const std::string schedule : {"1f1b", "dualpipe"}) {
    runtime::RuntimeOptions o = base_options();
    o.schedule = troupe::sched::parse_kind(schedule);
    o.stages = 2;
    o.devices = 2;
    o.expert_shards = 2;
    runtime::TestHooks hooks;
    hooks.corrupt_combine = true;
    runtime::ScopedTestHooks installed(hooks);
    runtime::Runtime rt(o);
    std::string first;
    try {
      rt.step();
      ADD_FAILURE() << schedule << ": a step with a malformed Combine succeeded";
    } catch (const std::runtime_error& e) {
      first = e.what();
      std::cout << "  " << schedule << ": " << first << "\n";
    }
    // Layer 0's stage: rank 0 (with DualPipe also rank 1, which holds copy
    // 1's stage 0; whichever dispatched first gets the bad Combine).
    const bool named = first.find("stage:0: rejected combine") != std::string::npos ||
                       (schedule == "dualpipe" && first.find("stage:1: rejected combine") != std::string::npos);
    EXPECT_TRUE(named) << schedule << ": " << first;
    EXPECT_NE(first.find("does not echo the dispatch"), std::string::npos) << schedule << ": " << first;
    try {
      rt.step();
      ADD_FAILURE() << schedule << ": the run went on after the rejection";
    } catch (const std::runtime_error& e) {
      EXPECT_EQ(std::string(e.what()), first);
    }
  }
}

TEST(RuntimeExpertsValidation, RejectsBadExpertShards) {
  runtime::RuntimeOptions o = base_options();
  o.expert_shards = 5;  // 4 experts
  EXPECT_THROW(runtime::validate(o), std::invalid_argument);
  o.expert_shards = -1;
  EXPECT_THROW(runtime::validate(o), std::invalid_argument);
  o = base_options();
  o.train.model.ffn = troupe::model::Ffn::dense;
  o.expert_shards = 2;
  EXPECT_THROW(runtime::validate(o), std::invalid_argument);
  o = base_options();
  o.expert_shards = 4;
  EXPECT_NO_THROW(runtime::validate(o));
}

}  // namespace
}  // namespace troupe::test
