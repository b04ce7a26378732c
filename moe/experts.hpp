// Expert compute for a GROUP of experts (a contiguous range of one layer's
// experts, e.g. the experts one expert-shard actor owns): SwiGLU FFNs run as
// grouped GEMMs over the permuted token rows of those experts. The same
// functions serve the single-process model (the group is all E experts) and
// a remote expert shard, so the math does not change with placement.
//
// A dense SwiGLU FFN over all tokens (dense layers, shared experts) is in
// ffn_forward / ffn_backward.
#pragma once

#include <cstdint>
#include <span>

#include "kernels/backend.hpp"
#include "moe/weight_grads.hpp"

namespace troupe::moe {

// Weights of n experts, each a torch-style [out, in] matrix, experts
// consecutive: gate [n,F,D], up [n,F,D], down [n,D,F].
struct ExpertWeights {
  kernels::Tensor gate, up, down;
};

// Activations the backward needs, all [N,F] (N = rows of the group).
struct ExpertActs {
  kernels::Tensor h_gate, h_up, act;
};

// y[N,D] = for each expert i of the group, on its counts[i] consecutive rows:
//   down_i(silu(gate_i x) * up_i x). Overwrites y and acts (first N rows).
void experts_forward(kernels::Backend& be, const kernels::Tensor& y, const ExpertActs& acts,
                     const kernels::Tensor& xs, const ExpertWeights& w,
                     std::span<const int64_t> counts);

// dxs[N,D] is OVERWRITTEN (it is the group's private input gradient, the
// reply of an expert shard); dw accumulates. scratch: dact, dh_gate, dh_up [>=N,F].
// wg: the weight gradients deferred there (weight_grads.hpp; dy must then
// stay valid until they run), nullptr = at once.
void experts_backward(kernels::Backend& be, const kernels::Tensor& dxs, const ExpertWeights& dw,
                      const ExpertActs& scratch, const kernels::Tensor& dy,
                      const kernels::Tensor& xs, const ExpertActs& acts,
                      const ExpertWeights& w, std::span<const int64_t> counts, WeightGrads* wg = nullptr);

// Dense SwiGLU FFN: out[T,D] += down(silu(gate x) * up x), weights gate/up
// [H,D], down [D,H] (an ExpertWeights of one expert). acts are [T,H].
void ffn_forward(kernels::Backend& be, const kernels::Tensor& out, const ExpertActs& acts,
                 const kernels::Tensor& x, const ExpertWeights& w);
// dx[T,D] and dw accumulate; scratch [T,H] overwritten. wg: the weight
// gradients deferred there (x and acts must then stay valid until they run),
// nullptr = at once.
void ffn_backward(kernels::Backend& be, const kernels::Tensor& dx, const ExpertWeights& dw,
                  const ExpertActs& scratch, const kernels::Tensor& dout,
                  const kernels::Tensor& x, const ExpertActs& acts, const ExpertWeights& w,
                  WeightGrads* wg = nullptr);

// Forward/backward FLOPs of one expert-group pass over N rows (for MFU).
inline double swiglu_flops(int64_t rows, int64_t d, int64_t f) {
  return 2.0 * 3.0 * static_cast<double>(rows) * static_cast<double>(d) * static_cast<double>(f);
}

}  // namespace troupe::moe
