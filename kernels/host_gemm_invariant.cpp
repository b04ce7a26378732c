// Batch-invariant host GEMM: every element of C is one dot product whose
// summation order depends only on k, never on m, on the row's position in A
// or on the split across threads. A row of C is then the same bits whatever
// other rows share the call, which is what lets a generator put a sequence in
// any slot of a continuous batch without changing its tokens
// (model/continuous_batch.hpp). OpenBLAS gives no such promise: its kernels
// pick tiles and tails by m, and a probe found a row's bits changing with m
// for most shapes under every core type.
//
// The order: lane l (0..7) sums the products at k = l, l + 8, l + 16, ... in
// increasing k, then the lanes combine as ((0+4)+(1+5))+((2+6)+(3+7)) (the
// lane_sum of host_ops.hpp); C = alpha * dot, plus beta * C when beta != 0.
// Multiplies and adds round separately (-ffp-contract=off, no FMA), so the
// AVX2 clone and the baseline one give the same bits, on every x86-64 CPU.
#include <algorithm>
#include <cstring>

#include "kernels/host_ops.hpp"
#include "kernels/host_pool.hpp"

// The helpers below pass 8-float vectors by value; they are inlined, so the
// ABI note GCC gives for such functions outside an AVX target does not apply.
#pragma GCC diagnostic ignored "-Wpsabi"

namespace troupe::kernels::host {

namespace {

typedef float f8 __attribute__((vector_size(32)));

inline f8 load8(const float* p) {
  f8 v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

inline float combine(const f8& a) { return ((a[0] + a[4]) + (a[1] + a[5])) + ((a[2] + a[6]) + (a[3] + a[7])); }

inline void store(float* c, float alpha, float beta, const f8& acc) {
  const float s = alpha * combine(acc);
  *c = beta == 0.0f ? s : s + beta * *c;
}

// The tail k8..k-1 of one dot product goes to lanes 0.. in order.
inline void tail(f8& acc, const float* x, const float* y, int64_t k8, int64_t k) {
  for (int64_t kk = k8, l = 0; kk < k; ++kk, ++l) acc[l] += x[kk] * y[kk];
}

// A [m,k] row-major (lda), B [n,k] row-major (ldb): C = alpha A B^T + beta C,
// in blocks of 2 rows x 4 columns that share their loads. Every element goes
// through the same lane sums whichever block (or remainder loop) computes it.
TROUPE_HOST_SIMD void gemm_nt(int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                              const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const int64_t k8 = k / 8 * 8;
  int64_t i = 0;
  for (; i + 2 <= m; i += 2) {
    const float *a0 = a + i * lda, *a1 = a0 + lda;
    float *c0 = c + i * ldc, *c1 = c0 + ldc;
    int64_t j = 0;
    for (; j + 4 <= n; j += 4) {
      const float *b0 = b + j * ldb, *b1 = b0 + ldb, *b2 = b1 + ldb, *b3 = b2 + ldb;
      f8 s00 = {}, s01 = {}, s02 = {}, s03 = {}, s10 = {}, s11 = {}, s12 = {}, s13 = {};
      for (int64_t kk = 0; kk < k8; kk += 8) {
        const f8 x0 = load8(a0 + kk), x1 = load8(a1 + kk);
        const f8 y0 = load8(b0 + kk), y1 = load8(b1 + kk), y2 = load8(b2 + kk), y3 = load8(b3 + kk);
        s00 += x0 * y0;
        s01 += x0 * y1;
        s02 += x0 * y2;
        s03 += x0 * y3;
        s10 += x1 * y0;
        s11 += x1 * y1;
        s12 += x1 * y2;
        s13 += x1 * y3;
      }
      tail(s00, a0, b0, k8, k);
      tail(s01, a0, b1, k8, k);
      tail(s02, a0, b2, k8, k);
      tail(s03, a0, b3, k8, k);
      tail(s10, a1, b0, k8, k);
      tail(s11, a1, b1, k8, k);
      tail(s12, a1, b2, k8, k);
      tail(s13, a1, b3, k8, k);
      store(c0 + j, alpha, beta, s00);
      store(c0 + j + 1, alpha, beta, s01);
      store(c0 + j + 2, alpha, beta, s02);
      store(c0 + j + 3, alpha, beta, s03);
      store(c1 + j, alpha, beta, s10);
      store(c1 + j + 1, alpha, beta, s11);
      store(c1 + j + 2, alpha, beta, s12);
      store(c1 + j + 3, alpha, beta, s13);
    }
    for (; j < n; ++j) {
      const float* b0 = b + j * ldb;
      f8 s0 = {}, s1 = {};
      for (int64_t kk = 0; kk < k8; kk += 8) {
        const f8 y = load8(b0 + kk);
        s0 += load8(a0 + kk) * y;
        s1 += load8(a1 + kk) * y;
      }
      tail(s0, a0, b0, k8, k);
      tail(s1, a1, b0, k8, k);
      store(c0 + j, alpha, beta, s0);
      store(c1 + j, alpha, beta, s1);
    }
  }
  for (; i < m; ++i) {
    const float* a0 = a + i * lda;
    for (int64_t j = 0; j < n; ++j) {
      const float* b0 = b + j * ldb;
      f8 s = {};
      for (int64_t kk = 0; kk < k8; kk += 8) s += load8(a0 + kk) * load8(b0 + kk);
      tail(s, a0, b0, k8, k);
      store(c + i * ldc + j, alpha, beta, s);
    }
  }
}

// Any other transposes: the same lane sums, element by element, with strided
// reads (no forward pass uses them; they exist so the mode covers every call).
void gemm_strided(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const float* a, int64_t lda,
                  const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  for (int64_t i = 0; i < m; ++i)
    for (int64_t j = 0; j < n; ++j) {
      f8 s = {};
      for (int64_t kk = 0; kk < k; ++kk) {
        const float x = ta ? a[kk * lda + i] : a[i * lda + kk];
        const float y = tb ? b[j * ldb + kk] : b[kk * ldb + j];
        s[kk % 8] += x * y;
      }
      store(c + i * ldc + j, alpha, beta, s);
    }
}

}  // namespace

void sgemm_invariant(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
                     int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (!trans_a && trans_b) return gemm_nt(m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  gemm_strided(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
}

void sgemm_invariant_split(HostPool& pool, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                           const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c,
                           int64_t ldc) {
  // By columns of C: a decode step has few rows and many columns (the vocabulary,
  // the FFN width). Any split gives the same bits; blocks of 4 columns keep
  // the kernel's full tiles.
  const int64_t parts = std::min<int64_t>({pool.size(), n / 4, m * n * k / kGemmMinPartFlops});
  if (parts < 2) return sgemm_invariant(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
  const int64_t blocks = (n + 3) / 4, per = (blocks + parts - 1) / parts * 4;
  pool.run(parts, [&](int64_t p, int) {
    const int64_t j0 = std::min(n, p * per), j1 = std::min(n, j0 + per);
    if (j0 == j1) return;
    // Columns j0.. of op(B): row j0 of B^T-stored B, or column j0 of B.
    const float* bp = trans_b ? b + j0 * ldb : b + j0;
    sgemm_invariant(trans_a, trans_b, m, j1 - j0, k, alpha, a, lda, bp, ldb, beta, c + j0, ldc);
  });
}

}  // namespace troupe::kernels::host
