// Host causal attention, fused per (batch, head, block of queries).
//
// For a block of queries [i0, i1) only keys [0, i1) can be visible, so the
// scores of the block are one small GEMM (block x i1), the causal mask and an
// exact row softmax run in place, and the weighted sum of values is a second
// GEMM written straight into `out`. The forward keeps lse = log-sum-exp of each
// row; the backward recomputes the probabilities from it (flash-attention
// style) instead of storing them. Q, K, V, O rows of one head are strided by
// H*hd in [B,S,H,hd], which BLAS takes as the leading dimension, so nothing is
// transposed or copied. The block size bounds the workspace to kBlock x S.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/host_ops.hpp"

namespace troupe::kernels::host {
namespace {

constexpr int64_t kBlock = 64;

// Per (b,h) pointers into [B,S,H,hd] tensors: row i of head h is at base + i*ld.
inline int64_t head_base(int64_t b, int64_t h, int64_t S, int64_t H, int64_t hd) {
  return b * S * H * hd + h * hd;
}

// scores[r, j] = scale * q[i0 + r] . k[j] for r < rows, j < n (row stride n).
void block_scores(float* scores, const float* q, const float* k, int64_t i0, int64_t rows,
                  int64_t n, int64_t hd, int64_t ld, float scale) {
  sgemm(false, true, rows, n, hd, scale, q + i0 * ld, ld, k, ld, 0.0f, scores, n);
}

}  // namespace

void attention_forward(float* out, float* lse, const float* q, const float* k, const float* v,
                       int64_t B, int64_t S, int64_t H, int64_t hd, float scale) {
  const int64_t ld = H * hd;
  std::vector<float> p(static_cast<size_t>(std::min(kBlock, S) * S));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t base = head_base(b, h, S, H, hd);
      float* lse_bh = lse + (b * H + h) * S;
      for (int64_t i0 = 0; i0 < S; i0 += kBlock) {
        const int64_t i1 = std::min(S, i0 + kBlock), rows = i1 - i0, n = i1;
        block_scores(p.data(), q + base, k + base, i0, rows, n, hd, ld, scale);
        for (int64_t r = 0; r < rows; ++r) {
          float* pr = p.data() + r * n;
          const int64_t visible = i0 + r + 1;  // keys 0..i0+r
          const float mx = lane_max(pr, visible);
          for (int64_t j = 0; j < visible; ++j) pr[j] = fast_exp(pr[j] - mx);
          const float sum = lane_sum(visible, [&](int64_t j) { return pr[j]; });
          const float inv = 1.0f / sum;
          for (int64_t j = 0; j < visible; ++j) pr[j] *= inv;
          std::fill(pr + visible, pr + n, 0.0f);
          lse_bh[i0 + r] = mx + std::log(sum);
        }
        sgemm(false, false, rows, hd, n, 1.0f, p.data(), n, v + base, ld, 0.0f,
              out + base + i0 * ld, ld);
      }
    }
  }
}

