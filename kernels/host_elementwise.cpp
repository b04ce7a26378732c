// Host elementwise kernels (fill, add, axpy, scale) and the optimizer kernels
// (squared norm, AdamW): flat loops over contiguous floats.
#include <cmath>

#include "kernels/host_ops.hpp"

namespace troupe::kernels::host {

void fill(float* x, float value, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] = value;
}

void add(float* out, const float* a, const float* b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = a[i] + b[i];
}

void axpy(float* y, float alpha, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += alpha * x[i];
}

void scale(float* x, float alpha, int64_t n) {
  for (int64_t i = 0; i < n; ++i) x[i] *= alpha;
}

double squared_norm(const float* x, int64_t n) {
  // Eight double accumulators in a fixed lane pattern: the loop vectorizes
  // without reassociating anything, so the result is the same on every run.
  constexpr int kLanes = 8;
  double acc[kLanes] = {};
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int l = 0; l < kLanes; ++l) {
      const double v = x[i + l];
      acc[l] += v * v;
    }
  for (int l = 0; i < n; ++i, ++l) {
    const double v = x[i];
    acc[l] += v * v;
  }
  double sum = 0.0;
  for (int l = 0; l < kLanes; ++l) sum += acc[l];
  return sum;
}

TROUPE_HOST_SIMD void adamw(float* param, const float* grad, const float* m_in, const float* v_in, float* m_out,
                            float* v_out, int64_t n, float lr, float beta1, float beta2, float eps,
                            float weight_decay, float bias_correction1, float bias_correction2, float grad_scale) {
  // bias_correction{1,2} = 1 / (1 - beta^step), computed once by the caller.
  // Three passes over chunks that stay in L1, each of which vectorizes (this
  // file is built with -fno-math-errno, kernels/CMakeLists.txt, so the sqrt
  // pass does too). Same float operations in the same order as a single
  // fused loop: same results.
  // m_out may be m_in (in place) or other memory (the optimizer shard keeps
  // the step-start moments as its snapshot): the same operations either way.
  constexpr int64_t kChunk = 256;
  float denom[kChunk];
  const float a1 = 1.0f - beta1, a2 = 1.0f - beta2;
  for (int64_t i0 = 0; i0 < n; i0 += kChunk) {
    const int64_t c = n - i0 < kChunk ? n - i0 : kChunk;
    float* p = param + i0;
    const float* g = grad + i0;
    const float* mi = m_in + i0;
    const float* vi = v_in + i0;
    float* mc = m_out + i0;
    float* vc = v_out + i0;
    for (int64_t i = 0; i < c; ++i) {
      const float gi = g[i] * grad_scale;  // as a separate scale pass would have left it
      mc[i] = beta1 * mi[i] + a1 * gi;
      vc[i] = beta2 * vi[i] + a2 * gi * gi;
      denom[i] = vc[i] * bias_correction2;  // vhat
    }
    for (int64_t i = 0; i < c; ++i) denom[i] = std::sqrt(denom[i]) + eps;
    for (int64_t i = 0; i < c; ++i)
      p[i] -= lr * ((mc[i] * bias_correction1) / denom[i] + weight_decay * p[i]);
  }
}

}  // namespace troupe::kernels::host
