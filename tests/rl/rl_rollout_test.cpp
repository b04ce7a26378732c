// Tests of rl/rollout: scoring sampled groups into the per-token batch the
// policy loss takes (verdicts, advantages, dynamic-sampling masks, tokens
// after EOS, metrics), pass@k, and one step from completions to gradients.
#include <gtest/gtest.h>

#include <cmath>
#include <vector>

#include "rl/loss.hpp"
#include "rl/rollout.hpp"

using namespace troupe;
using namespace troupe::rl;

namespace {

constexpr int32_t kEos = 12;

model::DataConfig one_digit() {
  model::DataConfig c;
  c.source = troupe::model::DataKind::addition;
  c.digits = 1;
  return c;
}

Completion completion(std::vector<int32_t> tokens) {
  Completion c;
  c.tokens = std::move(tokens);
  for (size_t t = 0; t < c.tokens.size(); ++t) c.logp_behav.push_back(-0.1 * static_cast<double>(t + 1));
  return c;
}

// Three groups of three on a 1-digit task (answers are 2 digits + EOS):
// group 0 all right, group 1 mixed (one right, one right-then-junk-after-EOS,
// one wrong), group 2 never finished.
struct Fixture {
  std::unique_ptr<Task> task = make_addition_task(one_digit(), 3, {});
  std::vector<Prompt> prompts;
  std::vector<Completion> completions;
  Fixture() {
    for (int64_t g = 0; g < 3; ++g) prompts.push_back(task->train_prompt(g));
    auto answer = [&](int64_t g) { return prompts[static_cast<size_t>(g)].answer; };
    for (int k = 0; k < 3; ++k) completions.push_back(completion(answer(0)));
    completions.push_back(completion(answer(1)));
    std::vector<int32_t> junk = answer(1);
    junk.insert(junk.end(), {4, 4});
    completions.push_back(completion(junk));
    std::vector<int32_t> wrong = answer(1);
    wrong[0] = (wrong[0] + 1) % 10;
    completions.push_back(completion(wrong));
    for (int k = 0; k < 3; ++k) completions.push_back(completion({1, 2, 3}));
  }
};

}  // namespace

TEST(RlRollout, ScoresGroupsIntoTheLossLayout) {
  Fixture f;
  for (bool drop : {false, true}) {
    const ScoredBatch b = score_groups(*f.task, f.prompts, f.completions, 3, AdvantageOptions{true, 1e-6, drop});
    ASSERT_EQ(b.verdicts.size(), 9u);
    const std::vector<double> rewards{1, 1, 1, 1, 1, 0, 0, 0, 0};
    EXPECT_EQ(b.rewards, rewards);
    EXPECT_FALSE(b.verdicts[6].finished);
    // Advantages are exactly group_advantages' of those rewards.
    std::vector<double> a(9);
    std::vector<uint8_t> keep(3);
    group_advantages(a, keep, rewards, 3, AdvantageOptions{true, 1e-6, drop});
    EXPECT_EQ(b.advantages, a);
    EXPECT_EQ(b.keep, keep);
    EXPECT_EQ(b.stats.zero_variance_groups, 2);
    // Layout: 3+3+3, 3+5+3, 3+3+3 tokens.
    const std::vector<int64_t> offsets{0, 3, 6, 9, 12, 17, 20, 23, 26, 29};
    EXPECT_EQ(b.offsets, offsets);
    ASSERT_EQ(b.mask.size(), 29u);
    for (int64_t i = 0; i < 9; ++i)
      for (int64_t t = offsets[static_cast<size_t>(i)]; t < offsets[static_cast<size_t>(i) + 1]; ++t) {
        const auto u = static_cast<size_t>(t);
        const int64_t pos = t - offsets[static_cast<size_t>(i)];
        EXPECT_EQ(b.advantage[u], b.advantages[static_cast<size_t>(i)]);
        EXPECT_DOUBLE_EQ(b.logp_behav[u], -0.1 * static_cast<double>(pos + 1));
        const bool dropped = drop && i / 3 != 1;
        const bool after_eos = i == 4 && pos >= 3;
        EXPECT_EQ(b.mask[u], dropped || after_eos ? 0.0 : 1.0) << "completion " << i << " token " << pos;
      }
    EXPECT_DOUBLE_EQ(b.correct_share, 5.0 / 9);
    EXPECT_DOUBLE_EQ(b.finished_share, 6.0 / 9);
    EXPECT_DOUBLE_EQ(b.pass_share, 2.0 / 3);
    EXPECT_DOUBLE_EQ(b.length_mean, 3.0);  // the junk after EOS is not response
    EXPECT_EQ(b.length_max, 3);
  }
}

