// Host kernels for MoE routing (top-k selection, per-expert sums, router bias)
// and for moving token rows to experts and back (gather, slot sums, weighted
// combine). Every scatter is written as a gather over a fixed order, so no two
// writes race and results are deterministic.
#include <cstring>

#include "kernels/host_ops.hpp"

namespace troupe::kernels::host {

void topk_forward(float* weights, int32_t* ids, const float* scores, const float* bias,
                  bool renormalize, int64_t T, int64_t E, int64_t K) {
  for (int64_t t = 0; t < T; ++t) {
    const float* s = scores + t * E;
    int32_t* id = ids + t * K;
    float* w = weights + t * K;
    // Insertion into a list kept sorted by (biased score desc, id asc). Experts
    // arrive in ascending id order, so an equal score never displaces an earlier
    // expert: ties go to the lower id.
    int64_t filled = 0;
    for (int64_t e = 0; e < E; ++e) {
      const float key = s[e] + (bias ? bias[e] : 0.0f);
      int64_t pos = filled;
      while (pos > 0 && key > s[id[pos - 1]] + (bias ? bias[id[pos - 1]] : 0.0f)) --pos;
      if (pos >= K) continue;
      const int64_t last = filled < K ? filled : K - 1;
      for (int64_t j = last; j > pos; --j) id[j] = id[j - 1];
      id[pos] = static_cast<int32_t>(e);
      if (filled < K) ++filled;
    }
    float sum = 0.0f;
    for (int64_t j = 0; j < K; ++j) {
      w[j] = s[id[j]];
      sum += w[j];
    }
    if (renormalize) {
      const float inv = 1.0f / sum;
      for (int64_t j = 0; j < K; ++j) w[j] *= inv;
    }
  }
}

void topk_backward(float* dscores, const float* dweights, const float* weights, const int32_t* ids,
                   const float* scores, bool renormalize, int64_t T, int64_t E, int64_t K) {
  for (int64_t t = 0; t < T; ++t) {
    const int32_t* id = ids + t * K;
    const float* dw = dweights + t * K;
    float* ds = dscores + t * E;
    if (!renormalize) {
      for (int64_t j = 0; j < K; ++j) ds[id[j]] += dw[j];
      continue;
    }
    // w_j = s_j / S with S = sum of the selected scores:
    // ds_i = (dw_i - sum_j dw_j w_j) / S for each selected i.
    const float* s = scores + t * E;
    const float* w = weights + t * K;
    float sum = 0.0f, dot = 0.0f;
    for (int64_t j = 0; j < K; ++j) {
      sum += s[id[j]];
      dot += dw[j] * w[j];
    }
    const float inv = 1.0f / sum;
    for (int64_t j = 0; j < K; ++j) ds[id[j]] += (dw[j] - dot) * inv;
  }
}

void sum_rows(float* out, const float* x, int64_t T, int64_t E) {
  for (int64_t e = 0; e < E; ++e) out[e] = 0.0f;
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = x + t * E;
    for (int64_t e = 0; e < E; ++e) out[e] += xt[e];
  }
}

void add_row(float* x, const float* row, float alpha, int64_t T, int64_t E) {
  for (int64_t t = 0; t < T; ++t) {
    float* xt = x + t * E;
    for (int64_t e = 0; e < E; ++e) xt[e] += alpha * row[e];
  }
}

void gather_rows(float* out, const float* src, const int32_t* idx, int64_t N, int64_t D) {
  for (int64_t n = 0; n < N; ++n)
    std::memcpy(out + n * D, src + static_cast<int64_t>(idx[n]) * D,
                static_cast<size_t>(D) * sizeof(float));
}

void sum_slots(float* dst, const float* src, const int32_t* slots, int64_t T, int64_t K,
               int64_t D) {
  for (int64_t t = 0; t < T; ++t) {
    float* dt = dst + t * D;
    for (int64_t j = 0; j < K; ++j) {
      const int32_t slot = slots[t * K + j];
      if (slot < 0) continue;
      const float* r = src + static_cast<int64_t>(slot) * D;
      for (int64_t d = 0; d < D; ++d) dt[d] += r[d];
    }
  }
}

void combine_forward(float* out, const float* y, const int32_t* slots, const float* weights,
                     int64_t T, int64_t K, int64_t D) {
  for (int64_t t = 0; t < T; ++t) {
    float* ot = out + t * D;
    for (int64_t j = 0; j < K; ++j) {
      const int32_t slot = slots[t * K + j];
      if (slot < 0) continue;
      const float w = weights[t * K + j];
      const float* r = y + static_cast<int64_t>(slot) * D;
      for (int64_t d = 0; d < D; ++d) ot[d] += w * r[d];
    }
  }
}

void combine_backward(float* dy, float* dweights, const float* dout, const float* y,
                      const int32_t* slots, const float* weights, int64_t T, int64_t K, int64_t D) {
  for (int64_t t = 0; t < T; ++t) {
    const float* g = dout + t * D;
    for (int64_t j = 0; j < K; ++j) {
      const int32_t slot = slots[t * K + j];
      if (slot < 0) continue;
      const float w = weights[t * K + j];
      const float* r = y + static_cast<int64_t>(slot) * D;
      float* dr = dy + static_cast<int64_t>(slot) * D;
      dweights[t * K + j] += lane_sum(D, [&](int64_t d) { return g[d] * r[d]; });
      for (int64_t d = 0; d < D; ++d) dr[d] += w * g[d];
    }
  }
}

}  // namespace troupe::kernels::host
