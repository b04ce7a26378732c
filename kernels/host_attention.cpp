// Host causal attention, tiled flash-style, one (batch, head) pair per item of
// the backend's HostPool.
//
// Queries go in blocks of kRows and keys in tiles of kKeys. For a block of
// queries [i0, i1) only keys [0, i1) can be visible, so tiles past i1 are
// skipped and only the last tile holds masked entries. Each (block, tile)
// score tile is one small GEMM into a kRows x kKeys workspace (16 KB, so it
// stays in L1/L2 whatever S is; nothing S x S or kRows x S exists). The forward
// keeps a running row max and sum across tiles (online softmax), rescales the
// output rows when the max grows and adds P V by GEMM straight into `out`; it
// saves lse = log-sum-exp per row. The backward recomputes each probability
// tile from lse (P = exp(scores - lse)), so it needs no running statistics.
// Q, K, V, O rows of one head are strided by H*hd in [B,S,H,hd], which BLAS
// takes as the leading dimension, so nothing is transposed or copied.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/host_ops.hpp"
#include "kernels/host_pool.hpp"

namespace troupe::kernels::host {
namespace {

// 32-row query blocks waste less of the diagonal tile than 64 (the scores
// above the diagonal are computed then dropped: (S + kRows) / (S + 1) times
// the causal work) at the same GEMM speed on this model's shapes; a 128-key
// tile makes the quickstart's S = 128 a single tile (exact row softmax).
constexpr int64_t kRows = 32;
constexpr int64_t kKeys = 128;
static_assert(kKeys % kRows == 0, "every tile must start at or before the block's first query");

struct Head {
  const float *q, *k, *v;  // row i at + i * ld
  int64_t S, hd, ld;
};

Head head_of(const float* q, const float* k, const float* v, int64_t b, int64_t h, int64_t S,
             int64_t H, int64_t hd) {
  const int64_t base = b * S * H * hd + h * hd;
  return {q + base, k + base, v + base, S, hd, H * hd};
}

// p[r, j] = scale * q[i0 + r] . k[j0 + j] for r < rows, j < n (row stride kKeys).
void tile_scores(float* p, const Head& a, int64_t i0, int64_t rows, int64_t j0, int64_t n,
                 float scale) {
  sgemm(false, true, rows, n, a.hd, scale, a.q + i0 * a.ld, a.ld, a.k + j0 * a.ld, a.ld, 0.0f, p,
        kKeys);
}

// Keys of tile [j0, j0 + n) visible to query i: those <= i.
inline int64_t visible_in_tile(int64_t i, int64_t j0, int64_t n) {
  return std::min(n, i - j0 + 1);
}

TROUPE_HOST_SIMD
void forward_head(float* out, float* lse, const Head& a, float scale, float* p, float* mx,
                  float* sum) {
  for (int64_t i0 = 0; i0 < a.S; i0 += kRows) {
    const int64_t i1 = std::min(a.S, i0 + kRows), rows = i1 - i0;
    float* o_blk = out + i0 * a.ld;
    for (int64_t j0 = 0; j0 < i1; j0 += kKeys) {
      const int64_t n = std::min(kKeys, i1 - j0);
      const bool first = j0 == 0;
      tile_scores(p, a, i0, rows, j0, n, scale);
      for (int64_t r = 0; r < rows; ++r) {
        float* pr = p + r * kKeys;
        const int64_t vis = visible_in_tile(i0 + r, j0, n);  // >= 1: j0 <= i0 (kKeys % kRows == 0)
        const float tile_max = lane_max(pr, vis);
        const float m = first ? tile_max : std::max(mx[r], tile_max);
        for (int64_t j = 0; j < vis; ++j) pr[j] = fast_exp(pr[j] - m);
        std::fill(pr + vis, pr + n, 0.0f);
        const float tile_sum = lane_sum(vis, [&](int64_t j) { return pr[j]; });
        if (first) {
          sum[r] = tile_sum;
        } else {
          // The max grew from mx[r] to m: earlier terms shrink by exp(mx - m).
          const float shrink = fast_exp(mx[r] - m);
          sum[r] = sum[r] * shrink + tile_sum;
          if (shrink != 1.0f) {
            float* orow = o_blk + r * a.ld;
            for (int64_t d = 0; d < a.hd; ++d) orow[d] *= shrink;
          }
        }
        mx[r] = m;
      }
      // O_blk (+)= P V_tile; the first tile overwrites (beta = 0).
      sgemm(false, false, rows, a.hd, n, 1.0f, p, kKeys, a.v + j0 * a.ld, a.ld, first ? 0.0f : 1.0f,
            o_blk, a.ld);
    }
    for (int64_t r = 0; r < rows; ++r) {
      const float inv = 1.0f / sum[r];
      float* orow = o_blk + r * a.ld;
      for (int64_t d = 0; d < a.hd; ++d) orow[d] *= inv;
      lse[i0 + r] = mx[r] + std::log(sum[r]);
    }
  }
}

struct Grads {
  float *dq, *dk, *dv;  // same layout as q, k, v
  const float *dout, *out, *lse;
};

TROUPE_HOST_SIMD
void backward_head(const Grads& g, const Head& a, float scale, bool accumulate, float* p,
                   float* dp, float* delta) {
  const int64_t hd = a.hd, ld = a.ld;
  for (int64_t i0 = 0; i0 < a.S; i0 += kRows) {
    const int64_t i1 = std::min(a.S, i0 + kRows), rows = i1 - i0;
    const float* dout_blk = g.dout + i0 * ld;
    // Overwrite: dK and dV rows [i0, i1) are first reached in this block
    // (earlier blocks see keys < i0), so they are zeroed here while hot; dQ's
    // block gets beta = 0 on its first tile. (BLAS applies beta before adding
    // the product: beta = 0 gives 0 + product, bitwise what zeroing then
    // accumulating gives.)
    if (!accumulate)
      for (int64_t r = i0; r < i1; ++r) {
        std::fill(g.dk + r * ld, g.dk + r * ld + hd, 0.0f);
        std::fill(g.dv + r * ld, g.dv + r * ld + hd, 0.0f);
      }
    // delta_r = rowsum(dO * O): the softmax backward's per-row term.
    for (int64_t r = 0; r < rows; ++r) {
      const float* o_r = g.out + (i0 + r) * ld;
      const float* do_r = dout_blk + r * ld;
      delta[r] = lane_sum(hd, [&](int64_t d) { return do_r[d] * o_r[d]; });
    }
    for (int64_t j0 = 0; j0 < i1; j0 += kKeys) {
      const int64_t n = std::min(kKeys, i1 - j0);
      // P = exp(scores - lse), zero above the diagonal.
      tile_scores(p, a, i0, rows, j0, n, scale);
      for (int64_t r = 0; r < rows; ++r) {
        float* pr = p + r * kKeys;
        const int64_t vis = visible_in_tile(i0 + r, j0, n);
        const float l = g.lse[i0 + r];
        for (int64_t j = 0; j < vis; ++j) pr[j] = fast_exp(pr[j] - l);
        std::fill(pr + vis, pr + n, 0.0f);
      }
      // dV[tile] += P^T dO_blk
      sgemm(true, false, n, hd, rows, 1.0f, p, kKeys, dout_blk, ld, 1.0f, g.dv + j0 * ld, ld);
      // dP = dO_blk V_tile^T
      sgemm(false, true, rows, n, hd, 1.0f, dout_blk, ld, a.v + j0 * ld, ld, 0.0f, dp, kKeys);
      // dS = P * (dP - delta), kept in dp.
      for (int64_t r = 0; r < rows; ++r) {
        const float* pr = p + r * kKeys;
        float* dsr = dp + r * kKeys;
        for (int64_t j = 0; j < n; ++j) dsr[j] = pr[j] * (dsr[j] - delta[r]);
      }
      // dQ_blk (+)= scale * dS K_tile; dK[tile] += scale * dS^T Q_blk
      const float dq_beta = (j0 == 0 && !accumulate) ? 0.0f : 1.0f;
      sgemm(false, false, rows, hd, n, scale, dp, kKeys, a.k + j0 * ld, ld, dq_beta,
            g.dq + i0 * ld, ld);
      sgemm(true, false, n, hd, rows, scale, dp, kKeys, a.q + i0 * ld, ld, 1.0f, g.dk + j0 * ld,
            ld);
    }
  }
}

// Per-thread scratch, one slot per pool worker.
std::vector<std::vector<float>> scratch(const HostPool& pool, size_t floats) {
  return std::vector<std::vector<float>>(static_cast<size_t>(pool.size()),
                                         std::vector<float>(floats));
}

}  // namespace

void attention_forward(HostPool& pool, float* out, float* lse, const float* q, const float* k,
                       const float* v, int64_t B, int64_t S, int64_t H, int64_t hd, float scale) {
  auto ws = scratch(pool, kRows * kKeys + 2 * kRows);
  pool.run(B * H, [&](int64_t bh, int worker) {
    const int64_t b = bh / H, h = bh % H;
    float* w = ws[static_cast<size_t>(worker)].data();
    const Head a = head_of(q, k, v, b, h, S, H, hd);
    forward_head(out + (a.q - q), lse + bh * S, a, scale, w, w + kRows * kKeys,
                 w + kRows * kKeys + kRows);
  });
}

void attention_backward(HostPool& pool, float* dq, float* dk, float* dv, const float* dout,
                        const float* q, const float* k, const float* v, const float* out,
                        const float* lse, int64_t B, int64_t S, int64_t H, int64_t hd, float scale,
                        bool accumulate) {
  auto ws = scratch(pool, 2 * kRows * kKeys + kRows);
  pool.run(B * H, [&](int64_t bh, int worker) {
    const int64_t b = bh / H, h = bh % H;
    float* w = ws[static_cast<size_t>(worker)].data();
    const Head a = head_of(q, k, v, b, h, S, H, hd);
    const int64_t off = a.q - q;
    const Grads g{dq + off, dk + off, dv + off, dout + off, out + off, lse + bh * S};
    backward_head(g, a, scale, accumulate, w, w + kRows * kKeys, w + 2 * kRows * kKeys);
  });
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
