// Host kernels for the decoder's non-GEMM layers: token embedding, RMSNorm and
// rotary position embedding (forward and backward).
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/host_ops.hpp"

namespace troupe::kernels::host {

void embedding_forward(float* out, const float* table, const int32_t* ids, int64_t T, int64_t D) {
  for (int64_t t = 0; t < T; ++t)
    std::memcpy(out + t * D, table + static_cast<int64_t>(ids[t]) * D,
                static_cast<size_t>(D) * sizeof(float));
}

void embedding_backward(float* dtable, const float* dout, const int32_t* ids, int64_t T,
                        int64_t D) {
  // Token order is the reduction order for repeated ids: deterministic.
  for (int64_t t = 0; t < T; ++t) {
    float* row = dtable + static_cast<int64_t>(ids[t]) * D;
    const float* g = dout + t * D;
    for (int64_t d = 0; d < D; ++d) row[d] += g[d];
  }
}

TROUPE_HOST_SIMD void rmsnorm_forward(float* out, float* rstd, const float* x, const float* w,
                                      int64_t T, int64_t D, float eps) {
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = x + t * D;
    float* ot = out + t * D;
    const float ss = lane_sum(D, [&](int64_t d) { return xt[d] * xt[d]; });
    const float r = 1.0f / std::sqrt(ss / static_cast<float>(D) + eps);
    for (int64_t d = 0; d < D; ++d) ot[d] = xt[d] * r * w[d];
    rstd[t] = r;
  }
}

TROUPE_HOST_SIMD void rmsnorm_backward(float* dx, float* dw, const float* dout, const float* x,
                                       const float* w, const float* rstd, int64_t T, int64_t D,
                                       bool accumulate) {
  // y = x r w with r = (mean(x^2) + eps)^-1/2, so
  // dx_i = r w_i g_i - (r^3 / D) x_i sum_j g_j w_j x_j and dw_i = sum_t g_i x_i r.
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = x + t * D;
    const float* gt = dout + t * D;
    float* dxt = dx + t * D;
    const float r = rstd[t];
    const float dot = lane_sum(D, [&](int64_t d) { return gt[d] * w[d] * xt[d]; });
    const float c = dot * r * r * r / static_cast<float>(D);
    if (accumulate) {
      for (int64_t d = 0; d < D; ++d) {
        dxt[d] += r * w[d] * gt[d] - c * xt[d];
        dw[d] += gt[d] * xt[d] * r;
      }
    } else {  // 0 + g: bitwise what zeroing dx then adding gives
      for (int64_t d = 0; d < D; ++d) {
        dxt[d] = 0.0f + (r * w[d] * gt[d] - c * xt[d]);
        dw[d] += gt[d] * xt[d] * r;
      }
    }
  }
}

namespace {

// cos/sin of pos * theta^(-2i/hd) for pos in [pos_offset, pos_offset + S), i < hd/2,
// computed in double so large positions keep their precision. Layout [S, hd/2].
void rope_table(std::vector<float>& cos_t, std::vector<float>& sin_t, int64_t S, int64_t hd,
                int64_t pos_offset, float theta) {
  const int64_t half = hd / 2;
  cos_t.resize(static_cast<size_t>(S * half));
  sin_t.resize(static_cast<size_t>(S * half));
  std::vector<double> freq(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i)
    freq[static_cast<size_t>(i)] = std::pow(
        static_cast<double>(theta), -2.0 * static_cast<double>(i) / static_cast<double>(hd));
  for (int64_t s = 0; s < S; ++s) {
    const double pos = static_cast<double>(pos_offset + s);
    for (int64_t i = 0; i < half; ++i) {
      const double a = pos * freq[static_cast<size_t>(i)];
      cos_t[static_cast<size_t>(s * half + i)] = static_cast<float>(std::cos(a));
      sin_t[static_cast<size_t>(s * half + i)] = static_cast<float>(std::sin(a));
    }
  }
}

// out = R(sign * angle) x for every head vector (or out += with Accumulate);
// sign = -1 applies R^T. ZeroPlus writes 0 + r (the backward's overwrite).
// Template parameters so the inner loop has no branch.
template <bool Accumulate, bool ZeroPlus = false>
void rope_apply(float* out, const float* x, float sign, int64_t B, int64_t S, int64_t H, int64_t hd,
                int64_t pos_offset, float theta) {
  // The last table this thread built, kept: a model's RoPE calls (every
  // layer, forward and backward, every micro-batch) share one (S, hd,
  // offset, theta), and the table's sin/cos in double cost more than
  // applying it. Per thread, since devices run ops on their own threads.
  struct Cached {
    int64_t S = -1, hd = -1, pos_offset = -1;
    float theta = 0.0f;
    std::vector<float> cos_t, sin_t;
  };
  thread_local Cached table;
  if (table.S != S || table.hd != hd || table.pos_offset != pos_offset || table.theta != theta) {
    table.S = -1;  // invalid while rebuilt (rope_table may throw bad_alloc)
    rope_table(table.cos_t, table.sin_t, S, hd, pos_offset, theta);
    table.S = S;
    table.hd = hd;
    table.pos_offset = pos_offset;
    table.theta = theta;
  }
  const std::vector<float>& cos_t = table.cos_t;
  const std::vector<float>& sin_t = table.sin_t;
  const int64_t half = hd / 2;
  for (int64_t b = 0; b < B; ++b) {
    for (int64_t s = 0; s < S; ++s) {
      const float* c = cos_t.data() + s * half;
      const float* sn = sin_t.data() + s * half;
      for (int64_t h = 0; h < H; ++h) {
        const int64_t off = ((b * S + s) * H + h) * hd;
        const float* x1 = x + off;
        const float* x2 = x + off + half;
        float* o1 = out + off;
        float* o2 = out + off + half;
        for (int64_t i = 0; i < half; ++i) {
          const float a = x1[i], bb = x2[i], si = sign * sn[i];
          const float r1 = a * c[i] - bb * si;
          const float r2 = bb * c[i] + a * si;
          if constexpr (Accumulate) {
            o1[i] += r1;
            o2[i] += r2;
          } else if constexpr (ZeroPlus) {  // bitwise what zeroing then adding gives
            o1[i] = 0.0f + r1;
            o2[i] = 0.0f + r2;
          } else {  // reads a, bb before the writes, so out may equal x
            o1[i] = r1;
            o2[i] = r2;
          }
        }
      }
    }
  }
}

}  // namespace

void rope_forward(float* out, const float* x, int64_t B, int64_t S, int64_t H, int64_t hd,
                  int64_t pos_offset, float theta) {
  rope_apply<false>(out, x, 1.0f, B, S, H, hd, pos_offset, theta);
}

void rope_backward(float* dx, const float* dout, int64_t B, int64_t S, int64_t H, int64_t hd,
                   int64_t pos_offset, float theta, bool accumulate) {
  if (accumulate) {
    rope_apply<true>(dx, dout, -1.0f, B, S, H, hd, pos_offset, theta);
  } else {
    rope_apply<false, true>(dx, dout, -1.0f, B, S, H, hd, pos_offset, theta);
  }
}

}  // namespace troupe::kernels::host
