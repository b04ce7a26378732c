// OpenCL backend, part 3: MoE routing (softmax, top-k, per-expert sums, router
// bias) and moving token rows to experts and back (gather, slot sums, weighted
// combine). Ops that read indices (expert ids, slots) let the kernels flag bad
// ones and report them.
#include <stdexcept>

#include "kernels/opencl_backend_impl.hpp"

namespace troupe::kernels {

// ---- routing ------------------------------------------------------------------------------------

void OpenClBackend::softmax_forward(const Tensor& out, const Tensor& x) {
  const char* op = "softmax_forward";
  cl_need_f32(out, op, "out");
  cl_need_f32(x, op, "x");
  const ClMat xm = cl_mat(x);
  const int64_t E = xm.cols, T = xm.rows;
  cl_need_mat(out, T, E, op, "out");
  cl_need_int(x.numel(), op, "numel");
  ClLaunch launch(*this, "softmax_fwd", op);
  const size_t L = row_group_size(launch.kernel(), E);
  launch.t(out).t(x).i(E).groups(static_cast<size_t>(T), L);
}

void OpenClBackend::softmax_backward(const Tensor& dx, const Tensor& dout, const Tensor& out) {
  const char* op = "softmax_backward";
  cl_need_f32(dx, op, "dx");
  cl_need_f32(dout, op, "dout");
  cl_need_f32(out, op, "out");
  const ClMat om = cl_mat(out);
  const int64_t E = om.cols, T = om.rows;
  cl_need_mat(dx, T, E, op, "dx");
  cl_need_mat(dout, T, E, op, "dout");
  cl_need_int(out.numel(), op, "numel");
  ClLaunch launch(*this, "softmax_bwd", op);
  const size_t L = row_group_size(launch.kernel(), E);
  launch.t(dx).t(dout).t(out).i(E).groups(static_cast<size_t>(T), L);
}

void OpenClBackend::topk_forward(const Tensor& weights, const Tensor& ids, const Tensor& scores,
                                 const Tensor& bias, bool renormalize) {
  const char* op = "topk_forward";
  cl_need_f32(weights, op, "weights");
  cl_need_i32(ids, op, "ids");
  cl_need_f32(scores, op, "scores");
  const ClMat sm = cl_mat(scores);
  const int64_t E = sm.cols, T = sm.rows, K = cl_mat(weights).cols;
  cl_need(K >= 1 && K <= E && K <= 64, op,
          "k = " + std::to_string(K) + " must be in [1, min(E = " + std::to_string(E) +
              ", 64)] (64: the OpenCL kernel's limit)");
  cl_need_mat(weights, T, K, op, "weights");
  cl_need_mat(ids, T, K, op, "ids");
  cl_need_int(scores.numel(), op, "numel");
  ClLaunch launch(*this, "topk_fwd", op);
  launch.t(weights).t(ids).t(scores);
  if (bias.defined()) {
    cl_need_f32(bias, op, "bias");
    cl_need_numel(bias, E, op, "bias");
    launch.t(bias).i(1);
  } else {
    launch.t(scores).i(0);  // any valid buffer; never read
  }
  launch.i(T).i(E).i(K).i(renormalize ? 1 : 0).items(T);
}

void OpenClBackend::topk_backward(const Tensor& dscores, const Tensor& dweights,
                                  const Tensor& weights, const Tensor& ids, const Tensor& scores,
                                  bool renormalize) {
  const char* op = "topk_backward";
  cl_need_f32(dscores, op, "dscores");
  cl_need_f32(dweights, op, "dweights");
  cl_need_f32(weights, op, "weights");
  cl_need_i32(ids, op, "ids");
  cl_need_f32(scores, op, "scores");
  const ClMat sm = cl_mat(scores);
  const int64_t E = sm.cols, T = sm.rows, K = cl_mat(weights).cols;
  cl_need_mat(dscores, T, E, op, "dscores");
  cl_need_mat(weights, T, K, op, "weights");
  cl_need_mat(dweights, T, K, op, "dweights");
  cl_need_mat(ids, T, K, op, "ids");
  cl_need_int(scores.numel(), op, "numel");
  ClLaunch(*this, "topk_bwd", op)
      .t(dscores)
      .t(dweights)
      .t(weights)
      .t(ids)
      .t(scores)
      .i(T)
      .i(E)
      .i(K)
      .i(renormalize ? 1 : 0)
      .err()
      .items(T);
  maybe_check_errors(op);
}

void OpenClBackend::sum_rows(const Tensor& out, const Tensor& x) {
  cl_need_f32(out, "sum_rows", "out");
  cl_need_f32(x, "sum_rows", "x");
  column_sum(out, x, false, "sum_rows");
}

void OpenClBackend::add_row(const Tensor& x, const Tensor& row, float alpha) {
  const char* op = "add_row";
  cl_need_f32(x, op, "x");
  cl_need_f32(row, op, "row");
  const ClMat xm = cl_mat(x);
  const int64_t E = xm.cols, T = xm.rows;
  cl_need_numel(row, E, op, "row");
  cl_need_int(x.numel(), op, "numel");
  ClLaunch(*this, "add_row", op).t(x).t(row).f(alpha).i(T).i(E).items2d(E, T);
}

// ---- token permutation --------------------------------------------------------------------------

void OpenClBackend::gather_rows(const Tensor& out, const Tensor& src, const Tensor& idx) {
  const char* op = "gather_rows";
  cl_need_f32(out, op, "out");
  cl_need_f32(src, op, "src");
  cl_need_i32(idx, op, "idx");
  const ClMat sm = cl_mat(src);
  const int64_t D = sm.cols, T = sm.rows, N = idx.numel();
  cl_need_mat(out, N, D, op, "out");
  cl_need_int(N * D, op, "N*D");
  cl_need_int(T, op, "T");
  ClLaunch(*this, "gather_rows", op).t(out).t(src).t(idx).i(N).i(D).i(T).err().items2d(D, N);
  maybe_check_errors(op);
}

void OpenClBackend::sum_slots(const Tensor& dst, const Tensor& src, const Tensor& slots) {
  const char* op = "sum_slots";
  cl_need_f32(dst, op, "dst");
  cl_need_f32(src, op, "src");
  cl_need_i32(slots, op, "slots");
  const ClMat dm = cl_mat(dst);
  const int64_t D = dm.cols, T = dm.rows, K = cl_mat(slots).cols, N = cl_mat(src).rows;
  cl_need_mat(slots, T, K, op, "slots");
  cl_need_mat(src, N, D, op, "src");
  cl_need_int(T * D, op, "T*D");
  cl_need_int(N * D, op, "N*D");
  ClLaunch(*this, "sum_slots", op).t(dst).t(src).t(slots).i(T).i(K).i(D).i(N).err().items2d(D, T);
  maybe_check_errors(op);
}

void OpenClBackend::combine_forward(const Tensor& out, const Tensor& y, const Tensor& slots,
                                    const Tensor& weights) {
  const char* op = "combine_forward";
  cl_need_f32(out, op, "out");
  cl_need_f32(y, op, "y");
  cl_need_i32(slots, op, "slots");
  cl_need_f32(weights, op, "weights");
  const ClMat om = cl_mat(out);
  const int64_t D = om.cols, T = om.rows, K = cl_mat(slots).cols, N = cl_mat(y).rows;
  cl_need_mat(slots, T, K, op, "slots");
  cl_need_mat(weights, T, K, op, "weights");
  cl_need_mat(y, N, D, op, "y");
  cl_need_int(T * D, op, "T*D");
  cl_need_int(N * D, op, "N*D");
  ClLaunch(*this, "combine_fwd", op)
      .t(out)
      .t(y)
      .t(slots)
      .t(weights)
      .i(T)
      .i(K)
      .i(D)
      .i(N)
      .err()
      .items2d(D, T);
  maybe_check_errors(op);
}

void OpenClBackend::combine_backward(const Tensor& dy, const Tensor& dweights, const Tensor& dout,
                                     const Tensor& y, const Tensor& slots,
                                     const Tensor& weights) {
  const char* op = "combine_backward";
  cl_need_f32(dy, op, "dy");
  cl_need_f32(dweights, op, "dweights");
  cl_need_f32(dout, op, "dout");
  cl_need_f32(y, op, "y");
  cl_need_i32(slots, op, "slots");
  cl_need_f32(weights, op, "weights");
  const ClMat om = cl_mat(dout);
  const int64_t D = om.cols, T = om.rows, K = cl_mat(slots).cols, N = cl_mat(y).rows;
  cl_need_mat(slots, T, K, op, "slots");
  cl_need_mat(weights, T, K, op, "weights");
  cl_need_mat(dweights, T, K, op, "dweights");
  cl_need_mat(y, N, D, op, "y");
  cl_need_mat(dy, N, D, op, "dy");
  cl_need_int(T * K * D, op, "T*k*D");
  cl_need_int(N * D, op, "N*D");
  if (T * K > 0 && N > 0) {  // the scatter below needs every row named at most once
    Tensor owner = empty({N}, DType::i32);
    ClLaunch(*this, "slot_owner", op).mem(mem_of(owner, op)).t(slots).i(T * K).i(N).items(T * K);
    ClLaunch(*this, "slot_check", op)
        .mem(mem_of(owner, op))
        .t(slots)
        .i(T * K)
        .i(N)
        .err()
        .items(T * K);
  }
  ClLaunch(*this, "combine_bwd_dy", op)
      .t(dy)
      .t(dout)
      .t(slots)
      .t(weights)
      .i(T)
      .i(K)
      .i(D)
      .i(N)
      .err()
      .items2d(D, T * K);
  ClLaunch launch(*this, "combine_bwd_dw", op);
  const size_t L = row_group_size(launch.kernel(), D);
  launch.t(dweights).t(dout).t(y).t(slots).i(K).i(D).i(N).groups(static_cast<size_t>(T * K), L);
  maybe_check_errors(op);
}

}  // namespace troupe::kernels
