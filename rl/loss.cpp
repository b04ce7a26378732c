// Policy losses: forward, backward and aggregation (loss.hpp). Both passes
// evaluate each token with the same term_at(), so the gradient always belongs
// to the loss the forward reports.
#include "rl/loss.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <stdexcept>
#include <string>
#include <vector>

#include "rl/group.hpp"

namespace troupe::rl {
namespace {

// One token's contribution l_t and dl_t/dlogp_t, plus what the metrics need.
struct Term {
  double loss = 0.0;   // l_t = -w o + kl_coef k3
  double dloss = 0.0;  // dl_t / dlogp_t
  double pg = 0.0;     // -w o
  double k3 = 0.0;     // KL estimate to the reference (0 without one)
  double r = 1.0;      // pi_theta / pi_prox
  double w_raw = 1.0;  // pi_prox / mu before the cap
  bool clip_low = false, clip_high = false, capped = false;
};

double prox_at(const PolicyTokens& in, size_t t) { return in.logp_prox.empty() ? in.logp_behav[t] : in.logp_prox[t]; }

// One token's term from its values (behav is read by decoupled_ppo only,
// ref only when has_ref).
Term term_of(double lp, double prox, double behav, bool has_ref, double ref, double a, const PolicyLossOptions& o) {
  Term x;
  x.r = std::exp(lp - prox);
  const double lo = 1.0 - o.clip_low, hi = 1.0 + o.clip_high;
  // min(r A, clip(r) A) is the clipped (constant) branch exactly when these hold.
  x.clip_high = a > 0 && x.r > hi;
  x.clip_low = a < 0 && x.r < lo;
  const double obj = x.clip_high ? hi * a : x.clip_low ? lo * a : x.r * a;
  const double dobj = x.clip_high || x.clip_low ? 0.0 : x.r * a;  // d(r A)/dlogp = r A
  double w = 1.0;
  if (o.kind == LossKind::decoupled_ppo) {
    x.w_raw = std::exp(prox - behav);
    x.capped = o.behaviour_weight_cap > 0 && x.w_raw > o.behaviour_weight_cap;
    w = !x.capped ? x.w_raw : o.cap_mode == CapMode::mask ? 0.0 : o.behaviour_weight_cap;
  }
  x.pg = -w * obj;
  x.loss = x.pg;
  x.dloss = -w * dobj;
  if (has_ref) {
    const double d = ref - lp, e = std::exp(d);
    x.k3 = e - d - 1.0;
    x.loss += o.kl_coef * x.k3;
    x.dloss += o.kl_coef * (1.0 - e);  // d k3 / dlogp = -e + 1
  }
  return x;
}

Term term_at(const PolicyTokens& in, const PolicyLossOptions& o, size_t t) {
  const bool has_ref = !in.logp_ref.empty();
  const double behav = o.kind == LossKind::decoupled_ppo ? in.logp_behav[t] : 0.0;
  return term_of(in.logp[t], prox_at(in, t), behav, has_ref, has_ref ? in.logp_ref[t] : 0.0, in.advantage[t], o);
}

void check_inputs(const PolicyTokens& in, const PolicyLossOptions& o) {
  const auto n = static_cast<int64_t>(in.logp.size());
  check_offsets(in.offsets, n);
  auto same = [&](std::span<const double> s, const char* name, bool optional) {
    if (optional && s.empty()) return;
    if (static_cast<int64_t>(s.size()) != n)
      throw std::invalid_argument(std::string("rl: policy loss: ") + name + " has " +
                                  std::to_string(static_cast<int64_t>(s.size())) + " tokens, logp has " + std::to_string(n));
  };
  if (o.kind == LossKind::decoupled_ppo && (in.logp_prox.empty() || in.logp_behav.empty()))
    throw std::invalid_argument("rl: policy loss: decoupled_ppo needs both logp_prox and logp_behav");
  same(in.logp_prox, "logp_prox", true);
  same(in.logp_behav, "logp_behav", in.logp_prox.empty() ? false : o.kind != LossKind::decoupled_ppo);
  same(in.logp_ref, "logp_ref", true);
  same(in.advantage, "advantage", false);
  same(in.mask, "mask", false);
  if (o.kl_coef > 0 && in.logp_ref.empty())
    throw std::invalid_argument("rl: policy loss: kl_coef > 0 needs the reference log-probs (logp_ref)");
  if (!(o.clip_low >= 0 && o.clip_low < 1 && o.clip_high >= 0))
    throw std::invalid_argument("rl: policy loss: clip_low must be in [0, 1) and clip_high >= 0");
  for (int64_t t = 0; t < n; ++t) {
    const auto i = static_cast<size_t>(t);
    if (!(in.mask[i] >= 0 && std::isfinite(in.mask[i])))
      throw std::invalid_argument("rl: policy loss: mask of token " + std::to_string(t) + " must be finite and >= 0");
    if (in.mask[i] == 0) continue;
    auto finite = [&](std::span<const double> s, const char* name) {
      if (!s.empty() && !std::isfinite(s[i]))
        throw std::invalid_argument(std::string("rl: policy loss: ") + name + " of token " + std::to_string(t) +
                                    " is not finite (its mask is " + std::to_string(in.mask[i]) + ")");
    };
    finite(in.logp, "logp");
    finite(in.logp_prox, "logp_prox");
    if (in.logp_prox.empty() || o.kind == LossKind::decoupled_ppo) finite(in.logp_behav, "logp_behav");
    finite(in.logp_ref, "logp_ref");
    finite(in.advantage, "advantage");
  }
}

}  // namespace

void aggregation_weights(std::span<double> c, std::span<const double> mask, std::span<const int64_t> offsets,
                         Aggregation aggregation, double constant_norm) {
  const auto n = static_cast<int64_t>(mask.size());
  check_offsets(offsets, n);
  if (static_cast<int64_t>(c.size()) != n)
    throw std::invalid_argument("rl: aggregation weights: c has " + std::to_string(static_cast<int64_t>(c.size())) +
                                " entries for " + std::to_string(n) + " tokens");
  std::fill(c.begin(), c.end(), 0.0);
  const size_t seqs = offsets.size() - 1;
  switch (aggregation) {
    case Aggregation::token_mean: {
      double total = 0.0;
      for (double m : mask) total += m;
      if (total > 0)
        for (size_t t = 0; t < c.size(); ++t) c[t] = mask[t] / total;
      break;
    }
    case Aggregation::seq_mean: {
      int64_t live = 0;  // sequences with any mask weight
      for (size_t s = 0; s < seqs; ++s) {
        double ms = 0.0;
        for (int64_t t = offsets[s]; t < offsets[s + 1]; ++t) ms += mask[static_cast<size_t>(t)];
        if (ms > 0) ++live;
      }
      for (size_t s = 0; s < seqs; ++s) {
        double ms = 0.0;
        for (int64_t t = offsets[s]; t < offsets[s + 1]; ++t) ms += mask[static_cast<size_t>(t)];
        if (ms <= 0) continue;
        for (int64_t t = offsets[s]; t < offsets[s + 1]; ++t)
          c[static_cast<size_t>(t)] = mask[static_cast<size_t>(t)] / (ms * static_cast<double>(live));
      }
      break;
    }
    case Aggregation::seq_constant: {
      if (!(constant_norm > 0 && std::isfinite(constant_norm)))
        throw std::invalid_argument("rl: aggregation seq_constant needs constant_norm > 0, got " +
                                    std::to_string(constant_norm));
      if (seqs == 0) break;
      const double denom = static_cast<double>(seqs) * constant_norm;
      for (size_t t = 0; t < c.size(); ++t) c[t] = mask[t] / denom;
      break;
    }
  }
}

double aggregate(std::span<const double> values, std::span<const double> mask, std::span<const int64_t> offsets,
                 Aggregation aggregation, double constant_norm) {
  if (values.size() != mask.size())
    throw std::invalid_argument("rl: aggregate: " + std::to_string(static_cast<int64_t>(values.size())) + " values for " +
                                std::to_string(static_cast<int64_t>(mask.size())) + " mask entries");
  std::vector<double> c(values.size());
  aggregation_weights(c, mask, offsets, aggregation, constant_norm);
  double sum = 0.0;
  for (size_t t = 0; t < c.size(); ++t)
    if (c[t] != 0) sum += c[t] * values[t];
  return sum;
}

PolicyMetrics policy_loss_forward(const PolicyTokens& in, const PolicyLossOptions& o) {
  check_inputs(in, o);
  std::vector<double> c(in.logp.size());
  aggregation_weights(c, in.mask, in.offsets, o.aggregation, o.constant_norm);
  PolicyMetrics m;
  m.ratio_min = m.behaviour_weight_min = std::numeric_limits<double>::infinity();
  m.ratio_max = m.behaviour_weight_max = -std::numeric_limits<double>::infinity();
  int64_t clip_low = 0, clip_high = 0, capped = 0;
  for (size_t t = 0; t < in.logp.size(); ++t) {
    if (in.mask[t] == 0) continue;
    const Term x = term_at(in, o, t);
    m.pg_loss += c[t] * x.pg;
    m.kl_ref += c[t] * x.k3;
    ++m.tokens;
    clip_low += x.clip_low ? 1 : 0;
    clip_high += x.clip_high ? 1 : 0;
    capped += x.capped ? 1 : 0;
    m.ratio_min = std::min(m.ratio_min, x.r);
    m.ratio_max = std::max(m.ratio_max, x.r);
    m.ratio_mean += x.r;
    m.behaviour_weight_min = std::min(m.behaviour_weight_min, x.w_raw);
    m.behaviour_weight_max = std::max(m.behaviour_weight_max, x.w_raw);
    m.behaviour_weight_mean += x.w_raw;
    m.approx_kl += x.r - 1.0 - std::log(x.r);
  }
  m.loss = m.pg_loss + o.kl_coef * m.kl_ref;
  for (size_t s = 0; s + 1 < in.offsets.size(); ++s)
    for (int64_t t = in.offsets[s]; t < in.offsets[s + 1]; ++t)
      if (in.mask[static_cast<size_t>(t)] > 0) {
        ++m.sequences;
        break;
      }
  if (m.tokens == 0) {
    m.ratio_min = m.ratio_max = m.behaviour_weight_min = m.behaviour_weight_max = 0.0;
    return m;
  }
  const auto n = static_cast<double>(m.tokens);
  m.clip_low_fraction = static_cast<double>(clip_low) / n;
  m.clip_high_fraction = static_cast<double>(clip_high) / n;
  m.capped_fraction = static_cast<double>(capped) / n;
  m.ratio_mean /= n;
  m.behaviour_weight_mean /= n;
  m.approx_kl /= n;
  return m;
}

void policy_loss_backward(std::span<double> grad_logp, const PolicyTokens& in, const PolicyLossOptions& o) {
  check_inputs(in, o);
  if (grad_logp.size() != in.logp.size())
    throw std::invalid_argument("rl: policy loss backward: grad_logp has " +
                                std::to_string(static_cast<int64_t>(grad_logp.size())) + " entries for " +
                                std::to_string(static_cast<int64_t>(in.logp.size())) + " tokens");
  aggregation_weights(grad_logp, in.mask, in.offsets, o.aggregation, o.constant_norm);  // c_t, then times dl_t
  for (size_t t = 0; t < in.logp.size(); ++t)
    if (in.mask[t] != 0) grad_logp[t] *= term_at(in, o, t).dloss;
}

double policy_token_grad(const PolicyToken& tok, double c, const PolicyLossOptions& o) {
  if (c == 0) return 0.0;
  const bool has_ref = !std::isnan(tok.logp_ref);
  if (o.kl_coef > 0 && !has_ref)
    throw std::invalid_argument("rl: policy loss: kl_coef > 0 needs the reference log-probs (logp_ref)");
  if (!std::isfinite(tok.logp) || !std::isfinite(tok.logp_prox) || !std::isfinite(tok.advantage) ||
      (o.kind == LossKind::decoupled_ppo && !std::isfinite(tok.logp_behav)) || (has_ref && !std::isfinite(tok.logp_ref)))
    throw std::invalid_argument("rl: policy loss: a trained token has a non-finite log-prob or advantage");
  return c * term_of(tok.logp, tok.logp_prox, tok.logp_behav, has_ref, tok.logp_ref, tok.advantage, o).dloss;
}

}  // namespace troupe::rl
