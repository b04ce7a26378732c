// Raw host kernels behind HostBackend (internal to kernels/host_*.cpp).
// llm.c style: plain pointers, outputs first, then inputs, then sizes. Shapes
// were already checked by HostBackend; these functions trust their arguments
// (except index ranges, which HostBackend validates before calling them).
// Every loop has a fixed order, so results are deterministic; the only threads
// are a HostPool's, where a kernel takes one (each item on one thread).
#pragma once

#include <bit>
#include <cstdint>
#include <cstring>

namespace troupe::kernels::host {

class HostPool;

// On x86-64 with GCC, the exp- and reduction-heavy kernels are also compiled for
// AVX2 and picked at load time (function multiversioning): the release flags
// target baseline SSE2. Results are bitwise the same in both versions: neither
// target has FMA, troupe_kernels builds with -ffp-contract=off anyway (GCC
// contracts a*b+c into an FMA wherever the target has one, -std=c++20 or not),
// and every reduction has a fixed lane order, so only the vector width differs.
// (An AVX-512 clone, bitwise the same with contraction off, was slower on the
// cross-entropy forward on a Sapphire Rapids VM, so there is none.)
#if defined(__x86_64__) && defined(__GNUC__) && !defined(__clang__)
#define TROUPE_HOST_SIMD __attribute__((target_clones("avx2", "default")))
#else
#define TROUPE_HOST_SIMD
#endif

// ---- building blocks for loops the compiler vectorizes -----------------------------
// (Release flags have no -ffast-math: a float reduction written as one running
// sum stays serial, and std::exp is a library call. These keep loops vectorizable
// while staying deterministic: the lane pattern fixes the summation order.)

// Sum of term(i) for i < n with 8 accumulators (lane i % 8), combined pairwise.
template <class Term>
inline float lane_sum(int64_t n, Term term) {
  float acc[8] = {};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int l = 0; l < 8; ++l) acc[l] += term(i + l);
  for (int l = 0; i < n; ++i, ++l) acc[l] += term(i);
  return ((acc[0] + acc[4]) + (acc[1] + acc[5])) + ((acc[2] + acc[6]) + (acc[3] + acc[7]));
}

// Max of x[0..n), n >= 1 (NaN-free input assumed; a NaN may or may not win).
// The main loop is written on an 8-float vector type: GCC leaves the same
// loop on a float[8] scalar (one maxss per element); lane by lane the compare
// and select are the same, so the result is too.
inline float lane_max(const float* x, int64_t n) {
  typedef float f8 __attribute__((vector_size(32)));
  f8 vacc;
  for (int l = 0; l < 8; ++l) vacc[l] = x[0];
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    f8 v;
    std::memcpy(&v, x + i, sizeof v);
    vacc = vacc < v ? v : vacc;
  }
  float acc[8];
  for (int l = 0; l < 8; ++l) acc[l] = vacc[l];
  for (int l = 0; i < n; ++i, ++l) acc[l] = acc[l] < x[i] ? x[i] : acc[l];
  float m = acc[0];
  for (int l = 1; l < 8; ++l) m = m < acc[l] ? acc[l] : m;
  return m;
}

// exp(x) in float without a library call, so loops calling it vectorize:
// x = n ln2 + r with |r| <= ln2/2 (Cody-Waite split of ln2), e^r by its degree-6
// Taylor polynomial (truncation < 1e-7 relative), times 2^n built in the
// exponent bits. Within 3 ulp of exp (checked over every float in range).
// |x| is clamped to 87 so 2^n stays a normal float (exp(-87) ~ 1.6e-38 stands
// in for smaller results, exp(87) ~ 6e37 for larger); NaN propagates. The clamp
// works on the bit pattern: a float compare-and-select there makes GCC thread
// the clamped constant through the arithmetic, and the loop no longer vectorizes.
inline float fast_exp(float x) {
  const int32_t bits = std::bit_cast<int32_t>(x);
  const int32_t limit = std::bit_cast<int32_t>(87.0f);
  int32_t mag = bits & 0x7fffffff;
  mag = (mag > limit && mag <= 0x7f800000) ? limit : mag;  // NaN (> 0x7f800000) kept
  x = std::bit_cast<float>((bits & static_cast<int32_t>(0x80000000u)) | mag);
  constexpr float kRound = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float t = x * 1.44269504088896341f + kRound;
  const int32_t n = std::bit_cast<int32_t>(t) - std::bit_cast<int32_t>(kRound);
  const float nf = t - kRound;
  const float r = (x - nf * 0.693359375f) + nf * 2.12194440e-4f;
  const float p =
      1.0f + r * (1.0f + r * (0.5f + r * (1.0f / 6 +
                                          r * (1.0f / 24 + r * (1.0f / 120 + r * (1.0f / 720))))));
  return p * std::bit_cast<float>((n + 127) << 23);
}

// ---- GEMM (OpenBLAS, row-major; host_gemm.cpp) -----------------------------------
// C[m,n] = alpha * op(A) * op(B) + beta * C with leading dimensions lda, ldb, ldc.
// Handles the degenerate sizes BLAS rejects (m, n or k == 0).
void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// The same GEMM split across `pool`'s threads by rows of C, each part one
// single-threaded OpenBLAS call. OpenBLAS always runs single-threaded in
// troupe (HostBackend): its own threading makes an element's bits depend on
// the thread count (Haswell kernels: 580 of 600 shapes differ between 1 and
// 2 threads) and its count is process-wide, so another device could change it
// mid-call. A split at a multiple of kGemmRowAlign rows gives every element
// the bits of the unsplit call (the Haswell sgemm kernel computes C in blocks
// of 12 rows of row-major C; Prescott and Sandybridge in 4 or 8): the result
// does not depend on the thread count (HostThreads.GemmSameBitsOnOneTwoAnd-
// ThreeThreads checks it under each family in the bitwise matrix; a probe of
// 420 shapes x 4 transposes found no exception for Haswell, Prescott and
// Sandybridge). SkylakeX's small-matrix kernels may be one: a part can fall
// under their size limit (5 of 420 shapes differed there).
inline constexpr int64_t kGemmRowAlign = 12;
// Below this many multiply-adds per part, waking a thread costs more than it
// saves (bench_kernels).
inline constexpr int64_t kGemmMinPartFlops = int64_t{1} << 20;
void sgemm_rows(HostPool& pool, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);

