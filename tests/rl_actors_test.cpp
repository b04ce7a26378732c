// Decoupled RL on actors (actors/rl/, rl.sync = "fixed_lag"): with
// max_staleness 0 it equals the synchronous loop bit for bit; with 1 and 2
// it is deterministic, every token is exactly max_staleness versions old
// (less in the first steps) and generation of step s is dealt before the
// trainer has produced version s (the overlap); a killed generator or
// reward actor at any of its kill points loses no rollout, trains none
// twice (the ledger) and ends bitwise equal to the fault-free run.
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "actors/rl/rl_actors.hpp"
#include "tests/rl_test_util.hpp"

namespace troupe::test {
namespace {

using runtime::RlActorReport;

struct Recorder final : runtime::RlActorObserver {
  std::vector<std::vector<double>> steps;  // per step: loss, reward, kl, entropy, grad norm, ratio max
  std::vector<int64_t> sampled;            // per step: the version that sampled it
  std::vector<runtime::RlActorStepMetrics> actor_steps;
  std::vector<runtime::RestartEvent> restarts;
  std::vector<double> evals;
  void on_step(const rl::RlStepMetrics& m) override {
    steps.push_back({m.loss, m.reward_mean, m.kl_ref, m.entropy, m.grad_norm, m.ratio_max});
    sampled.push_back(m.sampled_version);
  }
  void on_eval(const rl::RlEvalMetrics& e) override { evals.push_back(e.exact_match); }
  void on_actor_step(const runtime::RlActorStepMetrics& m) override { actor_steps.push_back(m); }
  void on_restart(const runtime::RestartEvent& e) override { restarts.push_back(e); }
};

rl::RlTrainOptions small(int64_t steps) {
  rl::RlTrainOptions o = tiny_options("moe");
  o.steps = steps;
  o.rl.policy.kl_coef = 0.01;
  o.rl.prompts_per_step = 3;
  o.rl.group_size = 4;
  o.data.eval_problems = 4;
  return o;
}

runtime::RlActorOptions decoupled(const rl::RlTrainOptions& base, int64_t eta, int generators, int rewards) {
  runtime::RlActorOptions a;
  a.train = base;
  a.train.rl.sync = rl::SyncMode::fixed_lag;
  a.train.rl.max_staleness = eta;
  a.train.rl.generators = generators;
  a.train.rl.reward_actors = rewards;
  a.make_task = [] { return std::make_unique<FirstTokenTask>(); };
  return a;
}

struct Run {
  Recorder rec;
  RlActorReport rep;
};

std::unique_ptr<Run> run(const runtime::RlActorOptions& a) {
  auto r = std::make_unique<Run>();
  runtime::train_decoupled(a, r->rec, &r->rep);
  return r;
}

// Every group of every step admitted once and trained once, in step order.
void expect_exactly_once(const RlActorReport& rep, const rl::RlTrainOptions& o) {
  std::vector<rl::GroupId> want;
  for (int64_t s = 0; s < o.steps; ++s)
    for (int64_t g = 0; g < o.rl.prompts_per_step; ++g) want.push_back({o.seed, s, g});
  EXPECT_EQ(rep.ledger.trained, want);
  const std::set<rl::GroupId> admitted(rep.ledger.admitted.begin(), rep.ledger.admitted.end());
  EXPECT_EQ(admitted.size(), rep.ledger.admitted.size()) << "a group was admitted twice";
  EXPECT_EQ(admitted, std::set<rl::GroupId>(want.begin(), want.end()));
  EXPECT_EQ(rep.ledger.double_trained, 0);
  EXPECT_EQ(rep.ledger.discarded, 0);
}

TEST(RlActors, FixedLagZeroEqualsSynchronousLoop) {
  const rl::RlTrainOptions o = small(4);
  Recorder sync;
  std::vector<float> sync_params;
  {
    rl::RlTrainer tr(o, std::make_unique<FirstTokenTask>());
    sync.on_eval(tr.evaluate());
    for (int64_t i = 0; i < o.steps; ++i) sync.on_step(tr.step());
    sync.on_eval(tr.evaluate());
    sync_params = tr.parameters();
  }
  for (int gens : {1, 2}) {
    SCOPED_TRACE("generators " + std::to_string(gens));
    const auto r = run(decoupled(o, 0, gens, 2));
    EXPECT_EQ(r->rec.steps, sync.steps) << "losses, rewards, KL, entropy, grad norms per step";
    EXPECT_EQ(r->rep.parameters, sync_params) << "eta = 0 must equal the synchronous loop bit for bit";
    EXPECT_EQ(r->rec.evals, sync.evals);
    EXPECT_EQ(r->rec.sampled, sync.sampled);
    for (const auto& m : r->rec.actor_steps) {
      ASSERT_EQ(m.staleness.size(), 1u);
      EXPECT_EQ(m.staleness.begin()->first, 0) << "on-policy: every token of the trained version";
    }
    expect_exactly_once(r->rep, o);
  }
}

TEST(RlActors, FixedLagIsDeterministicAndExactlyStale) {
  const rl::RlTrainOptions o = small(5);
  std::vector<float> on_policy = run(decoupled(o, 0, 1, 1))->rep.parameters;
  for (int64_t eta : {1, 2}) {
    SCOPED_TRACE("max_staleness " + std::to_string(eta));
    const auto a = run(decoupled(o, eta, 2, 1));
    const auto b = run(decoupled(o, eta, 2, 1));
    EXPECT_EQ(a->rep.parameters, b->rep.parameters) << "two runs of one seed";
    EXPECT_EQ(a->rec.steps, b->rec.steps);
    EXPECT_NE(a->rep.parameters, on_policy) << "stale rollouts must change the training";
    ASSERT_EQ(a->rec.actor_steps.size(), static_cast<size_t>(o.steps));
    for (int64_t s = 0; s < o.steps; ++s) {
      const auto& m = a->rec.actor_steps[static_cast<size_t>(s)];
      EXPECT_EQ(m.sampled_version, std::max<int64_t>(0, s - eta));
      ASSERT_EQ(m.staleness.size(), 1u) << "step " << s;
      EXPECT_EQ(m.staleness.begin()->first, std::min(s, eta)) << "every token of step " << s;
    }
    // The overlap: step s (sampled by version s - eta) is dealt to a
    // generator before the trainer publishes version s, i.e. while it trains.
    auto at = [&](const std::string& e) {
      const auto& ev = a->rep.events;
      const auto it = std::find(ev.begin(), ev.end(), e);
      EXPECT_NE(it, ev.end()) << e;
      return it - ev.begin();
    };
    for (int64_t s = 1; s < o.steps; ++s)
      EXPECT_LT(at("deal " + std::to_string(s) + " " + std::to_string(std::max<int64_t>(0, s - eta))),
                at("publish " + std::to_string(s)))
          << "step " << s << " must be dealt before version " << s << " exists";
    expect_exactly_once(a->rep, o);
  }
}

// kill faults on every kill point of a generator and the reward actor.
struct FaultCase {
  int64_t eta;
  std::string target;
  int64_t point;
};

class RlActorFaults : public ::testing::TestWithParam<FaultCase> {};

TEST_P(RlActorFaults, KillLosesNothingTrainsNothingTwiceAndEndsBitwiseEqual) {
  const FaultCase c = GetParam();
  const rl::RlTrainOptions o = small(3);
  const auto clean = run(decoupled(o, c.eta, 2, 1));
  runtime::RlActorOptions a = decoupled(o, c.eta, 2, 1);
  runtime::FaultSpec f;
  f.at_step = 2;
  f.target = c.target;
  f.kind = runtime::FaultKind::kill;
  f.at_message = c.point;
  a.faults.push_back(f);
  const auto hit = run(a);
  ASSERT_EQ(hit->rep.restarts.size(), 1u);
  EXPECT_EQ(hit->rep.restarts[0].actor, c.target);
  EXPECT_EQ(hit->rep.restarts[0].cause, "killed");
  EXPECT_EQ(hit->rec.restarts.size(), 1u) << "the observer hears of each restart";
  EXPECT_EQ(hit->rep.parameters, clean->rep.parameters) << "the run must end bitwise equal to the fault-free run";
  EXPECT_EQ(hit->rec.steps, clean->rec.steps);
  expect_exactly_once(hit->rep, o);
}

std::vector<FaultCase> fault_cases() {
  std::vector<FaultCase> out;
  for (int64_t eta : {0, 1})
    for (const char* t : {"generator:1", "generator:0", "reward:0"})
      for (int64_t p = 0; p <= 3; ++p) out.push_back({eta, t, p});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Points, RlActorFaults, ::testing::ValuesIn(fault_cases()), [](const auto& info) {
  std::string t = info.param.target;
  t[t.find(':')] = '_';
  return "eta" + std::to_string(info.param.eta) + "_" + t + "_point" + std::to_string(info.param.point);
});

}  // namespace
}  // namespace troupe::test
