// Expert parallelism on sim devices (actors/sim/ep_sim.hpp) against closed
// forms: uniform loads make every placement equal, one hot expert makes the
// static step its load, EPLB with enough replicas reaches the balanced bound,
// and a migration dearer than its gain is refused.
#include <gtest/gtest.h>

#include "actors/sim/ep_sim.hpp"

namespace troupe::sim {
namespace {

EpSimOptions small() {
  EpSimOptions o;
  o.devices = 16;
  o.experts = 64;
  o.slots_per_device = 5;  // 16 redundant slots
  o.layers = 3;
  o.steps = 30;
  o.tokens = 1 << 14;  // powers of two: exact sums
  o.top_k = 4;
  o.d_model = 256;
  o.expert_hidden = 128;
  o.flops_per_ns = 1000;
  o.link_bytes_per_ns = 100;
  o.link_latency_ns = 2000;
  o.zipf = 1.0;
  o.drift_every = 5;
  o.drift = 0.2;
  o.ema = 0.5;
  o.rebalance_every = 5;
  o.tolerance = 0.02;
  o.bytes_per_param = 12;
  o.seed = 7;
  return o;
}

TEST(EpSim, UniformLoadsMakeEveryPlacementEqual) {
  EpSimOptions o = small();
  o.zipf = 0;
  o.slots_per_device = 4;  // no redundant slots: eplb packs 4 equal copies per device
  const EpSimResult s = simulate_ep_static(o), e = simulate_ep_eplb(o), b = simulate_ep_balanced(o);
  EXPECT_EQ(s.step_ns, b.step_ns);
  EXPECT_EQ(e.step_ns, b.step_ns);
  EXPECT_EQ(e.rebalances, 0);  // nothing to gain
  EXPECT_EQ(e.stall_ns, 0);
  // The balanced step, by hand: per layer compute + four all-to-alls.
  const double copies = double(o.tokens) * o.top_k / o.devices;
  const double layer = copies * 18.0 * o.d_model * o.expert_hidden / o.flops_per_ns +
                       4.0 * (o.link_latency_ns + copies * 4.0 * o.d_model / o.link_bytes_per_ns);
  EXPECT_NEAR(double(b.step_ns[0]), layer * o.layers, o.layers);
}

TEST(EpSim, OneHotExpertMakesTheStaticStepItsLoad) {
  EpSimOptions o = small();
  o.zipf = 40;  // rank 1 takes all but 1e-12 of the tokens
  o.drift_every = 0;
  const EpSimResult s = simulate_ep_static(o), b = simulate_ep_balanced(o);
  const double all = double(o.tokens) * o.top_k;
  const double layer = all * ep_flops_per_copy(o) / o.flops_per_ns +
                       4.0 * (o.link_latency_ns + all * 4.0 * o.d_model / o.link_bytes_per_ns);
  EXPECT_NEAR(double(s.step_ns[0]), layer * o.layers, 1e-6 * layer);
  EXPECT_NEAR(s.imbalance[0], double(o.devices), 1e-6);
  EXPECT_GT(s.total_ns, 10 * b.total_ns);
}

TEST(EpSim, EplbWithEnoughReplicasReachesBalanced) {
  EpSimOptions o = small();
  o.zipf = 40;
  o.drift_every = 0;
  o.slots_per_device = 5;  // 16 spare slots: the hot expert gets a copy on every device
  const EpSimResult e = simulate_ep_eplb(o), b = simulate_ep_balanced(o);
  EXPECT_EQ(e.rebalances, o.layers);  // once, at step 1; afterwards nothing to gain
  EXPECT_GT(e.skipped, 0);
  EXPECT_GT(e.stall_ns, 0);
  EXPECT_EQ(e.step_ns[1] - e.step_ns[2], e.stall_ns);  // the migration stall, on step 1 only
  EXPECT_LE(e.after_rebalance, 1.0 + 1e-6);
  for (int s = 2; s < o.steps; ++s) EXPECT_LE(double(e.step_ns[s]), 1.001 * double(b.step_ns[s])) << s;
  // Before the first rebalance (placed for uniform loads) the hot expert has at most 2 copies.
  EXPECT_GT(e.step_ns[0], 4 * b.step_ns[0]);
}

TEST(EpSim, SkewedAndDriftingLoadsOrderThePlacements) {
  const EpSimOptions o = small();
  const EpSimResult s = simulate_ep_static(o), e = simulate_ep_eplb(o), b = simulate_ep_balanced(o);
  for (int i = 0; i < o.steps; ++i) {
    EXPECT_GE(s.step_ns[i], b.step_ns[i]);  // balanced is a lower bound
    EXPECT_GE(e.step_ns[i], b.step_ns[i]);
    EXPECT_GE(s.imbalance[i], 1.0);
  }
  EXPECT_LT(e.total_ns, s.total_ns);
  EXPECT_GT(e.rebalances, 0);
  EXPECT_GT(e.copies_moved, 0);
  EXPECT_LT(e.after_rebalance, s.imbalance.back());
  // Same options, same run; another seed, another run.
  EXPECT_EQ(simulate_ep_eplb(o).step_ns, e.step_ns);
  EpSimOptions other = o;
  other.seed = 8;
  EXPECT_NE(simulate_ep_static(other).step_ns, s.step_ns);
}

double mean_imbalance(const EpSimResult& r) {
  double sum = 0;
  for (double x : r.imbalance) sum += x;
  return sum / static_cast<double>(r.imbalance.size());
}

TEST(EpSim, ImbalanceThresholdCatchesDriftBetweenPeriodicRebalances) {
  EpSimOptions o = small();
  o.ema = 1;
  o.rebalance_every = 10;
  o.drift_every = 3;  // drifts land between the periodic rebalances
  const EpSimResult periodic = simulate_ep_eplb(o);
  o.imbalance_threshold = 1.05;
  const EpSimResult reactive = simulate_ep_eplb(o);
  EXPECT_GT(reactive.rebalances, periodic.rebalances);
  EXPECT_LT(mean_imbalance(reactive), mean_imbalance(periodic));
  EXPECT_LT(reactive.total_ns, periodic.total_ns);
}

TEST(EpSim, MigrationDearerThanItsGainIsRefused) {
  EpSimOptions o = small();
  o.bytes_per_param = 1 << 30;  // moving one expert copy costs far more than ten steps
  const EpSimResult e = simulate_ep_eplb(o);
  EXPECT_EQ(e.rebalances, 0);
  EXPECT_GT(e.skipped, 0);
  EXPECT_EQ(e.stall_ns, 0);
  EXPECT_EQ(e.copies_moved, 0);
}

TEST(EpSim, BadOptionsAreRefused) {
  EpSimOptions o = small();
  o.slots_per_device = 3;  // 48 slots for 64 experts
  EXPECT_THROW(simulate_ep_eplb(o), std::invalid_argument);
  o = small();
  o.experts = 8;  // fewer experts than devices
  EXPECT_THROW(simulate_ep_static(o), std::invalid_argument);
}

}  // namespace
}  // namespace troupe::sim