// Batch-invariant GEMM (host_gemm_invariant.cpp): the same C, with every
// element's summation order fixed by k alone, so a row's bits never depend on
// m, its position or the other rows. No FMA, no OpenBLAS.
void sgemm_invariant(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                     int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc);
// Split across `pool`'s threads by blocks of columns of C (same bits at any size).
void sgemm_invariant_split(HostPool& pool, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                           const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                           int64_t ldc);

// ---- attention (host_attention.cpp) ---------------------------------------------------
// q, k, v, out: [B,S,H,hd]; lse: [B,H,S]. The (batch, head) pairs run as items
// of `pool` (host_pool.hpp); the result does not depend on the pool's size.
void attention_forward(HostPool& pool, float* out, float* lse, const float* q, const float* k,
                       const float* v, int64_t B, int64_t S, int64_t H, int64_t hd, float scale);
void attention_backward(HostPool& pool, float* dq, float* dk, float* dv, const float* dout,
                        const float* q, const float* k, const float* v, const float* out,
                        const float* lse, int64_t B, int64_t S, int64_t H, int64_t hd, float scale,
                        bool accumulate);

// q, out: [B,S,H,hd]; k_cache, v_cache: [B,C,H,hd]; query s of sequence b attends
// cache keys 0..pos[b]+s (pos[b] + S <= C, checked by the caller).
void attention_cached(float* out, const float* q, const float* k_cache, const float* v_cache,
                      const int32_t* pos, int64_t B, int64_t S, int64_t C, int64_t H, int64_t hd,
                      float scale);

// ---- layers (host_layers.cpp) ---------------------------------------------------------
void embedding_forward(float* out, const float* table, const int32_t* ids, int64_t T, int64_t D);
void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t T, int64_t D);
void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w, int64_t T, int64_t D,
                     float eps);
void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x, const float* w,
                      const float* rstd, int64_t T, int64_t D, bool accumulate);
// x, out: [B,S,H,hd] (out may equal x).
void rope_forward(float* out, const float* x, int64_t B, int64_t S, int64_t H, int64_t hd,
                  int64_t pos_offset, float theta);
void rope_backward(float* dx, const float* dout, int64_t B, int64_t S, int64_t H, int64_t hd,
                   int64_t pos_offset, float theta, bool accumulate);

// ---- activations and loss (host_activations.cpp) -------------------------------------------
void silu_forward(float* out, const float* x, int64_t n);
void silu_backward(float* dx, const float* dout, const float* x, int64_t n);
void swiglu_forward(float* out, const float* gate, const float* up, int64_t n);
void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, int64_t n, bool accumulate);
void cross_entropy_forward(float* losses, const float* logits, const int32_t* targets,
                           int32_t ignore_index, int64_t T, int64_t V);
void cross_entropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                            int32_t ignore_index, float grad_scale, int64_t T, int64_t V,
                            bool accumulate);
void softmax_forward(float* out, const float* x, int64_t T, int64_t E);
void softmax_backward(float* dx, const float* dout, const float* out, int64_t T, int64_t E,
                      bool accumulate);

// ---- routing and token permutation (host_routing.cpp) ----------------------------------------
// bias may be nullptr.
void topk_forward(float* weights, int32_t* ids, const float* scores, const float* bias,
                  bool renormalize, int64_t T, int64_t E, int64_t K);
void topk_backward(float* dscores, const float* dweights, const float* weights, const int32_t* ids,
                   const float* scores, bool renormalize, int64_t T, int64_t E, int64_t K);
void sum_rows(float* out, const float* x, int64_t T, int64_t E);
void add_row(float* x, const float* row, float alpha, int64_t T, int64_t E);
void gather_rows(float* out, const float* src, const int32_t* idx, int64_t N, int64_t D);
void sum_slots(float* dst, const float* src, const int32_t* slots, int64_t T, int64_t K, int64_t D);
void combine_forward(float* out, const float* y, const int32_t* slots, const float* weights,
                     int64_t T, int64_t K, int64_t D);
void combine_backward(float* dy, float* dweights, const float* dout, const float* y,
                      const int32_t* slots, const float* weights, int64_t T, int64_t K, int64_t D);

// ---- elementwise and optimizer (host_elementwise.cpp) ------------------------------------
void fill(float* x, float value, int64_t n);
void add(float* out, const float* a, const float* b, int64_t n);
void axpy(float* y, float alpha, const float* x, int64_t n);
void scale(float* x, float alpha, int64_t n);
double squared_norm(const float* x, int64_t n);
// Reads each gradient as grad[i] * grad_scale (the clip factor, 1 = none):
// bitwise what scaling grad in place first gives, one pass fewer.
// The moments are read from m_in/v_in and written to m_out/v_out (the same
// pointers for an in-place update).
void adamw(float* param, const float* grad, const float* m_in, const float* v_in, float* m_out, float* v_out,
           int64_t n, float lr, float beta1, float beta2, float eps, float weight_decay, float bias_correction1,
           float bias_correction2, float grad_scale);

}  // namespace troupe::kernels::host
