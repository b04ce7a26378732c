// Supervised restart and kill-and-replay (actors/supervision/supervisor.hpp): a pipeline
// rank, an optimizer shard or an expert shard killed at a seeded point inside a step is
// respawned, the step is discarded and replayed from its snapshot, and the
// run ends with parameters, AdamW moments and losses bitwise equal to the
// run without the kill. Also: restart intensity escalates, stale messages
// are dropped and counted, bad fault entries are rejected.
// No sleeps, no wall-clock: a step returns when every actor has finished it.
#include <cstring>
#include <iostream>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "actors/runtime.hpp"
#include "tests/actors/runtime_test_options.hpp"

namespace troupe::test {
namespace {

runtime::RuntimeOptions options(const std::string& schedule, uint64_t seed) {
  runtime::RuntimeOptions o = tiny_moe_options(seed, 3);
  o.schedule = troupe::sched::parse_kind(schedule);
  o.stages = 2;
  o.devices = 2;
  o.optimizer_shards = 2;
  return o;
}

struct Outcome {
  model::TrainingState state;
  std::vector<double> losses, norms;
  std::vector<runtime::RestartEvent> restarts;
  uint64_t dropped = 0, damaged = 0;
  std::vector<std::vector<int64_t>> loads;  // the last step's expert load
  std::vector<double> step_seconds;
  runtime::Runtime::Slowdown slow;
  runtime::FaultSummary summary;
};

Outcome run(const runtime::RuntimeOptions& o) {
  runtime::Runtime rt(o);
  Outcome out;
  for (int64_t s = 0; s < o.train.steps; ++s) {
    const model::StepMetrics m = rt.step();
    out.losses.push_back(m.loss);
    out.norms.push_back(m.grad_norm);
    out.step_seconds.push_back(m.step_seconds);
  }
  out.state = rt.state();
  out.restarts = rt.restarts();
  out.dropped = runtime::testing::dropped_messages(rt);
  out.damaged = rt.damaged_messages();
  out.slow = rt.slowdown();
  out.loads = rt.expert_load();
  out.summary = rt.fault_summary();
  return out;
}

void expect_bitwise_equal(const Outcome& ref, const Outcome& got, const std::string& what) {
  EXPECT_TRUE(same_bits(ref.state.params, got.state.params)) << what << ": parameters differ";
  EXPECT_TRUE(same_bits(ref.state.adam_m, got.state.adam_m)) << what << ": AdamW m differs";
  EXPECT_TRUE(same_bits(ref.state.adam_v, got.state.adam_v)) << what << ": AdamW v differs";
  ASSERT_EQ(ref.losses.size(), got.losses.size());
  for (size_t i = 0; i < ref.losses.size(); ++i) {
    EXPECT_EQ(std::memcmp(&ref.losses[i], &got.losses[i], sizeof(double)), 0) << what << ": loss of step " << i + 1;
    EXPECT_EQ(std::memcmp(&ref.norms[i], &got.norms[i], sizeof(double)), 0) << what << ": norm of step " << i + 1;
  }
}

// Faults on messages in flight (drop, duplicate, delay, pause, corrupt), at a
// rank, an optimizer shard and an expert shard, in 1F1B and DualPipe: the run
// ends bitwise equal to the fault-free run. A drop stalls the step until its
// deadline, which replays it (reported as a deadline event); a corrupt
// message is dropped and counted by its receiver (never accepted with wrong
// values, never failing the run), which tells the coordinator, and the step
// is replayed at once (a damaged event); the others need no replay as long
// as they end within the deadline.
TEST(RuntimeFaults, MessageFaultsEndBitwiseEqual) {
  using runtime::FaultKind;
  for (const std::string schedule : {"1f1b", "dualpipe"}) {
    runtime::RuntimeOptions base = options(schedule, 5);
    base.expert_shards = 2;
    base.step_deadline = 1.0;
    const Outcome ref = run(base);
    for (const FaultKind kind : {FaultKind::drop, FaultKind::duplicate, FaultKind::delay, FaultKind::pause, FaultKind::corrupt}) {
      for (const std::string target : {"stage:1", "optimizer:0", "expert:1/1"}) {
        runtime::RuntimeOptions o = base;
        runtime::FaultSpec f;
        f.at_step = 2;
        f.target = target;
        f.kind = kind;
        f.count = 2;
        f.delay_ms = 40;
        f.duration_ms = 150;
        o.faults = {f};
        const std::string what = schedule + " " + runtime::fault_kind_name(kind) + " " + target;
        const Outcome got = run(o);
        expect_bitwise_equal(ref, got, what);
        size_t deadlines = 0, damaged = 0, gaps = 0;
        for (const auto& ev : got.restarts) {
          deadlines += ev.deadline;
          damaged += ev.damaged;
          gaps += ev.gap;
          EXPECT_TRUE(ev.deadline || ev.damaged || ev.gap) << what << ": no actor died, yet " << ev.str();
          EXPECT_EQ(ev.step, 2) << what << ": " << ev.str();
        }
        // A drop is found by the gap it leaves in its receiver's message
        // numbers when a later message follows it, else by the deadline;
        // nothing else leaves a gap. A damaged message is reported by its
        // receiver: the step is replayed at once.
        if (kind == FaultKind::drop) EXPECT_GE(deadlines + gaps, 1u) << what << ": a lost message must end in a replay";
        else EXPECT_EQ(gaps, 0u) << what << ": nothing was lost, yet a gap was seen";
        if (kind != FaultKind::drop && kind != FaultKind::corrupt) EXPECT_EQ(deadlines, 0u) << what << ": nothing was lost";
        if (kind == FaultKind::corrupt) EXPECT_GE(damaged, 1u) << what << ": a dropped damaged message must end in a replay";
        else EXPECT_EQ(damaged, 0u) << what;
        // Each corrupted Envelope was dropped by its receiver as damaged, and
        // nothing else was.
        EXPECT_EQ(got.damaged, kind == FaultKind::corrupt ? 2u : 0u) << what;
      }
    }
  }
}

// A partition: the target's device is cut off from the rest of the run in
// step 2 (step messages crossing either way are held, then arrive in order
// when the window ends, as TCP delivers them after a short partition), with
// a rank, an optimizer shard and an expert shard as the target, in 1F1B and
// DualPipe. A window within the step deadline only stalls the step; one
// longer than the deadline has the step replayed (the replay's crossing
// messages wait for the window too). Either way the run ends bitwise equal
// to the fault-free run, and the summary counts the messages the partition
// held (0 would mean it cut nothing).
TEST(RuntimeFaults, PartitionEndsBitwiseEqual) {
  for (const std::string schedule : {"1f1b", "dualpipe"}) {
    runtime::RuntimeOptions base = options(schedule, 5);
    base.expert_shards = 2;
    base.step_deadline = 1.0;
    const Outcome ref = run(base);
    for (const std::string target : {"stage:1", "optimizer:0", "expert:1/1"}) {
      for (const double window_ms : {150.0, 2000.0}) {
        if (window_ms > 1000 && target != "stage:1") continue;  // one long window per schedule is enough
        runtime::RuntimeOptions o = base;
        o.max_restarts = 100;  // each deadline replay counts against the intensity
        // The short window must end inside the deadline even on a loaded
        // machine (no replay expected); the long one must outlast it.
        o.step_deadline = window_ms > 1000 ? 1.0 : 5.0;
        runtime::FaultSpec f;
        f.at_step = 2;
        f.target = target;
        f.kind = runtime::FaultKind::partition;
        f.duration_ms = window_ms;
        o.faults = {f};
        const std::string what = schedule + " partition " + target + " " + std::to_string(window_ms) + " ms";
        const Outcome got = run(o);
        expect_bitwise_equal(ref, got, what);
        EXPECT_GT(got.summary.partitioned, 0) << what << ": the partition held no message";
        EXPECT_EQ(got.summary.injected.at("partition"), 1) << what;
        EXPECT_EQ(got.summary.recovered, 1) << what;
        size_t deadlines = 0;
        for (const auto& ev : got.restarts) {
          deadlines += ev.deadline;
          EXPECT_TRUE(ev.deadline) << what << ": no actor died, yet " << ev.str();
          EXPECT_EQ(ev.step, 2) << what << ": " << ev.str();
        }
        // Longer than its 1 s deadline: the stalled step is replayed; within
        // its 5 s one, nothing is lost and nothing replays.
        if (window_ms > 1000) EXPECT_GE(deadlines, 1u) << what;
        else EXPECT_EQ(deadlines, 0u) << what;
      }
    }
  }
}

// The default, adaptive deadlines (step_deadline = 0). A message to
// optimizer:0 or stage:1 lost in step 12 (after ten fault-free steps to
// learn from) is found by its sequence gap or by the message deadline (the
// run fell silent), never by the step deadline (before them: 3 s at least);
// the run ends bitwise equal to the fault-free one.
TEST(RuntimeFaults, AdaptiveDeadlinesFindALostMessage) {
  runtime::RuntimeOptions base = options("1f1b", 5);
  base.step_deadline = 0;  // the default: adaptive
  base.train.steps = 13;
  base.expert_shards = 2;
  const Outcome ref = run(base);
  EXPECT_EQ(ref.summary.suspicions, 0) << "a fault-free run suspected a loss";
  for (const std::string target : {"optimizer:0", "stage:1", "expert:1/1"}) {
    runtime::RuntimeOptions o = base;
    runtime::FaultSpec f;
    f.at_step = 12;
    f.target = target;
    f.kind = runtime::FaultKind::drop;
    o.faults = {f};
    const Outcome got = run(o);
    expect_bitwise_equal(ref, got, "drop " + target);
    ASSERT_GE(got.restarts.size(), 1u) << target;
    for (const auto& ev : got.restarts) {
      EXPECT_EQ(ev.cause.find("no progress within"), std::string::npos) << target << ": " << ev.str();
      EXPECT_TRUE(ev.gap || ev.cause.find("adaptive message deadline") != std::string::npos) << target << ": " << ev.str();
    }
    EXPECT_EQ(got.summary.suspicions + got.summary.gaps, static_cast<int64_t>(got.restarts.size())) << target;
  }
}

// With the step deadline far away (30 s), a message lost in a pipeline's
// stream with more messages behind it is found by its gap alone: the first
// message of step 2 to stage:1 is lost, stage:0's activations follow it.
TEST(RuntimeFaults, ASequenceGapFindsALostMessageAtOnce) {
  runtime::RuntimeOptions base = options("1f1b", 5);
  base.step_deadline = 30.0;
  const Outcome ref = run(base);
  runtime::RuntimeOptions o = base;
  runtime::FaultSpec f;
  f.at_step = 2;
  f.target = "stage:1";
  f.kind = runtime::FaultKind::drop;
  o.faults = {f};
  const Outcome got = run(o);
  expect_bitwise_equal(ref, got, "drop stage:1");
  ASSERT_EQ(got.restarts.size(), 1u);
  EXPECT_TRUE(got.restarts[0].gap) << got.restarts[0].str();
  EXPECT_EQ(got.summary.gaps, 1);
  EXPECT_EQ(got.summary.suspicions, 0);
}

// A pause longer than many message deadlines (400 ms, against a few ms) is
// waited out, not replayed until the run fails: each message deadline replay
// doubles the next, and those replays do not count against max_restarts (0
// here, so one counted replay would fail the run).
TEST(RuntimeFaults, ALongPauseIsWaitedOutUnderAdaptiveDeadlines) {
  runtime::RuntimeOptions base = options("1f1b", 5);
  base.step_deadline = 0;  // the default: adaptive
  base.train.steps = 13;
  const Outcome ref = run(base);
  runtime::RuntimeOptions o = base;
  o.max_restarts = 0;
  runtime::FaultSpec f;
  f.at_step = 12;
  f.target = "optimizer:0";
  f.kind = runtime::FaultKind::pause;
  f.duration_ms = 400;
  o.faults = {f};
  const Outcome got = run(o);
  expect_bitwise_equal(ref, got, "pause optimizer:0 400 ms");
  for (const auto& ev : got.restarts) EXPECT_TRUE(ev.deadline) << ev.str();
  EXPECT_EQ(got.summary.suspicions, static_cast<int64_t>(got.restarts.size()));
}

// A straggler: the device of the target runs 4x slower for steps 2..3 of 4
// (or for a wall-clock window). The math is unchanged (bitwise), the device
// reports closures it slowed and the time added, and a window in steps ends:
// the last step runs at full speed. Step times are printed, not asserted.
TEST(RuntimeFaults, SlowDeviceEndsBitwiseEqual) {
  runtime::RuntimeOptions base = options("1f1b", 5);
  base.train.steps = 4;
  base.expert_shards = 2;
  const Outcome ref = run(base);
  EXPECT_EQ(ref.slow.slowed, 0u);
  for (const std::string target : {"stage:1", "optimizer:0", "expert:1/1"}) {
    for (const double window_ms : {0.0, 30.0}) {
      runtime::RuntimeOptions o = base;
      runtime::FaultSpec f;
      f.at_step = 2;
      f.target = target;
      f.kind = runtime::FaultKind::slow;
      f.factor = 4;
      f.steps = 2;
      f.duration_ms = window_ms;
      o.faults = {f};
      const Outcome got = run(o);
      const std::string what = "slow " + target + (window_ms > 0 ? " for 30 ms" : " for 2 steps");
      expect_bitwise_equal(ref, got, what);
      EXPECT_GT(got.slow.slowed, 0u) << what;
      // Only the target's device is slowed; on it, steps 2..3 of 4 (the
      // initial loads and steps 1 and 4 are not) are at most half its
      // closures: a window that never ended would take step 4 too (3/4).
      int slowed_devices = 0;
      for (const auto& [slowed, completed] : got.slow.per_device) {
        if (slowed == 0) continue;
        ++slowed_devices;
        EXPECT_LT(slowed, completed) << what;
        if (window_ms == 0) EXPECT_LE(slowed, completed / 2) << what << ": the window never ended";
      }
      EXPECT_EQ(slowed_devices, 1) << what;
      EXPECT_GT(got.slow.seconds, 0.0) << what;
      std::cout << "  " << what << ": " << got.slow.slowed << " of " << got.slow.completed << " closures slowed, +"
                << got.slow.seconds * 1e3 << " ms; step seconds";
      for (double x : got.step_seconds) std::cout << " " << x;
      std::cout << "\n";
    }
  }
}

// A step that never finishes (every message to a rank lost, more replays than
// max_restarts allows) fails the run with a message naming what it waited for.
TEST(RuntimeFaults, EndlessStallFailsNamingTheWaitedFor) {
  runtime::RuntimeOptions o = options("1f1b", 5);
  o.step_deadline = 0.3;
  o.max_restarts = 0;
  runtime::FaultSpec f;
  f.at_step = 1;
  f.target = "stage:1";
  f.kind = runtime::FaultKind::drop;
  f.count = 1000000;
  o.faults = {f};
  runtime::Runtime rt(o);
  try {
    rt.step();
    ADD_FAILURE() << "a step whose messages to stage:1 are all lost succeeded";
  } catch (const std::runtime_error& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("step 1 made no progress within 0.3 s in 1 attempt(s)"), std::string::npos) << m;
    const size_t w = m.find("waiting for ");
    ASSERT_NE(w, std::string::npos) << m;
    EXPECT_NE(m.find("stage:1", w), std::string::npos) << m;
  }
}

// Seeded kill points: for each schedule and seed, kill each rank and each
// shard (separately) inside step 2. Which phase each kill hit is printed; the
// pinned-phase test below makes sure the earliest and latest points are run.
TEST(RuntimeFaults, SeededKillReplaysBitwise) {
  uint64_t replays = 0, dropped = 0;
  // zb1p: a kill may hit between a B and its deferred W (replayed from the step start).
  for (const std::string schedule : {"1f1b", "dualpipe", "zb1p"}) {
    for (uint64_t seed : {3u, 4u, 5u}) {
      const Outcome ref = run(options(schedule, seed));
      ASSERT_TRUE(ref.restarts.empty());
      for (const std::string target : {"stage:0", "stage:1", "optimizer:0", "optimizer:1"}) {
        runtime::RuntimeOptions o = options(schedule, seed);
        o.faults.push_back({2, target, runtime::FaultKind::kill, 0});
        const Outcome got = run(o);
        const std::string what = schedule + " seed " + std::to_string(seed) + " kill " + target;
        ASSERT_EQ(got.restarts.size(), 1u) << what;
        const runtime::RestartEvent& ev = got.restarts[0];
        EXPECT_EQ(ev.actor, target) << what;
        EXPECT_EQ(ev.cause, "killed") << what;
        EXPECT_EQ(ev.step, 2) << what;
        std::cout << "  " << what << ": " << ev.str() << "\n";
        replays += ev.replayed;
        dropped += got.dropped;
        expect_bitwise_equal(ref, got, what);
      }
    }
  }
  std::cout << "  replays " << replays << " of 36, messages dropped (older attempts) " << dropped << "\n";
  EXPECT_GT(replays, 0u);
}

// The two ends of a step, pinned with at_message: k = 1 (the target dies on
// its first message of the step: before any backward, before anything) and
// k = N (its last: a rank after sending its gradients with all but one
// parameter slice loaded; a shard after its update was applied and its new
// parameters sent to the ranks, before it sent its snapshot).
TEST(RuntimeFaults, EarliestAndLatestKillPoints) {
  for (const std::string schedule : {"1f1b", "dualpipe"}) {
    const Outcome ref = run(options(schedule, 7));
    for (const std::string target : {"stage:0", "stage:1", "optimizer:0", "optimizer:1"}) {
      for (int64_t k : {int64_t{1}, int64_t{1000000}}) {  // clipped to N
        runtime::RuntimeOptions o = options(schedule, 7);
        o.faults.push_back({2, target, runtime::FaultKind::kill, k});
        const Outcome got = run(o);
        const std::string what = schedule + " kill " + target + (k == 1 ? " early" : " late");
        ASSERT_EQ(got.restarts.size(), 1u) << what;
        const std::string phase = got.restarts[0].phase;
        std::cout << "  " << what << ": " << got.restarts[0].str() << "\n";
        const bool stage = target.rfind("stage", 0) == 0;
        if (k == 1) EXPECT_NE(phase.find(stage ? "waiting for its step to start" : "collecting gradients (0 of"), std::string::npos) << what << ": " << phase;
        else EXPECT_NE(phase.find(stage ? "after sending gradients (1 of 2 slices loaded)" : "finishing its update"), std::string::npos) << what << ": " << phase;
        EXPECT_TRUE(got.restarts[0].replayed) << what;
        expect_bitwise_equal(ref, got, what);
      }
    }
  }
}

// Expert parallelism (expert_shards > 1): an expert-shard actor killed at a
// seeded point of step 2 is respawned on its device with the step-start
// weights and the step replayed; so is a rank or optimizer shard of such a
// run (the expert shards then drop the failed attempt and reload). The run
// ends bitwise equal to the one without the kill.
TEST(RuntimeFaults, ExpertShardKillReplaysBitwise) {
  uint64_t replays = 0;
  for (const std::string schedule : {"1f1b", "dualpipe"}) {
    for (int shards : {2, 4}) {
      runtime::RuntimeOptions base = options(schedule, 11);
      base.expert_shards = shards;
      const Outcome ref = run(base);
      ASSERT_TRUE(ref.restarts.empty());
      const std::string last = "expert:3/" + std::to_string(shards - 1);
      for (const std::string& target : {std::string("expert:0/0"), last, std::string("stage:1"), std::string("optimizer:0")}) {
        runtime::RuntimeOptions o = base;
        o.faults.push_back({2, target, runtime::FaultKind::kill, 0});
        const Outcome got = run(o);
        const std::string what = schedule + " expert_shards " + std::to_string(shards) + " kill " + target;
        ASSERT_EQ(got.restarts.size(), 1u) << what;
        EXPECT_EQ(got.restarts[0].actor, target) << what;
        EXPECT_EQ(got.restarts[0].step, 2) << what;
        std::cout << "  " << what << ": " << got.restarts[0].str() << "\n";
        replays += got.restarts[0].replayed;
        expect_bitwise_equal(ref, got, what);
      }
    }
  }
  EXPECT_GT(replays, 0u);
}

// An expert shard killed on its first message of step 2 (before any
// dispatch), on its third (among its forwards) and on its last (parameters of all but one optimizer shard
// loaded), and one killed between steps (restored without a replay).
TEST(RuntimeFaults, ExpertShardEarliestLatestAndBetweenSteps) {
  for (const std::string schedule : {"1f1b", "dualpipe"}) {
    runtime::RuntimeOptions base = options(schedule, 12);
    base.expert_shards = 2;
    const Outcome ref = run(base);
    for (int64_t k : {int64_t{1}, int64_t{3}, int64_t{1000000}}) {
      runtime::RuntimeOptions o = base;
      o.faults.push_back({2, "expert:1/1", runtime::FaultKind::kill, k});
      const Outcome got = run(o);
      const std::string what = schedule + " kill expert:1/1 " + (k == 1 ? "early" : k == 3 ? "in the forwards" : "late");
      ASSERT_EQ(got.restarts.size(), 1u) << what;
      const std::string phase = got.restarts[0].phase;
      std::cout << "  " << what << ": " << got.restarts[0].str() << "\n";
      if (k == 1) EXPECT_NE(phase.find("waiting for its step's dispatches"), std::string::npos) << what << ": " << phase;
      // Message 3: after its first forward Dispatch (and its completion);
      // no backward reaches layer 1 before both stages ran a forward.
      else if (k == 3) EXPECT_NE(phase.find("in its forward dispatches"), std::string::npos) << what << ": " << phase;
      else EXPECT_NE(phase.find("after sending gradients"), std::string::npos) << what << ": " << phase;
      EXPECT_TRUE(got.restarts[0].replayed) << what;
      expect_bitwise_equal(ref, got, what);
    }
    runtime::Runtime rt(base);
    Outcome got;
    for (int64_t s = 0; s < base.train.steps; ++s) {
      if (s == 1) rt.kill("expert:2/0");
      const model::StepMetrics m = rt.step();
      got.losses.push_back(m.loss);
      got.norms.push_back(m.grad_norm);
    }
    got.state = rt.state();
    got.restarts = rt.restarts();
    ASSERT_EQ(got.restarts.size(), 1u);
    EXPECT_FALSE(got.restarts[0].replayed);
    expect_bitwise_equal(ref, got, schedule + " expert shard killed between steps");
  }
}

// Data-parallel replicas with expert shards: replica 1's expert shard.
TEST(RuntimeFaults, ExpertShardDataParallelReplay) {
  runtime::RuntimeOptions base = options("1f1b", 13);
  base.data_parallel = 2;
  base.expert_shards = 2;
  const Outcome ref = run(base);
  runtime::RuntimeOptions o = base;
  o.faults.push_back({2, "expert:1/0/replica:1", runtime::FaultKind::kill, 0});
  const Outcome got = run(o);
  ASSERT_EQ(got.restarts.size(), 1u);
  EXPECT_EQ(got.restarts[0].actor, "expert:1/0/replica:1");
  expect_bitwise_equal(ref, got, "dp2 kill expert:1/0/replica:1");
}

// Kills in two steps, with both shards and ranks, in one run.
TEST(RuntimeFaults, SeveralFaultsInOneRun) {
  const Outcome ref = run(options("1f1b", 9));
  runtime::RuntimeOptions o = options("1f1b", 9);
  o.max_restarts = 4;
  o.faults = {{1, "optimizer:1", runtime::FaultKind::kill, 0}, {2, "stage:1", runtime::FaultKind::kill, 0}, {2, "optimizer:0", runtime::FaultKind::kill, 0}, {3, "stage:0", runtime::FaultKind::kill, 0}};
  const Outcome got = run(o);
  EXPECT_EQ(got.restarts.size(), 4u);
  expect_bitwise_equal(ref, got, "four kills");
}

// Data-parallel replicas: replica 0's rank and a shard that reduces both
// replicas' gradients.
TEST(RuntimeFaults, DataParallelReplay) {
  runtime::RuntimeOptions base = options("1f1b", 5);
  base.data_parallel = 2;
  const Outcome ref = run(base);
  for (const std::string target : {"stage:1", "stage:0/replica:1", "optimizer:0"}) {
    runtime::RuntimeOptions o = base;
    o.faults.push_back({2, target, runtime::FaultKind::kill, 0});
    const Outcome got = run(o);
    ASSERT_EQ(got.restarts.size(), 1u) << target;
    EXPECT_EQ(got.restarts[0].actor, target == "stage:1" ? "stage:1/replica:0" : target);
    EXPECT_TRUE(got.restarts[0].replayed);
    expect_bitwise_equal(ref, got, "dp2 kill " + target);
  }
}

// An actor killed between steps (Runtime::kill waits for the supervisor): it
// is restarted from the committed snapshot, no step is replayed.
TEST(RuntimeFaults, KillBetweenStepsRestoresWithoutReplay) {
  for (const std::string schedule : {"1f1b", "dualpipe"}) {
    const Outcome ref = run(options(schedule, 6));
    runtime::Runtime rt(options(schedule, 6));
    Outcome got;
    for (int s = 0; s < 3; ++s) {
      if (s == 1) rt.kill("stage:0");
      if (s == 2) rt.kill("optimizer:1");
      const model::StepMetrics m = rt.step();
      got.losses.push_back(m.loss);
      got.norms.push_back(m.grad_norm);
    }
    got.state = rt.state();
    const auto events = rt.restarts();
    ASSERT_EQ(events.size(), 2u);
    EXPECT_FALSE(events[0].replayed);
    EXPECT_EQ(events[0].actor, "stage:0");
    EXPECT_EQ(events[1].actor, "optimizer:1");
    expect_bitwise_equal(ref, got, schedule + " kills between steps");
    EXPECT_THROW(rt.kill("stage:9"), std::runtime_error);
  }
}

TEST(RuntimeFaults, TooManyRestartsEscalate) {
  runtime::RuntimeOptions o = options("1f1b", 3);
  o.max_restarts = 1;
  o.restart_window = 10;
  o.faults = {{1, "stage:1", runtime::FaultKind::kill, 0}, {2, "optimizer:0", runtime::FaultKind::kill, 0}};
  runtime::Runtime rt(o);
  EXPECT_NO_THROW(rt.step());
  try {
    rt.step();
    FAIL() << "the second restart within the window should fail the step";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("optimizer:0"), std::string::npos) << msg;
    EXPECT_NE(msg.find("killed"), std::string::npos) << msg;
    EXPECT_NE(msg.find("max_restarts = 1"), std::string::npos) << msg;
  }
  EXPECT_THROW(rt.step(), std::runtime_error);  // the runtime stays failed
}

