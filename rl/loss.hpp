// Policy losses of the GRPO family as forward/backward pairs over per-token
// arrays (float64). The model computes log-probs of the sampled tokens; the
// backward here gives dL/dlogp_t, which the model's policy-gradient head
// backpropagates through the decoder (only logp is differentiated: the
// proximal, behaviour and reference log-probs and the advantages are data).
//
// Per token t, with mask weight m_t >= 0 and advantage A_t:
//   r_t = exp(logp_t - logp_prox_t)                 ratio to the proximal policy
//   o_t = min(r_t A_t, clip(r_t, 1 - eps_low, 1 + eps_high) A_t)
//   w_t = 1, or for decoupled_ppo exp(logp_prox_t - logp_behav_t) with the cap
//         applied (CapMode: masked to 0 or clipped to the cap)
//   k_t = exp(d_t) - d_t - 1, d_t = logp_ref_t - logp_t   (k3 KL estimator)
//   l_t = -w_t o_t + kl_coef k_t
//   L   = sum_t c_t l_t, c_t the aggregation weights (Aggregation in config.hpp)
// The clip zeroes the gradient where it binds: r > 1 + eps_high with A > 0,
// r < 1 - eps_low with A < 0; at r exactly on a bound the unclipped branch is
// taken (both branches are equal there).
#pragma once

#include <cstdint>
#include <span>

#include "rl/config.hpp"

namespace troupe::rl {

// Every array is [T] tokens, sequences given by offsets[S + 1] (sequence s is
// tokens offsets[s] .. offsets[s+1] - 1). Tokens with mask 0 contribute
// nothing and are not read beyond their mask (their log-probs may be anything).
struct PolicyTokens {
  std::span<const double> logp;        // [T] log pi_theta(a_t): the differentiated input
  std::span<const double> logp_prox;   // [T] proximal policy (PPO's "old"); empty = logp_behav
  std::span<const double> logp_behav;  // [T] behaviour policy mu, recorded at sampling
  std::span<const double> logp_ref;    // [T] frozen reference; empty = no KL term (kl_coef must be 0)
  std::span<const double> advantage;   // [T] per token (a sequence's advantage spread by expand_to_tokens)
  std::span<const double> mask;        // [T] weight >= 0: 1 = trained, 0 = not (prompt, padding, dropped group)
  std::span<const int64_t> offsets;    // [S + 1]
};

// Metrics over the tokens with mask > 0 (unweighted, except the loss terms).
struct PolicyMetrics {
  double loss = 0.0;       // L: the policy term plus the KL term
  double pg_loss = 0.0;    // aggregated -w o
  double kl_ref = 0.0;     // aggregated k3 to the reference (0 without one); L includes kl_coef * kl_ref
  int64_t tokens = 0;      // tokens with mask > 0
  int64_t sequences = 0;   // sequences with at least one such token
  double clip_low_fraction = 0.0;   // share where the low clip binds (A < 0, r < 1 - eps_low)
  double clip_high_fraction = 0.0;  // share where the high clip binds (A > 0, r > 1 + eps_high)
  double ratio_min = 0.0, ratio_mean = 0.0, ratio_max = 0.0;  // r = pi_theta / pi_prox
  // decoupled_ppo: w = pi_prox / mu before the cap (1 for the other kinds).
  double behaviour_weight_min = 0.0, behaviour_weight_mean = 0.0, behaviour_weight_max = 0.0;
  double capped_fraction = 0.0;  // share of tokens whose w exceeds behaviour_weight_cap
  double approx_kl = 0.0;        // mean of r - 1 - log r: k3 estimate of KL(pi_prox || pi_theta)
};

// Forward: the loss and its metrics. Throws std::invalid_argument for sizes
// that disagree with offsets, a negative or non-finite mask, a non-finite
// input on a masked-in token, a missing behaviour log-prob, or kl_coef > 0
// without logp_ref.
PolicyMetrics policy_loss_forward(const PolicyTokens& in, const PolicyLossOptions& options);

// Backward: grad_logp[T] = dL/dlogp_t (0 where mask is 0). Same checks.
void policy_loss_backward(std::span<double> grad_logp, const PolicyTokens& in, const PolicyLossOptions& options);

// One token on its own, as a pipeline's last stage sees it: dL/dlogp_t =
// c_t * dl_t/dlogp_t, exactly what policy_loss_backward writes at t when c_t
// is that token's aggregation weight over the whole batch
// (aggregation_weights). logp_prox is the proximal log-prob (the token's own
// logp when PPO's old policy is the current one); logp_ref NaN = no reference.
// c == 0 gives 0 without reading the rest; otherwise non-finite values are
// std::invalid_argument, as is kl_coef > 0 without a reference.
struct PolicyToken {
  double logp = 0.0, logp_prox = 0.0, logp_behav = 0.0, logp_ref = 0.0, advantage = 0.0;
};
double policy_token_grad(const PolicyToken& token, double c, const PolicyLossOptions& options);

// Aggregation weights: c[T] with L = sum_t c_t l_t for per-token l (see
// Aggregation). All zero when no token has mask > 0. constant_norm is used by
// seq_constant only.
void aggregation_weights(std::span<double> c, std::span<const double> mask, std::span<const int64_t> offsets,
                         Aggregation aggregation, double constant_norm);

// sum_t c_t values_t with the weights above: the same reduction as the loss,
// for metrics the model computes per token (entropy, response length).
double aggregate(std::span<const double> values, std::span<const double> mask, std::span<const int64_t> offsets,
                 Aggregation aggregation, double constant_norm);

}  // namespace troupe::rl
