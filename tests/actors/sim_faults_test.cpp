// The sim devices' failure/goodput model (actors/sim/sim_faults.hpp): closed
// forms without failures, first-order expectations with many, the bounds on
// lost work of each policy, recovery restarts, determinism, bad input.
#include <gtest/gtest.h>

#include <cmath>
#include <stdexcept>

#include "actors/sim/sim_faults.hpp"

using troupe::sim::FaultModel;
using troupe::sim::study_faults;

namespace {

FaultModel base() {
  FaultModel m;
  m.devices = 16384;
  m.step_s = 2.0;
  m.mtbf_hours = 50700;  // Llama 3's rate: one failure every ~3.1 h for the job
  m.horizon_hours = 24 * 365;
  m.seed = 7;
  return m;
}

}  // namespace

TEST(SimFaults, WithoutFailuresOnlyTheOverheadsCost) {
  FaultModel m = base();
  m.mtbf_hours = 0;
  const auto s = study_faults(m);
  EXPECT_EQ(s.failures, 0);
  // troupe: every step pays its snapshot; goodput 1 / (1 + overhead), to one step.
  EXPECT_NEAR(s.troupe.goodput, 1.0 / (1.0 + m.snapshot_overhead), 1e-6);
  EXPECT_EQ(s.troupe.lost_work_s, 0);
  EXPECT_EQ(s.troupe.downtime_s, 0);
  // checkpoint-restart: k steps then a write, k = every / step.
  const double k = m.checkpoint_every_min * 60 / m.step_s;
  EXPECT_NEAR(s.checkpoint.goodput, k * m.step_s / (k * m.step_s + m.checkpoint_write_s), 1e-4);
}

TEST(SimFaults, FailureCountFollowsTheDeviceMtbf) {
  const FaultModel m = base();
  const auto s = study_faults(m);
  const double expected = m.horizon_hours * static_cast<double>(m.devices) / m.mtbf_hours;  // ~2,830
  EXPECT_NEAR(static_cast<double>(s.failures), expected, 4 * std::sqrt(expected));  // Poisson: 4 sigma
  EXPECT_NEAR(s.job_mtbf_hours, m.mtbf_hours / static_cast<double>(m.devices), 1e-9);
  EXPECT_NEAR(s.young_daly_min, std::sqrt(2 * m.checkpoint_write_s * s.job_mtbf_hours * 3600) / 60, 1e-9);
}

TEST(SimFaults, TroupeLosesAtMostOneStepPerFailureCheckpointingUpToAnInterval) {
  const FaultModel m = base();
  const auto s = study_faults(m);
  EXPECT_LE(s.troupe.max_lost_steps, 1.0 + 1e-9);
  EXPECT_GT(s.troupe.max_lost_steps, 0.5);  // over ~2,800 failures one lands late in a step
  const double k = m.checkpoint_every_min * 60 / m.step_s;
  EXPECT_LE(s.checkpoint.max_lost_steps, k + m.checkpoint_write_s / m.step_s + 1e-9);
  EXPECT_GT(s.checkpoint.max_lost_steps, 0.5 * k);
  EXPECT_GT(s.troupe.goodput, s.checkpoint_young_daly.goodput);
}

TEST(SimFaults, GoodputMatchesTheFirstOrderExpectation) {
  FaultModel m = base();
  m.recover_s = 60;  // so failures cost troupe ~0.6% here, not lost in the tolerance
  const auto s = study_faults(m);
  const double H = m.horizon_hours * 3600, F = static_cast<double>(s.failures);
  // troupe: each failure costs detect + recover + half a step (with its snapshot) on average.
  const double troupe = (H - F * (m.detect_s + m.recover_s + 0.5 * m.step_s * (1 + m.snapshot_overhead))) / H /
                        (1 + m.snapshot_overhead);
  EXPECT_NEAR(s.troupe.goodput, troupe, 0.0005);  // ~10% of what the failures cost
  EXPECT_LT(s.troupe.goodput, 0.996 / (1 + m.snapshot_overhead));  // and they do cost (~0.56%)
  // checkpoint-restart: each failure costs detect + restart + half an interval (with its write).
  const double interval = m.checkpoint_every_min * 60 + m.checkpoint_write_s;
  const double useful_share = m.checkpoint_every_min * 60 / interval;
  const double ckpt = (H - F * (m.detect_s + m.checkpoint_restart_s + 0.5 * interval)) / H * useful_share;
  EXPECT_NEAR(s.checkpoint.goodput, ckpt, 0.02);  // ~10% of what they cost: the lost half-interval varies more
  // Accounting: useful + lost + down + overhead covers the horizon (up to the
  // unfinished segment at its end).
  for (const auto* r : {&s.troupe, &s.checkpoint}) {
    const double useful = static_cast<double>(r->steps) * m.step_s;
    EXPECT_NEAR(useful + r->lost_work_s + r->downtime_s + r->overhead_s, H, 2 * interval) << r->name;
  }
}

TEST(SimFaults, AFailureDuringRecoveryStartsItAgain) {
  FaultModel m = base();
  m.devices = 1000;
  m.mtbf_hours = 1000;      // the job fails once an hour
  m.recover_s = 3 * 3600;   // and takes 3 h to recover: it almost never comes back
  m.horizon_hours = 500;
  const auto s = study_faults(m);
  EXPECT_LT(s.troupe.goodput, 0.15);
  EXPECT_GT(s.troupe.downtime_s, 0.85 * m.horizon_hours * 3600);
}

TEST(SimFaults, SameSeedSameStudyOtherSeedOtherFailures) {
  const FaultModel m = base();
  const auto a = study_faults(m), b = study_faults(m);
  EXPECT_EQ(a.failures, b.failures);
  EXPECT_EQ(a.troupe.steps, b.troupe.steps);
  EXPECT_EQ(a.checkpoint.lost_work_s, b.checkpoint.lost_work_s);
  FaultModel other = m;
  other.seed = 8;
  const auto c = study_faults(other);
  EXPECT_NE(a.checkpoint.lost_work_s, c.checkpoint.lost_work_s);
}

TEST(SimFaults, NonsenseModelsAreRefused) {
  FaultModel m = base();
  m.devices = 0;
  EXPECT_THROW(study_faults(m), std::invalid_argument);
  m = base();
  m.step_s = 0;
  EXPECT_THROW(study_faults(m), std::invalid_argument);
  m = base();
  m.recover_s = -1;
  EXPECT_THROW(study_faults(m), std::invalid_argument);
  m = base();
  m.checkpoint_every_min = 0;
  EXPECT_THROW(study_faults(m), std::invalid_argument);
  m = base();
  m.step_s = std::nan("");
  EXPECT_THROW(study_faults(m), std::invalid_argument);
}