// Restart intensity counted in seconds as well: two kills in steps 1 and 3
// are outside a 1-step window but inside a 3600 s period, so the second
// escalates, naming the period; inside a period too short for two restarts
// to share, they do not. (Neither depends on how fast the machine is.)
TEST(RuntimeFaults, RestartIntensityInSecondsEscalates) {
  runtime::RuntimeOptions o = options("1f1b", 3);
  o.max_restarts = 1;
  o.restart_window = 1;
  o.restart_period = 3600;
  o.faults = {{1, "stage:1", runtime::FaultKind::kill, 0}, {3, "optimizer:0", runtime::FaultKind::kill, 0}};
  runtime::Runtime rt(o);
  EXPECT_NO_THROW(rt.step());
  EXPECT_NO_THROW(rt.step());
  try {
    rt.step();
    FAIL() << "the second restart within 3600 s should fail the step";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("optimizer:0 went down (killed) in step 3: 2 restarts within 3600 s, more than max_restarts = 1; giving up"),
              std::string::npos) << msg;
  }
  const Outcome ref = run(options("1f1b", 3));
  o.restart_period = 1e-9;  // no two restarts are this close
  const Outcome got = run(o);
  EXPECT_EQ(got.restarts.size(), 2u);
  expect_bitwise_equal(ref, got, "two restarts, period 1 ns");
}

