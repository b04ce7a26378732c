// OpenCL backend, part 2: the model ops (embedding, RMSNorm, RoPE, attention,
// activations, loss, routing, token permutation). Each checks shapes on the
// host, then launches kernels from kernels/cl/*.cl. Ops that read indices
// (ids, targets, slots) let the kernels flag bad ones and report them here.
#include <algorithm>
#include <cstring>
#include <stdexcept>

#include "kernels/opencl_backend_impl.hpp"

namespace troupe::kernels {

namespace {

// Last dimension of t (its row width); requires rank >= 1.
int64_t width_of(const Tensor& t, const char* op, const char* name) {
  cl_need(t.defined() && t.rank() >= 1, op, std::string(name) + " must have rank >= 1");
  return t.dim(-1);
}

int64_t rows_of(const Tensor& t, int64_t width) { return width ? t.numel() / width : 0; }

void need_rows(const Tensor& t, int64_t rows, int64_t width, const char* op, const char* name) {
  cl_need(t.numel() == rows * width, op,
          std::string(name) + " " + shape_str(t.shape()) + " must have " + std::to_string(rows) +
              " x " + std::to_string(width) + " elements");
}

constexpr int64_t kColsumChunk = 32;  // COLSUM_CHUNK in kernels/cl/norm.cl

}  // namespace

// ---- embedding ----------------------------------------------------------------------------------

void OpenClBackend::embedding_forward(const Tensor& out, const Tensor& table, const Tensor& ids) {
  const char* op = "embedding_forward";
  cl_need_f32(out, op, "out");
  cl_need_f32(table, op, "table");
  cl_need_i32(ids, op, "ids");
  const int64_t D = width_of(table, op, "table"), V = rows_of(table, D), T = ids.numel();
  need_rows(out, T, D, op, "out");
  cl_need_int(T * D, op, "T*D");
  cl_need_int(V, op, "V");
  ClLaunch(*this, "embedding_fwd", op).t(out).t(table).t(ids).i(T).i(D).i(V).err().items(T * D);
  maybe_check_errors(op);
}

void OpenClBackend::embedding_backward(const Tensor& dtable, const Tensor& dout,
                                       const Tensor& ids) {
  const char* op = "embedding_backward";
  cl_need_f32(dtable, op, "dtable");
  cl_need_f32(dout, op, "dout");
  cl_need_i32(ids, op, "ids");
  const int64_t D = width_of(dtable, op, "dtable"), V = rows_of(dtable, D), T = ids.numel();
  need_rows(dout, T, D, op, "dout");
  cl_need_int(T * D, op, "T*D");
  cl_need_int(V, op, "V");
  if (T == 0 || D == 0) return;
  Tensor sorted = empty({T}, DType::i32);  // token order grouped by id (pooled scratch)
  ClLaunch(*this, "stable_rank_i32", op).mem(mem_of(sorted, op)).t(ids).i(T).items(T);
  ClLaunch(*this, "embedding_bwd", op)
      .t(dtable)
      .t(dout)
      .t(ids)
      .mem(mem_of(sorted, op))
      .i(T)
      .i(D)
      .i(V)
      .err()
      .items(T * D);
  maybe_check_errors(op);
}

// ---- RMSNorm ------------------------------------------------------------------------------------

void OpenClBackend::rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& x,
                                    const Tensor& w, float eps) {
  const char* op = "rmsnorm_forward";
  cl_need_f32(out, op, "out");
  cl_need_f32(rstd, op, "rstd");
  cl_need_f32(x, op, "x");
  cl_need_f32(w, op, "w");
  const int64_t D = w.numel(), T = rows_of(x, D);
  cl_need(D > 0 && x.numel() == T * D, op,
          "x " + shape_str(x.shape()) + " is not rows of w's width " + std::to_string(D));
  cl_need_numel(out, x.numel(), op, "out");
  cl_need_numel(rstd, T, op, "rstd");
  cl_need_int(D, op, "D");
  ClLaunch launch(*this, "rmsnorm_fwd", op);
  const size_t L = row_group_size(launch.kernel(), D);
  launch.t(out).t(rstd).t(x).t(w).i(D).f(eps).groups(static_cast<size_t>(T), L);
}

