// Tests of rl/loss: every loss kind and aggregation gradient-checked against
// float64 central finite differences, the loss compared with an independent
// float64 reference written from the formulas (std::min / std::clamp, no
// branches shared with the library), and hand-computed cases for each clip
// boundary, the behaviour-weight cap, masking and aggregation.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <vector>

#include "model/sampling.hpp"
#include "rl/loss.hpp"

using namespace troupe::rl;

namespace {

// Owns the per-token arrays; view() gives the spans the library takes.
struct Batch {
  std::vector<double> logp, prox, behav, ref, adv, mask;
  std::vector<int64_t> offsets{0};

  void add(double lp, double px, double bh, double rf, double a, double m) {
    logp.push_back(lp);
    prox.push_back(px);
    behav.push_back(bh);
    ref.push_back(rf);
    adv.push_back(a);
    mask.push_back(m);
  }
  void end_sequence() { offsets.push_back(static_cast<int64_t>(logp.size())); }
  PolicyTokens view(bool with_ref = true, bool with_prox = true) const {
    return PolicyTokens{logp, with_prox ? std::span<const double>(prox) : std::span<const double>(), behav,
                        with_ref ? std::span<const double>(ref) : std::span<const double>(), adv, mask, offsets};
  }
};

PolicyLossOptions options(LossKind kind, Aggregation agg, double kl = 0.0) {
  PolicyLossOptions o;
  o.kind = kind;
  o.clip_low = 0.2;
  o.clip_high = 0.28;
  o.behaviour_weight_cap = 1.6;
  o.kl_coef = kl;
  o.aggregation = agg;
  o.constant_norm = 7.0;
  return o;
}

// Independent float64 reference of L, straight from the definitions.
double reference_loss(const Batch& b, const PolicyLossOptions& o, bool with_ref) {
  const size_t seqs = b.offsets.size() - 1;
  std::vector<double> seq_sum(seqs, 0.0), seq_mask(seqs, 0.0);
  double total = 0.0, total_mask = 0.0;
  for (size_t s = 0; s < seqs; ++s)
    for (int64_t t = b.offsets[s]; t < b.offsets[s + 1]; ++t) {
      const auto i = static_cast<size_t>(t);
      if (b.mask[i] == 0) continue;
      const double r = std::exp(b.logp[i] - b.prox[i]);
      const double a = b.adv[i];
      const double surrogate = std::min(r * a, std::clamp(r, 1 - o.clip_low, 1 + o.clip_high) * a);
      double w = 1.0;
      if (o.kind == LossKind::decoupled_ppo) {
        w = std::exp(b.prox[i] - b.behav[i]);
        if (o.behaviour_weight_cap > 0 && w > o.behaviour_weight_cap)
          w = o.cap_mode == CapMode::mask ? 0.0 : o.behaviour_weight_cap;
      }
      double l = -w * surrogate;
      if (with_ref) {
        const double d = b.ref[i] - b.logp[i];
        l += o.kl_coef * (std::exp(d) - d - 1);
      }
      seq_sum[s] += b.mask[i] * l;
      seq_mask[s] += b.mask[i];
      total += b.mask[i] * l;
      total_mask += b.mask[i];
    }
  switch (o.aggregation) {
    case Aggregation::token_mean: return total_mask > 0 ? total / total_mask : 0.0;
    case Aggregation::seq_mean: {
      double sum = 0.0;
      int live = 0;
      for (size_t s = 0; s < seqs; ++s)
        if (seq_mask[s] > 0) {
          sum += seq_sum[s] / seq_mask[s];
          ++live;
        }
      return live > 0 ? sum / live : 0.0;
    }
    case Aggregation::seq_constant: return total / (static_cast<double>(seqs) * o.constant_norm);
  }
  return NAN;
}

// Random batch: 6 sequences (one empty, one fully masked), log-ratios within
// and beyond both clip bounds but at least 1e-3 away from them (the loss has
// a kink there), behaviour weights on both sides of the cap, fractional masks.
Batch random_batch(uint64_t seed) {
  troupe::model::SamplerRng rng(seed);
  auto u = [&](double lo, double hi) { return lo + (hi - lo) * rng.next_double(); };
  Batch b;
  const int lengths[] = {5, 0, 7, 3, 9, 4};
  for (int s = 0; s < 6; ++s) {
    const double a = u(-2, 2);  // one advantage per sequence, as the group advantages give
    for (int k = 0; k < lengths[s]; ++k) {
      const double prox = u(-4, -0.05);
      double log_ratio = u(-0.5, 0.5);
      for (double bound : {std::log(0.8), std::log(1.28)})
        if (std::abs(std::exp(log_ratio) - std::exp(bound)) < 1e-3) log_ratio += 3e-3;
      const double lp = prox + log_ratio;
      const double behav = prox - u(-0.9, 0.9);  // w = exp(prox - behav) in [0.4, 2.5]
      const double mask = s == 3 ? 0.0 : (k % 4 == 3 ? 0.0 : (k % 5 == 1 ? 0.5 : 1.0));
      b.add(lp, prox, behav, lp + u(-1, 1), a, mask);
    }
    b.end_sequence();
  }
  return b;
}

}  // namespace

