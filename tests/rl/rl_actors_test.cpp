// Decoupled RL on actors (actors/rl/, rl.sync = "fixed_lag"): with
// max_staleness 0 it equals the synchronous loop bit for bit; with 1 and 2
// it is deterministic, every token is exactly max_staleness versions old
// (less in the first steps) and generation of step s is dealt before the
// trainer has produced version s (the overlap); a killed generator or
// reward actor at any of its kill points loses no rollout, trains none
// twice (the ledger) and ends bitwise equal to the fault-free run.
// rl.sync = "latest": with eta 0 it equals fixed_lag bit for bit; with eta > 0
// every token's version stays in [s - eta, s] and kills keep exactly-once
// (a rollout spanning a publication: tests/rl/rl_protocol_test.cpp). Weight-sync
// deadlines: a lost sync is retried, a second loss restarts the generator,
// and the run still ends as the fault-free one (fixed_lag: bitwise).
#include <algorithm>
#include <cstdio>
#include <iostream>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>

#include "actors/rl/rl_actors.hpp"
#include "actors/supervision/chaos.hpp"
#include "rl/rm_trainer.hpp"
#include "tests/rl/rl_test_util.hpp"

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

rl::RlTrainOptions small(int64_t steps) { return small_options(steps); }

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

// The same with rl.sync = "latest" (which needs the decoupled PPO loss).
runtime::RlActorOptions latest(rl::RlTrainOptions base, int64_t eta, int generators, int rewards) {
  base.rl.policy.kind = rl::LossKind::decoupled_ppo;
  runtime::RlActorOptions a = decoupled(base, eta, generators, rewards);
  a.train.rl.sync = rl::SyncMode::latest;
  return a;
}

