// Router forward/backward as a chain of backend ops (GEMM, softmax, top-k).
#include "moe/router.hpp"

#include <stdexcept>

namespace troupe::moe {

using kernels::Tensor;

void router_forward(kernels::Backend& be, const Tensor& weights, const Tensor& ids,
                    const Tensor& probs, const Tensor& logits, const Tensor& x, const Tensor& w,
                    const Tensor& bias, bool renormalize) {
  const int64_t T = x.dim(0), D = x.dim(1), E = w.dim(0);
  if (w.dim(1) != D || logits.numel() != T * E || probs.numel() != T * E)
    throw std::invalid_argument("router_forward: shape mismatch");
  be.gemm(false, true, T, E, D, 1.0f, x, w, 0.0f, logits);
  be.softmax_forward(probs, logits);
  be.topk_forward(weights, ids, probs, bias, renormalize);
}

void router_backward(kernels::Backend& be, const Tensor& dx, const Tensor& dw,
                     const Tensor& dprobs, const Tensor& dlogits, const Tensor& dweights,
                     const Tensor& aux_row, const Tensor& weights, const Tensor& ids,
                     const Tensor& probs, const Tensor& x, const Tensor& w, bool renormalize,
                     WeightGrads* wg) {
  const int64_t T = x.dim(0), D = x.dim(1), E = w.dim(0);
  be.fill(dprobs, 0.0f);
  be.topk_backward(dprobs, dweights, weights, ids, probs, renormalize);
  if (aux_row.defined()) be.add_row(dprobs, aux_row, 1.0f);
  // dlogits is the router projection's dY: held when W is deferred.
  const Tensor dl = held(wg, dlogits);
  be.softmax_backward_overwrite(dl, dprobs, probs);
  // dx[T,D] += dlogits[T,E] w[E,D]; dw[E,D] += dlogits^T x.
  be.gemm(false, false, T, D, E, 1.0f, dl, w, 1.0f, dx);
  weight_gemm(be, wg, true, false, E, D, T, 1.0f, dl, x, 1.0f, dw);
}

}  // namespace troupe::moe