void OpenClBackend::rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dout,
                                     const Tensor& x, const Tensor& w, const Tensor& rstd) {
  const char* op = "rmsnorm_backward";
  cl_need_f32(dx, op, "dx");
  cl_need_f32(dw, op, "dw");
  cl_need_f32(dout, op, "dout");
  cl_need_f32(x, op, "x");
  cl_need_f32(w, op, "w");
  cl_need_f32(rstd, op, "rstd");
  const int64_t D = w.numel(), T = rows_of(x, D);
  cl_need(D > 0 && x.numel() == T * D, op,
          "x " + shape_str(x.shape()) + " is not rows of w's width " + std::to_string(D));
  cl_need_numel(dx, x.numel(), op, "dx");
  cl_need_numel(dout, x.numel(), op, "dout");
  cl_need_numel(dw, D, op, "dw");
  cl_need_numel(rstd, T, op, "rstd");
  cl_need_int(T * D, op, "T*D");
  if (T == 0) return;
  ClLaunch dxl(*this, "rmsnorm_bwd_dx", op);
  const size_t L = row_group_size(dxl.kernel(), D);
  dxl.t(dx).t(dout).t(x).t(w).t(rstd).i(D).groups(static_cast<size_t>(T), L);
  const int64_t chunks = (T + kColsumChunk - 1) / kColsumChunk;
  Tensor partial = empty({chunks, D});
  ClLaunch(*this, "rmsnorm_dw_partial", op)
      .mem(mem_of(partial, op))
      .t(dout)
      .t(x)
      .t(rstd)
      .i(T)
      .i(D)
      .items(chunks * D);
  ClLaunch(*this, "colsum_finish", op)
      .t(dw)
      .mem(mem_of(partial, op))
      .i(chunks)
      .i(D)
      .i(1)
      .items(D);
}

void OpenClBackend::column_sum(const Tensor& out, const Tensor& x, bool accumulate,
                               const char* op) {
  const int64_t D = out.numel(), T = rows_of(x, D);
  cl_need(D == 0 || x.numel() == T * D, op,
          "x " + shape_str(x.shape()) + " is not rows of width " + std::to_string(D));
  cl_need_int(T * D, op, "T*D");
  if (D == 0) return;
  const int64_t chunks = std::max<int64_t>(1, (T + kColsumChunk - 1) / kColsumChunk);
  Tensor partial = empty({chunks, D});
  if (T == 0) {
    fill(partial, 0.0f);
  } else {
    ClLaunch(*this, "colsum_partial", op).mem(mem_of(partial, op)).t(x).i(T).i(D).items(chunks * D);
  }
  ClLaunch(*this, "colsum_finish", op)
      .t(out)
      .mem(mem_of(partial, op))
      .i(chunks)
      .i(D)
      .i(accumulate ? 1 : 0)
      .items(D);
}

// ---- RoPE ---------------------------------------------------------------------------------------

static void rope_shape(const Tensor& x, const char* op, int64_t* B, int64_t* S, int64_t* H,
                       int64_t* hd) {
  cl_need(x.rank() == 4, op, "expects [B,S,H,hd], got " + shape_str(x.shape()));
  *B = x.dim(0), *S = x.dim(1), *H = x.dim(2), *hd = x.dim(3);
  cl_need(*hd % 2 == 0, op, "head dim must be even, got " + std::to_string(*hd));
  cl_need_int(x.numel(), op, "numel");
}

const Tensor& OpenClBackend::rope_table(int64_t S, int64_t hd, int64_t pos_offset, float theta,
                                       const char* op) {
  uint32_t theta_bits = 0;
  std::memcpy(&theta_bits, &theta, sizeof(theta_bits));
  const auto key = std::make_tuple(S, hd, pos_offset, theta_bits);
  auto it = rope_tables_.find(key);
  if (it != rope_tables_.end()) return it->second;
  // Sampling with a KV cache moves pos_offset every token: keep the cache small.
  if (rope_tables_.size() >= 8) rope_tables_.clear();
  Tensor cs = empty({S, hd / 2, 2});
  cl_need_int(cs.numel(), op, "S*hd");
  ClLaunch(*this, "rope_table", op)
      .mem(mem_of(cs, op))
      .i(S)
      .i(hd)
      .l(pos_offset)
      .f(theta)
      .items(static_cast<size_t>(S * (hd / 2)));
  return rope_tables_.emplace(key, std::move(cs)).first->second;
}

void OpenClBackend::rope_forward(const Tensor& out, const Tensor& x, int64_t pos_offset,
                                 float theta) {
  const char* op = "rope_forward";
  cl_need_f32(out, op, "out");
  cl_need_f32(x, op, "x");
  int64_t B, S, H, hd;
  rope_shape(x, op, &B, &S, &H, &hd);
  cl_need_numel(out, x.numel(), op, "out");
  if (x.numel() == 0) return;
  const Tensor& cs = rope_table(S, hd, pos_offset, theta, op);
  ClLaunch(*this, "rope_fwd", op)
      .t(out)
      .t(x)
      .mem(mem_of(cs, op))
      .i(B)
      .i(S)
      .i(H)
      .i(hd)
      .items(x.numel() / 2);
}