TEST(RlLoss, GradientsMatchCentralFiniteDifferences) {
  // float64 central differences with h = 1e-6: truncation O(h^2 |l'''|) and
  // rounding O(eps |L| / h) are both ~1e-10 here; tolerance 1e-7 absolute +
  // 1e-6 relative.
  const double h = 1e-6;
  int checked = 0, clipped_seen = 0, capped_seen = 0;
  for (uint64_t seed : {1ull, 2ull, 3ull}) {
    const Batch base = random_batch(seed);
    for (LossKind kind : {LossKind::grpo, LossKind::dr_grpo, LossKind::dapo, LossKind::decoupled_ppo})
      for (Aggregation agg : {Aggregation::token_mean, Aggregation::seq_mean, Aggregation::seq_constant})
        for (CapMode cap : {CapMode::mask, CapMode::clip})
          for (double kl : {0.0, 0.3}) {
            PolicyLossOptions o = options(kind, agg, kl);
            o.cap_mode = cap;
            const bool with_ref = kl > 0;
            Batch b = base;
            std::vector<double> grad(b.logp.size());
            policy_loss_backward(grad, b.view(with_ref), o);
            const PolicyMetrics m = policy_loss_forward(b.view(with_ref), o);
            EXPECT_NEAR(m.loss, reference_loss(b, o, with_ref), 1e-12);
            clipped_seen += m.clip_low_fraction > 0 && m.clip_high_fraction > 0 ? 1 : 0;
            capped_seen += m.capped_fraction > 0 ? 1 : 0;
            for (size_t t = 0; t < b.logp.size(); ++t) {
              const double keep = b.logp[t];
              b.logp[t] = keep + h;
              const double up = policy_loss_forward(b.view(with_ref), o).loss;
              b.logp[t] = keep - h;
              const double down = policy_loss_forward(b.view(with_ref), o).loss;
              b.logp[t] = keep;
              const double fd = (up - down) / (2 * h);
              EXPECT_NEAR(grad[t], fd, 1e-7 + 1e-6 * std::abs(fd))
                  << loss_kind_name(kind) << " " << aggregation_name(agg) << " kl " << kl << " token " << t;
              if (b.mask[t] == 0) {
                EXPECT_EQ(grad[t], 0.0);
              }
              ++checked;
            }
          }
  }
  EXPECT_GT(checked, 1000);
  EXPECT_GT(clipped_seen, 0) << "the random batches must exercise both clip bounds";
  EXPECT_GT(capped_seen, 0) << "and the behaviour-weight cap";
}

