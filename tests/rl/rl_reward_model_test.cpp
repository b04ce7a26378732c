// The learned reward model (rl/reward_model.hpp, rl/rm_pairs.hpp,
// rl/rm_trainer.hpp):
//  - pointwise BCE with logits and the Bradley–Terry pair loss against
//    float64 central differences; pairs and pairwise accuracy by hand;
//  - the RM head's gradient (score = logit[yes] - logit[no] at the marker,
//    BCE or Bradley–Terry, through Decoder::backward_logits) for every
//    parameter against central differences of the float64 reference decoder
//    (tests/model/model_reference.cpp), dense and MoE with the aux loss;
//  - the data: every label is the verifier's verdict on its completion,
//    completions stop at the first EOS, and the data is a function of the seed;
//  - a tiny end-to-end run: accuracy is computed from the model's real scores,
//    training lowers the BCE (or the Bradley–Terry loss) on its training
//    data, runs are bitwise deterministic, and the checkpoint holds the
//    trained parameters.
#include <cmath>
#include <filesystem>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backend.hpp"
#include "model/checkpoint.hpp"
#include "model/params.hpp"
#include "model/weights.hpp"
#include "tests/model/model_reference.hpp"
#include "tests/model/model_test_util.hpp"
#include "rl/reward_model.hpp"
#include "rl/rm_pairs.hpp"
#include "rl/rm_reward.hpp"
#include "rl/rm_trainer.hpp"
#include "rl/rollout.hpp"
#include "rl/rollout_step.hpp"
#include "rl/task.hpp"
#include "tests/rl/rl_test_util.hpp"