void OpenClBackend::rope_backward(const Tensor& dx, const Tensor& dout, int64_t pos_offset,
                                  float theta) {
  const char* op = "rope_backward";
  cl_need_f32(dx, op, "dx");
  cl_need_f32(dout, op, "dout");
  int64_t B, S, H, hd;
  rope_shape(dout, op, &B, &S, &H, &hd);
  cl_need_numel(dx, dout.numel(), op, "dx");
  if (dout.numel() == 0) return;
  const Tensor& cs = rope_table(S, hd, pos_offset, theta, op);
  ClLaunch(*this, "rope_bwd", op)
      .t(dx)
      .t(dout)
      .mem(mem_of(cs, op))
      .i(B)
      .i(S)
      .i(H)
      .i(hd)
      .items(dout.numel() / 2);
}

// ---- attention ----------------------------------------------------------------------------------

static void attention_shape(const Tensor& q, const char* op, int64_t* B, int64_t* S, int64_t* H,
                            int64_t* hd) {
  cl_need_f32(q, op, "q");
  cl_need(q.rank() == 4, op, "q must be [B,S,H,hd], got " + shape_str(q.shape()));
  *B = q.dim(0), *S = q.dim(1), *H = q.dim(2), *hd = q.dim(3);
  cl_need(*hd <= 256, op, "head dim " + std::to_string(*hd) + " exceeds 256 (MAX_HD)");
  cl_need_int(q.numel(), op, "numel");
}

void OpenClBackend::attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q,
                                      const Tensor& k, const Tensor& v, float scale) {
  const char* op = "attention_forward";
  int64_t B, S, H, hd;
  attention_shape(q, op, &B, &S, &H, &hd);
  for (auto [t, name] : {std::pair{&k, "k"}, {&v, "v"}, {&out, "out"}}) {
    cl_need_f32(*t, op, name);
    cl_need(t->shape() == q.shape(), op,
            std::string(name) + " " + shape_str(t->shape()) + " must match q " +
                shape_str(q.shape()));
  }
  cl_need_f32(lse, op, "lse");
  cl_need_numel(lse, B * H * S, op, "lse");
  ClLaunch(*this, "attention_fwd", op)
      .t(out)
      .t(lse)
      .t(q)
      .t(k)
      .t(v)
      .i(B)
      .i(S)
      .i(H)
      .i(hd)
      .f(scale)
      .items(B * H * S);
}

void OpenClBackend::attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                       const Tensor& dout, const Tensor& q, const Tensor& k,
                                       const Tensor& v, const Tensor& out, const Tensor& lse,
                                       float scale) {
  const char* op = "attention_backward";
  int64_t B, S, H, hd;
  attention_shape(q, op, &B, &S, &H, &hd);
  for (auto [t, name] : {std::pair{&dq, "dq"}, {&dk, "dk"}, {&dv, "dv"}, {&dout, "dout"},
                         {&k, "k"}, {&v, "v"}, {&out, "out"}}) {
    cl_need_f32(*t, op, name);
    cl_need(t->shape() == q.shape(), op,
            std::string(name) + " " + shape_str(t->shape()) + " must match q " +
                shape_str(q.shape()));
  }
  cl_need_f32(lse, op, "lse");
  cl_need_numel(lse, B * H * S, op, "lse");
  const int64_t rows = B * H * S;
  if (rows == 0) return;
  Tensor delta = empty({rows});  // dot(dout, out) per query row
  cl_mem dm = mem_of(delta, op);
  ClLaunch(*this, "attention_bwd_delta", op)
      .mem(dm)
      .t(dout)
      .t(out)
      .i(B)
      .i(S)
      .i(H)
      .i(hd)
      .items(rows);
  ClLaunch(*this, "attention_bwd_dq", op)
      .t(dq)
      .t(dout)
      .t(q)
      .t(k)
      .t(v)
      .t(lse)
      .mem(dm)
      .i(B)
      .i(S)
      .i(H)
      .i(hd)
      .f(scale)
      .items(rows);
  ClLaunch(*this, "attention_bwd_dkv", op)
      .t(dk)
      .t(dv)
      .t(dout)
      .t(q)
      .t(k)
      .t(v)
      .t(lse)
      .mem(dm)
      .i(B)
      .i(S)
      .i(H)
      .i(hd)
      .f(scale)
      .items(rows);
}

