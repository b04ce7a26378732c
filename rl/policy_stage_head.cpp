// The policy loss as a last-stage loss head (policy_stage_head.hpp).
#include "rl/policy_stage_head.hpp"

#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/policy_head.hpp"
#include "rl/loss.hpp"

namespace troupe::rl {

PolicyStageHead::PolicyStageHead(const PolicyLossOptions& loss, double temperature)
    : loss_(loss), temperature_(temperature) {
  if (!(temperature > 0.0) || !std::isfinite(temperature))
    throw std::invalid_argument("policy stage head: temperature must be > 0, got " + std::to_string(temperature));
}

void PolicyStageHead::apply(std::span<const float> logits, std::span<const int32_t> targets,
                            std::span<const double> data, int64_t vocab, std::span<float> dlogits,
                            std::span<double> report) const {
  const size_t T = targets.size();
  if (data.size() != T * kColumns || report.size() != T * kReportColumns)
    throw std::invalid_argument("policy stage head: " + std::to_string(T) + " tokens need " +
                                std::to_string(T * kColumns) + " inputs and " + std::to_string(T * kReportColumns) +
                                " report entries, got " + std::to_string(data.size()) + " and " +
                                std::to_string(report.size()));
  std::vector<float> logp(T), entropy(T), coef(T, 0.0f);
  model::policy_logprobs(logp, entropy, logits, targets, vocab, temperature_);
  for (size_t t = 0; t < T; ++t) {
    const double* d = data.data() + t * kColumns;
    report[t * kReportColumns + kLogp] = logp[t];
    report[t * kReportColumns + kEntropy] = entropy[t];
    if (!(d[kC] >= 0 && std::isfinite(d[kC])))
      throw std::invalid_argument("policy stage head: token " + std::to_string(t) + " has aggregation weight " +
                                  std::to_string(d[kC]) + " (must be finite and >= 0)");
    if (d[kC] == 0) continue;
    if (targets[t] < 0)
      throw std::invalid_argument("policy stage head: token " + std::to_string(t) +
                                  " has a weight but no target");
    PolicyToken tok;
    tok.logp = logp[t];
    tok.logp_prox = std::isnan(d[kProx]) ? tok.logp : d[kProx];
    tok.logp_behav = d[kBehav];
    tok.logp_ref = d[kRef];
    tok.advantage = d[kAdv];
    coef[t] = static_cast<float>(policy_token_grad(tok, d[kC], loss_));
  }
  model::policy_logits_grad(dlogits, logits, targets, coef, vocab, temperature_);
}

}  // namespace troupe::rl
