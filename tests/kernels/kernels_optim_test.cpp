// Optimizer kernels on every backend: squared_norm, clip_grad_norm (the
// common helper over the backend's ops) and AdamW over several steps against a
// float64 reference (bias correction, decoupled weight decay).
#include <gtest/gtest.h>

#include <cmath>

#include "tests/kernels/kernels_harness.hpp"
#include "tests/kernels/kernels_reference.hpp"

namespace troupe::kernels::testing {
namespace {

using ref::V;

class KernelsOptim : public BackendTest {};

TEST_P(KernelsOptim, SquaredNorm) {
  Rng rng(60);
  for (int64_t n : {1, 7, 33, 1000, 100003}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const auto x = rng.f32(n, -3, 3);
    const double want = ref::squared_norm(to_double(x));
    Tensor t = be().from_f32({n}, x);
    const double got = be().squared_norm(t);
    EXPECT_NEAR(got, want, 1e-5 * want);
    // On a view at an offset too.
    auto padded = rng.f32(n + 9);
    std::copy(x.begin(), x.end(), padded.begin() + 4);
    EXPECT_NEAR(be().squared_norm(be().from_f32({n + 9}, padded).view(4, {n})), want, 1e-5 * want);
  }
}

TEST_P(KernelsOptim, ClipGradNorm) {
  Rng rng(61);
  const std::vector<int64_t> sizes = {5, 33, 1000};
  std::vector<std::vector<float>> g;
  double sq = 0.0;
  for (int64_t n : sizes) {
    g.push_back(rng.f32(n));
    sq += ref::squared_norm(to_double(g.back()));
  }
  const double norm = std::sqrt(sq);
  for (double max_norm : {0.5 * norm, 2.0 * norm, 0.0}) {
    SCOPED_TRACE("max_norm=" + std::to_string(max_norm));
    std::vector<Tensor> grads;
    for (size_t i = 0; i < sizes.size(); ++i) grads.push_back(be().from_f32({sizes[i]}, g[i]));
    const double got = clip_grad_norm(be(), grads, max_norm);
    EXPECT_NEAR(got, norm, 1e-6 * norm);
    const double s = (max_norm > 0 && norm > max_norm) ? max_norm / (norm + 1e-6) : 1.0;
    for (size_t i = 0; i < sizes.size(); ++i) {
      V want = to_double(g[i]);
      for (double& v : want) v *= s;
      EXPECT_TRUE(near(be().download_f32(grads[i]), want, {1e-7, 1e-6})) << "grad " << i;
    }
  }
}

TEST_P(KernelsOptim, AdamWSeveralSteps) {
  struct Case {
    int64_t n;
    ref::AdamW hp;
  };
  const Case cases[] = {{1, {1e-2, 0.9, 0.95, 1e-8, 0.1}},
                        {7, {1e-3, 0.9, 0.999, 1e-8, 0.0}},
                        {33, {3e-3, 0.8, 0.95, 1e-3, 0.5}},
                        {1000, {1e-2, 0.9, 0.95, 1e-8, 0.1}}};
  const int kSteps = 5;
  Rng rng(62);
  for (const Case& c : cases) {
    SCOPED_TRACE("n=" + std::to_string(c.n) + " wd=" + std::to_string(c.hp.weight_decay));
    const auto p0 = rng.f32(c.n), m0 = rng.f32(c.n, -0.1f, 0.1f), v0 = rng.f32(c.n, 0.001f, 0.1f);
    std::vector<std::vector<float>> grads;
    for (int s = 0; s < kSteps; ++s) grads.push_back(rng.f32(c.n));
    // Reference trajectory; every step's param, m and v are compared.
    std::vector<V> want;
    V p = to_double(p0), m = to_double(m0), v = to_double(v0);
    for (int s = 0; s < kSteps; ++s) {
      ref::adamw_step(p, m, v, to_double(grads[s]), c.hp, s + 1);
      want.push_back(p);
      want.push_back(m);
      want.push_back(v);
    }
    check_op(be(),
             [&](Arena& a) -> Outputs {
               Tensor tp = a.in({c.n}, p0), tm = a.in({c.n}, m0), tv = a.in({c.n}, v0);
               Outputs out;
               for (int s = 0; s < kSteps; ++s) {
                 AdamWParams hp;
                 hp.lr = static_cast<float>(c.hp.lr);
                 hp.beta1 = static_cast<float>(c.hp.beta1);
                 hp.beta2 = static_cast<float>(c.hp.beta2);
                 hp.eps = static_cast<float>(c.hp.eps);
                 hp.weight_decay = static_cast<float>(c.hp.weight_decay);
                 hp.step = s + 1;
                 a.be().adamw(tp, a.in({c.n}, grads[s]), tm, tv, hp);
                 const std::string at = "@step" + std::to_string(s + 1);
                 out.push_back({"param" + at, a.get(tp)});
                 out.push_back({"m" + at, a.get(tm)});
                 out.push_back({"v" + at, a.get(tv)});
               }
               return out;
             },
             want, {1e-6, 1e-5});
  }
  Tensor x = be().zeros({4});
  AdamWParams bad;
  bad.step = 0;
  EXPECT_THROW(be().adamw(x, x, x, x, bad), std::invalid_argument);
  EXPECT_THROW(be().adamw(x, be().zeros({3}), x, x, AdamWParams{}), std::invalid_argument);
}

// adamw_to (the optimizer shard's out-of-place update) gives bitwise what the
// in-place update gives, at offsets and with a clip scale, leaves its input
// moments as they were, and checks every size.
TEST_P(KernelsOptim, AdamWToEqualsInPlaceBitwise) {
  Rng rng(62);
  for (int64_t n : {1, 255, 257, 4099}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const auto p0 = rng.f32(n), g = rng.f32(n), m0 = rng.f32(n, -0.1f, 0.1f), v0 = rng.f32(n, 0.0f, 0.2f);
    AdamWParams hp;
    hp.lr = 1e-2f;
    hp.weight_decay = 0.1f;
    hp.step = 3;
    hp.grad_scale = 0.75f;
    Tensor pa = be().from_f32({n}, p0), ma = be().from_f32({n}, m0), va = be().from_f32({n}, v0);
    be().adamw(pa, be().from_f32({n}, g), ma, va, hp);
    // Out of place, on views 3 elements into larger buffers.
    auto pad = [&](const std::vector<float>& x) {
      std::vector<float> y(static_cast<size_t>(n) + 5, 7.0f);
      std::copy(x.begin(), x.end(), y.begin() + 3);
      return be().from_f32({n + 5}, y).view(3, {n});
    };
    Tensor pb = pad(p0), mi = pad(m0), vi = pad(v0), mo = pad(std::vector<float>(static_cast<size_t>(n), -1.0f)),
           vo = pad(std::vector<float>(static_cast<size_t>(n), -1.0f));
    be().adamw_to(pb, pad(g), mi, vi, mo, vo, hp);
    EXPECT_EQ(be().download_f32(pb), be().download_f32(pa));
    EXPECT_EQ(be().download_f32(mo), be().download_f32(ma));
    EXPECT_EQ(be().download_f32(vo), be().download_f32(va));
    EXPECT_EQ(be().download_f32(mi), m0);
    EXPECT_EQ(be().download_f32(vi), v0);
    EXPECT_NE(be().download_f32(mo), m0);
  }
  Tensor x = be().zeros({4});
  EXPECT_THROW(be().adamw_to(x, x, x, x, be().zeros({3}), x, AdamWParams{}), std::invalid_argument);
}

TROUPE_INSTANTIATE_BACKENDS(KernelsOptim);

}  // namespace
}  // namespace troupe::kernels::testing
