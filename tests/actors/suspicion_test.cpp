// Adaptive failure suspicion (actors/supervision/suspicion.hpp) against a
// float64 reference of the normal tail, and the run's activity clock
// (actors/device/activity.hpp) driven by hand. No threads, no sleeps.
#include <cmath>

#include <gtest/gtest.h>

#include "actors/device/activity.hpp"
#include "actors/supervision/suspicion.hpp"

namespace troupe::test {
namespace {

using runtime::Suspicion;
using runtime::SuspicionOptions;

SuspicionOptions pure_phi() {
  SuspicionOptions o;
  o.min_samples = 4;
  o.min_sd_fraction = 0.0;
  o.tail_factor = 0.0;
  o.floor = 0.0;
  return o;
}

TEST(Suspicion, NotReadyUntilEnoughSamples) {
  Suspicion s(pure_phi());
  EXPECT_EQ(s.deadline(), 0.0);
  EXPECT_EQ(s.phi(1.0), 0.0);
  for (int i = 0; i < 3; ++i) s.observe(0.1);
  EXPECT_FALSE(s.ready());
  EXPECT_EQ(s.deadline(), 0.0);
  s.observe(0.1);
  EXPECT_TRUE(s.ready());
  EXPECT_GT(s.deadline(), 0.0);
}

TEST(Suspicion, IgnoresNegativeAndNonFiniteSamples) {
  Suspicion s(pure_phi());
  s.observe(-1.0);
  s.observe(std::nan(""));
  s.observe(INFINITY);
  EXPECT_EQ(s.samples(), 0u);
}

// Samples 0.09 and 0.11 alternating: mean 0.1, sd 0.01. Phi is the normal
// tail, checked at the textbook points (P(X > mean) = 1/2, P(X > mean + sd)
// = 0.158655, P(X > mean + 3 sd) = 1.34990e-3) and monotone; the deadline is
// where it reaches 8: the 1 - 1e-8 quantile, 5.6120 sd above the mean.
TEST(Suspicion, PhiIsTheNormalTailAndTheDeadlineIsWhereItReachesTheThreshold) {
  Suspicion s(pure_phi());
  for (int i = 0; i < 100; ++i) s.observe(i % 2 ? 0.11 : 0.09);
  EXPECT_NEAR(s.mean(), 0.1, 1e-12);
  EXPECT_NEAR(s.sd(), 0.01, 1e-9);
  EXPECT_NEAR(s.phi(0.1), -std::log10(0.5), 1e-9);
  EXPECT_NEAR(s.phi(0.11), -std::log10(0.158655), 1e-5);
  EXPECT_NEAR(s.phi(0.13), -std::log10(1.34990e-3), 1e-5);
  double last = -1;
  for (double t = 0.05; t <= 0.3; t += 0.005) {
    EXPECT_GT(s.phi(t), last) << t;
    last = s.phi(t);
  }
  const double d = s.deadline();
  EXPECT_NEAR(s.phi(d), 8.0, 1e-6);
  EXPECT_NEAR(d, 0.1 + 5.6120 * 0.01, 1e-5);
}

TEST(Suspicion, GuardsTheTailFloorAndCeiling) {
  SuspicionOptions o = pure_phi();
  o.tail_factor = 2.0;
  Suspicion s(o);
  for (int i = 0; i < 9; ++i) s.observe(0.01);
  s.observe(0.5);  // one long outlier: the deadline is at least twice it
  EXPECT_GE(s.deadline(), 1.0);
  o.min_sd_fraction = 0.25;  // identical samples: sd is a quarter of the mean
  o.tail_factor = 0.0;
  Suspicion flat(o);
  for (int i = 0; i < 10; ++i) flat.observe(0.02);
  EXPECT_NEAR(flat.sd(), 0.005, 1e-12);
  EXPECT_GT(flat.deadline(), 0.02 + 5 * 0.005);
  o.floor = 1.0;
  Suspicion floored(o);
  for (int i = 0; i < 10; ++i) floored.observe(0.02);
  EXPECT_EQ(floored.deadline(), 1.0);
  o.floor = 0.0;
  o.ceiling = 0.001;
  Suspicion capped(o);
  for (int i = 0; i < 10; ++i) capped.observe(0.02);
  EXPECT_EQ(capped.deadline(), 0.001);
}

// The window forgets: after `window` fast samples a slow past no longer
// counts (a run that was loaded and is quiet again suspects sooner).
TEST(Suspicion, TheWindowAdapts) {
  SuspicionOptions o = pure_phi();
  o.window = 16;
  o.tail_factor = 2.0;
  Suspicion s(o);
  for (int i = 0; i < 16; ++i) s.observe(1.0);
  const double slow = s.deadline();
  for (int i = 0; i < 16; ++i) s.observe(0.01);
  EXPECT_EQ(s.samples(), 16u);
  EXPECT_NEAR(s.mean(), 0.01, 1e-12);
  EXPECT_LT(s.deadline(), slow / 10);
}

TEST(ActivityClock, SilenceCountsOnlyWhenNoDeviceHasWork) {
  runtime::ActivityClock c;
  c.reset(1000);
  EXPECT_EQ(c.silent_ns(1500), 500);
  c.event(1600);  // a message: 600 ns of silence ended
  EXPECT_EQ(c.longest_silence_ns(), 600);
  c.work_queued();  // now (steady clock) >> 1600: that silence is the longest
  const int64_t after_queue = c.longest_silence_ns();
  EXPECT_GT(after_queue, 600);
  EXPECT_EQ(c.silent_ns(), 0);  // busy: not silent however long it computes
  c.event();                    // a message while busy is no silence
  EXPECT_EQ(c.longest_silence_ns(), after_queue);
  c.work_done();
  const int64_t t = runtime::ActivityClock::now_ns();
  EXPECT_GE(c.silent_ns(t + 1000), 1000);
  c.reset(t);
  EXPECT_EQ(c.longest_silence_ns(), 0);
}

}  // namespace
}  // namespace troupe::test
