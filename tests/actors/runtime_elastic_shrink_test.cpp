// Elastic experts under failure ([experts] on_failure = "shrink",
// actors/supervision/elastic.cpp and coordinator.cpp): an expert shard that
// breaks its restart budget is removed instead of ending the run — its slot
// goes from every MoE layer, its experts join a neighbouring shard loaded
// from the committed snapshot, and the step is replayed — and a new shard
// that dies while loading its weights at a placement change is respawned
// and asked again. Either way the run must end BITWISE equal to the
// fault-free static placement (parameters, AdamW moments, losses, norms,
// expert loads): an expert's gradient does not depend on which shard holds
// it (see runtime_elastic_test.cpp). No sleeps, no wall-clock.
#include <cstring>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "actors/runtime.hpp"
#include "tests/actors/runtime_elastic_util.hpp"
#include "tests/actors/runtime_test_options.hpp"

namespace troupe::test {
namespace {

runtime::RuntimeOptions options(const std::string& schedule, int dp, int shards, uint64_t seed) {
  runtime::RuntimeOptions o = elastic_options(schedule, dp, shards, seed);
  o.train.model.balance = troupe::moe::Balance::bias;
  o.train.model.bias_update_rate = 0.01;
  o.max_restarts = 10;        // the expert budget is the one that breaks
  o.max_restarts_expert = 1;  // a second expert restart within 10 steps is one too many
  return o;
}

using Outcome = ElasticOutcome;
template <class F>
ElasticOutcome run(const runtime::RuntimeOptions& o, F&& before) {
  return run_elastic(o, std::forward<F>(before));
}
ElasticOutcome run(const runtime::RuntimeOptions& o) { return run_elastic(o); }

void expect_bitwise_equal(const Outcome& ref, const Outcome& got, const std::string& what) {
  EXPECT_TRUE(same_bits(ref.state.params, got.state.params)) << what << ": parameters differ";
  EXPECT_TRUE(same_bits(ref.state.adam_m, got.state.adam_m)) << what << ": AdamW m differs";
  EXPECT_TRUE(same_bits(ref.state.adam_v, got.state.adam_v)) << what << ": AdamW v differs";
  ASSERT_EQ(ref.losses.size(), got.losses.size()) << what;
  for (size_t i = 0; i < ref.losses.size(); ++i) {
    EXPECT_EQ(std::memcmp(&ref.losses[i], &got.losses[i], sizeof(double)), 0) << what << ": loss of step " << i + 1;
    EXPECT_EQ(std::memcmp(&ref.norms[i], &got.norms[i], sizeof(double)), 0) << what << ": norm of step " << i + 1;
    EXPECT_EQ(ref.loads[i], got.loads[i]) << what << ": expert loads of step " << i + 1;
  }
}

// expert:1/2 killed in steps 2 and 3 with max_restarts_expert = 1: the
// first kill is a restart, the second breaks the budget. With "shrink" the
// slot goes (4 -> 3 shards per layer), step 3 is replayed on the smaller
// plan and the run ends bitwise equal to the static run without faults;
// with "stop" the run fails naming the budget.
TEST(RuntimeElasticShrink, RepeatedKillsPastTheBudgetShrinkBitwise) {
  for (const std::string schedule : {"1f1b", "dualpipe"})
    for (int dp : {1, 2}) {
      const std::string what = schedule + " dp" + std::to_string(dp);
      const runtime::RuntimeOptions base = options(schedule, dp, 4, 31);
      const Outcome ref = run(base);
      runtime::RuntimeOptions o = base;
      o.faults.push_back({2, "expert:1/2", runtime::FaultKind::kill, 0});
      o.faults.push_back({3, "expert:1/2", runtime::FaultKind::kill, 0});
      o.expert_on_failure = runtime::ExpertOnFailure::shrink;
      const Outcome got = run(o);
      expect_bitwise_equal(ref, got, what);
      EXPECT_EQ(got.shards, (std::vector<int>{4, 4, 3, 3, 3})) << what;
      ASSERT_EQ(got.restarts.size(), 2u) << what;
      EXPECT_FALSE(got.restarts[0].shrink) << what;
      const runtime::RestartEvent& ev = got.restarts[1];
      std::cout << "  " << what << ": " << ev.str() << "\n";
      EXPECT_TRUE(ev.shrink) << what;
      EXPECT_TRUE(ev.replayed) << what;
      EXPECT_EQ(ev.step, 3) << what;
      EXPECT_EQ(ev.actor, dp == 1 ? "expert:1/2" : "expert:1/2/replica:0") << what;
      EXPECT_EQ(ev.shards_before, 4) << what;
      EXPECT_EQ(ev.shards_after, 3) << what;
      // 3 shards per MoE layer and replica are left, renumbered 0..2.
      EXPECT_EQ(got.experts().size(), static_cast<size_t>(4 * 3 * dp)) << what;
      EXPECT_EQ(got.experts().count(dp == 1 ? "expert:3/2" : "expert:3/2/replica:1"), 1u) << what;
      EXPECT_EQ(got.experts().count("expert:3/3"), 0u) << what;
      // A shrink is no scale event: no rescale report, and no event undoes it.
      EXPECT_TRUE(got.rescales.empty()) << what;

      runtime::RuntimeOptions stop = o;
      stop.expert_on_failure = runtime::ExpertOnFailure::stop;
      try {
        run(stop);
        ADD_FAILURE() << what << ": on_failure = stop ran through";
      } catch (const std::runtime_error& e) {
        EXPECT_NE(std::string(e.what()).find("max_restarts_expert = 1"), std::string::npos) << e.what();
      }
    }
}

// Between steps (Runtime::kill): the second kill of expert:0/0 breaks the
// budget and shrinks without a replay; the first shard's experts join its
// only neighbour. Then a later [[elastic]] event sets its own count again,
// and shrinking down to one shard works; past that the run stops.
TEST(RuntimeElasticShrink, BetweenStepsThenEventThenLastShardStops) {
  runtime::RuntimeOptions base = options("1f1b", 1, 2, 32);
  base.train.steps = 6;
  const Outcome ref = run(base);
  runtime::RuntimeOptions o = base;
  o.expert_on_failure = runtime::ExpertOnFailure::shrink;
  o.elastic = {{4, 3}};  // back to 3 shards before step 4
  const Outcome got = run(o, [](runtime::Runtime& rt, int64_t s) {
    if (s == 1) rt.kill("expert:0/0");
    if (s == 2) rt.kill("expert:0/0");  // over the budget: 2 -> 1 shard
    if (s == 4) rt.kill("expert:2/1");  // after the event: a restart, not a shrink (the history was forgotten)
  });
  expect_bitwise_equal(ref, got, "shrink between steps, then an event");
  EXPECT_EQ(got.shards, (std::vector<int>{2, 2, 1, 3, 3, 3}));
  ASSERT_EQ(got.restarts.size(), 3u);
  EXPECT_FALSE(got.restarts[0].shrink);
  EXPECT_TRUE(got.restarts[1].shrink);
  EXPECT_FALSE(got.restarts[1].replayed);
  EXPECT_EQ(got.restarts[1].shards_after, 1);
  EXPECT_FALSE(got.restarts[2].shrink);
  ASSERT_EQ(got.rescales.size(), 1u);
  EXPECT_EQ(got.rescales[0].old_shards, 1);
  EXPECT_EQ(got.rescales[0].new_shards, 3);

  // One shard per layer left: nothing to shrink to, the run stops.
  runtime::RuntimeOptions one = base;
  one.expert_shards = 1;
  one.expert_on_failure = runtime::ExpertOnFailure::shrink;
  runtime::Runtime rt(one);
  rt.step();
  rt.kill("expert:0/0");
  EXPECT_THROW(rt.kill("expert:0/0"), std::runtime_error);
  EXPECT_THROW(rt.step(), std::runtime_error);
}

// A new shard of a scale event (expert:1/3, from 2 -> 4 shards before step
// 2) dies while loading its weights: it is respawned, restored from the
// snapshot and asked again, the event completes and the run is bitwise
// the static one. Killed once more than its budget allows: with "stop" the
// placement change fails cleanly; with "shrink" its slot goes while the
// event is still loading (4 -> 3) and the run is still bitwise equal.
TEST(RuntimeElasticShrink, KillWhileLoadingIsRetried) {
  // Runs `o` with the test hook killing expert:1/3 the first `times` times it loads.
  auto run_killing = [](const runtime::RuntimeOptions& o, int times) {
    runtime::TestHooks hooks;
    hooks.kill_while_loading = "expert:1/3";
    hooks.kill_while_loading_times = times;
    runtime::ScopedTestHooks installed(hooks);
    return run(o);
  };
  for (const std::string schedule : {"1f1b", "dualpipe"}) {
    const runtime::RuntimeOptions base = options(schedule, 1, 2, 33);
    const Outcome ref = run(base);
    runtime::RuntimeOptions o = base;
    o.elastic = {{2, 4}, {4, 1}};
    const Outcome got = run_killing(o, 1);
    expect_bitwise_equal(ref, got, schedule + " kill while loading, retried");
    EXPECT_EQ(got.shards, (std::vector<int>{2, 4, 4, 1, 1}));
    ASSERT_EQ(got.restarts.size(), 1u);
    EXPECT_EQ(got.restarts[0].actor, "expert:1/3");
    EXPECT_FALSE(got.restarts[0].replayed);
    EXPECT_NE(got.restarts[0].phase.find("loading its weights"), std::string::npos) << got.restarts[0].phase;
    ASSERT_EQ(got.rescales.size(), 2u);
    // The retried shard's weights count once: the bytes of a clean event.
    const Outcome no_kill = run_killing(o, 0);
    EXPECT_EQ(got.rescales[0].bytes, no_kill.rescales[0].bytes);

    runtime::RuntimeOptions twice = o;  // 2 restarts > max_restarts_expert = 1
    try {
      run_killing(twice, 2);
      ADD_FAILURE() << schedule << ": a shard that never loads did not fail the run";
    } catch (const std::runtime_error& e) {
      EXPECT_NE(std::string(e.what()).find("placement change before step 2 failed"), std::string::npos) << e.what();
    }
    twice.expert_on_failure = runtime::ExpertOnFailure::shrink;
    const Outcome shrunk = run_killing(twice, 2);
    expect_bitwise_equal(ref, shrunk, schedule + " kill while loading past the budget, shrunk");
    EXPECT_EQ(shrunk.shards, (std::vector<int>{2, 3, 3, 1, 1}));
    ASSERT_EQ(shrunk.restarts.size(), 2u);
    EXPECT_TRUE(shrunk.restarts[1].shrink);
    EXPECT_EQ(shrunk.restarts[1].shards_before, 4);
  }
}

TEST(RuntimeElasticShrink, BadOptionsAreRejected) {
  runtime::RuntimeOptions o = options("1f1b", 1, 0, 1);
  o.expert_on_failure = runtime::ExpertOnFailure::shrink;
  try {
    runtime::validate(o);
    ADD_FAILURE() << "shrink without expert shards accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("needs expert-shard actors"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace troupe::test