// Per-role budgets: with max_restarts_optimizer = 0 the first optimizer-shard
// restart escalates, naming the role's budget, though max_restarts allows
// more; a stage restart under the same settings does not.
TEST(RuntimeFaults, PerRoleRestartBudgetEscalates) {
  runtime::RuntimeOptions o = options("1f1b", 3);
  o.max_restarts = 10;
  o.max_restarts_optimizer = 0;
  o.max_restarts_stage = 1;
  o.faults = {{1, "stage:1", runtime::FaultKind::kill, 0}, {2, "optimizer:1", runtime::FaultKind::kill, 0}};
  runtime::Runtime rt(o);
  EXPECT_NO_THROW(rt.step());
  try {
    rt.step();
    FAIL() << "an optimizer restart beyond max_restarts_optimizer = 0 should fail the step";
  } catch (const std::runtime_error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("optimizer:1 went down (killed) in step 2: 1 restarts of optimizer actors within 10 step(s), "
                       "more than max_restarts_optimizer = 0; giving up"),
              std::string::npos) << msg;
  }
  EXPECT_THROW(rt.step(), std::runtime_error);  // it stays stopped
  runtime::RuntimeOptions two = options("1f1b", 3);
  two.max_restarts = 10;
  two.max_restarts_stage = 1;
  two.faults = {{1, "stage:1", runtime::FaultKind::kill, 0}, {3, "stage:0", runtime::FaultKind::kill, 0}};
  try {
    run(two);
    FAIL() << "a second stage restart beyond max_restarts_stage = 1 should fail the run";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("2 restarts of stage actors within 10 step(s), more than max_restarts_stage = 1"),
              std::string::npos) << e.what();
  }
}

