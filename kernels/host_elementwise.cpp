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

void adamw(float* param, const float* grad, float* m, float* v, int64_t n, float lr, float beta1,
           float beta2, float eps, float weight_decay, float bias_correction1,
           float bias_correction2) {
  // bias_correction{1,2} = 1 / (1 - beta^step), computed once by the caller.
  const float a1 = 1.0f - beta1, a2 = 1.0f - beta2;
  for (int64_t i = 0; i < n; ++i) {
    const float g = grad[i];
    const float mi = beta1 * m[i] + a1 * g;
    const float vi = beta2 * v[i] + a2 * g * g;
    m[i] = mi;
    v[i] = vi;
    const float mhat = mi * bias_correction1;
    const float vhat = vi * bias_correction2;
    param[i] -= lr * (mhat / (std::sqrt(vhat) + eps) + weight_decay * param[i]);
  }
}

}  // namespace troupe::kernels::host