// ---- activations --------------------------------------------------------------------------------

void OpenClBackend::silu_forward(const Tensor& out, const Tensor& x) {
  const char* op = "silu_forward";
  cl_need_f32(out, op, "out");
  cl_need_f32(x, op, "x");
  cl_need_numel(out, x.numel(), op, "out");
  ClLaunch(*this, "silu_fwd", op).t(out).t(x).l(x.numel()).items(x.numel());
}

void OpenClBackend::silu_backward(const Tensor& dx, const Tensor& dout, const Tensor& x) {
  const char* op = "silu_backward";
  cl_need_f32(dx, op, "dx");
  cl_need_f32(dout, op, "dout");
  cl_need_f32(x, op, "x");
  cl_need_numel(dx, x.numel(), op, "dx");
  cl_need_numel(dout, x.numel(), op, "dout");
  ClLaunch(*this, "silu_bwd", op).t(dx).t(dout).t(x).l(x.numel()).items(x.numel());
}

void OpenClBackend::swiglu_forward(const Tensor& out, const Tensor& gate, const Tensor& up) {
  const char* op = "swiglu_forward";
  cl_need_f32(out, op, "out");
  cl_need_f32(gate, op, "gate");
  cl_need_f32(up, op, "up");
  cl_need_numel(up, gate.numel(), op, "up");
  cl_need_numel(out, gate.numel(), op, "out");
  ClLaunch(*this, "swiglu_fwd", op).t(out).t(gate).t(up).l(gate.numel()).items(gate.numel());
}

void OpenClBackend::swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dout,
                                    const Tensor& gate, const Tensor& up) {
  const char* op = "swiglu_backward";
  for (auto [t, name] : {std::pair{&dgate, "dgate"}, {&dup, "dup"}, {&dout, "dout"},
                         {&gate, "gate"}, {&up, "up"}}) {
    cl_need_f32(*t, op, name);
    cl_need_numel(*t, gate.numel(), op, name);
  }
  ClLaunch(*this, "swiglu_bwd", op)
      .t(dgate)
      .t(dup)
      .t(dout)
      .t(gate)
      .t(up)
      .l(gate.numel())
      .items(gate.numel());
}

// ---- loss ---------------------------------------------------------------------------------------

void OpenClBackend::cross_entropy_forward(const Tensor& losses, const Tensor& logits,
                                          const Tensor& targets, int32_t ignore_index) {
  const char* op = "cross_entropy_forward";
  cl_need_f32(losses, op, "losses");
  cl_need_f32(logits, op, "logits");
  cl_need_i32(targets, op, "targets");
  const int64_t V = width_of(logits, op, "logits"), T = targets.numel();
  need_rows(logits, T, V, op, "logits");
  cl_need_numel(losses, T, op, "losses");
  cl_need_int(T * V, op, "T*V");
  ClLaunch launch(*this, "cross_entropy_fwd", op);
  const size_t L = row_group_size(launch.kernel(), V);
  launch.t(losses).t(logits).t(targets).i(V).i(ignore_index).err().groups(
      static_cast<size_t>(T), L);
  maybe_check_errors(op);
}

void OpenClBackend::cross_entropy_backward(const Tensor& dlogits, const Tensor& logits,
                                           const Tensor& targets, int32_t ignore_index,
                                           float grad_scale) {
  const char* op = "cross_entropy_backward";
  cl_need_f32(dlogits, op, "dlogits");
  cl_need_f32(logits, op, "logits");
  cl_need_i32(targets, op, "targets");
  const int64_t V = width_of(logits, op, "logits"), T = targets.numel();
  need_rows(logits, T, V, op, "logits");
  cl_need_numel(dlogits, T * V, op, "dlogits");
  cl_need_int(T * V, op, "T*V");
  ClLaunch launch(*this, "cross_entropy_bwd", op);
  const size_t L = row_group_size(launch.kernel(), V);
  launch.t(dlogits).t(logits).t(targets).i(V).i(ignore_index).f(grad_scale).err().groups(
      static_cast<size_t>(T), L);
  maybe_check_errors(op);
}

// ---- routing ------------------------------------------------------------------------------------