// One token, mask 1, token_mean: L = l_0 and dL/dlogp = dl_0/dlogp.
struct One {
  PolicyMetrics m;
  double grad;
};
One one_token(double ratio, double advantage, PolicyLossOptions o, double w = 1.0) {
  Batch b;
  const double prox = -1.0;
  b.add(prox + std::log(ratio), prox, prox - std::log(w), 0.0, advantage, 1.0);
  b.end_sequence();
  One out;
  out.m = policy_loss_forward(b.view(false), o);
  std::vector<double> g(1);
  policy_loss_backward(g, b.view(false), o);
  out.grad = g[0];
  return out;
}

TEST(RlLoss, ClipBoundsForPositiveAndNegativeAdvantages) {
  PolicyLossOptions o = options(LossKind::dapo, Aggregation::token_mean);  // eps_low 0.2, eps_high 0.28
  // A > 0: only the high bound binds. Loss -min(r, clip(r)) * A.
  One x = one_token(1.5, 1.0, o);
  EXPECT_NEAR(x.m.loss, -1.28, 1e-12);
  EXPECT_EQ(x.grad, 0.0);
  EXPECT_EQ(x.m.clip_high_fraction, 1.0);
  EXPECT_EQ(x.m.clip_low_fraction, 0.0);
  x = one_token(1.25, 2.0, o);  // inside 1 + eps_high = 1.28: not clipped
  EXPECT_NEAR(x.m.loss, -2.5, 1e-12);
  EXPECT_NEAR(x.grad, -2.5, 1e-12);  // d(-r A)/dlogp = -r A
  EXPECT_EQ(x.m.clip_high_fraction, 0.0);
  x = one_token(0.5, 1.0, o);  // below 1 - eps_low with A > 0: the unclipped r A is the min
  EXPECT_NEAR(x.m.loss, -0.5, 1e-12);
  EXPECT_NEAR(x.grad, -0.5, 1e-12);
  EXPECT_EQ(x.m.clip_low_fraction, 0.0);
  // A < 0: only the low bound binds.
  x = one_token(0.5, -1.0, o);
  EXPECT_NEAR(x.m.loss, 0.8, 1e-12);
  EXPECT_EQ(x.grad, 0.0);
  EXPECT_EQ(x.m.clip_low_fraction, 1.0);
  EXPECT_EQ(x.m.clip_high_fraction, 0.0);
  x = one_token(0.9, -1.0, o);
  EXPECT_NEAR(x.m.loss, 0.9, 1e-12);
  EXPECT_NEAR(x.grad, 0.9, 1e-12);
  x = one_token(1.5, -1.0, o);  // above 1 + eps_high with A < 0: unclipped
  EXPECT_NEAR(x.m.loss, 1.5, 1e-12);
  EXPECT_NEAR(x.grad, 1.5, 1e-12);
  EXPECT_EQ(x.m.clip_high_fraction, 0.0);
  // eps_low and eps_high are not swapped: r = 0.75 with A < 0 is clipped by
  // eps_low = 0.2 but not by 0.28; r = 1.25 with A > 0 is clipped by eps_high = 0.2 only.
  x = one_token(0.75, -1.0, o);
  EXPECT_NEAR(x.m.loss, 0.8, 1e-12);
  o.clip_low = 0.28;
  x = one_token(0.75, -1.0, o);
  EXPECT_NEAR(x.m.loss, 0.75, 1e-12);
  o.clip_high = 0.2;
  x = one_token(1.25, 1.0, o);
  EXPECT_NEAR(x.m.loss, -1.2, 1e-12);
  EXPECT_EQ(x.grad, 0.0);
  // At a bound exactly both branches are equal; the gradient is the unclipped
  // one. r = exp(0) = 1 is exact, so put the bounds at 1.
  o = options(LossKind::grpo, Aggregation::token_mean);
  o.clip_low = 0.0;
  o.clip_high = 0.0;
  for (double a : {1.0, -1.0}) {
    x = one_token(1.0, a, o);
    EXPECT_EQ(x.m.loss, -a);
    EXPECT_EQ(x.grad, -a);
    EXPECT_EQ(x.m.clip_low_fraction + x.m.clip_high_fraction, 0.0);
  }
}