TEST(RuntimeFaults, RestartsOutsideTheWindowDoNotEscalate) {
  const Outcome ref = run(options("1f1b", 3));
  runtime::RuntimeOptions o = options("1f1b", 3);
  o.max_restarts = 1;
  o.restart_window = 1;
  o.faults = {{1, "stage:1", runtime::FaultKind::kill, 0}, {3, "optimizer:0", runtime::FaultKind::kill, 0}};
  const Outcome got = run(o);
  EXPECT_EQ(got.restarts.size(), 2u);
  expect_bitwise_equal(ref, got, "two restarts, window 1");
}

// Every step message sent twice (data, activations, gradients, losses,
// gradient slices, norms, clips, parameter slices, snapshots, step reports):
// each copy is dropped and counted, the math is unchanged, with and without
// a kill-and-replay in the middle.
TEST(RuntimeFaults, DuplicatedMessagesAreDropped) {
  for (const std::string schedule : {"1f1b", "dualpipe"}) {
    const Outcome ref = run(options(schedule, 8));
    EXPECT_EQ(ref.dropped, 0u) << schedule;
    for (const std::string target : {"", "stage:1", "optimizer:0"}) {
      runtime::RuntimeOptions o = options(schedule, 8);
      if (!target.empty()) o.faults.push_back({2, target, runtime::FaultKind::kill, 0});
      runtime::TestHooks hooks;
      hooks.duplicate_sends = true;
      runtime::ScopedTestHooks installed(hooks);
      const Outcome got = run(o);
      const std::string what = schedule + " duplicates" + (target.empty() ? "" : ", kill " + target);
      EXPECT_EQ(got.restarts.size(), target.empty() ? 0u : 1u) << what;
      // At least one copy of each message of the three steps: the data and
      // (start) of every rank, for instance, are 3 * (4 + 2) messages alone.
      EXPECT_GT(got.dropped, 3u * 6u) << what;
      expect_bitwise_equal(ref, got, what);
    }
  }
}