namespace troupe::test {
namespace {

TEST(RlRewardModel, BceMatchesFiniteDifferencesAndHandValues) {
  const std::vector<double> s = {-3.0, -0.4, 0.0, 0.7, 5.0, 40.0};
  const std::vector<int> y = {0, 1, 1, 0, 1, 0};
  std::vector<double> ds;
  const double L = rl::bce_with_logits(s, y, &ds);
  // Hand values: -log sigmoid(s) for y = 1, -log(1 - sigmoid(s)) for y = 0.
  double ref = 0.0;
  for (size_t i = 0; i < s.size(); ++i) {
    const double p = 1.0 / (1.0 + std::exp(-s[i]));
    ref += y[i] ? -std::log(p) : (s[i] > 30 ? s[i] : -std::log(1.0 - p));
  }
  EXPECT_NEAR(L, ref / 6.0, 1e-12);
  const double h = 1e-6;
  for (size_t i = 0; i < s.size(); ++i) {
    std::vector<double> sp = s, sm = s;
    sp[i] += h;
    sm[i] -= h;
    const double fd = (rl::bce_with_logits(sp, y, nullptr) - rl::bce_with_logits(sm, y, nullptr)) / (2 * h);
    EXPECT_NEAR(ds[i], fd, 1e-8 + 1e-6 * std::fabs(fd)) << i;
  }
  EXPECT_THROW(rl::bce_with_logits(s, std::vector<int>{0, 1}, nullptr), std::invalid_argument);
  EXPECT_THROW(rl::bce_with_logits(std::vector<double>{1.0}, std::vector<int>{2}, nullptr), std::invalid_argument);
}

TEST(RlRewardModel, AccuracyAndMajorityBaseline) {
  const std::vector<double> s = {1.0, -2.0, 0.5, -0.1, 0.0};
  const std::vector<int> y = {1, 0, 0, 0, 1};
  const rl::RmAccuracy a = rl::rm_accuracy(s, y);
  EXPECT_EQ(a.examples, 5);
  EXPECT_EQ(a.positives, 2);
  EXPECT_DOUBLE_EQ(a.accuracy, 3.0 / 5.0);  // 1.0 right, -2 right, 0.5 wrong, -0.1 right, 0.0 wrong (not > 0)
  EXPECT_DOUBLE_EQ(a.majority, 3.0 / 5.0);
  EXPECT_DOUBLE_EQ(a.mean_score_pos, 0.5);
}

TEST(RlRewardModel, BradleyTerryMatchesFiniteDifferencesAndHandValues) {
  const std::vector<double> sp = {2.0, -0.5, 0.0, 30.0, -40.0};
  const std::vector<double> sn = {-1.0, 0.5, 0.0, -5.0, 3.0};
  std::vector<double> dp, dn;
  const double L = rl::bradley_terry_loss(sp, sn, &dp, &dn);
  double ref = 0.0;
  for (size_t i = 0; i < sp.size(); ++i) {
    const double m = sp[i] - sn[i];
    ref += m < -30 ? -m : -std::log(1.0 / (1.0 + std::exp(-m)));  // -log sigmoid(m); -m where exp overflows the form
  }
  EXPECT_NEAR(L, ref / 5.0, 1e-12);
  EXPECT_NEAR(rl::bradley_terry_loss(std::vector<double>{0.0}, std::vector<double>{0.0}, nullptr, nullptr), std::log(2.0), 1e-15);
  const double h = 1e-6;
  for (size_t i = 0; i < sp.size(); ++i)
    for (int side = 0; side < 2; ++side) {
      std::vector<double> pp = sp, pm = sp, np = sn, nm = sn;
      (side ? np : pp)[i] += h;
      (side ? nm : pm)[i] -= h;
      const double fd = (rl::bradley_terry_loss(pp, np, nullptr, nullptr) - rl::bradley_terry_loss(pm, nm, nullptr, nullptr)) / (2 * h);
      const double an = side ? dn[i] : dp[i];
      EXPECT_NEAR(an, fd, 1e-8 + 1e-6 * std::fabs(fd)) << i << " side " << side;
    }
  // Only the difference matters: shifting every score leaves the loss.
  std::vector<double> sp2 = sp, sn2 = sn;
  for (double& x : sp2) x += 3.25;
  for (double& x : sn2) x += 3.25;
  EXPECT_NEAR(rl::bradley_terry_loss(sp2, sn2, nullptr, nullptr), L, 1e-12);
  EXPECT_THROW(rl::bradley_terry_loss(sp, std::vector<double>{1.0}, nullptr, nullptr), std::invalid_argument);
  EXPECT_THROW(rl::bradley_terry_loss(std::vector<double>{}, std::vector<double>{}, nullptr, nullptr), std::invalid_argument);
}

TEST(RlRewardModel, PairsMatchEveryAcceptedWithEveryRejectedOfItsPrompt) {
  // Prompt 5: right, wrong, right, wrong; prompt 2: all right; prompt 9: all
  // wrong; prompt 4: one right, two wrong, with a member of it placed after
  // prompt 9's (groups are by prompt, not by position).
  std::vector<rl::RmExample> ex;
  for (auto [prompt, label] : std::vector<std::pair<int64_t, int>>{
           {5, 1}, {5, 0}, {5, 1}, {5, 0}, {2, 1}, {2, 1}, {4, 0}, {4, 1}, {9, 0}, {9, 0}, {4, 0}})
    ex.push_back({prompt, {}, {}, label});
  const rl::RmPairSet ps = rl::make_pairs(ex);
  EXPECT_EQ(ps.counts.groups, 4);
  EXPECT_EQ(ps.counts.all_right, 1);
  EXPECT_EQ(ps.counts.all_wrong, 1);
  const std::vector<std::pair<int64_t, int64_t>> want = {{0, 1}, {0, 3}, {2, 1}, {2, 3}, {7, 6}, {7, 10}};
  ASSERT_EQ(ps.pairs.size(), want.size());
  EXPECT_EQ(ps.counts.pairs, 6);
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(ps.pairs[i].pos, want[i].first) << i;
    EXPECT_EQ(ps.pairs[i].neg, want[i].second) << i;
    EXPECT_EQ(ex[static_cast<size_t>(ps.pairs[i].pos)].label, 1);
    EXPECT_EQ(ex[static_cast<size_t>(ps.pairs[i].neg)].label, 0);
    EXPECT_EQ(ex[static_cast<size_t>(ps.pairs[i].pos)].prompt_index, ex[static_cast<size_t>(ps.pairs[i].neg)].prompt_index);
  }
  // Pairwise accuracy: strict s_pos > s_neg, so a tie is wrong.
  const std::vector<double> s = {1.0, 0.0, -1.0, -1.0, 9.0, 9.0, 0.5, 2.0, 0.0, 0.0, 3.0};
  const rl::RmPairAccuracy a = rl::rm_pair_accuracy(s, ps.pairs);
  EXPECT_EQ(a.pairs, 6);
  // (0,1) right, (0,3) right, (2,1) wrong, (2,3) tie: wrong, (7,6) right, (7,10) wrong.
  EXPECT_DOUBLE_EQ(a.accuracy, 3.0 / 6.0);
  const std::vector<double> p = {1.0, 1.0, -1.0, -1.0, 2.0, 2.0}, n = {0.0, -1.0, 0.0, -1.0, 0.5, 3.0};
  EXPECT_NEAR(a.loss, rl::bradley_terry_loss(p, n, nullptr, nullptr), 1e-15);
  EXPECT_EQ(rl::rm_pair_accuracy(s, std::vector<rl::RmPair>{}).pairs, 0);
}

// The RM's rows as reward_model.hpp lays them out: prompt, completion,
// marker, then markers to the row's end.
struct Ex {
  std::vector<int32_t> prompt, completion;
  int label;
};

// The loss the RM trains, from the float64 reference's logits: BCE against
// the labels, or (pairs given) Bradley–Terry over the pairs of rows.
double ref_rm_loss(const RefResult& r, const std::vector<int64_t>& pos, const std::vector<int>& labels,
                   const std::vector<rl::RmPair>& pairs, const rl::RmTokens& tok, int64_t V, double aux_scale) {
  std::vector<double> s;
  for (int64_t p : pos) s.push_back(r.logits[p * V + tok.yes] - r.logits[p * V + tok.no]);
  if (pairs.empty()) return rl::bce_with_logits(s, labels, nullptr) + aux_scale * r.aux_loss;
  std::vector<double> sp, sn;
  for (const rl::RmPair& q : pairs) {
    sp.push_back(s[static_cast<size_t>(q.pos)]);
    sn.push_back(s[static_cast<size_t>(q.neg)]);
  }
  return rl::bradley_terry_loss(sp, sn, nullptr, nullptr) + aux_scale * r.aux_loss;
}

// Every trainable parameter's gradient of the RM loss (BCE, or Bradley–Terry
// when `pairwise`) against central differences of the float64 reference.
void check_head_gradient(const std::string& ffn, bool pairwise) {
  {
    model::ModelConfig cfg = tiny_config(ffn);
    cfg.seq_len = 8;
    cfg.tie_embeddings = ffn == "dense";
    const int64_t V = cfg.vocab_size, S = cfg.seq_len, batch = 3;
    const double aux_scale = ffn == "moe" ? 0.5 : 0.0;
    const rl::RmTokens tok = rl::rm_tokens(V);
    const std::vector<Ex> exs = {{{12, 3, 10}, {4, 12}, 1}, {{12, 1}, {9, 9, 9}, 0}, {{12, 2, 11}, {7}, 0}};
    std::vector<rl::RmExample> rex;
    std::vector<int32_t> inputs(static_cast<size_t>(batch * S), tok.marker), targets(inputs.size(), -1);
    std::vector<int64_t> pos;
    std::vector<int> labels;
    // Row 0 is in two pairs and row 2 on both sides: a row's gradient gathers
    // every pair it is in.
    const std::vector<rl::RmPair> pairs =
        pairwise ? std::vector<rl::RmPair>{{0, 1}, {0, 2}, {2, 1}} : std::vector<rl::RmPair>{};
    for (int64_t b = 0; b < batch; ++b) {
      const Ex& e = exs[b];
      rex.push_back({b, e.prompt, e.completion, e.label});
      int64_t t = 0;
      for (int32_t x : e.prompt) inputs[b * S + t++] = x;
      for (int32_t x : e.completion) inputs[b * S + t++] = x;
      pos.push_back(b * S + t);  // the marker (already in place)
      labels.push_back(e.label);
    }
    const model::ParamLayout L = model::build_param_layout(cfg);
    std::vector<float> params;
    std::vector<double> p64;
    RefResult base;
    bool found = false;
    for (uint64_t seed = 1; seed <= 50 && !found; ++seed) {
      params = model::init_params(L, cfg, seed);
      p64.assign(params.begin(), params.end());
      base = reference_forward(cfg, L, p64, inputs, targets, batch);
      found = base.min_margin > 1e-3;
    }
    ASSERT_TRUE(found) << "no seed with clear routing margins";

    auto be = kernels::make_backend({});
    kernels::Tensor p = be->from_f32({L.total()}, params);
    kernels::Tensor g = be->zeros({L.total()});
    const model::ModelWeights w = model::bind_weights(L, cfg, p);
    const model::ModelWeights gw = model::bind_weights(L, cfg, g);
    rl::RewardModel rm(*be, cfg, batch, 7);
    ASSERT_EQ(rm.row_tokens(), S);
    std::vector<double> scores;
    const double loss = pairwise ? rm.train_pairs(w, gw, rex, pairs, aux_scale, &scores)
                                 : rm.train_batch(w, gw, rex, aux_scale, &scores);
    EXPECT_NEAR(loss + aux_scale * base.aux_loss, ref_rm_loss(base, pos, labels, pairs, tok, V, aux_scale), 1e-5);
    for (int64_t b = 0; b < batch; ++b)
      EXPECT_NEAR(scores[b], base.logits[pos[b] * V + tok.yes] - base.logits[pos[b] * V + tok.no], 1e-4);
    // score() gives the same scores as the training forward.
    const std::vector<double> again = rm.score(w, rex);
    for (int64_t b = 0; b < batch; ++b) EXPECT_EQ(again[b], scores[b]);

    const std::vector<float> grads = be->download_f32(g);
    const double h = 1e-5;
    int64_t checked = 0;
    double nonzero = 0.0;
    for (const auto& e : L.entries()) {
      if (!e.trainable) continue;
      double diff2 = 0.0, ref2 = 0.0;
      for (int64_t i = 0; i < e.numel; ++i) {
        const size_t idx = static_cast<size_t>(e.offset + i);
        const double keep = p64[idx];
        p64[idx] = keep + h;
        const RefResult rp = reference_forward(cfg, L, p64, inputs, targets, batch);
        p64[idx] = keep - h;
        const RefResult rmn = reference_forward(cfg, L, p64, inputs, targets, batch);
        p64[idx] = keep;
        ASSERT_EQ(rp.routing, base.routing) << e.name << "[" << i << "]: routing changed under +h";
        ASSERT_EQ(rmn.routing, base.routing) << e.name << "[" << i << "]: routing changed under -h";
        const double fd = (ref_rm_loss(rp, pos, labels, pairs, tok, V, aux_scale) -
                           ref_rm_loss(rmn, pos, labels, pairs, tok, V, aux_scale)) / (2.0 * h);
        const double gg = static_cast<double>(grads[idx]);
        EXPECT_LE(std::fabs(gg - fd), 1e-6 + 1e-3 * std::fabs(fd)) << e.name << "[" << i << "]: analytic " << gg << " vs FD " << fd;
        diff2 += (gg - fd) * (gg - fd);
        ref2 += fd * fd;
        nonzero += std::fabs(fd);
        ++checked;
      }
      EXPECT_LE(std::sqrt(diff2), 1e-4 * std::sqrt(ref2) + 1e-7) << e.name;
    }
    EXPECT_GT(checked, 0);
    EXPECT_GT(nonzero, 1e-3);  // the check is not vacuous
  }
}

TEST(RlRewardModel, HeadGradientMatchesFloat64Reference) {
  for (const std::string ffn : {"dense", "moe"}) {
    SCOPED_TRACE(ffn);
    check_head_gradient(ffn, false);
  }
}

TEST(RlRewardModel, BradleyTerryGradientMatchesFloat64Reference) {
  for (const std::string ffn : {"dense", "moe"}) {
    SCOPED_TRACE(ffn);
    check_head_gradient(ffn, true);
  }
}

rl::RlTrainOptions rm_options() {
  rl::RlTrainOptions o = tiny_options("dense");
  o.rl.rm_prompts = 24;
  o.rl.rm_batch = 16;
  o.rl.group_size = 4;
  o.rl.temperature = 1.0;
  o.data.eval_problems = 8;
  o.optim.lr = 3e-3;
  o.steps = 30;
  return o;
}

TEST(RlRewardModel, EveryLabelIsTheVerifiersVerdict) {
  const rl::RlTrainOptions o = rm_options();
  rl::RmTrainer tr(o, std::make_unique<FirstTokenTask>());
  const auto& train = tr.train_examples();
  const auto& held = tr.heldout_examples();
  ASSERT_EQ(static_cast<int64_t>(train.size()), o.rl.rm_prompts * o.rl.group_size);
  ASSERT_EQ(static_cast<int64_t>(held.size()), o.data.eval_problems * o.rl.group_size);
  FirstTokenTask task;
  int64_t pos = 0;
  for (const auto* set : {&train, &held})
    for (const rl::RmExample& e : *set) {
      rl::Prompt p;
      p.index = e.prompt_index;
      p.tokens = e.prompt;
      EXPECT_EQ(e.label, task.verifier().score(p, e.completion).correct ? 1 : 0);
      EXPECT_EQ(e.label, !e.completion.empty() && e.completion[0] == kTarget ? 1 : 0);  // the rule itself
      ASSERT_FALSE(e.completion.empty());
      EXPECT_LE(static_cast<int64_t>(e.completion.size()), o.rl.max_new_tokens);
      for (size_t j = 0; j + 1 < e.completion.size(); ++j) EXPECT_NE(e.completion[j], kEos) << "EOS before the end";
      pos += e.label;
    }
  EXPECT_EQ(tr.data_stats().train_positives + tr.data_stats().heldout_positives, pos);
  // Held-out prompts are not training prompts.
  for (const rl::RmExample& h : held)
    for (const rl::RmExample& t : train) ASSERT_NE(h.prompt_index, t.prompt_index);
  // A pure function of the seed.
  rl::RmTrainer again(o, std::make_unique<FirstTokenTask>());
  for (size_t i = 0; i < train.size(); ++i) {
    EXPECT_EQ(train[i].completion, again.train_examples()[i].completion);
    EXPECT_EQ(train[i].label, again.train_examples()[i].label);
  }
}

TEST(RlRewardModel, TrainingLowersTheLossAndAccuracyComesFromRealScores) {
  rl::RlTrainOptions o = rm_options();
  rl::RmTrainer tr(o, std::make_unique<FirstTokenTask>());
  const rl::RmEvalMetrics before = tr.evaluate();
  // Accuracy and baseline recomputed here from the model's own scores.
  const std::vector<double> s0 = tr.score(tr.heldout_examples());
  int64_t right = 0, positives = 0;
  for (size_t i = 0; i < s0.size(); ++i) {
    right += (s0[i] > 0) == (tr.heldout_examples()[i].label == 1);
    positives += tr.heldout_examples()[i].label;
  }
  const double n = static_cast<double>(s0.size());
  EXPECT_DOUBLE_EQ(before.heldout.accuracy, static_cast<double>(right) / n);
  EXPECT_DOUBLE_EQ(before.heldout.majority, std::max<double>(positives, n - positives) / n);
  ASSERT_GT(tr.data_stats().train_positives, 0);
  ASSERT_LT(tr.data_stats().train_positives, tr.data_stats().train_examples);
  for (int64_t s = 0; s < o.steps; ++s) {
    const rl::RmStepMetrics m = tr.step();
    ASSERT_TRUE(std::isfinite(m.loss));
    EXPECT_EQ(m.step, s + 1);
  }
  const rl::RmEvalMetrics after = tr.evaluate();
  EXPECT_LT(after.train.bce, 0.8 * before.train.bce) << before.train.bce << " -> " << after.train.bce;
  const std::vector<double> s1 = tr.score(tr.heldout_examples());
  EXPECT_NE(s0, s1);
  EXPECT_DOUBLE_EQ(after.heldout.bce, rl::bce_with_logits(s1, [&] {
                     std::vector<int> y;
                     for (const auto& e : tr.heldout_examples()) y.push_back(e.label);
                     return y;
                   }(), nullptr));
}

std::vector<double> scores_at(const std::vector<double>& s, const std::vector<rl::RmPair>& pairs, bool pos) {
  std::vector<double> out;
  for (const rl::RmPair& p : pairs) out.push_back(s[static_cast<size_t>(pos ? p.pos : p.neg)]);
  return out;
}

TEST(RlRewardModel, BradleyTerryTrainingRaisesPairwiseAccuracy) {
  rl::RlTrainOptions o = rm_options();
  o.rl.rm_loss = rl::RmLoss::bradley_terry;
  rl::RmTrainer tr(o, std::make_unique<FirstTokenTask>());
  // The trainer's pairs are the data's: every accepted against every rejected
  // completion of a prompt; all-right / all-wrong prompts counted apart.
  const rl::RmPairSet want = rl::make_pairs(tr.train_examples());
  const rl::RmPairSet& got = tr.train_pairs();
  ASSERT_EQ(got.pairs.size(), want.pairs.size());
  ASSERT_GT(got.pairs.size(), 0u);
  EXPECT_EQ(got.counts.groups, o.rl.rm_prompts);
  EXPECT_EQ(tr.data_stats().train_groups.pairs, got.counts.pairs);
  EXPECT_EQ(tr.data_stats().heldout_groups.groups, o.data.eval_problems);
  int64_t mixed_pairs = 0;
  for (int64_t g = 0; g < o.rl.rm_prompts; ++g) {
    int64_t r = 0;
    for (int64_t j = 0; j < o.rl.group_size; ++j) r += tr.train_examples()[static_cast<size_t>(g * o.rl.group_size + j)].label;
    mixed_pairs += r * (o.rl.group_size - r);
  }
  EXPECT_EQ(got.counts.pairs, mixed_pairs);

  const rl::RmEvalMetrics before = tr.evaluate();
  for (int64_t s = 0; s < o.steps; ++s) ASSERT_TRUE(std::isfinite(tr.step().loss));
  const rl::RmEvalMetrics after = tr.evaluate();
  EXPECT_LT(after.train_pairs.loss, 0.8 * before.train_pairs.loss) << before.train_pairs.loss << " -> " << after.train_pairs.loss;
  EXPECT_GT(after.train_pairs.accuracy, before.train_pairs.accuracy);
  // The reported held-out pair metrics are those of the model's own scores.
  const std::vector<double> s = tr.score(tr.heldout_examples());
  const auto& hp = tr.heldout_pairs().pairs;
  ASSERT_EQ(after.heldout_pairs.pairs, static_cast<int64_t>(hp.size()));
  int64_t right = 0;
  for (const rl::RmPair& p : hp) right += s[static_cast<size_t>(p.pos)] > s[static_cast<size_t>(p.neg)];
  if (!hp.empty()) {
    EXPECT_DOUBLE_EQ(after.heldout_pairs.accuracy, static_cast<double>(right) / static_cast<double>(hp.size()));
    EXPECT_DOUBLE_EQ(after.heldout_pairs.loss,
                     rl::bradley_terry_loss(scores_at(s, hp, true), scores_at(s, hp, false), nullptr, nullptr));
  }

  // Bitwise deterministic, and a different model from BCE on the same data.
  rl::RmTrainer again(o, std::make_unique<FirstTokenTask>());
  for (int64_t i = 0; i < o.steps; ++i) again.step();
  EXPECT_EQ(again.parameters(), tr.parameters());
  o.rl.rm_loss = rl::RmLoss::bce;
  rl::RmTrainer bce(o, std::make_unique<FirstTokenTask>());
  for (int64_t i = 0; i < o.steps; ++i) bce.step();
  EXPECT_NE(bce.parameters(), tr.parameters());
}

// Every completion right: no prompt gives a pair.
class AllRightTask final : public rl::Task {
 public:
  class Yes final : public rl::Verifier {
   public:
    rl::Verdict score(const rl::Prompt&, std::span<const int32_t>) const override {
      rl::Verdict v;
      v.correct = true;
      v.reward = 1.0;
      return v;
    }
  };
  std::string describe() const override { return "everything is right"; }
  rl::Prompt train_prompt(int64_t index) const override { return inner_.train_prompt(index); }
  std::vector<rl::Prompt> eval_prompts(int64_t n) const override { return inner_.eval_prompts(n); }
  const rl::Verifier& verifier() const override { return yes_; }
  int32_t eos_token() const override { return kEos; }

