// Raw host kernels behind HostBackend (internal to kernels/host_*.cpp).
// llm.c style: plain pointers, outputs first, then inputs, then sizes. Shapes
// were already checked by HostBackend; these functions trust their arguments
// (except index ranges, which HostBackend validates before calling them).
// Every loop has a fixed order and no threads, so results are deterministic.
#pragma once

#include <cstdint>

namespace troupe::kernels::host {

// ---- GEMM (OpenBLAS, row-major; host_gemm.cpp) -----------------------------------
// C[m,n] = alpha * op(A) * op(B) + beta * C with leading dimensions lda, ldb, ldc.
// Handles the degenerate sizes BLAS rejects (m, n or k == 0).
void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
           const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
           int64_t ldc);

// ---- attention (host_attention.cpp) ---------------------------------------------------
// q, k, v, out: [B,S,H,hd]; lse: [B,H,S].
void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       int64_t B, int64_t S, int64_t H, int64_t hd, float scale);
void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        int64_t B, int64_t S, int64_t H, int64_t hd, float scale);

// ---- layers (host_layers.cpp) ---------------------------------------------------------
void embedding_forward(float* out, const float* table, const int32_t* ids, int64_t T, int64_t D);
void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t T,
                        int64_t D);
void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int64_t T,
                     int64_t D, float eps);
void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w,
                      const float* rstd, int64_t T, int64_t D);
// x, out: [B,S,H,hd] (out may equal x).
void rope_forward(float* out, const float* x, int64_t B, int64_t S, int64_t H, int64_t hd,
                  int64_t pos_offset, float theta);
void rope_backward(float* dx, const float* dout, int64_t B, int64_t S, int64_t H, int64_t hd,
                   int64_t pos_offset, float theta);

// ---- activations and loss (host_activations.cpp) -------------------------------------------
void silu_forward(float* out, const float* x, int64_t n);
void silu_backward(float* dx, const float* dout, const float* x, int64_t n);
void swiglu_forward(float* out, const float* gate, const float* up, int64_t n);
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, int64_t n);
void cross_entropy_forward(float* losses, const float* logits, const int32_t* targets,
                           int32_t ignore_index, int64_t T, int64_t V);
void cross_entropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                            int32_t ignore_index, float grad_scale, int64_t T, int64_t V);
void softmax_forward(float* out, const float* x, int64_t T, int64_t E);
void softmax_backward(float* dx, const float* dout, const float* out, int64_t T, int64_t E);

// ---- routing and token permutation (host_routing.cpp) ----------------------------------------
// bias may be nullptr.
void topk_forward(float* weights, int32_t* ids, const float* scores, const float* bias,
                  bool renormalize, int64_t T, int64_t E, int64_t K);
void topk_backward(float* dscores, const float* dweights, const float* weights,
                   const int32_t* ids, const float* scores, bool renormalize, int64_t T,
                   int64_t E, int64_t K);
void sum_rows(float* out, const float* x, int64_t T, int64_t E);
void add_row(float* x, const float* row, float alpha, int64_t T, int64_t E);
void gather_rows(float* out, const float* src, const int32_t* idx, int64_t N, int64_t D);
void sum_slots(float* dst, const float* src, const int32_t* slots, int64_t T, int64_t K,
               int64_t D);
void combine_forward(float* out, const float* y, const int32_t* slots, const float* weights,
                     int64_t T, int64_t K, int64_t D);
void combine_backward(float* dy, float* dweights, const float* dout, const float* y,
                      const int32_t* slots, const float* weights, int64_t T, int64_t K,
                      int64_t D);

// ---- elementwise and optimizer (host_elementwise.cpp) ------------------------------------
void fill(float* x, float value, int64_t n);
void add(float* out, const float* a, const float* b, int64_t n);
void axpy(float* y, float alpha, const float* x, int64_t n);
void scale(float* x, float alpha, int64_t n);
double squared_norm(const float* x, int64_t n);
void adamw(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
           float beta2, float eps, float weight_decay, float bias_correction1,
           float bias_correction2);

}  // namespace troupe::kernels::host
