// One MoE FFN layer for one microbatch, in the single-process model:
// route -> dispatch plan (host) -> gather -> expert group compute -> combine,
// plus optional shared experts and the load-balancing terms. Each stage is a
// separate moe/ function, so the distributed runtime can run the expert
// group in another actor with the same math: forward_begin/forward_end and
// backward_begin/backward_end are the halves around the expert compute, and
// forward/backward run them with all experts computed here in between.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/backend.hpp"
#include "moe/arena.hpp"
#include "moe/balance.hpp"
#include "moe/dispatch.hpp"
#include "moe/experts.hpp"

namespace troupe::moe {

struct MoeOptions {
  int64_t n_experts = 8;
  int64_t top_k = 2;
  int64_t expert_hidden = 256;
  int64_t shared_hidden = 0;  // width of the merged shared experts, 0 = none
  double capacity_factor = 0.0;
  Balance balance = Balance::aux_loss;
  double aux_alpha = 0.01;
  // Combine weights renormalised over the chosen k (Mixtral). With k = 1 the
  // weight would be a constant 1, so k = 1 keeps the raw probability (Switch).
  bool renormalize() const { return top_k > 1; }
};

struct MoeWeights {
  kernels::Tensor router;  // [E,D]
  kernels::Tensor bias;    // [E] selection bias (undefined unless balance == bias)
  ExpertWeights experts;   // gate/up [E,F,D], down [E,D,F]
  ExpertWeights shared;    // gate/up [S,D], down [D,S]; undefined when none
};

// Backward scratch, shared by every MoE layer of a decoder.
struct MoeScratch {
  MoeScratch() = default;
  MoeScratch(Arena& arena, const MoeOptions& o, int64_t tokens, int64_t d_model);
  kernels::Tensor dy, dxs;           // [T*k, D]
  ExpertActs dexp;                   // [T*k, F]
  ExpertActs dshared;                // [T, S]
  kernels::Tensor dweights;          // [T,k]
  kernels::Tensor dprobs, dlogits;   // [T,E]
  kernels::Tensor aux_row;           // [E]
};

class MoeLayer {
 public:
  MoeLayer(Arena& arena, const MoeOptions& options, int64_t tokens, int64_t d_model);

  // out[T,D] += moe(x[T,D]). Returns the aux loss of this microbatch (0 unless
  // balance == aux_loss). The host sees the router ids here (dispatch plan).
  double forward(kernels::Backend& be, const kernels::Tensor& out, const kernels::Tensor& x,
                 const MoeWeights& w);
  // dx[T,D] and dw accumulate. aux_scale = d total / d aux of this microbatch.
  // wg (here and in the halves below): the weight gradients deferred there
  // (weight_grads.hpp), nullptr = at once; scratch.dy must then stay valid
  // until they run (the caller holds it).
  void backward(kernels::Backend& be, const kernels::Tensor& dx, const MoeWeights& dw,
                MoeScratch& scratch, const kernels::Tensor& dout, const kernels::Tensor& x,
                const MoeWeights& w, double aux_scale, WeightGrads* wg = nullptr);

  // The same passes in halves around the expert compute (forward/backward
  // are begin, run_experts_*, end). forward_begin routes x, builds the plan
  // and gathers xs() rows [0,N); the caller then writes the experts'
  // unweighted outputs into expert_out() rows [0,N) and forward_end combines
  // them into out, adds the shared experts and returns the aux loss.
  void forward_begin(kernels::Backend& be, const kernels::Tensor& x, const MoeWeights& w);
  double forward_end(kernels::Backend& be, const kernels::Tensor& out, const kernels::Tensor& x,
                     const MoeWeights& w);
  // backward_begin adds the shared experts' input gradient into dx and leaves
  // in scratch.dy rows [0,N) d loss / d unweighted expert output (and the
  // combine-weight gradients in scratch.dweights); the caller writes the
  // experts' input gradients into scratch.dxs rows [0,N) and backward_end
  // scatters them into dx and runs the router backward.
  void backward_begin(kernels::Backend& be, const kernels::Tensor& dx, const MoeWeights& dw,
                      MoeScratch& scratch, const kernels::Tensor& dout, const kernels::Tensor& x,
                      const MoeWeights& w, WeightGrads* wg = nullptr);
  void backward_end(kernels::Backend& be, const kernels::Tensor& dx, const MoeWeights& dw,
                    MoeScratch& scratch, const kernels::Tensor& x, const MoeWeights& w,
                    double aux_scale, WeightGrads* wg = nullptr);
  // All E experts computed here (between the halves): expert_out() from xs(),
  // and scratch.dxs from scratch.dy with dw accumulating.
  void run_experts_forward(kernels::Backend& be, const ExpertWeights& w);
  void run_experts_backward(kernels::Backend& be, const ExpertWeights& dw, MoeScratch& scratch,
                            const ExpertWeights& w, WeightGrads* wg = nullptr);

  const DispatchPlan& plan() const { return plan_; }
  const kernels::Tensor& xs() const { return xs_; }          // [T*k,D] gathered rows (first N)
  const kernels::Tensor& expert_out() const { return y_; }   // [T*k,D] expert outputs (first N)
  const kernels::Tensor& weights() const { return weights_; }  // [T,k] combine weights
  const MoeOptions& options() const { return opt_; }
  // Router outputs of the last forward.
  const kernels::Tensor& probs() const { return probs_; }
  const kernels::Tensor& ids() const { return ids_; }

 private:
  MoeOptions opt_;
  int64_t tokens_, d_model_;
  kernels::Tensor logits_, probs_;         // [T,E]
  kernels::Tensor weights_, ids_;          // [T,k]
  kernels::Tensor slots_;                  // [T,k] i32
  kernels::Tensor token_index_;            // [T*k] i32 (first N used)
  kernels::Tensor xs_, y_;                 // [T*k, D]
  ExpertActs acts_;                        // [T*k, F]
  ExpertActs shared_acts_;                 // [T, S]
  DispatchPlan plan_;
  std::vector<int32_t> ids_host_;
};

}  // namespace troupe::moe
