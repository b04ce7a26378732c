// MoE layer orchestration over the moe/ pieces (router, plan, experts, combine).
#include "moe/moe_layer.hpp"

#include <stdexcept>

#include "moe/router.hpp"

namespace troupe::moe {

using kernels::Tensor;

MoeScratch::MoeScratch(Arena& a, const MoeOptions& o, int64_t T, int64_t D) {
  const int64_t N = T * o.top_k, F = o.expert_hidden, E = o.n_experts;
  dy = a.f32({N, D});
  dxs = a.f32({N, D});
  dexp = {a.f32({N, F}), a.f32({N, F}), a.f32({N, F})};
  if (o.shared_hidden > 0) {
    const int64_t S = o.shared_hidden;
    dshared = {a.f32({T, S}), a.f32({T, S}), a.f32({T, S})};
  }
  dweights = a.f32({T, o.top_k});
  dprobs = a.f32({T, E});
  dlogits = a.f32({T, E});
  aux_row = a.f32({E});
}

MoeLayer::MoeLayer(Arena& a, const MoeOptions& o, int64_t T, int64_t D)
    : opt_(o), tokens_(T), d_model_(D) {
  if (o.top_k < 1 || o.top_k > o.n_experts)
    throw std::invalid_argument("MoE: top_k must be in [1, n_experts]");
  const int64_t N = T * o.top_k, F = o.expert_hidden, E = o.n_experts;
  logits_ = a.f32({T, E});
  probs_ = a.f32({T, E});
  weights_ = a.f32({T, o.top_k});
  ids_ = a.i32({T, o.top_k});
  slots_ = a.i32({T, o.top_k});
  token_index_ = a.i32({N});
  xs_ = a.f32({N, D});
  y_ = a.f32({N, D});
  acts_ = {a.f32({N, F}), a.f32({N, F}), a.f32({N, F})};
  if (o.shared_hidden > 0) {
    const int64_t S = o.shared_hidden;
    shared_acts_ = {a.f32({T, S}), a.f32({T, S}), a.f32({T, S})};
  }
}

double MoeLayer::forward(kernels::Backend& be, const Tensor& out, const Tensor& x,
                         const MoeWeights& w) {
  forward_begin(be, x, w);
  run_experts_forward(be, w.experts);
  return forward_end(be, out, x, w);
}

namespace {
std::vector<int64_t> plan_counts(const DispatchPlan& p) {
  std::vector<int64_t> counts(static_cast<size_t>(p.n_experts));
  for (int64_t e = 0; e < p.n_experts; ++e) counts[static_cast<size_t>(e)] = p.count(e);
  return counts;
}
}  // namespace

void MoeLayer::forward_begin(kernels::Backend& be, const Tensor& x, const MoeWeights& w) {
  const int64_t T = tokens_, k = opt_.top_k, E = opt_.n_experts;
  const Tensor bias = opt_.balance == Balance::bias ? w.bias : Tensor();
  router_forward(be, weights_, ids_, probs_, logits_, x, w.router, bias, opt_.renormalize());

  // The plan is built on the host: one small download of T*k ids.
  ids_host_.resize(static_cast<size_t>(T * k));
  be.download(ids_host_.data(), ids_, ids_host_.size() * sizeof(int32_t));
  plan_ = build_dispatch_plan(ids_host_, T, k, E, opt_.capacity_factor);
  const int64_t N = plan_.rows();
  be.upload_i32(slots_, plan_.slots);
  if (N > 0) {
    const Tensor idx = token_index_.rows(0, N);
    be.upload_i32(idx, plan_.token_index);
    be.gather_rows(xs_.rows(0, N), x, idx);
  }
}

void MoeLayer::run_experts_forward(kernels::Backend& be, const ExpertWeights& w) {
  if (plan_.rows() > 0) experts_forward(be, y_, acts_, xs_, w, plan_counts(plan_));
}

double MoeLayer::forward_end(kernels::Backend& be, const Tensor& out, const Tensor& x,
                             const MoeWeights& w) {
  const int64_t T = tokens_, k = opt_.top_k, E = opt_.n_experts;
  if (plan_.rows() > 0) be.combine_forward(out, y_, slots_, weights_);
  if (opt_.shared_hidden > 0) ffn_forward(be, out, shared_acts_, x, w.shared);

  if (opt_.balance != Balance::aux_loss) return 0.0;
  // P_i needs the column sums of the probabilities: E floats to the host.
  Tensor prob_sum = logits_.view(0, {E});  // logits are dead after the softmax
  be.sum_rows(prob_sum, probs_);
  std::vector<float> ps(static_cast<size_t>(E));
  be.download(ps.data(), prob_sum, ps.size() * sizeof(float));
  return aux_loss_value(ps, plan_.routed, T, k, opt_.aux_alpha);
}

void MoeLayer::backward(kernels::Backend& be, const Tensor& dx, const MoeWeights& dw,
                        MoeScratch& s, const Tensor& dout, const Tensor& x, const MoeWeights& w,
                        double aux_scale, WeightGrads* wg) {
  backward_begin(be, dx, dw, s, dout, x, w, wg);
  run_experts_backward(be, dw.experts, s, w.experts, wg);
  backward_end(be, dx, dw, s, x, w, aux_scale, wg);
}

void MoeLayer::backward_begin(kernels::Backend& be, const Tensor& dx, const MoeWeights& dw,
                              MoeScratch& s, const Tensor& dout, const Tensor& x,
                              const MoeWeights& w, WeightGrads* wg) {
  const int64_t N = plan_.rows();
  if (opt_.shared_hidden > 0) ffn_backward(be, dx, dw.shared, s.dshared, dout, x, shared_acts_, w.shared, wg);
  be.fill(s.dweights, 0.0f);
  if (N > 0) {
    be.fill(s.dy.rows(0, N), 0.0f);  // rows >= N are never read or written
    be.combine_backward(s.dy, s.dweights, dout, y_, slots_, weights_);
  }
}

void MoeLayer::run_experts_backward(kernels::Backend& be, const ExpertWeights& dw, MoeScratch& s,
                                    const ExpertWeights& w, WeightGrads* wg) {
  if (plan_.rows() > 0)
    experts_backward(be, s.dxs, dw, s.dexp, s.dy, xs_, acts_, w, plan_counts(plan_), wg);
}

void MoeLayer::backward_end(kernels::Backend& be, const Tensor& dx, const MoeWeights& dw,
                            MoeScratch& s, const Tensor& x, const MoeWeights& w, double aux_scale,
                            WeightGrads* wg) {
  if (plan_.rows() > 0) be.sum_slots(dx, s.dxs, slots_);
  Tensor aux_row;
  if (opt_.balance == Balance::aux_loss) {
    const auto row = aux_loss_grad_row(plan_.routed, tokens_, opt_.top_k, opt_.aux_alpha, aux_scale);
    be.upload_f32(s.aux_row, row);
    aux_row = s.aux_row;
  }
  router_backward(be, dx, dw.router, s.dprobs, s.dlogits, s.dweights, aux_row, weights_, ids_,
                  probs_, x, w.router, opt_.renormalize(), wg);
}

}  // namespace troupe::moe