void OpenClBackend::softmax_forward(const Tensor& out, const Tensor& x) {
  const char* op = "softmax_forward";
  cl_need_f32(out, op, "out");
  cl_need_f32(x, op, "x");
  const int64_t E = width_of(x, op, "x"), T = rows_of(x, E);
  cl_need_numel(out, x.numel(), op, "out");
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
  const int64_t E = width_of(out, op, "out"), T = rows_of(out, E);
  cl_need_numel(dx, out.numel(), op, "dx");
  cl_need_numel(dout, out.numel(), op, "dout");
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
  const int64_t E = width_of(scores, op, "scores"), T = rows_of(scores, E);
  const int64_t K = width_of(weights, op, "weights");
  cl_need(K >= 1 && K <= E && K <= 64, op,
          "k = " + std::to_string(K) + " must be in [1, min(E = " + std::to_string(E) + ", 64)]");
  need_rows(weights, T, K, op, "weights");
  need_rows(ids, T, K, op, "ids");
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
  const int64_t E = width_of(scores, op, "scores"), T = rows_of(scores, E);
  const int64_t K = width_of(weights, op, "weights");
  cl_need_numel(dscores, T * E, op, "dscores");
  need_rows(weights, T, K, op, "weights");
  need_rows(dweights, T, K, op, "dweights");
  need_rows(ids, T, K, op, "ids");
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
  const int64_t E = row.numel(), T = rows_of(x, E);
  cl_need(E > 0 ? x.numel() == T * E : x.numel() == 0, op,
          "x " + shape_str(x.shape()) + " is not rows of width " + std::to_string(E));
  cl_need_int(x.numel(), op, "numel");
  ClLaunch(*this, "add_row", op).t(x).t(row).f(alpha).i(T).i(E).items(T * E);
}

// ---- token permutation --------------------------------------------------------------------------

void OpenClBackend::gather_rows(const Tensor& out, const Tensor& src, const Tensor& idx) {
  const char* op = "gather_rows";
  cl_need_f32(out, op, "out");
  cl_need_f32(src, op, "src");
  cl_need_i32(idx, op, "idx");
  const int64_t D = width_of(src, op, "src"), T = rows_of(src, D), N = idx.numel();
  need_rows(out, N, D, op, "out");
  cl_need_int(N * D, op, "N*D");
  cl_need_int(T, op, "T");
  ClLaunch(*this, "gather_rows", op).t(out).t(src).t(idx).i(N).i(D).i(T).err().items(N * D);
  maybe_check_errors(op);
}

void OpenClBackend::sum_slots(const Tensor& dst, const Tensor& src, const Tensor& slots) {
  const char* op = "sum_slots";
  cl_need_f32(dst, op, "dst");
  cl_need_f32(src, op, "src");
  cl_need_i32(slots, op, "slots");
  const int64_t D = width_of(dst, op, "dst"), T = rows_of(dst, D);
  const int64_t K = width_of(slots, op, "slots"), N = rows_of(src, D);
  need_rows(slots, T, K, op, "slots");
  need_rows(src, N, D, op, "src");
  cl_need_int(T * D, op, "T*D");
  cl_need_int(N * D, op, "N*D");
  ClLaunch(*this, "sum_slots", op).t(dst).t(src).t(slots).i(T).i(K).i(D).i(N).err().items(T * D);
  maybe_check_errors(op);
}

void OpenClBackend::combine_forward(const Tensor& out, const Tensor& y, const Tensor& slots,
                                    const Tensor& weights) {
  const char* op = "combine_forward";
  cl_need_f32(out, op, "out");
  cl_need_f32(y, op, "y");
  cl_need_i32(slots, op, "slots");
  cl_need_f32(weights, op, "weights");
  const int64_t D = width_of(out, op, "out"), T = rows_of(out, D);
  const int64_t K = width_of(slots, op, "slots"), N = rows_of(y, D);
  need_rows(slots, T, K, op, "slots");
  need_rows(weights, T, K, op, "weights");
  need_rows(y, N, D, op, "y");
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
      .items(T * D);
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
  const int64_t D = width_of(dout, op, "dout"), T = rows_of(dout, D);
  const int64_t K = width_of(slots, op, "slots"), N = rows_of(y, D);
  need_rows(slots, T, K, op, "slots");
  need_rows(weights, T, K, op, "weights");
  need_rows(dweights, T, K, op, "dweights");
  need_rows(y, N, D, op, "y");
  need_rows(dy, N, D, op, "dy");
  cl_need_int(T * K * D, op, "T*k*D");
  cl_need_int(N * D, op, "N*D");
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
      .items(T * K * D);
  ClLaunch launch(*this, "combine_bwd_dw", op);
  const size_t L = row_group_size(launch.kernel(), D);
  launch.t(dweights).t(dout).t(y).t(slots).i(K).i(D).i(N).groups(static_cast<size_t>(T * K), L);
  maybe_check_errors(op);
}

}  // namespace troupe::kernels
