// Host GEMM: a thin row-major wrapper over OpenBLAS cblas_sgemm. It adds only
// the cases BLAS refuses (a zero dimension), so its speed is cblas_sgemm's.
#include <cblas.h>

#include <algorithm>

#include "kernels/host_ops.hpp"

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

}  // namespace troupe::kernels::host
