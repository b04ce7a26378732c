// Elastic experts ([[elastic]] scale events, actors/supervision/elastic.cpp):
// at a step boundary the expert-shard actors of every MoE layer are
// replaced by a new split (2 -> 4 -> 1 shards here), loaded from the
// optimizer shards' committed parameters, and training goes on. The run
// must end with parameters, AdamW moments, per-step losses, norms and
// expert loads BITWISE equal to the same spec with static placement:
// every expert's gradient is computed from the same rows in the same order
// whichever shard holds it (dispatch rows are grouped by expert, each
// expert's GEMMs see only its rows, a shard sums its chunk accumulators in
// chunk order), and each optimizer shard sums one slice per replica for an
// expert element, in replica order, whatever the producer numbering.
// Also: a kill of a shard that only exists after an event replays
// bitwise; bad events are rejected by validate(). No sleeps, no wall-clock.
#include <cstring>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "actors/runtime.hpp"
#include "model/params.hpp"
#include "tests/actors/runtime_elastic_util.hpp"
#include "tests/actors/runtime_test_options.hpp"

namespace troupe::test {
namespace {

runtime::RuntimeOptions options(const std::string& schedule, int dp, uint64_t seed) {
  runtime::RuntimeOptions o = elastic_options(schedule, dp, 2, seed);
  o.train.model.balance = troupe::moe::Balance::bias;  // the loads move the router bias
  o.train.model.bias_update_rate = 0.01;
  return o;
}

using Outcome = ElasticOutcome;
ElasticOutcome run(const runtime::RuntimeOptions& o) { return run_elastic(o); }

void expect_bitwise_equal(const Outcome& ref, const Outcome& got, const std::string& what) {
  EXPECT_TRUE(same_bits(ref.state.params, got.state.params)) << what << ": parameters differ";
  EXPECT_TRUE(same_bits(ref.state.adam_m, got.state.adam_m)) << what << ": AdamW m differs";
  EXPECT_TRUE(same_bits(ref.state.adam_v, got.state.adam_v)) << what << ": AdamW v differs";
  ASSERT_EQ(ref.losses.size(), got.losses.size());
  for (size_t i = 0; i < ref.losses.size(); ++i) {
    EXPECT_EQ(std::memcmp(&ref.losses[i], &got.losses[i], sizeof(double)), 0) << what << ": loss of step " << i + 1;
    EXPECT_EQ(std::memcmp(&ref.norms[i], &got.norms[i], sizeof(double)), 0) << what << ": norm of step " << i + 1;
    EXPECT_EQ(ref.loads[i], got.loads[i]) << what << ": expert loads of step " << i + 1;
  }
}

// 2 -> 4 shards before step 2, 4 -> 1 before step 4, against static 2.
const std::vector<runtime::ElasticEvent> kEvents = {{2, 4}, {4, 1}};

TEST(RuntimeElastic, ScaleOutAndInMatchesStaticPlacementBitwise) {
  for (const std::string schedule : {"1f1b", "dualpipe"})
    for (int dp : {1, 2}) {
      const std::string what = schedule + " dp" + std::to_string(dp);
      const runtime::RuntimeOptions base = options(schedule, dp, 21);
      const Outcome ref = run(base);
      runtime::RuntimeOptions o = base;
      o.elastic = kEvents;
      const Outcome got = run(o);
      expect_bitwise_equal(ref, got, what);
      EXPECT_EQ(got.shards, (std::vector<int>{2, 4, 4, 1, 1})) << what;
      // The shard loads follow the split in force: 4 entries per layer in
      // steps 2-3, 1 in steps 4-5, and they add up to the expert loads.
      for (size_t s = 0; s < got.shard_loads.size(); ++s)
        for (size_t l = 0; l < got.shard_loads[s].size(); ++l) {
          ASSERT_EQ(got.shard_loads[s][l].size(), static_cast<size_t>(got.shards[s])) << what;
          int64_t a = 0, b = 0;
          for (int64_t v : got.shard_loads[s][l]) a += v;
          for (int64_t v : got.loads[s][l]) b += v;
          EXPECT_EQ(a, b) << what;
        }
      // The live actors after the last event: one expert shard per layer and replica.
      std::set<std::string> experts;
      for (const std::string& n : got.names)
        if (n.rfind("expert:", 0) == 0) experts.insert(n);
      EXPECT_EQ(experts.size(), static_cast<size_t>(4 * dp)) << what;
      EXPECT_EQ(experts.count(dp == 1 ? "expert:2/0" : "expert:2/0/replica:1"), 1u) << what;
      // The reports: what moved, when.
      ASSERT_EQ(got.rescales.size(), 2u) << what;
      const auto& c = o.train.model;
      const int64_t all_weights = 4 * c.n_experts * 3 * c.expert_hidden * c.d_model * 4 * dp;  // layers x experts x bytes
      for (size_t i = 0; i < 2; ++i) {
        const runtime::RescaleReport& r = got.rescales[i];
        std::cout << "  " << what << ": " << r.str() << "\n";
        EXPECT_EQ(r.step, kEvents[i].at_step) << what;
        EXPECT_EQ(r.new_shards, kEvents[i].expert_shards) << what;
        EXPECT_EQ(r.old_shards, i == 0 ? 2 : 4) << what;
        EXPECT_EQ(r.bytes, all_weights) << what;  // every expert's weights, once per replica
        EXPECT_EQ(r.spawned, 4 * dp * r.new_shards) << what;
        EXPECT_EQ(r.retired, 4 * dp * r.old_shards) << what;
        ASSERT_EQ(r.imbalance_after.size(), 4u) << what;
        for (size_t l = 0; l < 4; ++l) {
          EXPECT_GE(r.imbalance_before[l], 1.0) << what;
          EXPECT_GE(r.imbalance_after[l], 1.0) << what;
        }
        // One shard holds every expert: balanced by definition.
        if (r.new_shards == 1)
          for (double x : r.imbalance_after) EXPECT_EQ(x, 1.0) << what;
      }
    }
}

// An event at step 1 changes the placement before the first step (the new
// shards load the initial parameters from the supervisor's first snapshot).
TEST(RuntimeElastic, EventBeforeTheFirstStep) {
  runtime::RuntimeOptions base = options("dualpipe", 1, 26);
  base.train.steps = 3;
  const Outcome ref = run(base);
  runtime::RuntimeOptions o = base;
  o.elastic = {{1, 3}};
  const Outcome got = run(o);
  EXPECT_EQ(got.shards, (std::vector<int>{3, 3, 3}));
  ASSERT_EQ(got.rescales.size(), 1u);
  EXPECT_EQ(got.rescales[0].step, 1);
  expect_bitwise_equal(ref, got, "event at step 1");
}

// A shard that only exists after the scale-out (expert:1/3) killed at a
// seeded point of step 3, and one killed in the event step itself: both
// respawn from the snapshot on the new plan's device and the run ends
// bitwise equal to the elastic run without kills (and to static placement).
TEST(RuntimeElastic, KillAfterScaleEventReplaysBitwise) {
  for (const std::string schedule : {"1f1b", "dualpipe"}) {
    const runtime::RuntimeOptions base = options(schedule, 1, 22);
    const Outcome ref = run(base);
    runtime::RuntimeOptions el = base;
    el.elastic = kEvents;
    for (const auto& [step, target] : {std::pair<int64_t, std::string>{3, "expert:1/3"},
                                       {2, "expert:3/2"}, {4, "expert:0/0"}, {4, "stage:1"}}) {
      runtime::RuntimeOptions o = el;
      o.faults.push_back({step, target, runtime::FaultKind::kill, 0});
      const Outcome got = run(o);
      const std::string what = schedule + " kill " + target + " in step " + std::to_string(step);
      ASSERT_EQ(got.restarts.size(), 1u) << what;
      EXPECT_EQ(got.restarts[0].actor, target) << what;
      EXPECT_EQ(got.restarts[0].step, step) << what;
      std::cout << "  " << what << ": " << got.restarts[0].str() << "\n";
      expect_bitwise_equal(ref, got, what);
    }
  }
}

// Between steps, after an event: Runtime::kill of a new shard restores it
// without a replay; then the next event replaces it.
TEST(RuntimeElastic, KillBetweenStepsAfterEvent) {
  const runtime::RuntimeOptions base = options("1f1b", 1, 23);
  const Outcome ref = run(base);
  runtime::RuntimeOptions o = base;
  o.elastic = kEvents;
  runtime::Runtime rt(o);
  Outcome got;
  for (int64_t s = 0; s < o.train.steps; ++s) {
    if (s == 2) rt.kill("expert:2/3");  // exists only between the two events
    const model::StepMetrics m = rt.step();
    got.losses.push_back(m.loss);
    got.norms.push_back(m.grad_norm);
    got.loads.push_back(m.expert_load);
  }
  got.state = rt.state();
  ASSERT_EQ(rt.restarts().size(), 1u);
  EXPECT_FALSE(rt.restarts()[0].replayed);
  expect_bitwise_equal(ref, got, "kill expert:2/3 between steps 2 and 3");
  EXPECT_THROW(rt.kill("expert:2/3"), std::runtime_error);  // retired with the second event
}

// Resumed from a checkpoint taken after step 2 (2 shards then 4 from step
// 2): the runtime starts with the initial split, catches up to the 4 shards
// in force before step 3, then applies the event of step 4; the run ends
// bitwise equal to the uninterrupted static one.
TEST(RuntimeElastic, ResumeCatchesUpWithTheEventsBefore) {
  const runtime::RuntimeOptions base = options("1f1b", 1, 24);
  const Outcome ref = run(base);
  runtime::RuntimeOptions o = base;
  o.elastic = kEvents;
  const std::string dir = ::testing::TempDir() + "/troupe_elastic_resume";
  {
    runtime::Runtime rt(o);
    rt.step();
    rt.step();
    EXPECT_EQ(rt.expert_shards(), 4);
    rt.save(dir);
  }
  o.train.resume_from = dir;
  runtime::Runtime rt(o);
  EXPECT_EQ(rt.expert_shards(), 2);
  Outcome got = ref;  // steps 1-2 from the reference; 3-5 from the resumed run
  for (int64_t s = 2; s < o.train.steps; ++s) {
    const model::StepMetrics m = rt.step();
    got.losses[static_cast<size_t>(s)] = m.loss;
    got.norms[static_cast<size_t>(s)] = m.grad_norm;
    got.loads[static_cast<size_t>(s)] = m.expert_load;
    if (s == 2) EXPECT_EQ(rt.expert_shards(), 4);
  }
  got.state = rt.state();
  EXPECT_EQ(rt.expert_shards(), 1);
  ASSERT_EQ(rt.rescales().size(), 2u);
  EXPECT_EQ(rt.rescales()[0].step, 3);
  EXPECT_EQ(rt.rescales()[0].new_shards, 4);
  EXPECT_EQ(rt.rescales()[1].step, 4);
  expect_bitwise_equal(ref, got, "resumed after step 2");
}

// The eplb policy: every step, experts move between neighbouring shards by
// the moving average of their measured loads (contiguous, uneven splits),
// also after an [[elastic]] event reset the split to the even one of the
// new count. The math stays bitwise the static placement's.
TEST(RuntimeElastic, EplbMovesExpertsAndKeepsTheMath) {
  for (const std::string schedule : {"1f1b", "dualpipe"})
    for (int dp : {1, 2}) {
      const std::string what = schedule + " dp" + std::to_string(dp) + " eplb";
      runtime::RuntimeOptions base = options(schedule, dp, 25);
      base.train.model.balance = troupe::moe::Balance::none;  // loads drift apart
      base.train.steps = 6;
      const Outcome ref = run(base);
      runtime::RuntimeOptions o = base;
      o.expert_policy = runtime::ExpertPolicy::eplb;
      o.rebalance_every = 1;
      o.migration_cost_scale = 0;  // the gate (runtime_elastic_gate_test.cpp) weighs no cost: moves are deterministic
      o.elastic = {{5, 3}};  // 2 -> 3 shards before step 5, then eplb again
      const Outcome got = run(o);
      expect_bitwise_equal(ref, got, what);
      int moved = 0, policy = 0;
      bool uneven = false;
      for (const runtime::RescaleReport& r : got.rescales) {
        std::cout << "  " << what << ": " << r.str() << "\n";
        if (!r.policy) continue;
        ++policy;
        moved += r.moved_experts;
        ASSERT_EQ(r.bounds.size(), 4u * static_cast<size_t>(r.new_shards + 1)) << what;
        for (size_t l = 0; l < 4; ++l) {
          const size_t at = l * static_cast<size_t>(r.new_shards + 1);
          for (int k = 0; k < r.new_shards; ++k) {
            EXPECT_GE(r.bounds[at + k + 1] - r.bounds[at + k], 1) << what;  // no empty shard
            uneven = uneven || r.bounds[at + k + 1] - r.bounds[at + k] != (k < 4 % r.new_shards ? 4 / r.new_shards + 1 : 4 / r.new_shards);
          }
        }
      }
      EXPECT_GT(policy, 0) << what << ": the policy never moved an expert";
      EXPECT_GT(moved, 0) << what;
      EXPECT_TRUE(uneven) << what << ": the splits stayed even";
      // The event of step 5 is there too, and sets the even split of 3.
      bool event = false;
      for (const runtime::RescaleReport& r : got.rescales) event = event || (!r.policy && r.step == 5 && r.new_shards == 3);
      EXPECT_TRUE(event) << what;
      // The shard loads follow each step's split: they add up to the expert loads.
      for (size_t s = 0; s < got.shard_loads.size(); ++s)
        for (size_t l = 0; l < got.shard_loads[s].size(); ++l) {
          int64_t a = 0, b = 0;
          for (int64_t v : got.shard_loads[s][l]) a += v;
          for (int64_t v : got.loads[s][l]) b += v;
          EXPECT_EQ(a, b) << what;
        }
    }
}

TEST(RuntimeElastic, BadEventsAreRejected) {
  runtime::RuntimeOptions o = options("1f1b", 1, 1);
  o.elastic = {{2, 5}};
  expect_invalid(o, "must be in 1..n_experts (4)");
  o.elastic = {{0, 2}};
  expect_invalid(o, "outside the run's steps 1..5");
  o.elastic = {{6, 2}};
  expect_invalid(o, "outside the run's steps 1..5");
  o.elastic = {{3, 4}, {3, 2}};
  expect_invalid(o, "greater than the previous event's (3)");
  o.elastic = {{2, 1}};
  o.expert_shards = 0;
  expect_invalid(o, "need a run with expert-shard actors");
  // A fault on a shard the plan does not have in that step.
  o = options("1f1b", 1, 1);
  o.elastic = kEvents;
  o.faults.push_back({4, "expert:1/3", runtime::FaultKind::kill, 0});
  expect_invalid(o, "1 expert shard(s) per layer in step 4");
  o.faults = {{3, "expert:1/3", runtime::FaultKind::kill, 0}};
  EXPECT_NO_THROW(runtime::validate(o));
  o.faults = {{1, "expert:1/3", runtime::FaultKind::kill, 0}};
  expect_invalid(o, "2 expert shard(s) per layer in step 1");
  EXPECT_EQ(runtime::expert_shards_at(o, 1), 2);
  EXPECT_EQ(runtime::expert_shards_at(o, 3), 4);
  EXPECT_EQ(runtime::expert_shards_at(o, 5), 1);
}

}  // namespace
}  // namespace troupe::test