TEST(RlLoss, DecoupledBehaviourWeightAndCap) {
  PolicyLossOptions o = options(LossKind::decoupled_ppo, Aggregation::token_mean);
  o.behaviour_weight_cap = 3.0;
  // w = pi_prox / mu = 2, r = pi_theta / pi_prox = 1.1, A = 1: loss -w r A.
  One x = one_token(1.1, 1.0, o, 2.0);
  EXPECT_NEAR(x.m.loss, -2.2, 1e-12);
  EXPECT_NEAR(x.grad, -2.2, 1e-12);
  EXPECT_NEAR(x.m.behaviour_weight_mean, 2.0, 1e-12);
  EXPECT_EQ(x.m.capped_fraction, 0.0);
  // The clip applies to r, never to w: r = 1.5 clips at 1.28 whatever w is.
  x = one_token(1.5, 1.0, o, 2.0);
  EXPECT_NEAR(x.m.loss, -2.0 * 1.28, 1e-12);
  EXPECT_EQ(x.grad, 0.0);
  x = one_token(1.0, 1.0, o, 0.5);  // r = 1 while mu differs: stale data below the cap
  EXPECT_NEAR(x.m.loss, -0.5, 1e-12);
  EXPECT_NEAR(x.m.ratio_mean, 1.0, 1e-12);
  // Over the cap: masked (w = 0) or clipped (w = cap).
  o.behaviour_weight_cap = 1.5;
  x = one_token(1.1, 1.0, o, 2.0);
  EXPECT_EQ(x.m.loss, 0.0);
  EXPECT_EQ(x.grad, 0.0);
  EXPECT_EQ(x.m.capped_fraction, 1.0);
  EXPECT_NEAR(x.m.behaviour_weight_max, 2.0, 1e-12) << "metrics show w before the cap";
  o.cap_mode = CapMode::clip;
  x = one_token(1.1, 1.0, o, 2.0);
  EXPECT_NEAR(x.m.loss, -1.5 * 1.1, 1e-12);
  EXPECT_NEAR(x.grad, -1.5 * 1.1, 1e-12);
  // A masked (over-cap) token stays in the token_mean normaliser, as AReaL's.
  o.cap_mode = CapMode::mask;
  Batch b;
  b.add(std::log(1.1), 0.0, -std::log(2.0), 0.0, 1.0, 1.0);  // w = 2: over the cap
  b.add(std::log(1.1), 0.0, 0.0, 0.0, 1.0, 1.0);             // w = 1
  b.end_sequence();
  EXPECT_NEAR(policy_loss_forward(b.view(false), o).loss, -1.1 / 2, 1e-12);
  // The other kinds ignore mu: w = 1.
  o.kind = LossKind::grpo;
  EXPECT_NEAR(policy_loss_forward(b.view(false), o).loss, -1.1, 1e-12);
  // Without proximal log-probs PPO's ratio is to the behaviour policy: r = 2.2
  // for the first token, clipped at 1.28.
  EXPECT_NEAR(policy_loss_forward(b.view(false, false), o).loss, -(1.28 + 1.1) / 2, 1e-12);
}

TEST(RlLoss, KlToTheReferenceIsK3) {
  PolicyLossOptions o = options(LossKind::grpo, Aggregation::token_mean, 0.5);
  Batch b;
  b.add(std::log(0.5), std::log(0.5), std::log(0.5), std::log(0.25), 0.0, 1.0);  // A = 0: KL only
  b.end_sequence();
  const double d = std::log(0.5);  // ref - logp
  const PolicyMetrics m = policy_loss_forward(b.view(true), o);
  EXPECT_NEAR(m.kl_ref, 0.5 - d - 1, 1e-12);  // exp(d) - d - 1 = 0.19315
  EXPECT_NEAR(m.kl_ref, 0.1931471805599453, 1e-12);
  EXPECT_NEAR(m.loss, 0.5 * m.kl_ref, 1e-12);
  std::vector<double> g(1);
  policy_loss_backward(g, b.view(true), o);
  EXPECT_NEAR(g[0], 0.5 * (1 - 0.5), 1e-12);  // kl_coef * (1 - pi_ref / pi_theta)
  // A reference without kl_coef is a metric only.
  o.kl_coef = 0.0;
  EXPECT_EQ(policy_loss_forward(b.view(true), o).loss, 0.0);
  EXPECT_NEAR(policy_loss_forward(b.view(true), o).kl_ref, 0.1931471805599453, 1e-12);
}

