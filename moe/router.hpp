// Router of a MoE layer: scores every token against every expert and picks
// top-k. Selection uses score + bias (the DeepSeek-V3 aux-loss-free bias; an
// undefined bias means none), combine weights use the unbiased scores,
// renormalised over the chosen k when `renormalize`.
#pragma once

#include "kernels/backend.hpp"
#include "moe/weight_grads.hpp"

namespace troupe::moe {

// logits[T,E] = x[T,D] w[E,D]^T; probs[T,E] = softmax(logits);
// (weights[T,k], ids[T,k]) = topk of probs + bias, weights taken from probs.
void router_forward(kernels::Backend& be, const kernels::Tensor& weights,
                    const kernels::Tensor& ids, const kernels::Tensor& probs,
                    const kernels::Tensor& logits, const kernels::Tensor& x,
                    const kernels::Tensor& w, const kernels::Tensor& bias, bool renormalize);

// Backward of router_forward given dweights[T,k] (and, when defined, a
// per-expert gradient row aux_row[E] added to every row of dprobs: the aux
// loss term). dx[T,D] and dw[E,D] accumulate; dprobs and dlogits [T,E] are
// scratch, overwritten.
void router_backward(kernels::Backend& be, const kernels::Tensor& dx, const kernels::Tensor& dw,
                     const kernels::Tensor& dprobs, const kernels::Tensor& dlogits,
                     const kernels::Tensor& dweights, const kernels::Tensor& aux_row,
                     const kernels::Tensor& weights, const kernels::Tensor& ids,
                     const kernels::Tensor& probs, const kernels::Tensor& x,
                     const kernels::Tensor& w, bool renormalize, WeightGrads* wg = nullptr);

}  // namespace troupe::moe
