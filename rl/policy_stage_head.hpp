// The GRPO-family policy loss as a pipeline's last-stage loss head
// (model/loss_head.hpp): the actor runtime trains the policy with it, each
// micro-batch on its own, and gets the same per-token gradient as the
// in-process trainer (rl/trainer.cpp) because both go through
// policy_token_grad with the batch-wide aggregation weight of the token.
//
// Per-token inputs (columns, in this order; see PolicyStageHead::Column):
//   c       aggregation weight over the whole batch (0: not trained)
//   prox    proximal log-prob; NaN = the token's own log-prob in this pass
//           (PPO's first update on a batch: the policy that is training)
//   behav   behaviour log-prob recorded by the generator
//   ref     frozen reference log-prob; NaN = no KL term
//   adv     advantage
// Report per token: log pi(a_t) at the temperature, and the entropy (0 where
// the target is -1), from which the driver computes the loss metrics.
#pragma once

#include "model/loss_head.hpp"
#include "rl/config.hpp"

namespace troupe::rl {

class PolicyStageHead final : public model::LossHead {
 public:
  enum Column : int64_t { kC = 0, kProx, kBehav, kRef, kAdv, kColumns };
  enum Report : int64_t { kLogp = 0, kEntropy, kReportColumns };
  // temperature > 0 (std::invalid_argument otherwise).
  PolicyStageHead(const PolicyLossOptions& loss, double temperature);
  int64_t columns() const override { return kColumns; }
  int64_t report_columns() const override { return kReportColumns; }
  void apply(std::span<const float> logits, std::span<const int32_t> targets, std::span<const double> data,
             int64_t vocab, std::span<float> dlogits, std::span<double> report) const override;

 private:
  PolicyLossOptions loss_;
  double temperature_;
};

}  // namespace troupe::rl