// The same with expert shards and aux-loss-free balancing: Dispatches,
// Combines, the experts' gradient and parameter slices and step reports, and
// the per-micro-batch expert loads (which move the router bias, so a load
// counted twice would change the math) are all sent twice.
TEST(RuntimeFaults, DuplicatedMessagesAreDroppedWithExpertShards) {
  for (const std::string schedule : {"1f1b", "dualpipe"}) {
    runtime::RuntimeOptions base = options(schedule, 8);
    base.expert_shards = 2;
    base.train.model.balance = troupe::moe::Balance::bias;
    const Outcome ref = run(base);
    EXPECT_EQ(ref.dropped, 0u) << schedule;
    for (const std::string& target : {std::string(), std::string("expert:1/0")}) {
      runtime::RuntimeOptions o = base;
      if (!target.empty()) o.faults.push_back({2, target, runtime::FaultKind::kill, 0});
      runtime::TestHooks hooks;
      hooks.duplicate_sends = true;
      runtime::ScopedTestHooks installed(hooks);
      const Outcome got = run(o);
      const std::string what = schedule + " expert shards, duplicates" + (target.empty() ? "" : ", kill " + target);
      EXPECT_EQ(got.restarts.size(), target.empty() ? 0u : 1u) << what;
      EXPECT_GT(got.dropped, 3u * 6u) << what;
      EXPECT_EQ(got.loads, ref.loads) << what << ": expert loads counted twice?";
      expect_bitwise_equal(ref, got, what);
    }
  }
}