TEST(RlRollout, OneStepFromCompletionsToGradients) {
  // With logp = logp_behav (on-policy, r = 1) the gradient on every trained
  // token is -c_t A: descending it raises the log-prob of the right
  // completion and lowers the wrong one's.
  Fixture f;
  const RlConfig cfg = rl_preset(LossKind::grpo, 8);
  const ScoredBatch b = score_groups(*f.task, f.prompts, f.completions, 3, cfg.advantage);
  std::vector<double> grad(b.mask.size());
  const PolicyTokens in{b.logp_behav, {}, b.logp_behav, {}, b.advantage, b.mask, b.offsets};
  policy_loss_backward(grad, in, cfg.policy);
  const PolicyMetrics m = policy_loss_forward(in, cfg.policy);
  EXPECT_EQ(m.tokens, 27);  // 29 less the 2 after EOS
  for (int64_t t = 9; t < 12; ++t) EXPECT_LT(grad[static_cast<size_t>(t)], 0.0) << "right answer, A > 0";
  for (int64_t t = 17; t < 20; ++t) EXPECT_GT(grad[static_cast<size_t>(t)], 0.0) << "wrong answer, A < 0";
  for (int64_t t = 0; t < 9; ++t) EXPECT_EQ(grad[static_cast<size_t>(t)], 0.0) << "zero-variance group";
  EXPECT_EQ(grad[15], 0.0);
  EXPECT_EQ(grad[16], 0.0);
  // seq_mean over 9 sequences: the right answer's tokens get A / (3 * 9) each.
  EXPECT_NEAR(grad[9], -b.advantages[3] / 27, 1e-15);
}

TEST(RlRollout, BadSizesAreErrors) {
  Fixture f;
  EXPECT_THROW(score_groups(*f.task, f.prompts, f.completions, 4, {}), std::invalid_argument);
  f.completions[2].logp_behav.pop_back();
  EXPECT_THROW(score_groups(*f.task, f.prompts, f.completions, 3, {}), std::invalid_argument);
}

TEST(RlRollout, PassAtKMatchesCounting) {
  EXPECT_DOUBLE_EQ(pass_at_k(4, 1, 1), 0.25);
  EXPECT_DOUBLE_EQ(pass_at_k(4, 1, 2), 0.5);  // 1 - C(3,2)/C(4,2)
  EXPECT_EQ(pass_at_k(5, 0, 3), 0.0);
  EXPECT_EQ(pass_at_k(5, 4, 2), 1.0);
  // Against exact counting of k-subsets: C(n-c, k) / C(n, k) by binomials.
  auto binom = [](int64_t n, int64_t k) {
    double r = 1;
    for (int64_t i = 1; i <= k; ++i) r = r * static_cast<double>(n - k + i) / static_cast<double>(i);
    return r;
  };
  for (int64_t n = 1; n <= 12; ++n)
    for (int64_t c = 0; c <= n; ++c)
      for (int64_t k = 1; k <= n; ++k) {
        const double expect = n - c < k ? 1.0 : 1.0 - binom(n - c, k) / binom(n, k);
        EXPECT_NEAR(pass_at_k(n, c, k), expect, 1e-12) << n << " " << c << " " << k;
      }
  EXPECT_THROW(pass_at_k(4, 5, 1), std::invalid_argument);
  EXPECT_THROW(pass_at_k(4, 1, 0), std::invalid_argument);
  EXPECT_THROW(pass_at_k(4, 1, 5), std::invalid_argument);
}
