// Host kernels for activations (SiLU, SwiGLU), row softmax and the token
// cross-entropy loss, forward and backward. exp is host::fast_exp and row
// reductions use lane_sum/lane_max so that every loop here vectorizes.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kernels/host_ops.hpp"

namespace troupe::kernels::host {
namespace {

inline float sigmoid(float x) { return 1.0f / (1.0f + fast_exp(-x)); }

}  // namespace

TROUPE_HOST_SIMD void silu_forward(float* out, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * sigmoid(x[i]);
}

TROUPE_HOST_SIMD void silu_backward(float* dx, const float* dout, const float* x, int64_t n) {
  // d/dx x s(x) = s (1 + x (1 - s))
  for (int64_t i = 0; i < n; ++i) {
    const float s = sigmoid(x[i]);
    dx[i] += dout[i] * s * (1.0f + x[i] * (1.0f - s));
  }
}

TROUPE_HOST_SIMD void swiglu_forward(float* out, const float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] * sigmoid(gate[i]) * up[i];
}

TROUPE_HOST_SIMD void swiglu_backward(float* dgate, float* dup, const float* dout,
                                      const float* gate, const float* up, int64_t n,
                                      bool accumulate) {
  // Two loops rather than a select per element, so each vectorizes; the
  // overwrite writes 0 + g (not g), bitwise what zeroing then adding gives.
  if (accumulate) {
    for (int64_t i = 0; i < n; ++i) {
      const float g = gate[i], s = sigmoid(g);
      dgate[i] += dout[i] * up[i] * s * (1.0f + g * (1.0f - s));
      dup[i] += dout[i] * g * s;
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      const float g = gate[i], s = sigmoid(g);
      dgate[i] = 0.0f + dout[i] * up[i] * s * (1.0f + g * (1.0f - s));
      dup[i] = 0.0f + dout[i] * g * s;
    }
  }
}

TROUPE_HOST_SIMD void cross_entropy_forward(float* losses, const float* logits,
                                            const int32_t* targets, int32_t ignore_index, int64_t T,
                                            int64_t V) {
  for (int64_t t = 0; t < T; ++t) {
    if (targets[t] == ignore_index) {
      losses[t] = 0.0f;
      continue;
    }
    const float* x = logits + t * V;
    const float mx = lane_max(x, V);
    const float sum = lane_sum(V, [&](int64_t v) { return fast_exp(x[v] - mx); });
    losses[t] = std::log(sum) + mx - x[targets[t]];
  }
}

TROUPE_HOST_SIMD void cross_entropy_backward(float* dlogits, const float* logits,
                                             const int32_t* targets, int32_t ignore_index,
                                             float grad_scale, int64_t T, int64_t V,
                                             bool accumulate) {
  std::vector<float> e(static_cast<size_t>(V));  // exp(x - max) of one row
  for (int64_t t = 0; t < T; ++t) {
    float* dx = dlogits + t * V;
    if (targets[t] == ignore_index) {
      if (!accumulate) std::fill(dx, dx + V, 0.0f);
      continue;
    }
    const float* x = logits + t * V;
    const float mx = lane_max(x, V);
    for (int64_t v = 0; v < V; ++v) e[v] = fast_exp(x[v] - mx);
    const float c = grad_scale / lane_sum(V, [&](int64_t v) { return e[v]; });
    if (accumulate) {
      for (int64_t v = 0; v < V; ++v) dx[v] += c * e[v];
    } else {
      for (int64_t v = 0; v < V; ++v) dx[v] = 0.0f + c * e[v];
    }
    dx[targets[t]] -= grad_scale;
  }
}

TROUPE_HOST_SIMD void softmax_forward(float* out, const float* x, int64_t T, int64_t E) {
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = x + t * E;
    float* ot = out + t * E;
    const float mx = lane_max(xt, E);  // before any write: out may equal x
    for (int64_t e = 0; e < E; ++e) ot[e] = fast_exp(xt[e] - mx);
    const float inv = 1.0f / lane_sum(E, [&](int64_t e) { return ot[e]; });
    for (int64_t e = 0; e < E; ++e) ot[e] *= inv;
  }
}

TROUPE_HOST_SIMD void softmax_backward(float* dx, const float* dout, const float* out, int64_t T,
                                       int64_t E, bool accumulate) {
  // dx_i += y_i (g_i - sum_j g_j y_j)
  for (int64_t t = 0; t < T; ++t) {
    const float* g = dout + t * E;
    const float* y = out + t * E;
    float* d = dx + t * E;
    const float dot = lane_sum(E, [&](int64_t e) { return g[e] * y[e]; });
    if (accumulate) {
      for (int64_t e = 0; e < E; ++e) d[e] += y[e] * (g[e] - dot);
    } else {
      for (int64_t e = 0; e < E; ++e) d[e] = 0.0f + y[e] * (g[e] - dot);
    }
  }
}

}  // namespace troupe::kernels::host
