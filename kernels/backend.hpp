// Backend: runs the ops the MoE decoder needs on tensors it allocated.
//
// Conventions (llm.c style): outputs first, then inputs, then scalars; sizes
// come from the tensors' shapes and are checked. Forward ops overwrite their
// outputs. Backward ops ACCUMULATE (+=) into every gradient they produce, so
// residual branches and microbatch accumulation need no extra adds; callers
// zero gradients when a step starts. For a gradient with one contribution the
// *_backward_overwrite variants write it instead, with no zeroing pass. All ops are deterministic: no atomics on
// floats, fixed reduction order.
//
// Row-major everywhere. "T" is a token count (batch*seq), "D" a width. An op
// documented on [T,D] reads a tensor's last dimension as D and all others,
// flattened, as T (so [B,S,D] works too); [B,S,H,hd] ops need rank 4.
// Bad shapes, dtypes or out-of-range indices (ids, targets, slots) throw
// std::invalid_argument naming the op and the shapes; nothing is written then.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels/tensor.hpp"

namespace troupe::kernels {

// One GEMM of a grouped call: C = alpha * op(A) * op(B) + beta * C, where the
// group's matrices start at the given element offsets of the call's A, B, C.
// op(A) is m x k, op(B) is k x n, C is m x n; leading dimensions are those of
// contiguous row-major storage (A: transA ? m : k, B: transB ? k : n, C: n).
struct GemmGroup {
  int64_t m = 0, n = 0, k = 0;
  int64_t a_offset = 0, b_offset = 0, c_offset = 0;
};

struct AdamWParams {
  float lr = 1e-3f;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.0f;
  int64_t step = 1;  // 1-based step count, for bias correction
  // Gradients are read as grad * grad_scale (grad itself is not written): the
  // global-norm clip factor fused into the update, bitwise what scaling the
  // gradients in place first gives (the same float product), one pass fewer.
  float grad_scale = 1.0f;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // ---- memory -------------------------------------------------------------
  virtual Tensor empty(Shape shape, DType dtype = DType::f32) = 0;
  Tensor zeros(Shape shape, DType dtype = DType::f32);
  virtual void upload(const Tensor& dst, const void* src, size_t bytes) = 0;
  virtual void download(void* dst, const Tensor& src, size_t bytes) = 0;
  virtual void synchronize() {}
  void upload_f32(const Tensor& dst, std::span<const float> src);
  void upload_i32(const Tensor& dst, std::span<const int32_t> src);
  std::vector<float> download_f32(const Tensor& src);
  std::vector<int32_t> download_i32(const Tensor& src);
  Tensor from_f32(Shape shape, std::span<const float> src);
  Tensor from_i32(Shape shape, std::span<const int32_t> src);

  // ---- elementwise ----------------------------------------------------------
  virtual void fill(const Tensor& x, float value) = 0;       // f32 only
  virtual void copy(const Tensor& dst, const Tensor& src) = 0;  // same numel and dtype
  virtual void add(const Tensor& out, const Tensor& a, const Tensor& b) = 0;  // out = a + b
  virtual void axpy(const Tensor& y, float alpha, const Tensor& x) = 0;      // y += alpha*x
  virtual void scale(const Tensor& x, float alpha) = 0;                      // x *= alpha

