// The RL trainer's policy update on the actor runtime (rl.trainer =
// "actors": actors/rl/runtime_policy.hpp): the pipeline's last stage runs the
// policy loss as a loss head (rl/policy_stage_head.hpp) on each micro-batch.
//  - the head's per-token gradient is the batch loss's (policy_loss_backward)
//    bit for bit, for every loss kind, aggregation and KL setting;
//  - one stage, one micro-batch, one optimizer shard: the runtime's update
//    equals the in-process trainer's bit for bit; pipelines with expert and
//    optimizer shards stay within float rounding of it;
//  - decoupled fixed-lag RL with the runtime trainer: a killed stage rank,
//    expert shard or optimizer shard (and a dropped message) is replayed and
//    the run ends bitwise equal to the fault-free one, every group trained
//    exactly once.
#include <unistd.h>

#include <atomic>
#include <cmath>
#include <filesystem>
#include <limits>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "actors/rl/rl_actors.hpp"
#include "actors/rl/runtime_policy.hpp"
#include "model/checkpoint.hpp"
#include "model/policy_head.hpp"
#include "rl/loss.hpp"
#include "rl/policy_stage_head.hpp"
#include "tests/rl/rl_test_util.hpp"

namespace troupe::test {
namespace {

namespace fs = std::filesystem;

// The most one AdamW update can move an element, in units of lr, at update t
// (1, 2, ...): sup over gradients of |m_hat| / sqrt(v_hat). With m_hat =
// sum_j a_j g_j and v_hat = sum_j b_j g_j^2 (bias-corrected weights a_j =
// (1-b1) b1^(t-j) / (1-b1^t), b_j likewise with b2), Cauchy-Schwarz gives
// |m_hat| <= sqrt(sum_j a_j^2 / b_j) sqrt(v_hat): 1 at t = 1, 1.00037 at t = 2
// for betas (0.9, 0.95).
double adam_step_bound(double b1, double b2, int t) {
  double s = 0.0;
  for (int j = 1; j <= t; ++j) {
    const double a = (1 - b1) * std::pow(b1, t - j) / (1 - std::pow(b1, t));
    const double b = (1 - b2) * std::pow(b2, t - j) / (1 - std::pow(b2, t));
    s += a * a / b;
  }
  return std::sqrt(s);
}

struct HeadCase {
  rl::LossKind kind;
  rl::Aggregation aggregation;
  double kl;
  bool prox_given;
};

class PolicyStageHeadTest : public ::testing::TestWithParam<HeadCase> {};

TEST_P(PolicyStageHeadTest, GradientEqualsTheBatchLossBitwise) {
  const HeadCase hc = GetParam();
  rl::PolicyLossOptions o;
  o.kind = hc.kind;
  o.aggregation = hc.aggregation;
  o.kl_coef = hc.kl;
  o.clip_high = 0.28;
  o.behaviour_weight_cap = 2.0;
  const int64_t rows = 3, S = 6, V = 11, T = rows * S;
  const double temp = 0.9;
  std::mt19937 rng(7);
  std::normal_distribution<float> nz(0.0f, 1.5f);
  std::vector<float> logits(static_cast<size_t>(T * V));
  for (float& x : logits) x = nz(rng);
  // Row r trains positions 2.. of the row (a prompt of 2), row 1 has one
  // masked-out token (a dropped token), targets random.
  std::vector<int32_t> targets(static_cast<size_t>(T), -1);
  std::vector<size_t> pos;
  std::vector<int64_t> offsets{0};
  for (int64_t r = 0; r < rows; ++r) {
    for (int64_t t = 2; t < S; ++t) {
      targets[static_cast<size_t>(r * S + t)] = static_cast<int32_t>(rng() % V);
      pos.push_back(static_cast<size_t>(r * S + t));
    }
    offsets.push_back(static_cast<int64_t>(pos.size()));
  }
  const size_t n = pos.size();
  std::vector<float> lp(static_cast<size_t>(T)), ent(static_cast<size_t>(T));
  model::policy_logprobs(lp, ent, logits, targets, V, temp);
  std::vector<double> logp(n), prox(n), behav(n), ref(n), adv(n), mask(n, 1.0);
  std::uniform_real_distribution<double> u(-0.4, 0.4);
  for (size_t k = 0; k < n; ++k) {
    logp[k] = lp[pos[k]];
    prox[k] = hc.prox_given ? logp[k] + u(rng) : logp[k];
    behav[k] = prox[k] + u(rng);
    ref[k] = logp[k] + u(rng);
    adv[k] = (k % 3 == 0 ? -1.0 : 1.0) * (0.5 + std::fabs(u(rng)));
  }
  mask[5] = 0.0;
  rl::PolicyTokens in;
  in.logp = logp;
  in.logp_prox = prox;
  in.logp_behav = behav;
  if (hc.kl > 0) in.logp_ref = ref;
  in.advantage = adv;
  in.mask = mask;
  in.offsets = offsets;
  std::vector<double> grad(n);
  rl::policy_loss_backward(grad, in, o);
  std::vector<float> coef(static_cast<size_t>(T), 0.0f), want(static_cast<size_t>(T * V));
  for (size_t k = 0; k < n; ++k) coef[pos[k]] = static_cast<float>(grad[k]);
  model::policy_logits_grad(want, logits, targets, coef, V, temp);

  std::vector<double> c(n);
  rl::aggregation_weights(c, mask, offsets, o.aggregation, o.constant_norm);
  using H = rl::PolicyStageHead;
  std::vector<double> data(static_cast<size_t>(T * H::kColumns), 0.0);
  for (size_t k = 0; k < n; ++k) {
    double* d = data.data() + pos[k] * H::kColumns;
    d[H::kC] = c[k];
    d[H::kProx] = hc.prox_given ? prox[k] : std::nan("");
    d[H::kBehav] = behav[k];
    d[H::kRef] = hc.kl > 0 ? ref[k] : std::nan("");
    d[H::kAdv] = adv[k];
  }
  const H head(o, temp);
  std::vector<float> got(static_cast<size_t>(T * V));
  std::vector<double> report(static_cast<size_t>(T * H::kReportColumns));
  head.apply(logits, targets, data, V, got, report);
  EXPECT_EQ(got, want);
  for (int64_t t = 0; t < T; ++t) {
    EXPECT_EQ(report[static_cast<size_t>(t * H::kReportColumns + H::kLogp)], lp[static_cast<size_t>(t)]);
    EXPECT_EQ(report[static_cast<size_t>(t * H::kReportColumns + H::kEntropy)], ent[static_cast<size_t>(t)]);
  }
  // Bad inputs are refused, not trained on.
  std::vector<double> bad = data;
  bad[pos[0] * H::kColumns + H::kC] = -1.0;
  EXPECT_THROW(head.apply(logits, targets, bad, V, got, report), std::invalid_argument);
  bad = data;
  bad[pos[1] * H::kColumns + H::kAdv] = std::numeric_limits<double>::infinity();
  EXPECT_THROW(head.apply(logits, targets, bad, V, got, report), std::invalid_argument);
  bad = data;
  bad[0 * H::kColumns + H::kC] = 0.5;  // position 0 has no target
  EXPECT_THROW(head.apply(logits, targets, bad, V, got, report), std::invalid_argument);
  EXPECT_THROW(head.apply(logits, targets, std::span<const double>(data).first(data.size() - 1), V, got, report),
               std::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(
    Kinds, PolicyStageHeadTest,
    ::testing::Values(HeadCase{rl::LossKind::grpo, rl::Aggregation::seq_mean, 0.0, false},
                      HeadCase{rl::LossKind::grpo, rl::Aggregation::token_mean, 0.05, true},
                      HeadCase{rl::LossKind::dapo, rl::Aggregation::token_mean, 0.0, true},
                      HeadCase{rl::LossKind::decoupled_ppo, rl::Aggregation::seq_mean, 0.02, true},
                      HeadCase{rl::LossKind::decoupled_ppo, rl::Aggregation::token_mean, 0.0, false}));

// The actor tests' small RL run, with two optimizer updates per batch.
rl::RlTrainOptions small(int64_t steps) {
  rl::RlTrainOptions o = small_options(steps);
  o.rl.updates_per_batch = 2;
  return o;
}

runtime::RuntimeOptions topology(int stages, int microbatches, int expert_shards, int optimizer_shards,
                                 sched::Kind kind = sched::Kind::one_f_one_b) {
  runtime::RuntimeOptions t;
  t.schedule = kind;
  t.stages = stages;
  t.devices = stages;
  t.train.microbatches = microbatches;
  t.expert_shards = expert_shards;
  t.optimizer_shards = optimizer_shards;
  return t;
}

rl::RlTrainOptions on_runtime(rl::RlTrainOptions o, const runtime::RuntimeOptions& t) {
  o.make_updater = runtime::runtime_policy_updater(t, o.rl.policy, o.rl.temperature > 0 ? o.rl.temperature : 1.0);
  return o;
}

std::unique_ptr<rl::Task> task() { return std::make_unique<FirstTokenTask>(); }

TEST(RlRuntimeTrainer, OneStageOneMicrobatchEqualsTheInProcessUpdateBitwise) {
  const rl::RlTrainOptions o = small(3);
  rl::RlTrainer mine(o, task());
  rl::RlTrainer actors(on_runtime(o, topology(1, 1, 0, 1, sched::Kind::sequential)), task());
  for (int s = 0; s < 3; ++s) {
    const rl::RlStepMetrics a = mine.step(), b = actors.step();
    EXPECT_EQ(a.loss, b.loss) << "step " << s;
    EXPECT_EQ(a.grad_norm, b.grad_norm) << "step " << s;
    EXPECT_EQ(a.entropy, b.entropy) << "step " << s;
    EXPECT_EQ(a.ratio_max, b.ratio_max) << "step " << s;
  }
  EXPECT_EQ(mine.parameters(), actors.parameters());
}

// The MoE aux loss is a per-micro-batch term (its f_i P_i products are not
// additive over rows): with several micro-batches the runtime averages the
// micro-batches' aux losses, as pretraining does, while the in-process RL
// update takes one aux loss over the whole batch. So the split cases compare
// with balance = none; one micro-batch keeps the aux loss and still matches.
TEST(RlRuntimeTrainer, PipelinesWithExpertAndOptimizerShardsStayWithinRounding) {
  struct Case {
    const char* name;
    runtime::RuntimeOptions t;
    moe::Balance balance;
  };
  const std::vector<Case> cases = {
      {"1f1b 2 stages, 2 micro-batches", topology(2, 2, 0, 2), moe::Balance::none},
      {"1f1b 2 stages, 2 expert shards, 3 optimizer shards", topology(2, 2, 2, 3), moe::Balance::none},
      {"dualpipe 2 stages, 4 micro-batches, 2 expert shards", topology(2, 4, 2, 2, sched::Kind::dualpipe), moe::Balance::none},
      {"1f1b 2 stages, 1 micro-batch, 2 expert shards, aux loss", topology(2, 1, 2, 2), moe::Balance::aux_loss},
  };
  // The parameters' bound, per element, from AdamW's arithmetic. The step is
  // lr * m_hat / (sqrt(v_hat) + eps). Where an element's gradients are well
  // above eps, the step hardly depends on their rounding (at t = 1 it is
  // lr g / (|g| + eps), whose slope lr eps / (|g| + eps)^2 turns an absolute
  // gradient error d into under lr d / (1e4 eps) once |g| >= 100 eps), so both
  // paths agree to float rounding: 1e-5 of the largest parameter. Where they
  // are eps-sized, the step is set by rounding: an exact 0 on one path and
  // 1e-11 on the other (a batch split changes a GEMM's bits under the AVX-512
  // families) is a step of 0 against 1e-3 lr, and it may reach any value up
  // to the step bound either way. There the bound is AdamW's own: two steps of
  // at most lr * adam_step_bound each way per update. The reference's first
  // moments say which elements had an eps-sized gradient at some update u:
  // the reference stopped after u updates (the first u updates of the same
  // batch) holds m_u = b1 m_(u-1) + (1-b1) g_u (m rather than v: its
  // difference resolves a g_u far smaller than g_(u-1)).
  const fs::path dir = fs::temp_directory_path() / ("troupe_rl_rounding_" + std::to_string(::getpid()));
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    rl::RlTrainOptions o = small(1);
    o.model.balance = c.balance;
    rl::RlTrainer mine(o, task());
    const rl::RlStepMetrics want = mine.step();
    const std::vector<float> ref = mine.parameters();
    rl::RlTrainer actors(on_runtime(o, c.t), task());
    const rl::RlStepMetrics got = actors.step();
    EXPECT_NEAR(got.loss, want.loss, 1e-5 * std::max(1.0, std::fabs(want.loss)));
    EXPECT_NEAR(got.grad_norm, want.grad_norm, 1e-4 * want.grad_norm);

    const int updates = static_cast<int>(o.rl.updates_per_batch);
    const double b1 = o.optim.beta1, b2 = o.optim.beta2;
    std::vector<double> min_g(ref.size(), std::numeric_limits<double>::infinity()), m_prev(ref.size(), 0.0);
    for (int u = 1; u <= updates; ++u) {
      rl::RlTrainOptions ou = o;
      ou.rl.updates_per_batch = u;
      rl::RlTrainer first_u(ou, task());
      first_u.step();
      first_u.save(dir.string());
      const std::vector<float> m = model::load_checkpoint(dir.string()).adam_m;
      fs::remove_all(dir);
      ASSERT_EQ(m.size(), ref.size());
      for (size_t i = 0; i < m.size(); ++i) {
        min_g[i] = std::min(min_g[i], std::fabs(m[i] - b1 * m_prev[i]) / (1 - b1));
        m_prev[i] = m[i];
      }
    }
    const std::vector<float> p = actors.parameters();
    ASSERT_EQ(p.size(), ref.size());
    double step_bound = 0.0;
    for (int t = 1; t <= updates; ++t) step_bound += 2.0 * o.optim.lr * adam_step_bound(b1, b2, t);
    double largest = 0.0;
    for (float x : ref) largest = std::max(largest, std::fabs(static_cast<double>(x)));
    const double rounding = 1e-5 * largest;
    int64_t eps_sized = 0, beyond = 0;
    double worst = 0.0;
    for (size_t i = 0; i < ref.size(); ++i) {
      const double d = std::fabs(static_cast<double>(p[i]) - ref[i]);
      const bool small_grad = min_g[i] < 100.0 * o.optim.eps;
      eps_sized += small_grad;
      if (d > (small_grad ? step_bound + rounding : rounding)) ++beyond;
      if (!small_grad) worst = std::max(worst, d);
    }
    EXPECT_EQ(beyond, 0) << "elements outside the bound (" << eps_sized << " eps-sized of " << ref.size() << ")";
    EXPECT_LE(worst, rounding) << "an element with gradients above 100 eps differs by more than float rounding";
  }
}

struct Recorder final : runtime::RlActorObserver {
  std::vector<double> losses;
  void on_step(const rl::RlStepMetrics& m) override { losses.push_back(m.loss); }
};

struct Outcome {
  std::vector<float> params;
  std::vector<double> losses;
  runtime::RlActorReport rep;
  int trainer_restarts = 0;
};

Outcome run_decoupled(const rl::RlTrainOptions& base, runtime::RuntimeOptions t) {
  auto restarts = std::make_shared<std::atomic<int>>(0);
  t.on_restart = [restarts](const runtime::RestartEvent&) { ++*restarts; };
  runtime::RlActorOptions a;
  a.train = on_runtime(base, t);
  a.train.rl.sync = rl::SyncMode::fixed_lag;
  a.train.rl.max_staleness = 1;
  a.train.rl.generators = 1;
  a.train.rl.reward_actors = 1;
  a.make_task = [] { return std::make_unique<FirstTokenTask>(); };
  Recorder rec;
  Outcome out;
  runtime::train_decoupled(a, rec, &out.rep);
  out.params = out.rep.parameters;
  out.losses = rec.losses;
  out.trainer_restarts = restarts->load();
  return out;
}

TEST(RlRuntimeTrainer, KilledTrainerActorsAreReplayedAndTheRunEndsBitwiseEqual) {
  const rl::RlTrainOptions o = small(3);
  const runtime::RuntimeOptions base = topology(2, 2, 2, 2);
  const Outcome clean = run_decoupled(o, base);
  ASSERT_EQ(clean.losses.size(), 3u);
  // Kills at the runtime's optimizer updates (2 per RL step), and a dropped
  // step message on an expert shard (replayed at the step's deadline).
  runtime::RuntimeOptions faulty = base;
  faulty.step_deadline = 2.0;
  auto fault = [](const std::string& target, int64_t update, runtime::FaultKind kind) {
    runtime::FaultSpec f;
    f.target = target;
    f.at_step = update;
    f.kind = kind;
    return f;
  };
  faulty.faults = {fault("stage:1", 2, runtime::FaultKind::kill), fault("optimizer:0", 3, runtime::FaultKind::kill),
                   fault("expert:1/0", 4, runtime::FaultKind::kill), fault("expert:0/1", 5, runtime::FaultKind::drop)};
  const Outcome hit = run_decoupled(o, faulty);
  EXPECT_GE(hit.trainer_restarts, 3) << "each kill restarts its actor";
  EXPECT_EQ(hit.params, clean.params);
  EXPECT_EQ(hit.losses, clean.losses);
  std::vector<rl::GroupId> want;
  for (int64_t s = 0; s < o.steps; ++s)
    for (int64_t g = 0; g < o.rl.prompts_per_step; ++g) want.push_back({o.seed, s, g});
  EXPECT_EQ(hit.rep.ledger.trained, want);
  EXPECT_EQ(hit.rep.ledger.double_trained, 0);
  EXPECT_EQ(hit.rep.ledger.discarded, 0);
}

}  // namespace
}  // namespace troupe::test