 private:
  FirstTokenTask inner_;
  Yes yes_;
};

TEST(RlRewardModel, BradleyTerryWithoutPairsIsRefused) {
  rl::RlTrainOptions o = rm_options();
  o.rl.rm_loss = rl::RmLoss::bradley_terry;
  try {
    rl::RmTrainer tr(o, std::make_unique<AllRightTask>());
    FAIL() << "accepted a Bradley-Terry run without pairs";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("none of the 24 training prompts"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("24 all right"), std::string::npos) << e.what();
  }
  o.rl.rm_loss = rl::RmLoss::bce;  // pointwise BCE trains on the same data
  rl::RmTrainer tr(o, std::make_unique<AllRightTask>());
  EXPECT_EQ(tr.data_stats().train_groups.all_right, 24);
  EXPECT_EQ(tr.data_stats().train_groups.pairs, 0);
  // An odd rm_batch cannot be split into pairs.
  o.rl.rm_loss = rl::RmLoss::bradley_terry;
  o.rl.rm_batch = 15;
  const auto problems = rl::check_config(o.rl);
  ASSERT_EQ(problems.size(), 1u);
  EXPECT_EQ(problems[0].key, "rm_batch");
}

class Quiet final : public rl::RmObserver {
 public:
  void on_step(const rl::RmStepMetrics&) override { ++steps; }
  void on_eval(const rl::RmEvalMetrics&) override { ++evals; }
  int steps = 0, evals = 0;
};

TEST(RlRewardModel, EndToEndIsDeterministicAndSavesTheModel) {
  // The built-in addition task with a fresh model: the loop, the summary and
  // the checkpoint (the RM is an ordinary checkpoint of the same model).
  rl::RlTrainOptions o = rm_options();
  o.model.vocab_size = 20;
  o.model.seq_len = 24;
  o.data.source = model::DataKind::addition;
  o.data.digits = 2;
  o.rl.max_new_tokens = 4;
  o.rl.rm_prompts = 8;
  o.steps = 6;
  o.eval_every = 3;
  const std::string dir = (std::filesystem::temp_directory_path() / "troupe_rm_e2e").string();
  std::filesystem::remove_all(dir);
  o.checkpoint_dir = dir;
  Quiet q1, q2;
  const rl::RmSummary a = rl::train_reward_model(o, q1);
  EXPECT_EQ(a.steps_done, 6);
  EXPECT_EQ(q1.steps, 6);
  EXPECT_EQ(q1.evals, 3);  // before, at 3, at 6
  EXPECT_EQ(a.first_eval.step, 0);
  EXPECT_EQ(a.last_eval.step, 6);
  EXPECT_EQ(a.first_eval.heldout.examples, o.data.eval_problems * o.rl.group_size);
  const model::TrainingState st = model::load_checkpoint(dir);
  EXPECT_EQ(st.step, 6);
  o.checkpoint_dir.clear();
  const rl::RmSummary b = rl::train_reward_model(o, q2);
  EXPECT_EQ(a.last_eval.heldout.bce, b.last_eval.heldout.bce);
  EXPECT_EQ(a.last_eval.train.bce, b.last_eval.train.bce);
  rl::RmTrainer tr(o);
  for (int i = 0; i < 6; ++i) tr.step();
  EXPECT_EQ(tr.parameters(), st.params);  // bitwise, and what was saved
  std::filesystem::remove_all(dir);
}

TEST(RlRewardModel, ResumeContinuesBitForBitAndRefusesAnotherRun) {
  // For both losses: 3 steps, save, a fresh trainer resumes and takes 3 more;
  // weights and both AdamW moments equal 6 uninterrupted steps bit for bit.
  for (const rl::RmLoss loss : {rl::RmLoss::bce, rl::RmLoss::bradley_terry}) {
    SCOPED_TRACE(rl::rm_loss_name(loss));
    rl::RlTrainOptions o = rm_options();
    o.rl.rm_loss = loss;
    o.optim.schedule = model::LrSchedule::cosine;  // the schedule depends on the step: resumed steps must count
    o.optim.warmup_steps = 2;
    o.steps = 6;
    const std::string half = (std::filesystem::temp_directory_path() / "troupe_rm_resume_half").string();
    const std::string full = (std::filesystem::temp_directory_path() / "troupe_rm_resume_full").string();
    const std::string cont = (std::filesystem::temp_directory_path() / "troupe_rm_resume_cont").string();
    for (const auto* d : {&half, &full, &cont}) std::filesystem::remove_all(*d);
    {
      rl::RmTrainer a(o, std::make_unique<FirstTokenTask>());
      for (int i = 0; i < 3; ++i) a.step();
      a.save(half);
      for (int i = 0; i < 3; ++i) a.step();
      a.save(full);
    }
    rl::RlTrainOptions r = o;
    r.resume_from = half;
    rl::RmTrainer b(r, std::make_unique<FirstTokenTask>());
    EXPECT_EQ(b.resumed_from(), 3);
    EXPECT_EQ(b.steps_done(), 3);
    const rl::RmStepMetrics m = b.step();
    EXPECT_EQ(m.step, 4);
    for (int i = 0; i < 2; ++i) b.step();
    b.save(cont);
    const model::TrainingState want = model::load_checkpoint(full), got = model::load_checkpoint(cont);
    EXPECT_EQ(got.step, 6);
    EXPECT_EQ(got.params, want.params);
    EXPECT_EQ(got.adam_m, want.adam_m);
    EXPECT_EQ(got.adam_v, want.adam_v);
    EXPECT_EQ(got.rng_state, want.rng_state);
    // Resuming the half-way checkpoint with a different run is refused, naming the file.
    rl::RlTrainOptions other = r;
    other.rl.rm_loss = loss == rl::RmLoss::bce ? rl::RmLoss::bradley_terry : rl::RmLoss::bce;
    EXPECT_THROW(rl::RmTrainer(other, std::make_unique<FirstTokenTask>()), model::CheckpointError);
    other = r;
    other.rl.temperature = 0.7;  // other completions: another data fingerprint
    EXPECT_THROW(rl::RmTrainer(other, std::make_unique<FirstTokenTask>()), model::CheckpointError);
    other = r;
    other.seed = o.seed + 1;
    EXPECT_THROW(rl::RmTrainer(other, std::make_unique<FirstTokenTask>()), model::CheckpointError);
    for (const auto* d : {&half, &full, &cont}) std::filesystem::remove_all(*d);
  }
  // A checkpoint of another kind of run (no data fingerprint) is refused.
  rl::RlTrainOptions o = rm_options();
  const std::string plain = (std::filesystem::temp_directory_path() / "troupe_rm_resume_plain").string();
  std::filesystem::remove_all(plain);
  {
    const model::ParamLayout L = model::build_param_layout(o.model);
    model::TrainingState st;
    st.config = o.model;
    st.seed = o.seed;
    st.step = 2;
    st.params = model::init_params(L, o.model, o.seed);
    st.adam_m.assign(st.params.size(), 0.0f);
    st.adam_v.assign(st.params.size(), 0.0f);
    st.data_cursor = 2;
    model::save_checkpoint(plain, st, L);
  }
  o.resume_from = plain;
  try {
    rl::RmTrainer tr(o, std::make_unique<FirstTokenTask>());
    ADD_FAILURE() << "resumed from a checkpoint that is not a reward model's";
  } catch (const model::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("not a checkpoint of a reward-model run"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(plain);
}

TEST(RlRewardModel, RlRewardedByTheModelGetsSigmoidOfItsScores) {
  // A tiny RM trained and saved, then used as the RL reward (rl.reward = "model").
  rl::RlTrainOptions o = rm_options();
  const std::string dir = (std::filesystem::temp_directory_path() / "troupe_rm_reward").string();
  std::filesystem::remove_all(dir);
  {
    rl::RmTrainer tr(o, std::make_unique<FirstTokenTask>());
    for (int i = 0; i < 10; ++i) tr.step();
    tr.save(dir);
  }
  FirstTokenTask task;
  auto be = kernels::make_backend({});
  const int64_t G = 4;
  o.rl.group_size = G;
  o.rl.prompts_per_step = 2;
  rl::ModelReward mr(*be, o.model, dir, task, 8, 3 + o.rl.max_new_tokens + 1);
  rl::StepRollouts r;
  std::vector<rl::RmExample> ex;
  const std::vector<std::vector<int32_t>> comps = {{7, 12}, {3, 12}, {7, 1, 2}, {7, 12, 5}, {12}, {7, 7, 7}, {0, 12}, {7}};
  for (int64_t g = 0; g < 2; ++g) r.prompts.push_back(task.train_prompt(g));
  for (size_t i = 0; i < comps.size(); ++i) {
    model::Completion c;
    c.tokens = comps[i];
    c.logprobs.assign(c.tokens.size(), -1.0f);
    r.completions.push_back(c);
    const rl::Prompt& p = r.prompts[i / G];
    // What the RM reads: the completion up to its first EOS ({7, 12, 5} -> {7, 12}).
    std::vector<int32_t> upto;
    for (int32_t t : comps[i]) {
      upto.push_back(t);
      if (t == kEos) break;
    }
    ex.push_back({p.index, p.tokens, upto, 0});
  }
  const rl::ScoredBatch sb = mr.score_step(o.rl, r);
  // An independent scorer over the saved checkpoint.
  const model::ParamLayout L = model::build_param_layout(o.model);
  const model::TrainingState st = model::load_checkpoint(dir);
  kernels::Tensor p = be->from_f32({L.total()}, st.params);
  const model::ModelWeights w = model::bind_weights(L, o.model, p);
  rl::RewardModel rm(*be, o.model, 8, 3 + o.rl.max_new_tokens + 1);
  const std::vector<double> s = rm.score(w, ex);
  bool distinct = false;
  for (size_t i = 0; i < comps.size(); ++i) {
    EXPECT_NEAR(sb.rewards[i], 1.0 / (1.0 + std::exp(-s[i])), 1e-12) << i;
    EXPECT_EQ(sb.verdicts[i].correct, task.verifier().score(r.prompts[i / G], comps[i]).correct) << i;
    distinct = distinct || std::fabs(sb.rewards[i] - sb.rewards[0]) > 1e-6;
  }
  EXPECT_TRUE(distinct);  // the rewards are the RM's, not a constant
  EXPECT_EQ(sb.rewards[0], sb.rewards[3]);  // {7, 12} and {7, 12, 5} read the same row

  // The synchronous loop with rl.reward = "model" runs, and refuses an RM of another model.
  o.rl.reward = rl::RewardSource::model;
  o.rl.reward_model = dir;
  o.steps = 2;
  rl::RlTrainer tr(o, std::make_unique<FirstTokenTask>());
  const rl::RlStepMetrics m = tr.step();
  EXPECT_GT(m.reward_mean, 0.0);
  EXPECT_LT(m.reward_mean, 1.0);
  rl::RlTrainOptions bad = o;
  bad.model.d_model = 64;
  bad.rl.init.clear();
  EXPECT_THROW(rl::RlTrainer(bad, std::make_unique<FirstTokenTask>()), model::CheckpointError);  // names the tensor
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace troupe::test
