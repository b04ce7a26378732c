// float64 reference implementations of every Backend op, written as plain
// loops for clarity, not speed. Backward functions return the gradient itself
// (not accumulated); tests add the initial value of the accumulating output.
// Also: central finite differences over any reference forward.
#pragma once

#include <cstdint>
#include <functional>
#include <vector>

namespace troupe::kernels::ref {

using V = std::vector<double>;
using Ids = std::vector<int32_t>;

// ---- GEMM: returns alpha*op(A)*op(B) + beta*C (C is not read when beta == 0) ----
V gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, double alpha, const V& a, const V& b,
       double beta, const V& c, int64_t a_off = 0, int64_t b_off = 0, int64_t c_off = 0);

// ---- embedding ----
V embedding_fwd(const V& table, const Ids& ids, int64_t D);
V embedding_bwd(const V& dout, const Ids& ids, int64_t V_rows, int64_t D);  // dtable

// ---- RMSNorm ----
void rmsnorm_fwd(V& out, V& rstd, const V& x, const V& w, int64_t T, int64_t D, double eps);
void rmsnorm_bwd(V& dx, V& dw, const V& dout, const V& x, const V& w, int64_t T, int64_t D,
                 double eps);

// ---- RoPE, x [B,S,H,hd] ----
V rope_fwd(const V& x, int64_t B, int64_t S, int64_t H, int64_t hd, int64_t pos_offset,
           double theta);
V rope_bwd(const V& dout, int64_t B, int64_t S, int64_t H, int64_t hd, int64_t pos_offset,
           double theta);

// ---- causal attention, q/k/v [B,S,H,hd], lse [B,H,S] ----
void attention_fwd(V& out, V& lse, const V& q, const V& k, const V& v, int64_t B, int64_t S,
                   int64_t H, int64_t hd, double scale);
void attention_bwd(V& dq, V& dk, V& dv, const V& dout, const V& q, const V& k, const V& v,
                   int64_t B, int64_t S, int64_t H, int64_t hd, double scale);

// ---- attention over a KV cache: q/out [B,S,H,hd], caches [B,C,H,hd], pos [B] ----
V attention_cached_fwd(const V& q, const V& k_cache, const V& v_cache,
                       const std::vector<int32_t>& pos, int64_t B, int64_t S, int64_t C,
                       int64_t H, int64_t hd, double scale);

// RoPE of q, k at positions pos[b] + s (in place) and the cache rows they fill.
void rope_kv_append(V& q, V& k, const V& v, V& k_cache, V& v_cache, const std::vector<int32_t>& pos,
                    int64_t B, int64_t S, int64_t C, int64_t H, int64_t hd, double theta);

// ---- activations ----
V silu_fwd(const V& x);
V silu_bwd(const V& dout, const V& x);
V swiglu_fwd(const V& gate, const V& up);
void swiglu_bwd(V& dgate, V& dup, const V& dout, const V& gate, const V& up);

// ---- loss and softmax ----
V cross_entropy_fwd(const V& logits, const Ids& targets, int32_t ignore, int64_t T, int64_t Vn);
V cross_entropy_bwd(const V& logits, const Ids& targets, int32_t ignore, double grad_scale,
                    int64_t T, int64_t Vn);
V softmax_fwd(const V& x, int64_t T, int64_t E);
V softmax_bwd(const V& dout, const V& out, int64_t T, int64_t E);

// ---- routing ----
// Selection uses float32 keys (score + bias rounded to float, exactly as the
// contract computes them), so near-ties resolve as in the backends.
void topk_fwd(V& weights, Ids& ids, const std::vector<float>& scores,
              const std::vector<float>& bias, bool renormalize, int64_t T, int64_t E, int64_t K);
V topk_bwd(const V& dweights, const Ids& ids, const V& scores, bool renormalize, int64_t T,
           int64_t E, int64_t K);
// The weights of topk as a function of the scores for a fixed selection (for finite differences).
V topk_weights(const V& scores, const Ids& ids, bool renormalize, int64_t T, int64_t E, int64_t K);
V sum_rows(const V& x, int64_t T, int64_t E);
V add_row(const V& x, const V& row, double alpha, int64_t T, int64_t E);
V gather_rows(const V& src, const Ids& idx, int64_t D);
V sum_slots(const V& src, const Ids& slots, int64_t T, int64_t K, int64_t D);  // the sum only
V combine_fwd(const V& y, const Ids& slots, const V& weights, int64_t T, int64_t K, int64_t D);
void combine_bwd(V& dy, V& dweights, const V& dout, const V& y, const Ids& slots, const V& weights,
                 int64_t N, int64_t T, int64_t K, int64_t D);

// ---- optimizer ----
double squared_norm(const V& x);
struct AdamW {
  double lr, beta1, beta2, eps, weight_decay;
};
void adamw_step(V& param, V& m, V& v, const V& grad, const AdamW& hp, int64_t step);

// ---- finite differences ----
// d(sum_j dout_j f(x)_j)/dx_i by central differences with step h (relative to |x_i|).
V numeric_grad(const std::function<V(const V&)>& f, const V& x, const V& dout, double h = 1e-6);

}  // namespace troupe::kernels::ref