TEST(RlLoss, AggregationModes) {
  // Per-token values: sequence 0 = {4}, sequence 1 = {1, 1, 100 (masked)}, sequence 2 = {9, 9} all masked.
  const std::vector<double> v{4, 1, 1, 100, 9, 9};
  const std::vector<double> mask{1, 1, 1, 0, 0, 0};
  const std::vector<int64_t> offsets{0, 1, 4, 6};
  EXPECT_DOUBLE_EQ(aggregate(v, mask, offsets, Aggregation::token_mean, 0), 6.0 / 3);
  EXPECT_DOUBLE_EQ(aggregate(v, mask, offsets, Aggregation::seq_mean, 0), (4.0 + 1.0) / 2);
  // The constant normaliser counts every sequence given, masked or not.
  EXPECT_DOUBLE_EQ(aggregate(v, mask, offsets, Aggregation::seq_constant, 4), 6.0 / (3 * 4));
  // Fractional mask weights weight both the sum and the normaliser.
  const std::vector<double> half{1, 0.5, 1, 0, 0, 0};
  EXPECT_DOUBLE_EQ(aggregate(v, half, offsets, Aggregation::token_mean, 0), (4 + 0.5 + 1) / 2.5);
  EXPECT_DOUBLE_EQ(aggregate(v, half, offsets, Aggregation::seq_mean, 0), (4 + 1.5 / 1.5) / 2);
  // Nothing masked in: 0, not NaN.
  const std::vector<double> none(6, 0.0);
  EXPECT_EQ(aggregate(v, none, offsets, Aggregation::token_mean, 0), 0.0);
  EXPECT_EQ(aggregate(v, none, offsets, Aggregation::seq_mean, 0), 0.0);
  EXPECT_THROW(aggregate(v, mask, offsets, Aggregation::seq_constant, 0), std::invalid_argument);

  // The loss uses the same reduction: with r = 1 and A = -1 each l_t = 1 * ... = A-weighted.
  Batch b;
  for (double a : {-4.0}) b.add(0, 0, 0, 0, a, 1);
  b.end_sequence();
  for (double a : {-1.0, -1.0, -100.0}) b.add(0, 0, 0, 0, a, a == -100.0 ? 0 : 1);
  b.end_sequence();
  for (int k = 0; k < 2; ++k) b.add(0, 0, 0, 0, -9.0, 0);
  b.end_sequence();
  // r = 1: l_t = -A_t, so the loss is the aggregate of -A = v.
  EXPECT_DOUBLE_EQ(policy_loss_forward(b.view(false), options(LossKind::dapo, Aggregation::token_mean)).loss, 2.0);
  EXPECT_DOUBLE_EQ(policy_loss_forward(b.view(false), options(LossKind::grpo, Aggregation::seq_mean)).loss, 2.5);
  PolicyLossOptions dr = options(LossKind::dr_grpo, Aggregation::seq_constant);
  dr.constant_norm = 4;
  EXPECT_DOUBLE_EQ(policy_loss_forward(b.view(false), dr).loss, 0.5);
  // Gradients are the aggregation weights times dl/dlogp = -r A = -A: seq_mean
  // gives 4 * 1/2 to the lone token and 1 * 1/(2*2) to each of the other two.
  std::vector<double> g(6);
  policy_loss_backward(g, b.view(false), options(LossKind::grpo, Aggregation::seq_mean));
  EXPECT_EQ(g, (std::vector<double>{2.0, 0.25, 0.25, 0.0, 0.0, 0.0}));
}

