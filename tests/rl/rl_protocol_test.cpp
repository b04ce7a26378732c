// Protocols of the decoupled RL actors (actors/rl/rl_roles.cpp), message by
// message on CAF's deterministic test coordinator: no threads, no sleeps,
// every interleaving chosen by the test.
// - The rollout buffer's admission: it keeps the staleness window, a group is
//   admitted and trained exactly once, a step waits in the buffer until the
//   trainer takes it (or is handed over at once), and a buffer killed at each
//   of its kill points is replaced by one that goes on from the shared store
//   without losing or repeating a group.
// - The generator's sync fence: with sync = "latest" a version that arrives
//   mid-rollout is taken between two decode steps (the tokens before it keep
//   the old version, every token after carries the new one); with
//   "fixed_lag" a rollout never switches.
#include <gtest/gtest.h>

#include <caf/all.hpp>
#include <caf/scheduler/test_coordinator.hpp>

#include <chrono>
#include <memory>
#include <optional>
#include <vector>

#include "actors/rl/rl_actors.hpp"
#include "actors/rl/rl_messages.hpp"
#include "model/params.hpp"
#include "tests/rl/rl_test_util.hpp"

namespace troupe::test {
namespace {

namespace runtime = troupe::runtime;
namespace rlmsg = troupe::runtime::rlmsg;

constexpr uint64_t kSeed = 7;

// One step's rollouts: `groups` groups of one completion each, every token
// sampled by `version`.
rlmsg::Scored step_of(int64_t step, int64_t version, int groups = 2) {
  auto r = std::make_shared<rl::StepRollouts>();
  r->step = step;
  r->version = version;
  for (int g = 0; g < groups; ++g) {
    r->ids.push_back(rl::GroupId{kSeed, step, g});
    model::Completion c;
    c.tokens = {3, 4, 1};
    c.logprobs = {-0.5f, -0.25f, -0.125f};
    c.versions = {version, version, version};
    r->completions.push_back(c);
  }
  rlmsg::Scored s;
  s.rollout.r = r;
  s.scored = std::make_shared<const rl::ScoredBatch>();
  return s;
}

// A system on the test coordinator, a rollout buffer, and the test as the
// actors' driver and trainer.
struct RlFixture {
  caf::actor_system_config cfg;
  std::optional<caf::actor_system> sys;
  caf::scheduler::test_coordinator* sched = nullptr;
  std::optional<caf::scoped_actor> self;
  runtime::RlActorOptions opt;
  std::shared_ptr<runtime::RlShared> sh = std::make_shared<runtime::RlShared>();
  std::shared_ptr<runtime::RlLedger> ledger = std::make_shared<runtime::RlLedger>();
  std::shared_ptr<runtime::BufferStore> store = std::make_shared<runtime::BufferStore>();
  caf::actor buffer;

