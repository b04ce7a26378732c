// A custom loss head for the last pipeline stage: what replaces the token
// cross-entropy when a pipeline trains on another objective (RL's policy
// gradient, rl/policy_stage_head.hpp). The stage runs its forward as usual;
// the head then sees the micro-batch's logits on the host, its targets and
// `columns()` doubles of per-token inputs that rode along with the batch
// (Activations.tokenData), and returns d total / d logits, which the stage's
// backward takes as dout (Stage::backward), plus `report_columns()` doubles
// per token for the caller (the driver computes the objective's metrics over
// the whole batch from them). The head is a pure function of its inputs, so
// a replayed micro-batch gets the same gradient bit for bit. No actors here.
#pragma once

#include <cstdint>
#include <span>

namespace troupe::model {

class LossHead {
 public:
  virtual ~LossHead() = default;
  // Per-token input doubles the head reads, and report doubles it writes.
  virtual int64_t columns() const = 0;
  virtual int64_t report_columns() const = 0;
  // logits [T,V], targets [T] (-1: no target), data [T * columns()];
  // writes dlogits [T,V] (overwritten) and report [T * report_columns()].
  // Throws std::invalid_argument on sizes that disagree or bad inputs.
  virtual void apply(std::span<const float> logits, std::span<const int32_t> targets,
                     std::span<const double> data, int64_t vocab, std::span<float> dlogits,
                     std::span<double> report) const = 0;
};

}  // namespace troupe::model
