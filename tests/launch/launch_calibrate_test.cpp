// Calibration's reading of a device trace (launch/calibrate.hpp) when the
// schedule splits backwards: a split chunk's full backward is its B plus its
// W, and the W's give the weight part (stage_weight_ms) the sim subtracts
// from a split B. A synthetic two-stage zb1p-like trace with known times.
#include <gtest/gtest.h>

#include <cmath>

#include "launch/calibrate.hpp"
#include "launch/calibrate_rl.hpp"
#include "launch/run_plan.hpp"

namespace troupe::launch {
namespace {

runtime::TraceEvent event(runtime::TraceLabel::Kind kind, int mb, int stage, int64_t start_ms, int64_t ms) {
  runtime::TraceEvent e;
  e.label.kind = kind;
  e.label.mb = static_cast<int16_t>(mb);
  e.label.stage = static_cast<int16_t>(stage);
  e.label.chunk = 0;
  e.label.owner = static_cast<int16_t>(stage);
  e.start_ns = start_ms * 1000000;
  e.end_ns = (start_ms + ms) * 1000000;
  return e;
}

Spec two_stages(const std::string& schedule) {
  Spec s;
  s.source = "test";
  s.topology.devices = 2;
  s.topology.stages = 2;
  s.topology.microbatches = 2;
  s.topology.schedule = sched::parse_kind(schedule);
  return s;
}

TEST(Calibrate, SplitBackwardIsBPlusWAndWIsTheWeightPart) {
  using K = runtime::TraceLabel;
  const Spec spec = two_stages("zb1p");
  // Stage s: F 2 ms, B 3 ms (stage 1: 5), W 1 ms (stage 1: 2) for mb 0 and 1.
  std::vector<runtime::DeviceTrace> tr(2);
  for (int s = 0; s < 2; ++s) {
    tr[s].device = s;
    int64_t t = 0;
    for (int mb = 0; mb < 2; ++mb) tr[s].events.push_back(event(K::Forward, mb, s, t += 10, 2));
    for (int mb = 0; mb < 2; ++mb) {
      tr[s].events.push_back(event(K::Backward, mb, s, t += 10, s == 0 ? 3 : 5));
      tr[s].events.push_back(event(K::Weight, mb, s, t += 10, s == 0 ? 1 : 2));
    }
  }
  const OpTimes m = read_op_times(tr, {{0, int64_t{1000} * 1000000}}, spec, resolve_topology(spec));
  ASSERT_EQ(m.f.size(), 2u);
  EXPECT_DOUBLE_EQ(m.f[0], 2.0);
  EXPECT_DOUBLE_EQ(m.b[0], 4.0);
  EXPECT_DOUBLE_EQ(m.b[1], 7.0);
  ASSERT_EQ(m.w.size(), 2u);
  EXPECT_DOUBLE_EQ(m.w[0], 1.0);
  EXPECT_DOUBLE_EQ(m.w[1], 2.0);

  // Unsplit (1F1B): B is the full backward, no weight part.
  for (auto& d : tr) std::erase_if(d.events, [](const runtime::TraceEvent& e) { return e.label.kind == K::Weight; });
  const OpTimes u = read_op_times(tr, {{0, int64_t{1000} * 1000000}}, two_stages("1f1b"), resolve_topology(spec));
  EXPECT_DOUBLE_EQ(u.b[0], 3.0);
  EXPECT_DOUBLE_EQ(u.b[1], 5.0);
  EXPECT_TRUE(u.w.empty());
}

TEST(CalibrateRl, LogNormalFitIsTheMeanAndSdOfTheLogs) {
  double mean = 0, sigma = 0;
  fit_log_normal({50, 50, 50}, mean, sigma);
  EXPECT_NEAR(mean, 50.0, 1e-9);
  EXPECT_NEAR(sigma, 0.0, 1e-6);
  // ln 10 and ln 1000: mu = ln 100, sigma = ln 10; the mean is exp(mu + sigma^2 / 2).
  fit_log_normal({10, 1000}, mean, sigma);
  EXPECT_NEAR(sigma, std::log(10.0), 1e-9);
  EXPECT_NEAR(mean, 100.0 * std::exp(0.5 * std::log(10.0) * std::log(10.0)), 1e-6);
  fit_log_normal({}, mean, sigma);
  EXPECT_EQ(mean, 0.0);
}

}  // namespace
}  // namespace troupe::launch
