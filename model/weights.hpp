// Typed views of the flat parameter (or gradient) buffer per layer, and the
// deterministic initialisation. The same binding is used for parameters and
// gradients, so gradient views line up with parameter views by construction.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/tensor.hpp"
#include "model/config.hpp"
#include "model/params.hpp"
#include "moe/moe_layer.hpp"

namespace troupe::model {

struct LayerWeights {
  kernels::Tensor ln1;             // [D] input_layernorm
  kernels::Tensor wq, wk, wv, wo;  // [D,D] each, [out,in]
  kernels::Tensor ln2;             // [D] post_attention_layernorm
  moe::ExpertWeights dense;        // dense FFN: gate/up [H,D], down [D,H]
  moe::MoeWeights moe;             // MoE FFN
};

struct ModelWeights {
  kernels::Tensor embed;    // [V,D]
  kernels::Tensor norm;     // [D]
  kernels::Tensor lm_head;  // [V,D]; the embedding view when tied
  std::vector<LayerWeights> layers;
};

// Views of `flat` ([layout.total()] f32) following `layout`.
ModelWeights bind_weights(const ParamLayout& layout, const ModelConfig& config,
                          const kernels::Tensor& flat);

// Host values of a fresh model. Every entry draws from its own generator,
// seeded from (seed, entry name), so adding an entry does not shift the
// others: matrices ~ normal(0, init_std), output projections (o_proj and
// every down_proj) additionally scaled by 1/sqrt(2*n_layers) (GPT-2 style, so
// the residual stream does not grow with depth), norms = 1, router bias = 0.
std::vector<float> init_params(const ParamLayout& layout, const ModelConfig& config,
                               uint64_t seed);

}  // namespace troupe::model