TEST(RuntimeFaults, StaleMessagesAreDroppedAndCounted) {
  for (const std::string schedule : {"1f1b", "dualpipe"}) for (int shards : {0, 2}) {
    runtime::RuntimeOptions o = options(schedule, 3);
    o.expert_shards = shards;  // 2: the expert shards get stale parameter slices too
    const Outcome ref = run(o);
    runtime::TestHooks hooks;
    hooks.replay_stale = true;  // the seam keeps each step's messages for inject_stale_messages()
    runtime::ScopedTestHooks installed(hooks);
    runtime::Runtime rt(o);
    Outcome got;
    auto step = [&] {
      const model::StepMetrics m = rt.step();
      got.losses.push_back(m.loss);
      got.norms.push_back(m.grad_norm);
    };
    step();
    const uint64_t before = runtime::testing::dropped_messages(rt);
    const uint32_t sent = runtime::testing::inject_stale_messages(rt);
    EXPECT_GT(sent, 0u);
    step();  // every receiver has handled them now
    step();
    EXPECT_GE(runtime::testing::dropped_messages(rt), before + sent) << schedule << " expert_shards " << shards;
    got.state = rt.state();
    expect_bitwise_equal(ref, got, schedule + " with stale messages");
  }
}

// Supervision strategies: one_for_all respawns every rank and shard with the
// dead one, rest_for_one those started after it (shards, then ranks); the
// step is replayed and the run ends bitwise equal either way. The restart
// reports name exactly the actors the strategy covers.
TEST(RuntimeFaults, OneForAllAndRestForOneEndBitwiseEqual) {
  const Outcome ref = run(options("1f1b", 7));
  struct Case {
    runtime::Strategy strategy;
    std::string target;
    std::set<std::string> restarted;
  };
  const std::vector<Case> cases = {
      {runtime::Strategy::one_for_all, "stage:1", {"optimizer:0", "optimizer:1", "stage:0", "stage:1"}},
      {runtime::Strategy::rest_for_one, "optimizer:1", {"optimizer:1", "stage:0", "stage:1"}},
      {runtime::Strategy::rest_for_one, "stage:0", {"stage:0", "stage:1"}},
      {runtime::Strategy::rest_for_one, "stage:1", {"stage:1"}},
  };
  for (const Case& c : cases) {
    runtime::RuntimeOptions o = options("1f1b", 7);
    o.strategy = c.strategy;
    o.faults = {{2, c.target, runtime::FaultKind::kill, 0}};
    const Outcome got = run(o);
    const std::string what = runtime::strategy_name(c.strategy) + " killing " + c.target;
    expect_bitwise_equal(ref, got, what);
    std::set<std::string> names;
    for (const auto& ev : got.restarts) {
      names.insert(ev.actor);
      EXPECT_EQ(ev.step, 2) << what;
    }
    EXPECT_EQ(names, c.restarted) << what;
    EXPECT_EQ(got.restarts.size(), c.restarted.size()) << what;
  }
}

