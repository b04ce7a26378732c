// The coordinator's replay, message by message on CAF's deterministic test
// coordinator (runtime::testing::DeterministicRuntime): the runtime's own
// actors, no scheduler threads, devices that run a closure only when the test
// says, and no sleeps.
// - A deterministic run equals the threaded runtime bit for bit.
// - A pipeline rank or an optimizer shard killed after any number k of the
//   step's messages (every k, from the first to past the last) is respawned
//   by the supervisor, the step is replayed from its snapshot, and the run
//   ends bitwise equal to the fault-free one, with exactly one restart.
// - A step message lost on its way ([[faults]] kind drop) is found by the
//   sequence gap when a later message reaches the same actor, or else by the
//   coordinator's deadline, fired by the test once the run has gone quiet;
//   the replayed step ends bitwise equal too.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "actors/plan.hpp"
#include "actors/test_hooks.hpp"
#include "tests/actors/runtime_test_options.hpp"

namespace troupe::test {
namespace {

using runtime::testing::DeterministicRuntime;

// 2 pipeline ranks (1f1b) on 2 devices, 2 optimizer shards: every kind of
// step message crosses between actors.
runtime::RuntimeOptions pipeline(int64_t steps) {
  runtime::RuntimeOptions o = tiny_moe_options(7, steps);
  o.stages = 2;
  o.devices = 2;
  o.optimizer_shards = 2;
  o.schedule = sched::Kind::one_f_one_b;
  return o;
}

// Runs `steps` steps to their end; returns the replies.
std::vector<runtime::testing::StepReply> run_steps(DeterministicRuntime& rt, int64_t steps) {
  std::vector<runtime::testing::StepReply> out;
  for (int64_t s = 0; s < steps; ++s) {
    rt.start_step();
    rt.settle();
    EXPECT_TRUE(rt.step_done()) << "step " << s + 1 << " did not end once the run went quiet";
    if (!rt.step_done()) return out;
    out.push_back(rt.reply());
  }
  return out;
}

// What a run ends with: the parameters after step 3 and every restart.
struct RunEnd {
  std::vector<float> params;
  std::vector<runtime::RestartEvent> restarts;
};

// Once step 2 has ended (`what` says how it was hit): step 3, then the end.
RunEnd finish(DeterministicRuntime& rt, const std::string& what) {
  EXPECT_NO_THROW(rt.reply()) << what;
  run_steps(rt, 1);
  return {rt.parameters(), rt.restarts()};
}

// The parameters of the fault-free run of `o`, 3 steps.
std::vector<float> clean_parameters(const runtime::RuntimeOptions& o) {
  DeterministicRuntime rt(o);
  run_steps(rt, 3);
  return rt.parameters();
}

TEST(DeterministicRuntime, EqualsTheThreadedRuntimeBitForBit) {
  const runtime::RuntimeOptions o = pipeline(3);
  runtime::Runtime threaded(o);
  std::vector<double> losses;
  for (int s = 0; s < 3; ++s) losses.push_back(threaded.step().loss);
  DeterministicRuntime det(o);
  const auto replies = run_steps(det, 3);
  ASSERT_EQ(replies.size(), 3u);
  for (size_t s = 0; s < replies.size(); ++s) EXPECT_EQ(replies[s].loss, losses[s]) << "step " << s + 1;
  EXPECT_TRUE(same_bits(det.parameters(), threaded.parameters()));
  EXPECT_TRUE(det.restarts().empty());
}

// Step 1 clean, then step 2 with `target` killed after its k-th message of the
// run's step-2 traffic (k counts every actor's messages), then step 3 clean.
struct KillRun : RunEnd {
  size_t step_messages = 0;  // messages step 2 took (kill at k past this: after the step)
  bool killed = false;
};

KillRun kill_after(const runtime::RuntimeOptions& o, const std::string& target, size_t k) {
  DeterministicRuntime rt(o);
  KillRun out;
  run_steps(rt, 1);
  rt.start_step();
  size_t n = 0;
  while (!rt.step_done()) {
    if (n == k && !out.killed) {
      rt.kill(target);
      out.killed = true;
    }
    if (rt.run_message()) {
      ++n;
      continue;
    }
    bool ran = false;
    for (int d = 0; d < rt.devices() && !ran; ++d) ran = rt.run_closure(d);
    if (!ran) break;  // quiet and not done: the supervisor failed to recover
  }
  out.step_messages = n;
  const std::string what = target + " killed after " + std::to_string(k) + " messages";
  EXPECT_TRUE(rt.step_done()) << what << ": the step never ended";
  if (rt.step_done()) static_cast<RunEnd&>(out) = finish(rt, what);
  return out;
}

TEST(DeterministicRuntime, AKillAtEveryPointOfAStepIsReplayedToTheSameBits) {
  const runtime::RuntimeOptions o = pipeline(3);
  const std::vector<float> clean = clean_parameters(o);
  for (const std::string target : {"stage:1", "optimizer:0"}) {
    // The step's length without a kill: k runs over all of it, every 7th
    // message (the test's time), plus its first and last.
    const size_t len = kill_after(o, target, static_cast<size_t>(-1)).step_messages;
    ASSERT_GT(len, 20u);
    std::vector<size_t> points;
    for (size_t k = 0; k < len; k += 7) points.push_back(k);
    points.push_back(len - 1);
    int replayed = 0;
    for (size_t k : points) {
      const KillRun r = kill_after(o, target, k);
      ASSERT_TRUE(r.killed);
      EXPECT_TRUE(same_bits(r.params, clean)) << target << " killed after " << k << " of " << len << " messages";
      ASSERT_EQ(r.restarts.size(), 1u) << target << " killed after " << k << " messages";
      EXPECT_EQ(r.restarts[0].actor, target);
      // Killed while step 2 ran, the step is replayed; killed after its
      // last message (its reply on its way), the actor is restarted for step 3.
      EXPECT_EQ(r.restarts[0].step, r.restarts[0].replayed ? 2 : 3) << target << " killed after " << k << " messages";
      replayed += r.restarts[0].replayed;
    }
    EXPECT_GE(replayed, static_cast<int>(points.size()) - 1) << target;
  }
}

// Step 2 with `count` step messages to stage:1 lost ([[faults]] kind drop).
struct LossRun : RunEnd {
  bool stalled = false;  // the step could not end without a deadline
  size_t fired = 0;      // timeouts the test fired
};

LossRun lose(runtime::RuntimeOptions o, int64_t count) {
  runtime::FaultSpec f;
  f.at_step = 2;
  f.target = "stage:1";
  f.kind = runtime::FaultKind::drop;
  f.count = count;
  o.faults.push_back(f);
  DeterministicRuntime rt(o);
  LossRun out;
  run_steps(rt, 1);
  rt.start_step();
  rt.settle();
  out.stalled = !rt.step_done();
  // Quiet and stalled: only the coordinator's deadline can move the run.
  for (int i = 0; i < 8 && !rt.step_done(); ++i) {
    out.fired += rt.fire_timeouts();
    rt.settle();
  }
  EXPECT_TRUE(rt.step_done()) << "no deadline ended the stall (" << out.fired << " timeouts fired)";
  if (rt.step_done()) static_cast<RunEnd&>(out) = finish(rt, "losing " + std::to_string(count) + " message(s)");
  return out;
}

TEST(DeterministicRuntime, ALostMessageWithMessagesBehindItIsFoundByTheSequenceGap) {
  const runtime::RuntimeOptions o = pipeline(3);
  const LossRun r = lose(o, 1);
  EXPECT_FALSE(r.stalled) << "the next message to stage:1 shows the gap: no deadline is needed";
  EXPECT_EQ(r.fired, 0u);
  EXPECT_TRUE(same_bits(r.params, clean_parameters(o)));
  ASSERT_EQ(r.restarts.size(), 1u);
  EXPECT_EQ(r.restarts[0].step, 2);
  EXPECT_TRUE(r.restarts[0].gap);
  EXPECT_TRUE(r.restarts[0].replayed);
}

TEST(DeterministicRuntime, ALostLastMessageIsFoundByTheDeadline) {
  const runtime::RuntimeOptions o = pipeline(3);
  const std::vector<float> clean = clean_parameters(o);
  // Losing the first c messages stage:1 gets in step 2: while one of the
  // attempt's messages still reaches it, the gap shows the loss at once; the
  // smallest c that loses them all leaves the run quiet with the step
  // unfinished, and only the deadline finds it.
  const int64_t most = runtime::make_plan(o).rank(0, 1).messages_per_step;
  int64_t c = 1;
  LossRun r;
  for (; c <= most; ++c) {
    r = lose(o, c);
    if (r.stalled) break;
    EXPECT_TRUE(!r.restarts.empty() && r.restarts[0].gap) << "losing " << c << " message(s)";
  }
  ASSERT_LE(c, most) << "no loss stalled the step";
  EXPECT_GT(c, 1) << "one lost message with others behind it is a gap, not a stall";
  EXPECT_GE(r.fired, 1u);
  EXPECT_TRUE(same_bits(r.params, clean)) << "losing " << c << " messages";
  ASSERT_EQ(r.restarts.size(), 1u) << "losing " << c << " messages";
  EXPECT_EQ(r.restarts[0].step, 2);
  EXPECT_TRUE(r.restarts[0].deadline);
  EXPECT_TRUE(r.restarts[0].replayed);
}

}  // namespace
}  // namespace troupe::test
