// The synchronous RL loop (rl/trainer.hpp): it learns a trivially learnable
// reward within a few seeded steps (asserting learning, not just running),
// two runs of one spec are identical, a resumed run equals a straight one
// bit for bit, and bad init checkpoints are refused with the file named.
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <unistd.h>
#include <vector>

#include <gtest/gtest.h>

#include "model/checkpoint.hpp"
#include "model/trainer.hpp"
#include "rl/rollout_step.hpp"
#include "rl/task.hpp"
#include "rl/trainer.hpp"
#include "tests/rl/rl_test_util.hpp"

namespace troupe::test {
namespace {

namespace fs = std::filesystem;

std::string temp_dir(const std::string& tag) {
  const fs::path p = fs::temp_directory_path() / ("troupe_rl_" + tag + "_" + std::to_string(getpid()));
  fs::remove_all(p);
  return p.string();
}

class RlTrainerLearns : public ::testing::TestWithParam<rl::LossKind> {};

TEST_P(RlTrainerLearns, FirstTokenRewardRisesFromChanceToNearOne) {
  for (const std::string ffn : {"dense", "moe"}) {
    rl::RlTrainOptions o = tiny_options(ffn);
    o.rl = rl::rl_preset(GetParam(), o.rl.max_new_tokens);
    o.rl.group_size = 8;
    o.rl.prompts_per_step = 4;
    o.rl.max_new_tokens = 3;
    o.rl.temperature = 1.0;
    rl::RlTrainer tr(o, std::make_unique<FirstTokenTask>());
    std::vector<double> reward;
    for (int i = 0; i < o.steps; ++i) reward.push_back(tr.step().reward_mean);
    std::string curve;
    for (double r : reward) curve += std::to_string(r).substr(0, 5) + " ";
    SCOPED_TRACE(ffn + " " + rl::loss_kind_name(GetParam()) + ": rewards " + curve);
    EXPECT_LT(reward.front(), 0.35) << "a random policy should rarely start with token 7";
    double last = 0.0;
    for (size_t i = reward.size() - 5; i < reward.size(); ++i) last += reward[i] / 5.0;
    EXPECT_GT(last, 0.85) << "mean reward of the last 5 of " << o.steps << " steps";
    const rl::RlEvalMetrics e = tr.evaluate();
    EXPECT_EQ(e.exact_match, 1.0) << "greedy decoding should now start with token 7";
  }
}

INSTANTIATE_TEST_SUITE_P(Losses, RlTrainerLearns,
                         ::testing::Values(rl::LossKind::grpo, rl::LossKind::dr_grpo, rl::LossKind::dapo,
                                           rl::LossKind::decoupled_ppo),
                         [](const auto& info) { return std::string(rl::loss_kind_name(info.param)); });

TEST(RlTrainer, TwoRunsAreIdentical) {
  rl::RlTrainOptions o = tiny_options("moe");
  o.steps = 3;
  o.rl.policy.kl_coef = 0.01;
  std::vector<std::vector<double>> metrics[2];
  std::vector<float> params[2];
  for (int run = 0; run < 2; ++run) {
    rl::RlTrainer tr(o, std::make_unique<FirstTokenTask>());
    for (int i = 0; i < o.steps; ++i) {
      const rl::RlStepMetrics m = tr.step();
      metrics[run].push_back({m.loss, m.reward_mean, m.kl_ref, m.entropy, m.grad_norm, m.ratio_max});
    }
    params[run] = tr.parameters();
  }
  EXPECT_EQ(metrics[0], metrics[1]);
  EXPECT_EQ(params[0], params[1]);
}

// rl.row_buckets: the rows sorted by length into buckets, each padded to
// its own longest row, change the rounding, not the update, for a dense
// model: the same losses, KL, gradient norms and parameters within float
// rounding, with fewer padded tokens trained; an uneven split (5 buckets of
// 12 rows: 3, 3, 3, 3) too. (MoE routes the padding too: its aux loss and
// balancing loads are over each bucket's tokens, so fewer padding tokens
// change them; the next test.)
TEST(RlTrainer, RowBucketsChangeTheRoundingNotTheUpdate) {
  rl::RlTrainOptions o = tiny_options("dense");
  o.steps = 3;
  o.rl.max_new_tokens = 6;  // completions of different lengths
  o.rl.policy.kl_coef = 0.01;
  o.rl.updates_per_batch = 2;
  auto run = [&](int64_t buckets, std::vector<rl::RlStepMetrics>& steps) {
    rl::RlTrainOptions b = o;
    b.rl.row_buckets = buckets;
    rl::RlTrainer tr(b, std::make_unique<FirstTokenTask>());
    for (int i = 0; i < b.steps; ++i) steps.push_back(tr.step());
    return tr.parameters();
  };
  std::vector<rl::RlStepMetrics> one;
  const std::vector<float> p1 = run(1, one);
  int64_t fewer = 0;  // steps that padded fewer tokens (rows round up to 8)
  for (int64_t buckets : {3, 4, 5}) {
    SCOPED_TRACE("row_buckets " + std::to_string(buckets));
    std::vector<rl::RlStepMetrics> many;
    const std::vector<float> pb = run(buckets, many);
    ASSERT_EQ(many.size(), one.size());
    for (size_t i = 0; i < one.size(); ++i) {
      EXPECT_NEAR(many[i].loss, one[i].loss, 1e-5 * (1 + std::abs(one[i].loss))) << "step " << i;
      EXPECT_NEAR(many[i].kl_ref, one[i].kl_ref, 1e-5) << "step " << i;
      EXPECT_NEAR(many[i].grad_norm, one[i].grad_norm, 1e-4 * (1 + one[i].grad_norm)) << "step " << i;
      EXPECT_EQ(many[i].reward_mean, one[i].reward_mean) << "same rollouts";
      EXPECT_LE(many[i].train_tokens, one[i].train_tokens);
      fewer += many[i].train_tokens < one[i].train_tokens;
    }
    ASSERT_EQ(pb.size(), p1.size());
    double worst = 0;
    for (size_t i = 0; i < p1.size(); ++i) worst = std::max(worst, std::abs(double(pb[i]) - double(p1[i])));
    EXPECT_LT(worst, 1e-4) << "parameters after 3 steps";
  }
  EXPECT_GT(fewer, 0) << "buckets must pad fewer tokens somewhere";
}

// The synchronous loop data-parallel over devices (RlTrainOptions::devices):
// a step's sequences dealt over the devices' continuous batches give exactly
// one device's rollouts; the update equals one device's to rounding (the
// chunks' gradients are summed in another grouping); and a data-parallel run
// is the same bits every time, whatever its threads' timing.
TEST(RlTrainer, DataParallelDevicesSampleTheSameBitsAndTrainTheSame) {
  rl::RlTrainOptions o = tiny_options("moe");
  o.steps = 3;
  o.rl.max_new_tokens = 6;
  o.rl.policy.kl_coef = 0.01;
  o.rl.updates_per_batch = 2;
  // Every step's completions: tokens and behaviour log-probs, bit for bit.
  using Sampled = std::vector<std::pair<std::vector<int32_t>, std::vector<float>>>;
  auto run = [&](int64_t devices, std::vector<rl::RlStepMetrics>& steps, std::vector<Sampled>& sampled) {
    rl::RlTrainOptions b = o;
    b.devices = devices;
    b.rl.row_buckets = 2;  // the chunking the 2-device runs use, so only the gradient grouping differs
    b.rollouts_every = 1;
    b.on_rollouts = [&sampled](const rl::StepRollouts& r, const rl::ScoredBatch&) {
      Sampled s;
      for (const auto& c : r.completions) s.emplace_back(c.tokens, std::vector<float>(c.logprobs.begin(), c.logprobs.end()));
      sampled.push_back(std::move(s));
    };
    rl::RlTrainer tr(b, std::make_unique<FirstTokenTask>());
    for (int i = 0; i < b.steps; ++i) steps.push_back(tr.step());
    return tr.parameters();
  };
  std::vector<rl::RlStepMetrics> one, two, again, three;
  std::vector<Sampled> s1, s2, s2b, s3;
  const std::vector<float> p1 = run(1, one, s1), p2 = run(2, two, s2), p2b = run(2, again, s2b), p3 = run(3, three, s3);
  ASSERT_EQ(s1.size(), 3u);
  EXPECT_TRUE(s1[0] == s2[0] && s1[0] == s3[0]) << "step 1 (the same weights): rollouts must be the same bits";
  EXPECT_TRUE(s2 == s2b);
  for (size_t i = 0; i < one.size(); ++i) {
    EXPECT_EQ(two[i].reward_mean, one[i].reward_mean) << "step " << i << ": the same rollouts";
    EXPECT_EQ(two[i].gen_tokens, one[i].gen_tokens) << "step " << i;
    EXPECT_EQ(three[i].reward_mean, one[i].reward_mean) << "step " << i;
    EXPECT_NEAR(two[i].loss, one[i].loss, 1e-5 * (1 + std::abs(one[i].loss))) << "step " << i;
    EXPECT_NEAR(two[i].grad_norm, one[i].grad_norm, 1e-4 * (1 + one[i].grad_norm)) << "step " << i;
    EXPECT_NEAR(two[i].aux_loss, one[i].aux_loss, 1e-5 * (1 + one[i].aux_loss)) << "step " << i;
  }
  double worst = 0;
  for (size_t i = 0; i < p1.size(); ++i) worst = std::max(worst, std::abs(double(p2[i]) - double(p1[i])));
  EXPECT_LT(worst, 1e-4) << "parameters after 3 steps";
  EXPECT_EQ(p2, p2b) << "a data-parallel run must be the same bits every time";
  EXPECT_NE(p2, p1) << "the 2-device update did not run (its gradient grouping differs from one device's)";
  // The updater path has no devices.
  rl::RlTrainOptions bad = o;
  bad.devices = 0;
  EXPECT_THROW(rl::RlTrainer(bad, std::make_unique<FirstTokenTask>()), std::invalid_argument);
}

// MoE with buckets: each bucket's aux loss counts by its share of the rows
// and the expert loads are summed. The first step's rollouts are the same, and
// its policy loss (the aux loss apart) agrees to rounding.
TEST(RlTrainer, RowBucketsWithMoeWeighTheAuxLossByRows) {
  rl::RlTrainOptions o = tiny_options("moe");
  o.steps = 1;
  o.rl.max_new_tokens = 6;
  std::vector<rl::RlStepMetrics> m;
  for (int64_t buckets : {1, 4}) {
    o.rl.row_buckets = buckets;
    rl::RlTrainer tr(o, std::make_unique<FirstTokenTask>());
    m.push_back(tr.step());
  }
  EXPECT_EQ(m[0].reward_mean, m[1].reward_mean);
  EXPECT_NEAR(m[0].pg_loss, m[1].pg_loss, 1e-5 * (1 + std::abs(m[0].pg_loss)));
  EXPECT_GT(m[1].aux_loss, 0.0);
  EXPECT_NEAR(m[1].aux_loss, m[0].aux_loss, 0.5 * m[0].aux_loss) << "the same order of size";
  EXPECT_LT(m[1].train_tokens, m[0].train_tokens);
}

TEST(RlTrainer, ResumeEqualsStraightRun) {
  rl::RlTrainOptions o = tiny_options("moe");
  o.steps = 4;
  o.rl.updates_per_batch = 2;
  o.rl.policy.kl_coef = 0.01;
  o.optim.schedule = troupe::model::LrSchedule::cosine;
  o.optim.warmup_steps = 1;
  std::vector<float> straight;
  {
    rl::RlTrainer tr(o, std::make_unique<FirstTokenTask>());
    for (int i = 0; i < o.steps; ++i) tr.step();
    straight = tr.parameters();
  }
  const std::string dir = temp_dir("resume");
  {
    rl::RlTrainer tr(o, std::make_unique<FirstTokenTask>());
    tr.step();
    tr.step();
    tr.save(dir);
  }
  rl::RlTrainOptions r = o;
  r.resume_from = dir;
  rl::RlTrainer tr(r, std::make_unique<FirstTokenTask>());
  EXPECT_EQ(tr.steps_done(), 2);
  while (tr.steps_done() < o.steps) tr.step();
  EXPECT_EQ(tr.parameters(), straight) << "a resumed RL run must continue bit for bit";
  fs::remove_all(dir);
}

TEST(RlTrainer, StartsFromInitAndKeepsItAsReference) {
  // A pretraining checkpoint as init: the RL policy starts from its
  // parameters (KL to the reference is exactly 0 before the first update).
  rl::RlTrainOptions o = tiny_options("dense");
  model::TrainOptions pre;
  pre.model = o.model;
  pre.data.source = troupe::model::DataKind::addition;
  pre.data.digits = 1;
  pre.data.batch_size = 4;
  pre.steps = 1;
  pre.eval_every = 0;
  pre.seed = 9;
  const std::string dir = temp_dir("init");
  {
    model::Trainer t(pre);
    t.step();
    t.save(dir);
  }
  o.rl.init = dir;
  o.rl.policy.kl_coef = 0.1;
  rl::RlTrainer tr(o, std::make_unique<FirstTokenTask>());
  const model::TrainingState st = model::load_checkpoint(dir);
  EXPECT_EQ(tr.parameters(), st.params);
  const rl::RlStepMetrics m = tr.step();
  EXPECT_EQ(m.kl_ref, 0.0) << "the first step samples and scores with the reference itself";
  EXPECT_NE(tr.parameters(), st.params);

  // A model that disagrees with the checkpoint is refused, naming both.
  rl::RlTrainOptions bad = o;
  bad.model.d_model = 64;
  try {
    rl::RlTrainer t(bad, std::make_unique<FirstTokenTask>());
    ADD_FAILURE() << "a mismatched init was accepted";
  } catch (const std::exception& e) {
    EXPECT_NE(std::string(e.what()).find(dir), std::string::npos) << e.what();
  }
  fs::remove_all(dir);

  // A missing init is a checkpoint error naming the path.
  rl::RlTrainOptions missing = o;
  missing.rl.init = dir + "_missing";
  EXPECT_THROW(rl::RlTrainer(missing, std::make_unique<FirstTokenTask>()), model::CheckpointError);
}

}  // namespace
}  // namespace troupe::test