void attention_backward(float* dq, float* dk, float* dv, const float* dout, const float* q,
                        const float* k, const float* v, const float* out, const float* lse,
                        int64_t B, int64_t S, int64_t H, int64_t hd, float scale,
                        bool accumulate) {
  const int64_t ld = H * hd;
  const size_t ws = static_cast<size_t>(std::min(kBlock, S) * S);
  // Overwrite: a dQ row block is written by one GEMM per head, so beta = 0
  // there. dK and dV rows [i0, i1) are first reached in block i0 (earlier
  // blocks stop at row i0), so those rows are zeroed just before, while hot in
  // cache, instead of in a separate pass over the whole tensors. BLAS applies
  // beta to C before adding the product, so beta = 0 gives 0 + product, as
  // zeroing then beta = 1 does: bitwise the same.
  const float dq_beta = accumulate ? 1.0f : 0.0f;
  std::vector<float> p(ws), dp(ws);
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t h = 0; h < H; ++h) {
      const int64_t base = head_base(b, h, S, H, hd);
      const float* lse_bh = lse + (b * H + h) * S;
      for (int64_t i0 = 0; i0 < S; i0 += kBlock) {
        const int64_t i1 = std::min(S, i0 + kBlock), rows = i1 - i0, n = i1;
        const float* dout_blk = dout + base + i0 * ld;
        if (!accumulate)
          for (int64_t r = i0; r < i1; ++r) {
            std::fill(dk + base + r * ld, dk + base + r * ld + hd, 0.0f);
            std::fill(dv + base + r * ld, dv + base + r * ld + hd, 0.0f);
          }
        // P = exp(scores - lse), zero above the diagonal.
        block_scores(p.data(), q + base, k + base, i0, rows, n, hd, ld, scale);
        for (int64_t r = 0; r < rows; ++r) {
          float* pr = p.data() + r * n;
          const int64_t visible = i0 + r + 1;
          const float l = lse_bh[i0 + r];
          for (int64_t j = 0; j < visible; ++j) pr[j] = fast_exp(pr[j] - l);
          std::fill(pr + visible, pr + n, 0.0f);
        }
        // dV[0:n] += P^T dO
        sgemm(true, false, n, hd, rows, 1.0f, p.data(), n, dout_blk, ld, 1.0f, dv + base, ld);
        // dP = dO V^T
        sgemm(false, true, rows, n, hd, 1.0f, dout_blk, ld, v + base, ld, 0.0f, dp.data(), n);
        // dS = P * (dP - rowsum(dO * O)), kept in dp.
        for (int64_t r = 0; r < rows; ++r) {
          const float* o_r = out + base + (i0 + r) * ld;
          const float* do_r = dout_blk + r * ld;
          const float delta = lane_sum(hd, [&](int64_t d) { return do_r[d] * o_r[d]; });
          const float* pr = p.data() + r * n;
          float* dsr = dp.data() + r * n;
          for (int64_t j = 0; j < n; ++j) dsr[j] = pr[j] * (dsr[j] - delta);
        }
        // dQ_blk += scale * dS K; dK[0:n] += scale * dS^T Q_blk
        sgemm(false, false, rows, hd, n, scale, dp.data(), n, k + base, ld, dq_beta,
              dq + base + i0 * ld, ld);
        sgemm(true, false, n, hd, rows, scale, dp.data(), n, q + base + i0 * ld, ld, 1.0f,
              dk + base, ld);
      }
    }
  }
}

}  // namespace troupe::kernels::host

namespace troupe::kernels::host {

// Decoding attends one or a few queries per sequence to at most C cached keys:
// plain loops (one dot product per key, an exact softmax, a weighted sum of
// value rows), vectorized along hd and the keys, no GEMM set-up per head.
TROUPE_HOST_SIMD
void attention_cached(float* out, const float* q, const float* k_cache, const float* v_cache,
                      const int32_t* pos, int64_t B, int64_t S, int64_t C, int64_t H, int64_t hd,
                      float scale) {
  const int64_t ld = H * hd;
  std::vector<float> p(static_cast<size_t>(C)), acc(static_cast<size_t>(hd));
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t s = 0; s < S; ++s) {
      const int64_t visible = static_cast<int64_t>(pos[b]) + s + 1;  // keys 0..pos+s
      for (int64_t h = 0; h < H; ++h) {
        const float* qr = q + (b * S + s) * ld + h * hd;
        const float* kb = k_cache + b * C * ld + h * hd;
        const float* vb = v_cache + b * C * ld + h * hd;
        for (int64_t j = 0; j < visible; ++j) {
          const float* kr = kb + j * ld;
          p[j] = scale * lane_sum(hd, [&](int64_t d) { return qr[d] * kr[d]; });
        }
        const float mx = lane_max(p.data(), visible);
        for (int64_t j = 0; j < visible; ++j) p[j] = fast_exp(p[j] - mx);
        const float inv = 1.0f / lane_sum(visible, [&](int64_t j) { return p[j]; });
        // Accumulate in a local row (no aliasing with the value rows, so the
        // d loop vectorizes), then store.
        std::fill(acc.begin(), acc.begin() + hd, 0.0f);
        float* __restrict a = acc.data();
        for (int64_t j = 0; j < visible; ++j) {
          const float pj = p[j] * inv;
          const float* __restrict vr = vb + j * ld;
          for (int64_t d = 0; d < hd; ++d) a[d] += pj * vr[d];
        }
        std::copy(a, a + hd, out + (b * S + s) * ld + h * hd);
      }
    }
  }
}

}  // namespace troupe::kernels::host
