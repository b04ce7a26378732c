// Grouped-GEMM SwiGLU experts and the dense SwiGLU FFN.
#include "moe/experts.hpp"

#include <stdexcept>
#include <vector>

namespace troupe::moe {

using kernels::GemmGroup;
using kernels::Tensor;

namespace {

struct GroupShape {
  int64_t n = 0, d = 0, f = 0, rows = 0;
};

GroupShape check_group(const Tensor& xs, const ExpertWeights& w, std::span<const int64_t> counts) {
  GroupShape g;
  g.n = w.gate.dim(0);
  g.f = w.gate.dim(1);
  g.d = w.gate.dim(2);
  if (static_cast<int64_t>(counts.size()) != g.n || w.up.shape() != w.gate.shape() ||
      w.down.dim(0) != g.n || w.down.dim(1) != g.d || w.down.dim(2) != g.f)
    throw std::invalid_argument("experts: weights/counts shapes do not match");
  for (int64_t c : counts) {
    if (c < 0) throw std::invalid_argument("experts: negative row count");
    g.rows += c;
  }
  if (xs.dim(0) < g.rows || xs.dim(1) != g.d)
    throw std::invalid_argument("experts: input rows " + kernels::shape_str(xs.shape()) +
                                " do not cover the group's " + std::to_string(g.rows) + " rows");
  return g;
}

// One group per expert with rows: C_i[m_i, n] = op(A_i) op(B_i).
// `row_side` says which operand is indexed by rows (the token side).
enum class Kind {
  rows_x_wT,   // C[rows, out] = X[rows, in] W_i[out, in]^T   (forward)
  rows_x_w,    // C[rows, in]  = X[rows, out] W_i[out, in]    (input gradient)
  wgrad        // C_i[out, in] += X[rows, out]^T Y[rows, in]   (weight gradient)
};

std::vector<GemmGroup> make_groups(Kind kind, std::span<const int64_t> counts, int64_t out,
                                   int64_t in) {
  std::vector<GemmGroup> gs;
  gs.reserve(counts.size());
  int64_t r0 = 0;
  for (size_t i = 0; i < counts.size(); ++i) {
    const int64_t c = counts[i];
    const int64_t w_off = static_cast<int64_t>(i) * out * in;
    if (c > 0) {
      GemmGroup g;
      switch (kind) {
        case Kind::rows_x_wT:
          g = {c, out, in, r0 * in, w_off, r0 * out};
          break;
        case Kind::rows_x_w:
          g = {c, in, out, r0 * out, w_off, r0 * in};
          break;
        case Kind::wgrad:
          g = {out, in, c, r0 * out, r0 * in, w_off};
          break;
      }
      gs.push_back(g);
    }
    r0 += c;
  }
  return gs;
}

}  // namespace

void experts_forward(kernels::Backend& be, const Tensor& y, const ExpertActs& acts,
                     const Tensor& xs, const ExpertWeights& w, std::span<const int64_t> counts) {
  const GroupShape g = check_group(xs, w, counts);
  if (g.rows == 0) return;
  const auto up = make_groups(Kind::rows_x_wT, counts, g.f, g.d);     // [rows,F] = x W^T
  const auto down = make_groups(Kind::rows_x_wT, counts, g.d, g.f);   // [rows,D] = act Wd^T
  be.gemm_grouped(false, true, 1.0f, xs, w.gate, 0.0f, acts.h_gate, up);
  be.gemm_grouped(false, true, 1.0f, xs, w.up, 0.0f, acts.h_up, up);
  const Tensor act = acts.act.rows(0, g.rows);
  be.swiglu_forward(act, acts.h_gate.rows(0, g.rows), acts.h_up.rows(0, g.rows));
  be.gemm_grouped(false, true, 1.0f, acts.act, w.down, 0.0f, y, down);
}

void experts_backward(kernels::Backend& be, const Tensor& dxs, const ExpertWeights& dw,
                      const ExpertActs& scratch, const Tensor& dy, const Tensor& xs,
                      const ExpertActs& acts, const ExpertWeights& w,
                      std::span<const int64_t> counts, WeightGrads* wg) {
  const GroupShape g = check_group(xs, w, counts);
  if (g.rows == 0) return;
  const int64_t N = g.rows;
  // Down projection: dact[rows,F] = dy Wd; dWd_i += dy_i^T act_i.
  be.gemm_grouped(false, false, 1.0f, dy, w.down, 0.0f, scratch.act,
                  make_groups(Kind::rows_x_w, counts, g.d, g.f));
  weight_gemm_grouped(be, wg, true, false, 1.0f, dy, acts.act, 1.0f, dw.down, make_groups(Kind::wgrad, counts, g.d, g.f));
  // SwiGLU: one contribution, so the rows are written, not added. dh_gate
  // and dh_up are the gate/up projections' dY: held when W is deferred.
  const Tensor h_gate = held(wg, scratch.h_gate), h_up = held(wg, scratch.h_up);
  be.swiglu_backward_overwrite(h_gate.rows(0, N), h_up.rows(0, N), scratch.act.rows(0, N), acts.h_gate.rows(0, N),
                               acts.h_up.rows(0, N));
  // Gate/up projections: dxs = dh_gate Wg + dh_up Wu; dW_i += dh_i^T x_i.
  const auto dx_groups = make_groups(Kind::rows_x_w, counts, g.f, g.d);
  be.gemm_grouped(false, false, 1.0f, h_gate, w.gate, 0.0f, dxs, dx_groups);
  be.gemm_grouped(false, false, 1.0f, h_up, w.up, 1.0f, dxs, dx_groups);
  const auto wgrad_in = make_groups(Kind::wgrad, counts, g.f, g.d);
  weight_gemm_grouped(be, wg, true, false, 1.0f, h_gate, xs, 1.0f, dw.gate, wgrad_in);
  weight_gemm_grouped(be, wg, true, false, 1.0f, h_up, xs, 1.0f, dw.up, wgrad_in);
}

void ffn_forward(kernels::Backend& be, const Tensor& out, const ExpertActs& acts, const Tensor& x,
                 const ExpertWeights& w) {
  const int64_t T = x.dim(0), D = x.dim(1), H = w.gate.dim(w.gate.rank() - 2);
  be.gemm(false, true, T, H, D, 1.0f, x, w.gate, 0.0f, acts.h_gate);
  be.gemm(false, true, T, H, D, 1.0f, x, w.up, 0.0f, acts.h_up);
  be.swiglu_forward(acts.act, acts.h_gate, acts.h_up);
  be.gemm(false, true, T, D, H, 1.0f, acts.act, w.down, 1.0f, out);
}

void ffn_backward(kernels::Backend& be, const Tensor& dx, const ExpertWeights& dw,
                  const ExpertActs& scratch, const Tensor& dout, const Tensor& x,
                  const ExpertActs& acts, const ExpertWeights& w, WeightGrads* wg) {
  const int64_t T = x.dim(0), D = x.dim(1), H = w.gate.dim(w.gate.rank() - 2);
  be.gemm(false, false, T, H, D, 1.0f, dout, w.down, 0.0f, scratch.act);  // dact
  // dout is the caller's running residual gradient: a deferred W needs a copy.
  weight_gemm(be, wg, true, false, D, H, T, 1.0f, kept(be, wg, dout), acts.act, 1.0f, dw.down);
  const Tensor h_gate = held(wg, scratch.h_gate), h_up = held(wg, scratch.h_up);
  be.swiglu_backward_overwrite(h_gate, h_up, scratch.act, acts.h_gate, acts.h_up);
  be.gemm(false, false, T, D, H, 1.0f, h_gate, w.gate, 1.0f, dx);
  be.gemm(false, false, T, D, H, 1.0f, h_up, w.up, 1.0f, dx);
  weight_gemm(be, wg, true, false, H, D, T, 1.0f, h_gate, x, 1.0f, dw.gate);
  weight_gemm(be, wg, true, false, H, D, T, 1.0f, h_up, x, 1.0f, dw.up);
}

}  // namespace troupe::moe
