// The rl/ pieces chained into RL on a bandit: a tabular softmax policy over 10
// tokens, reward 1 when the first generated token is 3 (chance 0.1). Groups
// are sampled with sampler_seed(), scored by a task-specific Verifier
// (the interface is open to new tasks), turned into a batch by score_groups(),
// and trained through policy_loss_backward() chained into the softmax. For
// every loss kind the mean reward must rise from near chance to near 1: a
// wrong sign or a dropped term anywhere in the chain stops the learning.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "model/sampling.hpp"
#include "rl/loss.hpp"
#include "rl/rollout.hpp"

using namespace troupe;
using namespace troupe::rl;

namespace {

constexpr int64_t kVocab = 10;
constexpr int32_t kTarget = 3;

class FirstTokenVerifier final : public Verifier {
 public:
  Verdict score(const Prompt&, std::span<const int32_t> completion) const override {
    Verdict v;
    v.correct = !completion.empty() && completion[0] == kTarget;
    v.reward = v.correct ? 1.0 : 0.0;
    v.finished = true;
    return v;
  }
};

class BanditTask final : public Task {
 public:
  std::string describe() const override { return "bandit: reward 1 for token 3"; }
  Prompt train_prompt(int64_t index) const override { return Prompt{index, {0}, {kTarget}}; }
  std::vector<Prompt> eval_prompts(int64_t n) const override {
    std::vector<Prompt> out;
    for (int64_t i = 0; i < n; ++i) out.push_back(train_prompt(i));
    return out;
  }
  const Verifier& verifier() const override { return verifier_; }
  int32_t eos_token() const override { return -1; }

 private:
  FirstTokenVerifier verifier_;
};

std::vector<double> log_softmax(const std::vector<double>& theta) {
  double m = theta[0];
  for (double x : theta) m = std::max(m, x);
  double z = 0;
  for (double x : theta) z += std::exp(x - m);
  std::vector<double> out(theta.size());
  for (size_t i = 0; i < theta.size(); ++i) out[i] = theta[i] - m - std::log(z);
  return out;
}

// Mean reward per step of `steps` RL steps with `kind`'s preset.
std::vector<double> train(LossKind kind, int64_t steps) {
  const BanditTask task;
  RlConfig cfg = rl_preset(kind, 1);
  cfg.group_size = 8;
  const int64_t prompts_per_step = 4, updates_per_batch = 2;
  const double lr = kind == LossKind::dr_grpo ? 4.0 : 1.0;  // Dr. GRPO's advantages are not std-scaled
  std::vector<double> theta(kVocab, 0.0), stale = theta;
  std::vector<double> curve;
  for (int64_t step = 0; step < steps; ++step) {
    // decoupled_ppo samples with the weights of one step ago (behaviour mu),
    // the others on-policy.
    const std::vector<double>& behaviour = kind == LossKind::decoupled_ppo ? stale : theta;
    std::vector<float> logits(behaviour.begin(), behaviour.end());
    const std::vector<double> mu = log_softmax(behaviour);
    std::vector<Prompt> prompts;
    std::vector<Completion> completions;
    for (int64_t g = 0; g < prompts_per_step; ++g) {
      const GroupId id{42, step, g};
      prompts.push_back(task.train_prompt(prompt_index(id, prompts_per_step)));
      for (int64_t k = 0; k < cfg.group_size; ++k) {
        model::SamplerRng rng(sampler_seed(id, k));
        const int32_t tok = model::sample_token(logits.data(), kVocab, model::SamplingOptions{}, rng);
        completions.push_back(Completion{{tok}, {mu[static_cast<size_t>(tok)]}});
      }
    }
    const ScoredBatch b = score_groups(task, prompts, completions, cfg.group_size, cfg.advantage);
    curve.push_back(b.stats.reward_mean);
    std::copy(theta.begin(), theta.end(), stale.begin());  // same size; copy-assign trips a GCC 12 false -Wstringop-overflow
    const std::vector<double> prox_theta = log_softmax(theta);  // the policy at the batch's start
    std::vector<double> prox(b.mask.size());
    for (size_t t = 0; t < prox.size(); ++t) prox[t] = prox_theta[static_cast<size_t>(completions[t].tokens[0])];
    for (int64_t u = 0; u < updates_per_batch; ++u) {
      const std::vector<double> lp_all = log_softmax(theta);
      std::vector<double> logp(b.mask.size());
      for (size_t t = 0; t < logp.size(); ++t) logp[t] = lp_all[static_cast<size_t>(completions[t].tokens[0])];
      const PolicyTokens in{logp, prox, b.logp_behav, {}, b.advantage, b.mask, b.offsets};
      std::vector<double> g(logp.size());
      policy_loss_backward(g, in, cfg.policy);
      // dlogp_k/dtheta_j = [j == k] - p_j
      std::vector<double> dtheta(kVocab, 0.0);
      for (size_t t = 0; t < g.size(); ++t)
        for (int64_t j = 0; j < kVocab; ++j)
          dtheta[static_cast<size_t>(j)] +=
              g[t] * ((j == completions[t].tokens[0] ? 1.0 : 0.0) - std::exp(lp_all[static_cast<size_t>(j)]));
      for (int64_t j = 0; j < kVocab; ++j) theta[static_cast<size_t>(j)] -= lr * dtheta[static_cast<size_t>(j)];
    }
  }
  return curve;
}

}  // namespace

TEST(RlLearning, EveryLossKindLearnsTheBandit) {
  for (LossKind kind : {LossKind::grpo, LossKind::dr_grpo, LossKind::dapo, LossKind::decoupled_ppo}) {
    const std::vector<double> curve = train(kind, 40);
    EXPECT_LT(curve[0], 0.3) << loss_kind_name(kind) << ": starts near chance (0.1)";
    double tail = 0;
    for (size_t i = curve.size() - 5; i < curve.size(); ++i) tail += curve[i] / 5;
    EXPECT_GT(tail, 0.9) << loss_kind_name(kind) << ": mean reward of the last 5 steps";
    EXPECT_EQ(train(kind, 40), curve) << "same seed, same run";
  }
}
