// Host GEMM: a thin row-major wrapper over OpenBLAS cblas_sgemm. It adds only
// the cases BLAS refuses (a zero dimension), so its speed is cblas_sgemm's,
// and the split of a large GEMM across a device's threads (sgemm_rows).
#include <cblas.h>

#include <algorithm>

#include "kernels/host_ops.hpp"
#include "kernels/host_pool.hpp"

namespace troupe::kernels::host {

void sgemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const float* a,
           int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    // op(A)*op(B) is all zeros; BLAS semantics: beta == 0 overwrites C (NaN is not kept).
    for (int64_t i = 0; i < m; ++i) {
      float* ci = c + i * ldc;
      if (beta == 0.0f) {
        std::fill(ci, ci + n, 0.0f);
      } else {
        for (int64_t j = 0; j < n; ++j) ci[j] *= beta;
      }
    }
    return;
  }
  // BLAS requires every leading dimension >= 1 even when it is never used.
  cblas_sgemm(CblasRowMajor, trans_a ? CblasTrans : CblasNoTrans,
              trans_b ? CblasTrans : CblasNoTrans, static_cast<blasint>(m), static_cast<blasint>(n),
              static_cast<blasint>(k), alpha, a, static_cast<blasint>(std::max<int64_t>(lda, 1)), b,
              static_cast<blasint>(std::max<int64_t>(ldb, 1)), beta, c,
              static_cast<blasint>(std::max<int64_t>(ldc, 1)));
}

void sgemm_rows(HostPool& pool, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                const float* a, int64_t lda, const float* b, int64_t ldb, float beta, float* c, int64_t ldc) {
  const int64_t flops = m * n * k;
  const int64_t parts = std::min<int64_t>({pool.size(), m / kGemmRowAlign, flops / kGemmMinPartFlops});
  if (parts < 2) {
    sgemm(trans_a, trans_b, m, n, k, alpha, a, lda, b, ldb, beta, c, ldc);
    return;
  }
  // Whole blocks of kGemmRowAlign rows per part (m / parts rounded up to a
  // block), so the parts cover all m rows; the last one may be short or empty.
  const int64_t blocks = (m + kGemmRowAlign - 1) / kGemmRowAlign;
  const int64_t per = (blocks + parts - 1) / parts * kGemmRowAlign;
  pool.run(parts, [&](int64_t i, int) {
    const int64_t r0 = std::min(m, i * per), r1 = std::min(m, r0 + per);
    if (r0 == r1) return;
    // Rows r0.. of op(A): row r0 of A, or column r0 of A^T.
    const float* ap = trans_a ? a + r0 : a + r0 * lda;
    sgemm(trans_a, trans_b, r1 - r0, n, k, alpha, ap, lda, b, ldb, beta, c + r0 * ldc, ldc);
  });
}

}  // namespace troupe::kernels::host