  RlFixture(rl::SyncMode mode, int64_t eta) {
    cfg.set("scheduler.policy", caf::atom("testing"));
    cfg.set("scheduler.max-throughput", size_t{1});  // one message per run_once()
    cfg.set("logger.file-verbosity", caf::atom("quiet"));
    sys.emplace(cfg);
    sched = &dynamic_cast<caf::scheduler::test_coordinator&>(sys->scheduler());
    self.emplace(*sys);
    opt.train.rl.sync = mode;
    opt.train.rl.max_staleness = eta;
    sh->opt = &opt;
    sh->seed = kSeed;
    spawn();
  }
  ~RlFixture() {
    caf::anon_send_exit(buffer, caf::exit_reason::user_shutdown);
    sched->run();
  }
  // A buffer on the shared store (a respawn after a kill).
  void spawn() {
    buffer = sys->spawn(runtime::buffer_actor, std::static_pointer_cast<const runtime::RlShared>(sh), ledger, store,
                        caf::actor_cast<caf::actor>(*self));
    sched->run();
  }
  void send(rlmsg::Scored s) {
    (*self)->send(buffer, rlmsg::admit_atom::value, std::move(s));
    sched->run();
  }
  void take(int64_t step) {
    (*self)->send(buffer, rlmsg::take_atom::value, step, caf::actor_cast<caf::actor>(*self));
    sched->run();
  }
  void arm(uint32_t point) {
    (*self)->send(buffer, rlmsg::arm_atom::value, point);
    sched->run();
  }
  // What reached the driver and the trainer so far, in order.
  struct Seen {
    std::vector<std::pair<int64_t, bool>> admitted;
    std::vector<int64_t> batches;  // the steps handed to the trainer
  };
  Seen drain() {
    Seen out;
    bool more = true;
    while (more)
      (*self)->receive([&](rlmsg::admitted_atom, int64_t step, bool ok) { out.admitted.emplace_back(step, ok); },
                       [&](rlmsg::batch_atom, rlmsg::Scored& s, int64_t, int64_t, int64_t) {
                         out.batches.push_back(s.rollout.r->step);
                       },
                       caf::after(std::chrono::seconds(0)) >> [&] { more = false; });
    return out;
  }
  bool buffer_alive() const {
    return !caf::actor_cast<caf::abstract_actor*>(buffer)->getf(caf::abstract_actor::is_terminated_flag);
  }
};

using Admitted = std::vector<std::pair<int64_t, bool>>;

TEST(RlBufferProtocol, FixedLagAdmitsExactlyTheLaggedVersionAndRefusesTheRest) {
  RlFixture f(rl::SyncMode::fixed_lag, 1);
  f.send(step_of(0, 0));  // step 0: version max(0, 0 - 1) = 0
  f.send(step_of(1, 0));  // step 1: version 0
  f.send(step_of(2, 2));  // step 2 wants version 1 exactly: 2 is too new
  f.send(step_of(3, 1));  // step 3 wants version 2: 1 is too stale
  const auto seen = f.drain();
  EXPECT_EQ(seen.admitted, (Admitted{{0, true}, {1, true}, {2, false}, {3, false}}));
  EXPECT_TRUE(seen.batches.empty()) << "nothing is handed over before the trainer asks";
  EXPECT_EQ(f.ledger->admitted.size(), 4u);
  EXPECT_EQ(f.ledger->discarded, 4);
  EXPECT_EQ(f.store->ready.size(), 2u);
}

TEST(RlBufferProtocol, LatestAdmitsTheWholeWindow) {
  RlFixture f(rl::SyncMode::latest, 2);
  f.send(step_of(4, 2));  // window [2, 4]
  f.send(step_of(5, 5));
  f.send(step_of(6, 3));  // window [4, 6]: 3 is too stale
  const auto seen = f.drain();
  EXPECT_EQ(seen.admitted, (Admitted{{4, true}, {5, true}, {6, false}}));
  EXPECT_EQ(f.ledger->discarded, 2);
}

TEST(RlBufferProtocol, ATakeWaitsForItsStepAndEachStepIsHandedOverOnce) {
  RlFixture f(rl::SyncMode::fixed_lag, 1);
  f.take(0);  // the trainer asks before step 0 is in
  EXPECT_TRUE(f.drain().batches.empty());
  f.send(step_of(1, 0));  // another step: not the one asked for
  EXPECT_TRUE(f.drain().batches.empty());
  f.send(step_of(0, 0));
  EXPECT_EQ(f.drain().batches, (std::vector<int64_t>{0}));
  f.take(1);  // already in: handed over at once
  EXPECT_EQ(f.drain().batches, (std::vector<int64_t>{1}));
  EXPECT_TRUE(f.store->ready.empty());
  EXPECT_EQ(f.ledger->trained.size(), 4u);
  EXPECT_EQ(f.ledger->double_trained, 0);
}

TEST(RlBufferProtocol, ARepeatedGroupIsDroppedAndItsStepReportedInAgain) {
  RlFixture f(rl::SyncMode::fixed_lag, 1);
  f.send(step_of(0, 0));
  f.take(0);
  f.send(step_of(0, 0));  // a re-run job's rollouts after the step was admitted and trained
  const auto seen = f.drain();
  EXPECT_EQ(seen.admitted, (Admitted{{0, true}, {0, true}}));
  EXPECT_EQ(seen.batches, (std::vector<int64_t>{0}));
  EXPECT_EQ(f.ledger->duplicates, 2);
  EXPECT_EQ(f.ledger->admitted.size(), 2u);
  EXPECT_EQ(f.ledger->trained.size(), 2u);
}

// Kill point k on the next admission: 1 before it (the rollouts are lost with
// the buffer), 2 after storing them but before telling the coordinator, 3
// after telling it. The coordinator then deals the step again; the respawned
// buffer, on the same store, admits it (1), reports the stored step in again
// without storing it twice (2), or drops the copy (3). Either way the trainer
// gets the step once and the ledger holds each group once.
TEST(RlBufferProtocol, AKilledBufferLosesNothingAndRepeatsNothing) {
  for (uint32_t point : {1u, 2u, 3u}) {
    RlFixture f(rl::SyncMode::fixed_lag, 1);
    f.take(0);
    f.arm(point);
    EXPECT_TRUE(f.buffer_alive());
    f.send(step_of(0, 0));
    const auto before = f.drain();
    EXPECT_FALSE(f.buffer_alive()) << "kill point " << point;
    EXPECT_EQ(before.admitted, point == 3 ? (Admitted{{0, true}}) : Admitted{}) << "kill point " << point;
    f.spawn();          // the supervisor's respawn
    f.send(step_of(0, 0));  // the step dealt again
    f.take(0);          // the trainer asks the new buffer
    const auto after = f.drain();
    EXPECT_EQ(after.admitted, (Admitted{{0, true}})) << "kill point " << point;
    const size_t handed = before.batches.size() + after.batches.size();
    EXPECT_EQ(handed, 1u) << "kill point " << point << ": the step must reach the trainer exactly once";
    EXPECT_EQ(f.ledger->admitted.size(), 2u) << "kill point " << point;
    EXPECT_EQ(f.ledger->trained.size(), 2u) << "kill point " << point;
    EXPECT_EQ(f.ledger->double_trained, 0) << "kill point " << point;
    EXPECT_EQ(f.ledger->duplicates, point == 1 ? 0 : 2) << "kill point " << point;
  }
}

// A generator's sync fence. Versions 0 and 1 differ (1 is 0 with every
// weight moved), so a switch shows in the tokens' recorded versions.
TEST(RlGeneratorFence, LatestSwitchesBetweenTwoDecodeStepsAndFixedLagNever) {
  for (const rl::SyncMode mode : {rl::SyncMode::latest, rl::SyncMode::fixed_lag}) {
    const std::string what = mode == rl::SyncMode::latest ? "latest" : "fixed_lag";
    RlFixture f(mode, 1);  // its system, scheduler and driver; the buffer stays idle
    f.opt.train = small_options(2);
    f.opt.train.rl.sync = mode;
    f.opt.train.rl.max_staleness = 1;
    f.opt.train.rl.max_new_tokens = 6;
    f.opt.make_task = [] { return std::make_unique<FirstTokenTask>(); };
    const auto layout = model::build_param_layout(f.opt.train.model);
    auto v0 = std::make_shared<std::vector<float>>(model::init_params(layout, f.opt.train.model, 3));
    auto v1 = std::make_shared<std::vector<float>>(*v0);
    for (float& x : *v1) x = -x;
    const caf::actor driver = caf::actor_cast<caf::actor>(*f.self);
    const caf::actor gen = f.sys->spawn(runtime::generator_actor, std::static_pointer_cast<const runtime::RlShared>(f.sh),
                                        0, int64_t{0}, driver);
    f.sched->run();
    (*f.self)->send(gen, rlmsg::sync_atom::value, rlmsg::Weights::of(0, v0));
    (*f.self)->send(gen, rlmsg::job_atom::value, int64_t{1}, int64_t{0});
    // sync, job (which starts the rollout and sends the first decode), then
    // exactly `before` decode steps.
    const int before = 2;
    f.sched->run_once();
    f.sched->run_once();
    for (int i = 0; i < before; ++i) f.sched->run_once();
    // Version 1 arrives now: behind the decode step already queued.
    (*f.self)->send(gen, rlmsg::sync_atom::value, rlmsg::Weights::of(1, v1));
    f.sched->run();
    std::vector<int64_t> synced;
    std::optional<rlmsg::Rollout> got;
    bool more = true;
    while (more)
      (*f.self)->receive([&](rlmsg::synced_atom, int, int64_t, int64_t v) { synced.push_back(v); },
                         [&](rlmsg::rollout_atom, rlmsg::Rollout& r) { got = std::move(r); },
                         caf::after(std::chrono::seconds(0)) >> [&] { more = false; });
    EXPECT_EQ(synced, (std::vector<int64_t>{0, 1})) << what << ": both syncs confirmed";
    ASSERT_TRUE(got.has_value()) << what << ": no rollout";
    // The fence: the queued decode step (the third) still ran on version 0,
    // the sync came next, and the fourth took version 1. Each decode step
    // feeds one prompt token (chunked prefill, chunk 1), so step d samples
    // token d - (prompt - 1).
    const size_t prompt = FirstTokenTask().train_prompt(0).tokens.size();
    const size_t switch_at = mode == rl::SyncMode::latest ? static_cast<size_t>(before) + 1 - (prompt - 1) : 100;
    int spanning = 0;
    for (const model::Completion& c : got->r->completions) {
      ASSERT_EQ(c.versions.size(), c.tokens.size()) << what;
      for (size_t t = 0; t < c.versions.size(); ++t)
        EXPECT_EQ(c.versions[t], t < switch_at ? 0 : 1) << what << ": token " << t;
      spanning += c.versions.size() > switch_at;
    }
    if (mode == rl::SyncMode::latest) {
      EXPECT_GT(spanning, 0) << "no completion reached the switch: the test would prove nothing";
      EXPECT_EQ(got->switches, 1);
    } else {
      EXPECT_EQ(got->switches, 0);
    }
    caf::anon_send_exit(gen, caf::exit_reason::user_shutdown);
    f.sched->run();
  }
}

}  // namespace
}  // namespace troupe::test