  // ---- GEMM -----------------------------------------------------------------
  // C[m,n] = alpha * op(A) * op(B) + beta * C; A, B, C are contiguous row-major
  // with exactly m*k, k*n, m*n elements. As in BLAS, beta == 0 means C is not
  // read (it may hold garbage or NaN); this holds for the batched and grouped
  // calls too. m, n or k may be 0 (k == 0: C = beta * C).
  virtual void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                    const Tensor& a, const Tensor& b, float beta, const Tensor& c) = 0;
  // `batch` independent GEMMs of one shape; matrix i starts at i*stride_{a,b,c}.
  // Strides of A and B may be 0 (one shared matrix); C matrices may not overlap.
  virtual void gemm_strided_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                                    float alpha, const Tensor& a, int64_t stride_a,
                                    const Tensor& b, int64_t stride_b, float beta,
                                    const Tensor& c, int64_t stride_c, int64_t batch) = 0;
  // Many GEMMs of different shapes in one call (one per expert; m may be 0).
  virtual void gemm_grouped(bool trans_a, bool trans_b, float alpha, const Tensor& a,
                            const Tensor& b, float beta, const Tensor& c,
                            std::span<const GemmGroup> groups) = 0;

  // Batch-invariant GEMMs: while on, every GEMM computes each element of C
  // with a summation order fixed by k alone, so a row's bits do not depend on
  // m, on its position or on the other rows of the call (a continuous batch
  // relies on it, model/continuous_batch.hpp). Slower than BLAS at large m.
  // Returns the previous setting. Only the host backend has it; the others
  // throw std::logic_error when asked to turn it on.
  virtual bool supports_batch_invariant() const { return false; }
  virtual bool set_batch_invariant(bool on);

  // ---- embedding ------------------------------------------------------------
  // out[T,D] = table[ids[t]]; ids is i32 [T], each in [0, V).
  virtual void embedding_forward(const Tensor& out, const Tensor& table, const Tensor& ids) = 0;
  // dtable[V,D] += scatter of dout[T,D] rows by ids.
  virtual void embedding_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids) = 0;

  // ---- RMSNorm --------------------------------------------------------------
  // out[T,D] = x * rstd * w, rstd[T] = 1/sqrt(mean(x^2) + eps).
  virtual void rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& x,
                               const Tensor& w, float eps) = 0;
  virtual void rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dout,
                                const Tensor& x, const Tensor& w, const Tensor& rstd) = 0;

  // ---- RoPE -----------------------------------------------------------------
  // x, out: [B,S,H,hd], hd even. Rotate-half (GPT-NeoX / Llama) layout: pair
  // (i, i+hd/2) rotates by angle pos * theta^(-2i/hd), pos = pos_offset + s.
  // out may alias x.
  virtual void rope_forward(const Tensor& out, const Tensor& x, int64_t pos_offset,
                            float theta) = 0;
  // dx += R^T dout.
  virtual void rope_backward(const Tensor& dx, const Tensor& dout, int64_t pos_offset,
                             float theta) = 0;

  // ---- causal multi-head attention -------------------------------------------
  // q, k, v, out: [B,S,H,hd]; lse: [B,H,S] (log-sum-exp of the scaled, masked
  // scores, kept for backward). Scores are scaled by `scale` (1/sqrt(hd)).
  virtual void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q,
                                 const Tensor& k, const Tensor& v, float scale) = 0;
  virtual void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                  const Tensor& dout, const Tensor& q, const Tensor& k,
                                  const Tensor& v, const Tensor& out, const Tensor& lse,
                                  float scale) = 0;

  // ---- attention over a KV cache (incremental decoding) ------------------------
  // q, out: [B,S,H,hd], S new tokens per sequence; k_cache, v_cache: [B,C,H,hd],
  // C cached positions per sequence, already holding this step's keys/values.
  // Query s of sequence b sits at position pos[b] + s and attends keys
  // 0..pos[b]+s of its own cache row (causal), so sequences of different
  // lengths share one call; needs 0 <= pos[b] and pos[b] + S <= C (positions
  // are host values: the decoder knows them). Forward only: decoding runs no
  // backward, training uses attention_forward.
  virtual void attention_cached(const Tensor& out, const Tensor& q, const Tensor& k_cache,
                                const Tensor& v_cache, std::span<const int32_t> pos,
                                float scale) = 0;
  // The step before it, in one call for the whole batch: q and k ([B,S,H,hd])
  // are rotated IN PLACE by RoPE at positions pos[b] + s (the rotation of
  // rope_forward with pos_offset = pos[b]), then the rotated k and v rows go into
  // k_cache and v_cache ([B,C,H,hd]) at rows pos[b] .. pos[b]+S-1 (needs
  // pos[b] + S <= C; other rows are untouched). Forward only.
  virtual void rope_kv_append(const Tensor& q, const Tensor& k, const Tensor& v,
                              const Tensor& k_cache, const Tensor& v_cache,
                              std::span<const int32_t> pos, float theta) = 0;

  // ---- activations ------------------------------------------------------------
  virtual void silu_forward(const Tensor& out, const Tensor& x) = 0;
  virtual void silu_backward(const Tensor& dx, const Tensor& dout, const Tensor& x) = 0;
  // out = silu(gate) * up, all [T,F].
  virtual void swiglu_forward(const Tensor& out, const Tensor& gate, const Tensor& up) = 0;
  virtual void swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dout,
                               const Tensor& gate, const Tensor& up) = 0;

  // ---- loss -------------------------------------------------------------------
  // losses[T] = -log softmax(logits[t])[targets[t]], 0 where targets[t] == ignore_index.
  virtual void cross_entropy_forward(const Tensor& losses, const Tensor& logits,
                                     const Tensor& targets, int32_t ignore_index) = 0;
  // dlogits[T,V] += grad_scale * (softmax(logits) - onehot(target)) on counted
  // tokens (grad_scale = dLoss/dmean / count for a mean over counted tokens).
  virtual void cross_entropy_backward(const Tensor& dlogits, const Tensor& logits,
                                      const Tensor& targets, int32_t ignore_index,
                                      float grad_scale) = 0;

  // ---- routing ------------------------------------------------------------------
  // Row softmax: out[T,E] = softmax(x[T,E]).
  virtual void softmax_forward(const Tensor& out, const Tensor& x) = 0;
  virtual void softmax_backward(const Tensor& dx, const Tensor& dout, const Tensor& out) = 0;
  // Per token, pick the k experts with the largest scores[t,e] + bias[e] (bias
  // may be undefined = 0; ties go to the lower expert id), ids ascending by
  // selection rank. weights[t,j] = scores[t, ids[t,j]], divided by their sum
  // when `renormalize` (no epsilon: router scores are positive). weights f32
  // [T,k], ids i32 [T,k], 1 <= k <= E.
  virtual void topk_forward(const Tensor& weights, const Tensor& ids, const Tensor& scores,
                            const Tensor& bias, bool renormalize) = 0;
  // dscores[T,E] += d weights / d scores applied to dweights[T,k].
  virtual void topk_backward(const Tensor& dscores, const Tensor& dweights,
                             const Tensor& weights, const Tensor& ids, const Tensor& scores,
                             bool renormalize) = 0;
  // out[E] = sum over rows of x[T,E] (overwrites).
  virtual void sum_rows(const Tensor& out, const Tensor& x) = 0;
  // x[T,E] += alpha * row[E] for every row.
  virtual void add_row(const Tensor& x, const Tensor& row, float alpha) = 0;

  // ---- token permutation to experts and back -------------------------------------
  // out[N,D] = src[idx[n]] (idx i32 [N], each in [0,T)).
  virtual void gather_rows(const Tensor& out, const Tensor& src, const Tensor& idx) = 0;
  // A negative slot is an empty one (a dropped token choice) and is skipped.
  // dst[T,D] += sum_j src[slots[t,j]] over slots[t,j] >= 0 (slots i32 [T,k]):
  // the backward of gather_rows, given the inverse map (deterministic, no atomics).
  virtual void sum_slots(const Tensor& dst, const Tensor& src, const Tensor& slots) = 0;
  // out[T,D] += sum_j weights[t,j] * y[slots[t,j]] over slots[t,j] >= 0.
  virtual void combine_forward(const Tensor& out, const Tensor& y, const Tensor& slots,
                               const Tensor& weights) = 0;
  // dy[N,D] += weights[t,j] * dout[t] at row slots[t,j];
  // dweights[T,k] += dot(dout[t], y[slots[t,j]]).
  virtual void combine_backward(const Tensor& dy, const Tensor& dweights, const Tensor& dout,
                                const Tensor& y, const Tensor& slots, const Tensor& weights) = 0;

  // ---- overwrite variants of backward ops ----------------------------------------------
  // The gradients of the ops above WRITTEN instead of added: each output holds
  // 0 + g, bitwise what fill(0) then the accumulating op gives, so a gradient
  // with a single contribution needs no zeroing pass. rmsnorm's dw is a weight
  // gradient and still accumulates. These defaults fill then accumulate (any
  // backend is right); the host backend writes in one pass.
  virtual void rmsnorm_backward_overwrite(const Tensor& dx, const Tensor& dw, const Tensor& dout,
                                          const Tensor& x, const Tensor& w, const Tensor& rstd);
  virtual void rope_backward_overwrite(const Tensor& dx, const Tensor& dout, int64_t pos_offset,
                                       float theta);
  virtual void attention_backward_overwrite(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                            const Tensor& dout, const Tensor& q, const Tensor& k,
                                            const Tensor& v, const Tensor& out, const Tensor& lse,
                                            float scale);
  virtual void swiglu_backward_overwrite(const Tensor& dgate, const Tensor& dup,
                                         const Tensor& dout, const Tensor& gate,
                                         const Tensor& up);
  virtual void cross_entropy_backward_overwrite(const Tensor& dlogits, const Tensor& logits,
                                                const Tensor& targets, int32_t ignore_index,
                                                float grad_scale);
  virtual void softmax_backward_overwrite(const Tensor& dx, const Tensor& dout, const Tensor& out);

  // ---- optimizer ---------------------------------------------------------------------
  // Sum of squares of x (f32), returned to the host in double.
  virtual double squared_norm(const Tensor& x) = 0;
  // AdamW with bias correction and decoupled weight decay, elementwise over
  // param/grad/m/v (same numel):
  //   m = b1 m + (1-b1) g; v = b2 v + (1-b2) g^2
  //   p -= lr * (mhat / (sqrt(vhat) + eps) + wd * p)
  virtual void adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
                     const AdamWParams& hp) = 0;
  // The same update with the moments read from m_in/v_in and written to
  // m_out/v_out (param still in place), bitwise what copying them first and
  // updating in place gives; m_in/v_in are left as they were. The optimizer
  // shard keeps the step-start moments as its kill-and-replay snapshot this
  // way, without copying them. This default copies, then updates in place; the
  // host backend does it in one pass.
  virtual void adamw_to(const Tensor& param, const Tensor& grad, const Tensor& m_in, const Tensor& v_in,
                        const Tensor& m_out, const Tensor& v_out, const AdamWParams& hp) {
    copy(m_out, m_in);
    copy(v_out, v_in);
    adamw(param, grad, m_out, v_out, hp);
  }
};