TEST(RuntimeFaults, ProcessTargetsParse) {
  int p = -1;
  EXPECT_TRUE(runtime::parse_process_target("process:1", p));
  EXPECT_EQ(p, 1);
  EXPECT_TRUE(runtime::parse_process_target("process:0", p));
  EXPECT_EQ(p, 0);
  for (const char* bad : {"process:", "process:-1", "process:1x", "process", "stage:1", "process:1234567"})
    EXPECT_FALSE(runtime::parse_process_target(bad, p)) << bad;
  EXPECT_FALSE(runtime::parse_fault_target("process:1").has_value());  // not an actor
  EXPECT_STREQ(runtime::fault_kind_name(runtime::FaultKind::stop), "stop");
  EXPECT_FALSE(runtime::on_messages(runtime::FaultKind::stop));
}

TEST(RuntimeFaults, BadFaultEntriesAreRejected) {
  auto bad = [](runtime::FaultSpec f, const std::string& want) {
    runtime::RuntimeOptions o = options("1f1b", 3);
    o.faults.push_back(f);
    try {
      runtime::validate(o);
      ADD_FAILURE() << "accepted " << f.target;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  bad({1, "expert:0", runtime::FaultKind::kill, 0}, "must be stage:K, stage:K/replica:R, optimizer:K or expert:L/S[/replica:R]");
  bad({1, "expert:0/0", runtime::FaultKind::kill, 0}, "the run has no expert shards");
  auto bad_x = [](const std::string& target, const std::string& want) {
    runtime::RuntimeOptions o = options("1f1b", 3);
    o.expert_shards = 2;
    o.faults.push_back({1, target, runtime::FaultKind::kill, 0});
    try {
      runtime::validate(o);
      ADD_FAILURE() << "accepted " << target;
    } catch (const std::invalid_argument& e) {
      EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
    }
  };
  bad_x("expert:4/0", "there are 4 MoE layer(s)");
  bad_x("expert:0/2", "there are 2 expert shard(s) per layer");
  bad_x("expert:0/1/replica:1", "there are 1 data-parallel replica(s)");
  bad_x("expert:0/x", "must be stage:K");
  bad({1, "optimizer:0/replica:0", runtime::FaultKind::kill, 0}, "must be stage:K");
  bad({1, "stage:0/replica:1", runtime::FaultKind::kill, 0}, "there are 1 data-parallel replica(s)");
  bad({1, "stage:2", runtime::FaultKind::kill, 0}, "there are 2 stage(s)");
  bad({1, "optimizer:5", runtime::FaultKind::kill, 0}, "there are 2 optimizer shard(s)");
  // An unknown kind ("hang") cannot be written here: kinds are an enum, and the
  // spec parser rejects the name (tests/launch/bad_specs/36_faults_bad_kind.toml).
  // Whole processes: only kill or stop of process 1 of a 2-process run
  // (here: one process), and stop only on a process.
  bad({1, "process:1", runtime::FaultKind::kill, 0}, "only kill or stop of process 1 of 2");
  bad({1, "process:1", runtime::FaultKind::drop, 0}, "only kill or stop of process 1 of 2");
  bad({1, "stage:0", runtime::FaultKind::stop, 0}, "fault kind stop applies to a whole process");
  bad({1, "stage:0", runtime::FaultKind::partition, 0}, "fault kind partition needs duration_ms > 0");
  bad({0, "stage:0", runtime::FaultKind::kill, 0}, "outside the run's steps 1..3");
  bad({4, "stage:0", runtime::FaultKind::kill, 0}, "outside the run's steps 1..3");
}

}  // namespace
}  // namespace troupe::test
