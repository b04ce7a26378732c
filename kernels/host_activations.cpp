// Host kernels for activations (SiLU, SwiGLU), row softmax and the token
// cross-entropy loss, forward and backward.
#include <algorithm>
#include <cmath>

#include "kernels/host_ops.hpp"

namespace troupe::kernels::host {
namespace {

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

// Row max, then sum of exp(x - max): the stable softmax denominator.
inline float row_max(const float* x, int64_t n) {
  float mx = x[0];
  for (int64_t i = 1; i < n; ++i) mx = std::max(mx, x[i]);
  return mx;
}

}  // namespace

void silu_forward(float* out, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = x[i] * sigmoid(x[i]);
}

void silu_backward(float* dx, const float* dout, const float* x, int64_t n) {
  // d/dx x s(x) = s (1 + x (1 - s))
  for (int64_t i = 0; i < n; ++i) {
    const float s = sigmoid(x[i]);
    dx[i] += dout[i] * s * (1.0f + x[i] * (1.0f - s));
  }
}

void swiglu_forward(float* out, const float* gate, const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = gate[i] * sigmoid(gate[i]) * up[i];
}

void swiglu_backward(float* dgate, float* dup, const float* dout, const float* gate,
                     const float* up, int64_t n) {
  for (int64_t i = 0; i < n; ++i) {
    const float g = gate[i], s = sigmoid(g);
    dgate[i] += dout[i] * up[i] * s * (1.0f + g * (1.0f - s));
    dup[i] += dout[i] * g * s;
  }
}

void cross_entropy_forward(float* losses, const float* logits, const int32_t* targets,
                           int32_t ignore_index, int64_t T, int64_t V) {
  for (int64_t t = 0; t < T; ++t) {
    if (targets[t] == ignore_index) {
      losses[t] = 0.0f;
      continue;
    }
    const float* x = logits + t * V;
    const float mx = row_max(x, V);
    float sum = 0.0f;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(x[v] - mx);
    losses[t] = std::log(sum) + mx - x[targets[t]];
  }
}

void cross_entropy_backward(float* dlogits, const float* logits, const int32_t* targets,
                            int32_t ignore_index, float grad_scale, int64_t T, int64_t V) {
  for (int64_t t = 0; t < T; ++t) {
    if (targets[t] == ignore_index) continue;
    const float* x = logits + t * V;
    float* dx = dlogits + t * V;
    const float mx = row_max(x, V);
    float sum = 0.0f;
    for (int64_t v = 0; v < V; ++v) sum += std::exp(x[v] - mx);
    const float c = grad_scale / sum;
    for (int64_t v = 0; v < V; ++v) dx[v] += c * std::exp(x[v] - mx);
    dx[targets[t]] -= grad_scale;
  }
}

void softmax_forward(float* out, const float* x, int64_t T, int64_t E) {
  for (int64_t t = 0; t < T; ++t) {
    const float* xt = x + t * E;
    float* ot = out + t * E;
    const float mx = row_max(xt, E);  // before any write: out may equal x
    float sum = 0.0f;
    for (int64_t e = 0; e < E; ++e) {
      ot[e] = std::exp(xt[e] - mx);
      sum += ot[e];
    }
    const float inv = 1.0f / sum;
    for (int64_t e = 0; e < E; ++e) ot[e] *= inv;
  }
}

void softmax_backward(float* dx, const float* dout, const float* out, int64_t T, int64_t E) {
  // dx_i += y_i (g_i - sum_j g_j y_j)
  for (int64_t t = 0; t < T; ++t) {
    const float* g = dout + t * E;
    const float* y = out + t * E;
    float* d = dx + t * E;
    float dot = 0.0f;
    for (int64_t e = 0; e < E; ++e) dot += g[e] * y[e];
    for (int64_t e = 0; e < E; ++e) d[e] += y[e] * (g[e] - dot);
  }
}

}  // namespace troupe::kernels::host
