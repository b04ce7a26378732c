// Float64 reference of the full decoder forward (plain loops, written from
// the math, independent of kernels/ and moe/), for gradient checks by
// central finite differences.
#pragma once

#include <cstdint>
#include <vector>

#include "model/config.hpp"
#include "model/params.hpp"

namespace troupe::test {

struct RefResult {
  double loss_sum = 0.0;  // sum of token cross-entropies
  int64_t counted = 0;
  double aux_loss = 0.0;  // sum over MoE layers
  // Router decisions: per layer, per token, the chosen ids then a kept flag
  // per choice. Finite differences are only valid if this does not change.
  std::vector<int32_t> routing;
  // Smallest gap, over layers and tokens, between the k-th and (k+1)-th
  // selection score (inf when k == E or dense).
  double min_margin = 0.0;
  int64_t dropped = 0;
  std::vector<double> logits;  // [T,V], for loss heads other than cross-entropy
};

// params: the flat buffer (layout of build_param_layout(config)) in double.
RefResult reference_forward(const model::ModelConfig& config, const model::ParamLayout& layout,
                            const std::vector<double>& params, const std::vector<int32_t>& inputs,
                            const std::vector<int32_t>& targets, int64_t batch);

}  // namespace troupe::test
