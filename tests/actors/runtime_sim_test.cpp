// Sim devices (actors/sim/sim_runtime.hpp): the actor-level simulation and the
// discrete-event simulator (actors/schedule/pipeline_sim.hpp) are two independent
// implementations of the same timing rules, so with fixed costs they must
// give the same step time, per-device busy time, finish time and op start
// times, for every schedule, pipeline depth and chunk count — up to a
// 1,024-device topology. Also: the flops cost model's totals, multi-step
// runs, bad options, and the virtual-time trace.
#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <gtest/gtest.h>

#include "actors/schedule/pipeline_sim.hpp"
#include "actors/sim/sim_runtime.hpp"
#include "model/decoder.hpp"

namespace troupe::test {
namespace {

using sched::Kind;

struct Case {
  Kind kind;
  int pp, chunks;
};

// Every valid (kind, PP, chunks) for PP in {2, 4, 8} and a few chunk counts.
std::vector<Case> all_cases() {
  std::vector<Case> out;
  for (Kind k : {Kind::sequential, Kind::one_f_one_b, Kind::zb1p, Kind::dualpipe, Kind::dualpipev})
    for (int pp : {2, 4, 8})
      for (int c : {1, pp, 2 * pp, 2 * pp + 1, 3 * pp + 2}) {
        try {
          sched::make_layout(k, pp, c);
        } catch (const std::invalid_argument&) {
          continue;
        }
        out.push_back({k, pp, c});
      }
  return out;
}

std::string name(const Case& c) {
  return std::string(sched::to_string(c.kind)) + " PP=" + std::to_string(c.pp) + " C=" + std::to_string(c.chunks);
}

// The DES on the same op lists, with the same costs (integers, so exact in doubles).
sched::SimResult des(const Case& c, const sim::StageCost& cost, int64_t link_ns, bool timeline) {
  sched::OpCosts oc;
  oc.f = static_cast<double>(cost.f);
  oc.b = static_cast<double>(cost.b);
  oc.w = static_cast<double>(cost.w);
  oc.fb = static_cast<double>(cost.f + cost.b);
  oc.latency = static_cast<double>(link_ns);
  sched::SimOptions so;
  so.record_timeline = timeline;
  return sched::simulate(sched::make_all_schedules(c.kind, c.pp, c.chunks), oc, so);
}

sim::SimOptions actor_options(const Case& c, const sim::StageCost& cost, int64_t latency_ns) {
  sim::SimOptions o;
  o.kind = c.kind;
  o.stages = c.pp;
  o.chunks = c.chunks;
  o.stage_costs = {cost};
  o.link_latency_ns = latency_ns;
  o.d_model = 16;
  return o;
}

// Makespan, busy, finish and every op's start/end agree with the DES.
void expect_same(const Case& c, const sim::SimOptions& o, const sim::SimResult& a, const sched::SimResult& d) {
  ASSERT_TRUE(a.completed) << name(c) << ": " << a.error;
  ASSERT_TRUE(d.completed) << name(c) << ": " << d.error << d.deadlock;
  EXPECT_EQ(static_cast<double>(a.makespan), d.makespan) << name(c);
  EXPECT_EQ(a.steps.front().step_ns, a.makespan + o.optimizer_ns) << name(c);
  ASSERT_EQ(a.devices, o.replicas * c.pp);
  for (int dev = 0; dev < a.devices; ++dev) {
    const int r = dev % c.pp;
    EXPECT_EQ(static_cast<double>(a.busy[dev]), d.busy[r]) << name(c) << " device " << dev;
    EXPECT_EQ(static_cast<double>(a.finish[dev]), d.finish[r]) << name(c) << " device " << dev;
    EXPECT_EQ(static_cast<double>(a.bubble(dev)), d.bubble(r)) << name(c) << " device " << dev;
  }
  EXPECT_EQ(a.messages, d.messages * static_cast<uint64_t>(o.replicas) * static_cast<uint64_t>(o.steps)) << name(c);
  if (a.timeline.empty() || d.timeline.empty()) return;
  for (int dev = 0; dev < a.devices; ++dev) {
    std::vector<sim::Span> ops;
    for (const sim::Span& s : a.timeline[dev])
      if (s.kind == sim::Span::Op && s.step == 1) ops.push_back(s);
    const auto& want = d.timeline[dev % c.pp];
    ASSERT_EQ(ops.size(), want.size()) << name(c) << " device " << dev;
    for (size_t i = 0; i < ops.size(); ++i) {
      EXPECT_EQ(static_cast<double>(ops[i].start), want[i].start) << name(c) << " device " << dev << " op " << i;
      EXPECT_EQ(static_cast<double>(ops[i].end), want[i].end) << name(c) << " device " << dev << " op " << i;
    }
  }
}

TEST(SimActors, EqualTheDiscreteEventSimulatorForEverySchedule) {
  const auto cases = all_cases();
  ASSERT_GE(cases.size(), 40u);
  // Two cost sets: the DualPipe README's ratios with a split W, and uneven
  // times with a link latency that shifts every cross-device dependency.
  const sim::StageCost costs[] = {{10, 20, 10}, {7, 13, 4}};
  const int64_t latency[] = {0, 3};
  for (const Case& c : cases)
    for (int k = 0; k < 2; ++k) {
      sim::SimOptions o = actor_options(c, costs[k], latency[k]);
      o.record_timeline = true;
      const sim::SimResult a = sim::simulate(o);
      expect_same(c, o, a, des(c, costs[k], latency[k], true));
      if (HasFatalFailure()) return;
    }
}

TEST(SimActors, ReplicasRunTheSameTimelineOnTheirOwnDevices) {
  const Case c{Kind::dualpipe, 4, 8};
  sim::SimOptions o = actor_options(c, {5, 9, 3}, 2);
  o.replicas = 3;
  o.record_timeline = true;
  const sim::SimResult a = sim::simulate(o);
  expect_same(c, o, a, des(c, {5, 9, 3}, 2, true));
}

TEST(SimActors, StepsFollowEachOtherAfterTheOptimizerStep) {
  const Case c{Kind::one_f_one_b, 4, 6};
  sim::SimOptions o = actor_options(c, {4, 8, 3}, 1);
  o.steps = 3;
  o.optimizer_ns = 25;
  o.record_timeline = true;
  std::vector<int64_t> seen;
  o.on_step = [&](const sim::StepReport& r) { seen.push_back(r.step); };
  const sim::SimResult a = sim::simulate(o);
  expect_same(c, o, a, des(c, {4, 8, 3}, 1, false));
  ASSERT_EQ(a.steps.size(), 3u);
  EXPECT_EQ(seen, (std::vector<int64_t>{1, 2, 3}));
  for (size_t s = 0; s < a.steps.size(); ++s) {
    EXPECT_EQ(a.steps[s].start_ns, static_cast<int64_t>(s) * (a.makespan + 25));
    EXPECT_EQ(a.steps[s].pipeline_ns, a.makespan);
    EXPECT_EQ(a.steps[s].step_ns, a.makespan + 25);
  }
  // Each device: its ops of step s are those of step 1 shifted by the step start.
  for (int dev = 0; dev < a.devices; ++dev) {
    std::vector<std::vector<sim::Span>> by_step(4);
    for (const sim::Span& sp : a.timeline[dev]) by_step[sp.step].push_back(sp);
    for (int s = 2; s <= 3; ++s) {
      ASSERT_EQ(by_step[s].size(), by_step[1].size());
      const int64_t shift = a.steps[s - 1].start_ns;
      for (size_t i = 0; i < by_step[1].size(); ++i) EXPECT_EQ(by_step[s][i].start, by_step[1][i].start + shift);
    }
    ASSERT_FALSE(by_step[1].empty());
    EXPECT_EQ(by_step[1].back().kind, sim::Span::Optimizer);
  }
}

TEST(SimActors, LinkBandwidthAddsTransferTime) {
  const Case c{Kind::dualpipev, 4, 8};
  sim::SimOptions o = actor_options(c, {6, 10, 4}, 5);
  o.message_bytes = 1000;
  o.link_bytes_per_ns = 8;  // 125 ns per message
  const sim::SimResult a = sim::simulate(o);
  expect_same(c, o, a, des(c, {6, 10, 4}, 5 + 125, false));
  const sim::SimResult slow = sim::simulate(actor_options(c, {6, 10, 4}, 5));
  EXPECT_GT(a.makespan, slow.makespan);
}

TEST(SimActors, ThousandDeviceDualPipeStepEqualsTheDiscreteEventSimulator) {
  const Case c{Kind::dualpipe, 32, 64};
  sim::SimOptions o = actor_options(c, {10, 20, 10}, 1);
  o.replicas = 32;  // 32 x 32 = 1,024 devices
  const sim::SimResult a = sim::simulate(o);
  ASSERT_EQ(a.devices, 1024);
  expect_same(c, o, a, des(c, {10, 20, 10}, 1, false));
}

TEST(SimActors, SameOptionsSameTimeline) {
  const Case c{Kind::zb1p, 4, 9};
  sim::SimOptions o = actor_options(c, {3, 7, 2}, 2);
  o.record_timeline = true;
  o.replicas = 2;
  const sim::SimResult a = sim::simulate(o), b = sim::simulate(o);
  ASSERT_TRUE(a.completed && b.completed);
  ASSERT_EQ(a.timeline.size(), b.timeline.size());
  for (size_t d = 0; d < a.timeline.size(); ++d) {
    ASSERT_EQ(a.timeline[d].size(), b.timeline[d].size());
    for (size_t i = 0; i < a.timeline[d].size(); ++i) {
      EXPECT_EQ(a.timeline[d][i].start, b.timeline[d][i].start);
      EXPECT_EQ(a.timeline[d][i].end, b.timeline[d][i].end);
      EXPECT_EQ(a.timeline[d][i].kind, b.timeline[d][i].kind);
    }
  }
}

TEST(SimActors, BadOptionsAreReportedNotThrown) {
  auto error_of = [](sim::SimOptions o) {
    const sim::SimResult r = sim::simulate(o);
    EXPECT_FALSE(r.completed);
    return r.error;
  };
  sim::SimOptions o = actor_options({Kind::dualpipe, 3, 6}, {1, 2, 1}, 0);
  EXPECT_NE(error_of(o).find("even"), std::string::npos) << error_of(o);
  o = actor_options({Kind::one_f_one_b, 2, 2}, {1, 2, 3}, 0);
  EXPECT_NE(error_of(o).find("w <= b"), std::string::npos);
  o = actor_options({Kind::one_f_one_b, 2, 2}, {1, 2, 1}, 0);
  o.stage_costs = {{1, 2, 1}, {1, 2, 1}, {1, 2, 1}};
  EXPECT_NE(error_of(o).find("stage_costs has 3 entries"), std::string::npos);
  o = actor_options({Kind::one_f_one_b, 2, 2}, {1, 2, 1}, -1);
  EXPECT_NE(error_of(o).find(">= 0"), std::string::npos);
}

TEST(SimCosts, FlopsModelAddsUpToTheModelsTrainingFlops) {
  model::ModelConfig c;
  c.n_layers = 8;
  for (int stages : {1, 3, 8}) {
    const auto work = sim::stage_work(c, 2, stages);
    ASSERT_EQ(static_cast<int>(work.size()), stages);
    double total = 0;
    for (const sim::StageWork& w : work) {
      total += w.f_flops + w.bin_flops + w.w_flops;
      EXPECT_NEAR(w.bin_flops + w.w_flops, 2 * w.f_flops, 1e-9 * w.f_flops);  // backward = 2 x forward
    }
    const double want = model::train_flops_per_token(c) * 2.0 * static_cast<double>(c.seq_len);
    EXPECT_NEAR(total, want, 1e-9 * want) << stages << " stages";
  }
  // Compute-bound (huge memory bandwidth): time = FLOPs / GFLOP/s, in ns.
  sim::CostConfig cc;
  cc.model = sim::CostModel::flops;
  cc.gflops = 50;
  cc.gbps = 1e9;
  const auto costs = sim::stage_costs(cc, c, 2, 4);
  const auto work = sim::stage_work(c, 2, 4);
  for (size_t s = 0; s < costs.size(); ++s) {
    EXPECT_EQ(costs[s].f, std::llround(work[s].f_flops / 50));
    EXPECT_EQ(costs[s].w, std::llround(work[s].w_flops / 50));
    EXPECT_EQ(costs[s].b - costs[s].w, std::llround(work[s].bin_flops / 50));
  }
  EXPECT_GT(costs.back().f, costs[1].f);  // the LM head sits on the last stage
  // Memory-bound (slow memory): time = bytes / GB/s.
  cc.gflops = 1e9;
  cc.gbps = 0.5;
  const auto mem = sim::stage_costs(cc, c, 2, 4);
  EXPECT_EQ(mem[0].f, std::llround(work[0].f_bytes / 0.5));
  // Fixed: the spec's times on every stage.
  sim::CostConfig fixed;
  fixed.forward_ms = 1.5;
  fixed.backward_ms = 3;
  fixed.weight_ms = 1.25;
  EXPECT_EQ(sim::stage_costs(fixed, c, 2, 3), std::vector<sim::StageCost>(3, sim::StageCost{1500000, 3000000, 1250000}));
  fixed.weight_ms = 4;
  EXPECT_THROW(sim::stage_costs(fixed, c, 2, 3), std::invalid_argument);
  // Measured (troupe calibrate): each stage its own times; no weight list = no W part.
  sim::CostConfig m;
  m.model = sim::CostModel::measured;
  m.stage_forward_ms = {1.5, 2.25};
  m.stage_backward_ms = {3, 4.5};
  EXPECT_EQ(sim::stage_costs(m, c, 2, 2),
            (std::vector<sim::StageCost>{{1500000, 3000000, 0}, {2250000, 4500000, 0}}));
  m.stage_weight_ms = {1, 2};
  EXPECT_EQ(sim::stage_costs(m, c, 2, 2)[1], (sim::StageCost{2250000, 4500000, 2000000}));
  EXPECT_THROW(sim::stage_costs(m, c, 2, 3), std::invalid_argument);  // 2 values, 3 stages
  m.stage_weight_ms = {1, 5};                                         // W > B
  EXPECT_THROW(sim::stage_costs(m, c, 2, 2), std::invalid_argument);
  m.stage_weight_ms = {1};                                            // a weight list of the wrong length
  EXPECT_THROW(sim::stage_costs(m, c, 2, 2), std::invalid_argument);
}

// The measured model on the actor sim: a 1F1B step on 2 devices with
// unequal stages is the schedule's makespan over those stage times (F0 F0
// ... on rank 0, the last stage's F+B back to back), plus the optimizer.
TEST(SimActors, MeasuredCostsPerStage) {
  model::ModelConfig c;
  sim::CostConfig m;
  m.model = sim::CostModel::measured;
  m.stage_forward_ms = {1, 2};
  m.stage_backward_ms = {3, 5};
  sim::SimOptions o = actor_options(Case{Kind::one_f_one_b, 2, 4}, {}, 0);
  o.stage_costs = sim::stage_costs(m, c, 1, 2);
  const sim::SimResult r = sim::simulate(o);
  ASSERT_TRUE(r.completed) << r.error;
  EXPECT_EQ(r.busy[0], 4 * (1 + 3) * 1000000);
  EXPECT_EQ(r.busy[1], 4 * (2 + 5) * 1000000);
  // Stage 1 is the bottleneck: it waits for F0 once, then runs F1 B1 four times.
  EXPECT_EQ(r.makespan, (1 + 4 * (2 + 5) + 3) * 1000000);
}

TEST(SimActors, FlopsCostsRunPerStage) {
  model::ModelConfig c;
  c.n_layers = 8;
  sim::CostConfig cc;
  cc.model = sim::CostModel::flops;
  const Case cs{Kind::dualpipev, 4, 8};
  sim::SimOptions o = actor_options(cs, {}, 0);
  o.stage_costs = sim::stage_costs(cc, c, 1, 8);
  const sim::SimResult a = sim::simulate(o);
  ASSERT_TRUE(a.completed) << a.error;
  for (int d = 0; d < a.devices; ++d) {
    // Each rank of the V holds stages d and 7-d: F, B, W of each, once per micro-batch.
    const auto& s1 = o.stage_costs[d];
    const auto& s2 = o.stage_costs[7 - d];
    EXPECT_EQ(a.busy[d], 8 * (s1.f + s1.b + s2.f + s2.b)) << d;
    EXPECT_GE(a.bubble(d), 0);
  }
}

TEST(SimTrace, OneTrackPerDeviceWithEveryOpAndWait) {
  const Case c{Kind::one_f_one_b, 4, 4};
  sim::SimOptions o = actor_options(c, {4, 8, 3}, 2);
  o.replicas = 2;
  o.steps = 2;
  o.optimizer_ns = 10;
  o.record_timeline = true;
  const sim::SimResult a = sim::simulate(o);
  ASSERT_TRUE(a.completed) << a.error;
  const std::string path = (std::filesystem::temp_directory_path() / ("troupe-sim-trace-" + std::to_string(::getpid()) + ".json")).string();
  sim::write_sim_trace(path, o, a);
  std::ifstream in(path);
  std::stringstream ss;
  ss << in.rdbuf();
  const std::string text = ss.str();
  std::filesystem::remove(path);
  auto count = [&](const std::string& needle) {
    size_t n = 0;
    for (size_t p = text.find(needle); p != std::string::npos; p = text.find(needle, p + 1)) ++n;
    return n;
  };
  EXPECT_EQ(count("\"thread_name\""), 8u);
  EXPECT_EQ(count("\"name\":\"device 7 (replica 1, rank 3)\""), 1u);
  // Per device per step: 4 forwards and 4 backwards.
  EXPECT_EQ(count("\"cat\":\"forward\""), 8u * 2 * 4);
  EXPECT_EQ(count("\"cat\":\"backward\""), 8u * 2 * 4);
  EXPECT_EQ(count("\"cat\":\"optimizer\""), 8u * 2);
  EXPECT_GT(count("\"cat\":\"wait\""), 0u);
  EXPECT_GT(count("\"cat\":\"idle\""), 0u);  // in 1F1B every rank but 0 finishes before the pipeline drains
  EXPECT_EQ(text.rfind("{\"displayTimeUnit\"", 0), 0u);
  EXPECT_EQ(text.substr(text.size() - 4), "\n]}\n");
}

}  // namespace
}  // namespace troupe::test