// Every token trained at step s (trainer version s) is at most eta versions
// old, and none is newer than the trainer.
void expect_within_bound(const std::vector<runtime::RlActorStepMetrics>& steps, int64_t eta) {
  for (const auto& m : steps)
    for (const auto& [lag, n] : m.staleness) {
      EXPECT_GE(lag, 0) << "step " << m.step;
      EXPECT_LE(lag, eta) << "step " << m.step << ": " << n << " tokens too stale";
    }
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

// rl.sft_fraction through the actors: the generators and the trainer each
// build the mixed task from the options (no test task here), so eta = 0
// still equals the synchronous loop bit for bit; the mix changes what is
// trained, and every evaluation scores the SFT side of the split too.
TEST(RlActors, SftSidePromptsThroughTheActorsEqualTheSynchronousLoop) {
  rl::RlTrainOptions o = small(3);
  o.data.source = model::DataKind::addition;
  o.data.digits = 1;
  o.data.target_pairs = "6-9+6-9";
  o.data.target_column = 0;
  o.rl.prompts_per_step = 4;
  o.rl.sft_fraction = 0.5;
  const auto sync_run = [](const rl::RlTrainOptions& opt, Recorder& rec, rl::RlEvalMetrics& first) {
    rl::RlTrainer tr(opt);
    first = tr.evaluate();
    rec.on_eval(first);
    for (int64_t i = 0; i < opt.steps; ++i) rec.on_step(tr.step());
    rec.on_eval(tr.evaluate());
    return tr.parameters();
  };
  Recorder sync;
  rl::RlEvalMetrics first;
  const std::vector<float> sync_params = sync_run(o, sync, first);
  EXPECT_EQ(first.problems, 4);
  EXPECT_EQ(first.sft_problems, 4) << "the SFT side is scored at every evaluation";
  runtime::RlActorOptions a = decoupled(o, 0, 2, 1);
  a.make_task = nullptr;  // every actor builds rl::make_task(options)
  const auto r = run(a);
  EXPECT_EQ(r->rec.steps, sync.steps);
  EXPECT_EQ(r->rep.parameters, sync_params) << "eta = 0 with the mixed task must equal the synchronous loop";
  EXPECT_EQ(r->rec.evals, sync.evals);
  expect_exactly_once(r->rep, o);
  Recorder unmixed;
  o.rl.sft_fraction = 0.0;
  EXPECT_NE(sync_run(o, unmixed, first), sync_params) << "the SFT-side prompts must change the training";
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

TEST(RlActors, LatestWithEtaZeroEqualsFixedLagBitwise) {
  // No publication can land mid-rollout with eta 0 (version s + 1 needs step
  // s trained), so latest reduces to fixed_lag.
  rl::RlTrainOptions o = small(4);
  o.rl.policy.kind = rl::LossKind::decoupled_ppo;
  const auto fixed = run(decoupled(o, 0, 2, 1));
  const auto lat = run(latest(o, 0, 2, 1));
  EXPECT_EQ(lat->rep.parameters, fixed->rep.parameters);
  EXPECT_EQ(lat->rec.steps, fixed->rec.steps);
  EXPECT_EQ(lat->rep.mixed_completions, 0);
  expect_within_bound(lat->rec.actor_steps, 0);
  expect_exactly_once(lat->rep, o);
}

TEST(RlActors, LatestKeepsEveryTokenWithinTheStalenessBound) {
  const rl::RlTrainOptions o = small(6);
  for (int64_t eta : {1, 2}) {
    SCOPED_TRACE("max_staleness " + std::to_string(eta));
    const auto r = run(latest(o, eta, 2, 1));
    ASSERT_EQ(r->rec.actor_steps.size(), static_cast<size_t>(o.steps));
    expect_within_bound(r->rec.actor_steps, eta);
    for (const auto& m : r->rec.actor_steps) {
      int64_t tokens = 0;
      for (const auto& [lag, n] : m.staleness) tokens += n;
      EXPECT_GT(tokens, 0) << "every token's version is recorded, step " << m.step;
      EXPECT_GE(m.sampled_version, std::max<int64_t>(0, m.step - 1 - eta)) << "dealt once admissible";
    }
    for (const std::string& e : r->rep.events)
      if (e.rfind("deal ", 0) == 0) {
        int64_t step = 0, v = 0;
        ASSERT_EQ(std::sscanf(e.c_str(), "deal %ld %ld", &step, &v), 2);
        EXPECT_EQ(v, std::max<int64_t>(0, step - eta)) << e;
      }
    expect_exactly_once(r->rep, o);
    EXPECT_EQ(r->rep.ledger.discarded, 0) << "generators are paused, never discarded";
  }
}

// Weight-sync deadlines: a generator loses `count` syncs from step 2 on.
struct SyncCase {
  rl::SyncMode mode;
  int64_t count;
};

class RlActorSyncDeadline : public ::testing::TestWithParam<SyncCase> {};

TEST_P(RlActorSyncDeadline, LostSyncIsRetriedThenRestartedAndNothingHangs) {
  const SyncCase c = GetParam();
  const rl::RlTrainOptions o = small(4);
  const bool lat = c.mode == rl::SyncMode::latest;
  // latest with eta 0: step s needs version s, the newest there is, so the
  // one generator cannot start it without the lost sync and the trainer
  // cannot publish a newer version to stand in for it (eta > 0 would let a
  // later confirmation cancel the lost one, or not, by timing).
  const std::string target = lat ? "generator:0" : "generator:1";
  auto make = [&] {
    runtime::RlActorOptions a = lat ? latest(o, 0, 1, 1) : decoupled(o, 1, 2, 1);
    a.train.rl.sync_deadline_ms = 400;
    return a;
  };
  const auto clean = run(make());
  runtime::RlActorOptions a = make();
  runtime::FaultSpec f;
  f.at_step = 2;
  f.target = target;
  f.kind = runtime::FaultKind::drop;
  f.count = c.count;
  a.faults.push_back(f);
  const auto hit = run(a);
  const auto& ev = hit->rep.events;
  auto seen = [&](const std::string& prefix) {
    return std::any_of(ev.begin(), ev.end(), [&](const std::string& e) { return e.rfind(prefix, 0) == 0; });
  };
  EXPECT_GE(hit->rep.sync_retries, 1);
  EXPECT_TRUE(seen("sync retry " + target + " "));
  if (c.count >= 2) {
    EXPECT_GE(hit->rep.sync_restarts, 1);
    EXPECT_TRUE(seen("sync restart " + target + " "));
    ASSERT_FALSE(hit->rep.restarts.empty());
    EXPECT_EQ(hit->rep.restarts[0].actor, target);
    EXPECT_EQ(hit->rep.restarts[0].cause, "weight sync deadline missed twice");
  }
  EXPECT_EQ(static_cast<int64_t>(hit->rep.restarts.size()), hit->rep.sync_restarts)
      << "every restart here is a sync restart";
  expect_exactly_once(hit->rep, o);
  // fixed_lag, and latest with eta 0 (no publication can land mid-rollout),
  // are pure functions of the seed: the run ends as the fault-free one.
  EXPECT_EQ(hit->rep.parameters, clean->rep.parameters) << "ends bitwise equal to the fault-free run";
  EXPECT_EQ(hit->rec.steps, clean->rec.steps);
  expect_within_bound(hit->rec.actor_steps, lat ? 0 : 1);
}

INSTANTIATE_TEST_SUITE_P(Drops, RlActorSyncDeadline,
                         ::testing::Values(SyncCase{rl::SyncMode::fixed_lag, 1}, SyncCase{rl::SyncMode::fixed_lag, 2},
                                           SyncCase{rl::SyncMode::latest, 1}, SyncCase{rl::SyncMode::latest, 2}),
                         [](const auto& info) {
                           return std::string(rl::sync_mode_name(info.param.mode)) + "_lose" +
                                  std::to_string(info.param.count);
                         });

// reward_model:K actors (rl.reward = "model"): a tiny RM of the policy's
// model, trained and saved once per test process.
struct SavedRm {
  std::string dir;
  SavedRm() {
    dir = (std::filesystem::temp_directory_path() / ("troupe_rl_actors_rm_" + std::to_string(::getpid()))).string();
    std::filesystem::remove_all(dir);
    rl::RlTrainOptions o = small(1);
    o.rl.rm_prompts = 12;
    o.rl.rm_batch = 16;
    o.optim.lr = 3e-3;
    rl::RmTrainer tr(o, std::make_unique<FirstTokenTask>());
    for (int i = 0; i < 6; ++i) tr.step();
    tr.save(dir);
  }
  ~SavedRm() { std::filesystem::remove_all(dir); }
};
const std::string& saved_rm() {
  static SavedRm rm;
  return rm.dir;
}

rl::RlTrainOptions rewarded_by_rm(int64_t steps) {
  rl::RlTrainOptions o = small(steps);
  o.rl.reward = rl::RewardSource::model;
  o.rl.reward_model = saved_rm();
  return o;
}

TEST(RlActors, RewardModelActorsEqualTheSynchronousLoopWithTheRm) {
  const rl::RlTrainOptions o = rewarded_by_rm(3);
  std::vector<float> sync_params;
  std::vector<double> sync_rewards;
  {
    rl::RlTrainer tr(o, std::make_unique<FirstTokenTask>());
    for (int64_t i = 0; i < o.steps; ++i) sync_rewards.push_back(tr.step().reward_mean);
    sync_params = tr.parameters();
  }
  const auto r = run(decoupled(o, 0, 2, 2));
  EXPECT_EQ(r->rep.parameters, sync_params) << "the RM served by reward_model:K actors, batched per step, bit for bit";
  ASSERT_EQ(r->rec.steps.size(), sync_rewards.size());
  for (size_t i = 0; i < sync_rewards.size(); ++i) {
    EXPECT_EQ(r->rec.steps[i][1], sync_rewards[i]) << "step " << i;
    EXPECT_GT(sync_rewards[i], 0.0);
    EXPECT_LT(sync_rewards[i], 1.0) << "sigmoid of RM scores, not the verifier's 0/1";
  }
  expect_exactly_once(r->rep, o);
}

// Continuous batching (rl.slots): neither the slots a sequence decodes in,
// nor a generator mixing two steps in its slots, nor a generator killed
// mid-rollout changes a bit. The synchronous loop with 2 slots equals it with
// a whole step's; fixed_lag with 3 slots and 2 generators, and again with a
// generator killed while its step was in flight, equals 1 generator with a
// whole step's slots; latest with 3 slots keeps exactly-once and the bound
// under the same kill.
TEST(RlActors, SlotsStepMixingAndKillsChangeNoBit) {
  rl::RlTrainOptions o = small(4);
  o.rl.max_new_tokens = 6;  // completions of different lengths: slots free at different steps
  auto sync_params = [](rl::RlTrainOptions opt, int64_t slots) {
    opt.rl.slots = slots;
    rl::RlTrainer tr(opt, std::make_unique<FirstTokenTask>());
    for (int64_t i = 0; i < opt.steps; ++i) tr.step();
    return tr.parameters();
  };
  EXPECT_EQ(sync_params(o, 2), sync_params(o, 0)) << "synchronous: 2 slots against a whole step's";
  auto with_slots = [](runtime::RlActorOptions a, int64_t slots) {
    a.train.rl.slots = slots;
    return a;
  };
  auto killed = [](runtime::RlActorOptions a, const std::string& target) {
    runtime::FaultSpec f;
    f.at_step = 2;
    f.target = target;
    f.kind = runtime::FaultKind::kill;
    f.at_message = 2;  // the rollout is lost with the generator
    a.faults.push_back(f);
    return a;
  };
  const auto ref = run(with_slots(decoupled(o, 1, 1, 1), 0));
  const auto mixed = run(with_slots(decoupled(o, 1, 2, 1), 3));
  EXPECT_EQ(mixed->rep.parameters, ref->rep.parameters) << "fixed_lag: 3 slots, 2 generators";
  EXPECT_EQ(mixed->rec.steps, ref->rec.steps);
  expect_exactly_once(mixed->rep, o);
  const auto hit = run(killed(with_slots(decoupled(o, 1, 2, 1), 3), "generator:0"));
  ASSERT_EQ(hit->rep.restarts.size(), 1u);
  EXPECT_EQ(hit->rep.parameters, ref->rep.parameters) << "fixed_lag: 3 slots, a generator killed mid-rollout";
  expect_exactly_once(hit->rep, o);
  const auto late = run(killed(with_slots(latest(o, 1, 2, 1), 3), "generator:1"));
  ASSERT_EQ(late->rep.restarts.size(), 1u);
  expect_within_bound(late->rec.actor_steps, 1);
  expect_exactly_once(late->rep, o);
}

// kill faults on every kill point of a generator, the reward actor and the
// rollout buffer (a respawned buffer goes on from its store).
struct FaultCase {
  int64_t eta;
  std::string target;
  int64_t point;
  rl::SyncMode mode = rl::SyncMode::fixed_lag;
};

class RlActorFaults : public ::testing::TestWithParam<FaultCase> {};

TEST_P(RlActorFaults, KillLosesNothingTrainsNothingTwiceAndEndsBitwiseEqual) {
  const FaultCase c = GetParam();
  const rl::RlTrainOptions o = small(3);
  if (c.mode == rl::SyncMode::latest) {
    // latest is not bitwise reproducible: exactly-once and the bound only.
    runtime::RlActorOptions a = latest(o, c.eta, 2, 1);
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
    expect_within_bound(hit->rec.actor_steps, c.eta);
    expect_exactly_once(hit->rep, o);
    return;
  }
  const rl::RlTrainOptions base = c.target.rfind("reward_model:", 0) == 0 ? rewarded_by_rm(3) : o;
  const auto clean = run(decoupled(base, c.eta, 2, 1));
  runtime::RlActorOptions a = decoupled(base, c.eta, 2, 1);
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
    for (const char* t : {"generator:1", "generator:0", "reward:0", "rollout_buffer"})
      for (int64_t p = 0; p <= 3; ++p) out.push_back({eta, t, p});
  for (const char* t : {"generator:1", "generator:0", "reward:0", "rollout_buffer"})
    for (int64_t p = 0; p <= 3; ++p) out.push_back({1, t, p, rl::SyncMode::latest});
  for (int64_t p = 0; p <= 3; ++p) out.push_back({1, "reward_model:0", p});
  return out;
}

INSTANTIATE_TEST_SUITE_P(Points, RlActorFaults, ::testing::ValuesIn(fault_cases()), [](const auto& info) {
  std::string t = info.param.target;
  if (const auto colon = t.find(':'); colon != std::string::npos) t[colon] = '_';  // gtest names: letters, digits and underscores
  return std::string(info.param.mode == rl::SyncMode::latest ? "latest_" : "") + "eta" +
         std::to_string(info.param.eta) + "_" + t + "_point" + std::to_string(info.param.point);
});

// [chaos] on the RL actors: more than 50 seeded faults — kills at seeded
// points of generators and reward actors, lost weight syncs of generators,
// and duplicated, delayed or held (pause) messages to either — each aimed at
// the actor that handles its step. Every group is admitted
// and trained exactly once and the run ends bitwise equal to the fault-free
// run (fixed_lag, eta 1, two generators, two reward actors).
TEST(RlActorChaos, FiftySeededFaultsOnGeneratorsAndRewardActorsEndBitwiseEqual) {
  const rl::RlTrainOptions o = small(40);
  runtime::RlActorOptions base = decoupled(o, 1, 2, 2);
  base.train.rl.sync_deadline_ms = 300;  // a lost sync is found by its deadline
  const auto clean = run(base);

  runtime::ChaosOptions c;
  c.seed = 5;
  c.mean_steps_between_faults = 0.35;
  runtime::RlActorOptions a = base;
  a.faults = runtime::rl_chaos_schedule(c, 2, 2, false, o.steps);
  a.max_restarts = 1000;
  ASSERT_GE(a.faults.size(), 50u);
  std::set<std::string> targets, kind_role;
  for (const auto& f : a.faults) {
    targets.insert(f.target);
    kind_role.insert(std::string(runtime::fault_kind_name(f.kind)) + " " + f.target.substr(0, f.target.find(':')));
    // Aimed at the actor that handles its step.
    const int64_t k = (f.at_step - 1) % 2;
    EXPECT_EQ(f.target.back() - '0', k) << runtime::describe(f);
  }
  EXPECT_EQ(targets, (std::set<std::string>{"generator:0", "generator:1", "reward:0", "reward:1"}));
  EXPECT_EQ(kind_role, (std::set<std::string>{"kill generator", "kill reward", "drop generator", "duplicate generator",
                                              "duplicate reward", "delay generator", "delay reward", "pause generator",
                                              "pause reward"}));
  std::cout << "  " << a.faults.size() << " faults\n";

  const auto hit = run(a);
  std::cout << "  " << hit->rep.restarts.size() << " restart(s), " << hit->rep.sync_retries << " sync retr(ies), "
            << hit->rep.sync_restarts << " sync restart(s), " << hit->rep.ledger.duplicates << " duplicate(s) dropped\n";
  EXPECT_GT(hit->rep.restarts.size(), 0u);
  EXPECT_GT(hit->rep.sync_retries, 0) << "a drop loses a sync, which its deadline sends again";
  EXPECT_EQ(hit->rep.parameters, clean->rep.parameters) << "the run must end bitwise equal to the fault-free run";
  EXPECT_EQ(hit->rec.steps, clean->rec.steps);
  expect_exactly_once(hit->rep, o);
}

// Message faults on the RL actors (what the RL coordinator sends them:
// jobs, weight syncs, rollouts to score): duplicated, delayed, or held for a
// pause, at a generator and at a reward actor. Nothing is lost or trained
// twice, and the run ends bitwise equal to the fault-free run; duplicates
// are re-generated or re-scored rollouts the ledger drops.
TEST(RlActorFaults, MessageFaultsEndBitwiseEqual) {
  const rl::RlTrainOptions o = small(3);
  const auto clean = run(decoupled(o, 1, 2, 1));
  for (const runtime::FaultKind kind : {runtime::FaultKind::duplicate, runtime::FaultKind::delay, runtime::FaultKind::pause})
    for (const std::string target : {"generator:1", "reward:0"}) {
      runtime::RlActorOptions a = decoupled(o, 1, 2, 1);
      a.faults.push_back({.at_step = 2, .target = target, .kind = kind, .count = 2, .delay_ms = 40, .duration_ms = 150});
      const std::string what = std::string(runtime::fault_kind_name(kind)) + " " + target;
      const auto hit = run(a);
      EXPECT_TRUE(hit->rep.restarts.empty()) << what << ": nothing died";
      EXPECT_EQ(hit->rep.parameters, clean->rep.parameters) << what << ": must end bitwise equal to the fault-free run";
      EXPECT_EQ(hit->rec.steps, clean->rec.steps) << what;
      expect_exactly_once(hit->rep, o);
      if (kind == runtime::FaultKind::duplicate)
        EXPECT_GT(hit->rep.ledger.duplicates, 0) << what << ": a doubled job or rollout must reach the ledger twice";
    }
}

// The RL nemesis keeps to what is asked: its kinds (a drop only at a
// generator), its roles, reward_model:K names with a learned RM, one fault
// per actor and step, and the same schedule for the same seed.
TEST(RlActorChaos, ScheduleKeepsToKindsRolesAndSteps) {
  runtime::ChaosOptions c;
  c.seed = 9;
  c.mean_steps_between_faults = 0.3;
  const auto a = runtime::rl_chaos_schedule(c, 3, 2, true, 30);
  const auto b = runtime::rl_chaos_schedule(c, 3, 2, true, 30);
  ASSERT_EQ(a.size(), b.size());
  std::set<std::pair<std::string, int64_t>> seen;
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(runtime::describe(a[i]), runtime::describe(b[i]));
    EXPECT_TRUE(seen.emplace(a[i].target, a[i].at_step).second) << runtime::describe(a[i]);
    const bool gen = a[i].target.rfind("generator:", 0) == 0;
    EXPECT_TRUE(gen || a[i].target.rfind("reward_model:", 0) == 0) << a[i].target;
    EXPECT_TRUE(runtime::rl_fault_kind(a[i].kind) && (gen || a[i].kind != runtime::FaultKind::drop))
        << runtime::describe(a[i]);
    EXPECT_EQ(a[i].target.back() - '0', (a[i].at_step - 1) % (gen ? 3 : 2)) << runtime::describe(a[i]);
  }
  c.roles = {runtime::Role::Reward};
  c.kinds = {runtime::FaultKind::kill};
  for (const auto& f : runtime::rl_chaos_schedule(c, 3, 2, false, 30))
    EXPECT_EQ(f.target.rfind("reward:", 0), 0u) << runtime::describe(f);
  c.mean_steps_between_faults = 0;
  EXPECT_TRUE(runtime::rl_chaos_schedule(c, 3, 2, false, 30).empty());
}

}  // namespace
}  // namespace troupe::test