TEST(RlLoss, MetricsOverMaskedInTokens) {
  Batch b;
  b.add(std::log(1.5), 0, 0, 0, 1.0, 1);   // r 1.5, clipped high
  b.add(std::log(0.5), 0, 0, 0, -1.0, 1);  // r 0.5, clipped low
  b.add(std::log(1.1), 0, 0, 0, 1.0, 1);   // r 1.1
  b.add(std::log(0.9), 0, 0, 0, 1.0, 1);   // r 0.9
  b.end_sequence();
  b.add(NAN, NAN, NAN, NAN, NAN, 0);  // masked out: never read, never an error
  b.end_sequence();
  const PolicyMetrics m = policy_loss_forward(b.view(false), options(LossKind::dapo, Aggregation::token_mean));
  EXPECT_EQ(m.tokens, 4);
  EXPECT_EQ(m.sequences, 1);
  EXPECT_DOUBLE_EQ(m.clip_high_fraction, 0.25);
  EXPECT_DOUBLE_EQ(m.clip_low_fraction, 0.25);
  EXPECT_NEAR(m.ratio_min, 0.5, 1e-12);
  EXPECT_NEAR(m.ratio_max, 1.5, 1e-12);
  EXPECT_NEAR(m.ratio_mean, (1.5 + 0.5 + 1.1 + 0.9) / 4, 1e-12);
  double kl = 0;
  for (double r : {1.5, 0.5, 1.1, 0.9}) kl += r - 1 - std::log(r);
  EXPECT_NEAR(m.approx_kl, kl / 4, 1e-12);
  EXPECT_EQ(m.behaviour_weight_mean, 1.0);
  EXPECT_NEAR(m.pg_loss, -(1.28 - 0.8 + 1.1 + 0.9) / 4, 1e-12);
  std::vector<double> g(5);
  policy_loss_backward(g, b.view(false), options(LossKind::dapo, Aggregation::token_mean));
  EXPECT_EQ(g[4], 0.0);
}

TEST(RlLoss, BadInputIsAClearError) {
  Batch b = random_batch(9);
  const PolicyLossOptions o = options(LossKind::grpo, Aggregation::token_mean);
  std::vector<double> g(b.logp.size());
  auto message = [&](const PolicyTokens& in, const PolicyLossOptions& opt) {
    try {
      policy_loss_forward(in, opt);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  PolicyTokens in = b.view(false);
  in.advantage = in.advantage.subspan(1);
  EXPECT_NE(message(in, o).find("advantage has"), std::string::npos) << message(in, o);
  in = b.view(false);
  EXPECT_NE(message(in, options(LossKind::grpo, Aggregation::token_mean, 0.1)).find("needs the reference"),
            std::string::npos);
  in.logp_behav = {};
  EXPECT_NE(message(in, options(LossKind::decoupled_ppo, Aggregation::token_mean)).find("needs both"),
            std::string::npos);
  EXPECT_NO_THROW(policy_loss_forward(in, o)) << "PPO with proximal log-probs does not need mu";
  Batch bad = b;
  bad.logp[0] = NAN;
  ASSERT_GT(bad.mask[0], 0);
  EXPECT_NE(message(bad.view(false), o).find("logp of token 0 is not finite"), std::string::npos)
      << message(bad.view(false), o);
  bad = b;
  bad.mask[2] = -1;
  EXPECT_NE(message(bad.view(false), o).find("mask of token 2"), std::string::npos);
  bad = b;
  bad.offsets.back() -= 1;
  EXPECT_THROW(policy_loss_forward(bad.view(false), o), std::invalid_argument);
  std::vector<double> short_grad(b.logp.size() - 1);
  EXPECT_THROW(policy_loss_backward(short_grad, b.view(false), o), std::invalid_argument);
  PolicyLossOptions dr = options(LossKind::dr_grpo, Aggregation::seq_constant);
  dr.constant_norm = 0;
  EXPECT_THROW(policy_loss_backward(g, b.view(false), dr), std::invalid_argument);
}