// Clips grads so that their global L2 norm is at most max_norm (no-op if
// max_norm <= 0). Returns the norm before clipping.
double clip_grad_norm(Backend& backend, std::span<const Tensor> grads, double max_norm);

enum class BackendKind : uint8_t { host, opencl };      // "host", "opencl"
enum class OpenclDeviceType : uint8_t { any, gpu, cpu };  // "any", "gpu", "cpu"

const char* backend_kind_name(BackendKind kind);
const char* opencl_device_type_name(OpenclDeviceType type);
// The inverses, for command lines and tests (specs convert through their key
// table); std::invalid_argument naming the valid values otherwise.
BackendKind parse_backend_kind(const std::string& name);
OpenclDeviceType parse_opencl_device_type(const std::string& name);

struct BackendOptions {
  BackendKind kind = BackendKind::host;
  int threads = 1;            // host: the backend's threads (OpenBLAS itself runs
                              // single-threaded; the result does not depend on this)
  int platform = -1;          // opencl: platform index (-1: first with a device of `device_type`)
  int device = 0;             // opencl: device index on that platform
  OpenclDeviceType device_type = OpenclDeviceType::any;  // opencl
};

// Creates a backend; throws std::runtime_error with a clear message on failure
// (for example, no OpenCL platform).
std::unique_ptr<Backend> make_backend(const BackendOptions& options);

}  // namespace troupe::kernels
