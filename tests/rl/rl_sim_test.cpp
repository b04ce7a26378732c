// Synchronous against decoupled RL on sim devices (actors/sim/rl_sim.hpp):
// the lengths are a pure function of (seed, step, index); with every
// completion the same length the step times have closed forms, for the
// synchronous loop, decoupled with eta = 0 (no overlap: generate, train,
// publish), and decoupled with eta large enough that generation never waits;
// completions are never older than eta versions; bad options are errors.
#include <algorithm>
#include <stdexcept>

#include <gtest/gtest.h>

#include "actors/sim/rl_sim.hpp"

namespace troupe::test {
namespace {

sim::RlSimOptions flat() {
  sim::RlSimOptions o;
  o.devices = 8;
  o.steps = 5;
  o.completions = 32;
  o.max_tokens = 4096;
  o.mean_tokens = 100;
  o.sigma = 0;  // every completion has 100 tokens
  o.slots = 4;
  o.decode_ns_per_token = 1000;
  o.reward_ns = 500;
  o.train_ns_per_token = 40;
  o.sync_ns = 7000;
  return o;
}

TEST(RlSim, LengthsArePureAndCapped) {
  sim::RlSimOptions o = flat();
  o.sigma = 1.5;
  o.max_tokens = 300;
  const auto a = sim::completion_lengths(o, 3), b = sim::completion_lengths(o, 3), c = sim::completion_lengths(o, 4);
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  for (int64_t l : a) {
    EXPECT_GE(l, 1);
    EXPECT_LE(l, 300);
  }
  EXPECT_EQ(*std::max_element(a.begin(), a.end()), 300) << "sigma 1.5 reaches the cap among 32";
  o.seed = 2;
  EXPECT_NE(sim::completion_lengths(o, 3), a);
  for (int64_t l : sim::completion_lengths(flat(), 0)) EXPECT_EQ(l, 100);
}

TEST(RlSim, SynchronousClosedForm) {
  const sim::RlSimOptions o = flat();
  // 32 completions over 8 devices: 4 each, one per slot, all at once.
  const int64_t gen = 100 * 1000 + 500;
  const int64_t train = (32 * 100 * 40 + 7) / 8;
  const sim::RlSimResult r = sim::simulate_synchronous(o);
  EXPECT_EQ(r.makespan_ns, 5 * (gen + train));
  ASSERT_EQ(r.step_end_ns.size(), 5u);
  EXPECT_EQ(r.step_end_ns[0], gen + train);
  EXPECT_EQ(r.tokens, 5 * 32 * 100);
  // Twice as many completions: two rounds of slots.
  sim::RlSimOptions o2 = o;
  o2.completions = 64;
  EXPECT_EQ(sim::simulate_synchronous(o2).makespan_ns, 5 * (2 * gen + (64 * 100 * 40 + 7) / 8));
}

TEST(RlSim, SharedHostCostsApplyOnlyWhenDevicesRunAPhaseTogether) {
  sim::RlSimOptions o = flat();
  o.parallel_decode_ns_per_token = 1500;  // devices sharing a host slow each other down
  o.parallel_train_ns_per_token = 60;
  o.train_step_ns = 900;
  // Synchronous: all 8 devices generate and train at once: the parallel costs.
  const int64_t gen = 100 * 1500 + 500, train = (32 * 100 * 60 + 7) / 8 + 900;
  EXPECT_EQ(sim::simulate_synchronous(o).makespan_ns, 5 * (gen + train));
  // Decoupled with one generator and 7 trainers: the generator decodes at its
  // one-device cost (8 rounds of 4 slots), the trainers at the parallel one.
  // eta = 0: no overlap.
  const int64_t gen1 = 8 * (100 * 1000 + 500), train7 = (32 * 100 * 60 + 6) / 7 + 900;
  EXPECT_EQ(sim::simulate_decoupled(o, 0, 1).makespan_ns, 5 * (gen1 + train7) + 4 * o.sync_ns);
  // One trainer: its one-device cost (7 generators x 4 slots: two rounds).
  const int64_t gen7 = 2 * (100 * 1500 + 500), train1 = 32 * 100 * 40 + 900;
  EXPECT_EQ(sim::simulate_decoupled(o, 0, 7).makespan_ns, 5 * (gen7 + train1) + 4 * o.sync_ns);
  o.train_step_ns = -1;
  EXPECT_THROW(sim::simulate_synchronous(o), std::invalid_argument);
}

TEST(RlSim, DecoupledWithoutLagDoesNotOverlap) {
  const sim::RlSimOptions o = flat();
  // 4 generators x 4 slots = 16 completions at once: two rounds for 32.
  const int64_t gen = 2 * (100 * 1000 + 500);
  const int64_t train = (32 * 100 * 40 + 3) / 4;
  const sim::RlSimResult r = sim::simulate_decoupled(o, 0, 4);
  EXPECT_EQ(r.makespan_ns, 5 * (gen + train) + 4 * o.sync_ns);
  EXPECT_EQ(r.version_lag, std::vector<int64_t>({5 * 32}));
}

TEST(RlSim, DecoupledWithEnoughLagNeverWaitsForWeights) {
  sim::RlSimOptions o = flat();
  o.slots = 8;  // 4 generators x 8 slots = one step's 32 completions
  const int64_t gen = 100 * 1000 + 500;
  const int64_t train = (32 * 100 * 40 + 3) / 4;
  ASSERT_LT(train, gen);
  // eta >= steps: every step's completions may start at once; the slots run
  // them one step after another, and the trainer follows the last one.
  const sim::RlSimResult r = sim::simulate_decoupled(o, 5, 4);
  EXPECT_EQ(r.makespan_ns, 5 * gen + train);
  for (int s = 0; s < 5; ++s) EXPECT_EQ(r.step_end_ns[static_cast<size_t>(s)], (s + 1) * gen + train);
  // Step s runs version max(0, s - 5) = 0: lag s.
  EXPECT_EQ(r.version_lag, std::vector<int64_t>({32, 32, 32, 32, 32, 0}));
}

TEST(RlSim, NoCompletionIsOlderThanEta) {
  sim::RlSimOptions o = flat();
  o.sigma = 1.0;
  o.steps = 9;
  for (int eta : {1, 2, 4}) {
    const sim::RlSimResult r = sim::simulate_decoupled(o, eta, 3);
    ASSERT_EQ(r.version_lag.size(), static_cast<size_t>(eta) + 1);
    // Steps 0..eta-1 use version 0 (lags 0..eta-1), the rest exactly eta.
    for (int lag = 0; lag < eta; ++lag) EXPECT_EQ(r.version_lag[static_cast<size_t>(lag)], 32) << "eta " << eta;
    EXPECT_EQ(r.version_lag[static_cast<size_t>(eta)], (9 - eta) * 32) << "eta " << eta;
    // Deterministic.
    EXPECT_EQ(sim::simulate_decoupled(o, eta, 3).step_end_ns, r.step_end_ns);
  }
}

TEST(RlSim, ALongTailIsWhereDecouplingWins) {
  sim::RlSimOptions o = flat();
  o.devices = 64;
  o.completions = 256;
  o.sigma = 1.0;
  o.max_tokens = 2000;
  o.slots = 8;
  o.steps = 10;
  const int64_t sync = sim::simulate_synchronous(o).makespan_ns;
  const sim::RlSimResult d0 = sim::best_decoupled(o, 0), d2 = sim::best_decoupled(o, 2);
  EXPECT_GE(d0.makespan_ns, sync) << "without lag a split can only lose devices";
  EXPECT_LT(d2.makespan_ns, sync);
  EXPECT_GE(d2.generators, 1);
  EXPECT_LT(d2.generators, 64);
}

TEST(RlSim, BadOptionsAreErrors) {
  sim::RlSimOptions o = flat();
  EXPECT_THROW(sim::simulate_decoupled(o, 1, 0), std::invalid_argument);
  EXPECT_THROW(sim::simulate_decoupled(o, 1, 8), std::invalid_argument);
  EXPECT_THROW(sim::simulate_decoupled(o, -1, 2), std::invalid_argument);
  o.slots = 0;
  EXPECT_THROW(sim::simulate_synchronous(o), std::invalid_argument);
  o = flat();
  o.devices = 1;
  EXPECT_THROW(sim::simulate_synchronous(o), std::invalid_argument);
}

}  // namespace
}  // namespace troupe::test
