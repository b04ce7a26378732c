// The *_backward_overwrite ops and AdamW's fused clip factor (issue 16), on every
// backend. Each overwrite op runs on outputs poisoned with NaN (so a missed
// element fails) against the float64 reference gradient, and must equal
// bitwise what zeroing then the accumulating op gives (the trainer's results
// before the change). AdamW with grad_scale must equal bitwise a separate
// scale pass followed by AdamW, and leave the gradients untouched.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>

#include "tests/kernels/kernels_harness.hpp"
#include "tests/kernels/kernels_reference.hpp"

namespace troupe::kernels::testing {
namespace {

using ref::V;

constexpr Tol kBwd{1e-4, 1e-4};

class KernelsOverwrite : public BackendTest {};

// Bitwise equality of two float vectors (NaN patterns included).
::testing::AssertionResult same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  if (a.size() != b.size()) return ::testing::AssertionFailure() << "sizes " << a.size() << " vs " << b.size();
  for (size_t i = 0; i < a.size(); ++i)
    if (std::memcmp(&a[i], &b[i], sizeof(float)) != 0)
      return ::testing::AssertionFailure() << "element " << i << ": " << a[i] << " vs " << b[i];
  return ::testing::AssertionSuccess();
}

// Runs `op(outputs...)` once on zeroed outputs through the accumulating op and
// once on garbage through the overwrite op; both results must match bitwise.
template <class Acc, class Over>
void expect_same_as_zero_then_add(Backend& be, const std::vector<Shape>& shapes, Acc acc, Over over) {
  Rng rng(99);
  std::vector<Tensor> a, o;
  for (const Shape& s : shapes) {
    a.push_back(be.zeros(s));
    const int64_t n = shape_numel(s);
    o.push_back(be.from_f32(s, rng.f32(static_cast<size_t>(n), -1e3f, 1e3f)));  // garbage
  }
  acc(a);
  over(o);
  for (size_t i = 0; i < a.size(); ++i)
    EXPECT_TRUE(same_bits(be.download_f32(a[i]), be.download_f32(o[i]))) << "output " << i;
}

TEST_P(KernelsOverwrite, SwiGlu) {
  Rng rng(131);
  for (const auto& [T, F] : {std::pair<int64_t, int64_t>{1, 1}, {5, 17}, {33, 64}, {64, 256}}) {
    SCOPED_TRACE("T=" + std::to_string(T) + " F=" + std::to_string(F));
    const int64_t n = T * F;
    const auto g = rng.f32(n, -6, 6), u = rng.f32(n, -2, 2), dout = rng.f32(n);
    V dg, du;
    ref::swiglu_bwd(dg, du, to_double(dout), to_double(g), to_double(u));
    check_op(be(),
             [&](Arena& a) -> Outputs {
               Tensor tdg = a.out({T, F}), tdu = a.out({T, F});
               a.be().swiglu_backward_overwrite(tdg, tdu, a.in({T, F}, dout), a.in({T, F}, g), a.in({T, F}, u));
               return {{"dgate", a.get(tdg)}, {"dup", a.get(tdu)}};
             },
             {dg, du}, kBwd);
    const Tensor tg = be().from_f32({T, F}, g), tu = be().from_f32({T, F}, u), td = be().from_f32({T, F}, dout);
    expect_same_as_zero_then_add(
        be(), {{T, F}, {T, F}}, [&](std::vector<Tensor>& x) { be().swiglu_backward(x[0], x[1], td, tg, tu); },
        [&](std::vector<Tensor>& x) { be().swiglu_backward_overwrite(x[0], x[1], td, tg, tu); });
  }
}

TEST_P(KernelsOverwrite, SoftmaxAndCrossEntropy) {
  Rng rng(132);
  for (const auto& [T, E] : {std::pair<int64_t, int64_t>{1, 1}, {7, 3}, {33, 9}, {9, 256}}) {
    SCOPED_TRACE("T=" + std::to_string(T) + " E=" + std::to_string(E));
    const int64_t n = T * E;
    const auto x = rng.f32(n, -5, 5), dout = rng.f32(n);
    const V y = ref::softmax_fwd(to_double(x), T, E);
    const std::vector<float> y_f(y.begin(), y.end());
    check_op(be(),
             [&](Arena& a) -> Outputs {
               Tensor dx = a.out({T, E});
               a.be().softmax_backward_overwrite(dx, a.in({T, E}, dout), a.in({T, E}, y_f));
               return {{"dx", a.get(dx)}};
             },
             {ref::softmax_bwd(to_double(dout), y, T, E)}, kBwd);
    const Tensor ty = be().from_f32({T, E}, y_f), td = be().from_f32({T, E}, dout);
    expect_same_as_zero_then_add(
        be(), {{T, E}}, [&](std::vector<Tensor>& o) { be().softmax_backward(o[0], td, ty); },
        [&](std::vector<Tensor>& o) { be().softmax_backward_overwrite(o[0], td, ty); });

    // Cross-entropy over the same shape, every third token ignored: its rows
    // must come out zero, not left as they were.
    auto targets = rng.i32(T, 0, static_cast<int32_t>(E - 1));
    for (int64_t t = 1; t < T; t += 3) targets[t] = -1;
    const float scale = 0.25f;
    check_op(be(),
             [&](Arena& a) -> Outputs {
               Tensor dl = a.out({T, E});
               a.be().cross_entropy_backward_overwrite(dl, a.in({T, E}, x), a.in_i32({T}, targets), -1, scale);
               return {{"dlogits", a.get(dl)}};
             },
             {ref::cross_entropy_bwd(to_double(x), targets, -1, scale, T, E)}, kBwd);
    const Tensor tx = be().from_f32({T, E}, x), tt = be().from_i32({T}, targets);
    expect_same_as_zero_then_add(
        be(), {{T, E}}, [&](std::vector<Tensor>& o) { be().cross_entropy_backward(o[0], tx, tt, -1, scale); },
        [&](std::vector<Tensor>& o) { be().cross_entropy_backward_overwrite(o[0], tx, tt, -1, scale); });
  }
}

TEST_P(KernelsOverwrite, RmsNormOverwritesDxAndAccumulatesDw) {
  Rng rng(133);
  for (const auto& [T, D] : {std::pair<int64_t, int64_t>{1, 3}, {7, 17}, {33, 64}}) {
    SCOPED_TRACE("T=" + std::to_string(T) + " D=" + std::to_string(D));
    const auto x = rng.f32(T * D, -2, 2), w = rng.f32(D, 0.5f, 1.5f), dout = rng.f32(T * D), dw0 = rng.f32(D);
    const double eps = 1e-5;
    V out, rstd, dx, dw;
    ref::rmsnorm_fwd(out, rstd, to_double(x), to_double(w), T, D, eps);
    ref::rmsnorm_bwd(dx, dw, to_double(dout), to_double(x), to_double(w), T, D, eps);
    const std::vector<float> rstd_f(rstd.begin(), rstd.end());
    check_op(be(),
             [&](Arena& a) -> Outputs {
               Tensor tdx = a.out({T, D}), tdw = a.in({D}, dw0);
               a.be().rmsnorm_backward_overwrite(tdx, tdw, a.in({T, D}, dout), a.in({T, D}, x), a.in({D}, w),
                                                 a.in({T}, rstd_f));
               return {{"dx", a.get(tdx)}, {"dw", a.get(tdw)}};
             },
             {dx, add(to_double(dw0), dw)}, kBwd);
    const Tensor tx = be().from_f32({T, D}, x), tw = be().from_f32({D}, w), td = be().from_f32({T, D}, dout),
                 tr = be().from_f32({T}, rstd_f);
    // dw starts from the same values in both runs (it accumulates in both).
    const Tensor dwa = be().from_f32({D}, dw0), dwo = be().from_f32({D}, dw0);
    expect_same_as_zero_then_add(
        be(), {{T, D}}, [&](std::vector<Tensor>& o) { be().rmsnorm_backward(o[0], dwa, td, tx, tw, tr); },
        [&](std::vector<Tensor>& o) { be().rmsnorm_backward_overwrite(o[0], dwo, td, tx, tw, tr); });
    EXPECT_TRUE(same_bits(be().download_f32(dwa), be().download_f32(dwo)));
  }
}

TEST_P(KernelsOverwrite, RopeAndAttention) {
  struct Case {
    int64_t B, S, H, hd;
  };
  // S = 130 spans several of the host attention's row blocks (the dK/dV rows
  // are zeroed block by block there).
  const Case cases[] = {{1, 1, 1, 2}, {2, 7, 3, 6}, {1, 33, 2, 16}, {2, 130, 2, 4}};
  Rng rng(134);
  for (const Case& c : cases) {
    SCOPED_TRACE("B=" + std::to_string(c.B) + " S=" + std::to_string(c.S) + " H=" + std::to_string(c.H) +
                 " hd=" + std::to_string(c.hd));
    const Shape shape{c.B, c.S, c.H, c.hd};
    const int64_t n = shape_numel(shape);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
    const auto q = rng.f32(n, -2, 2), k = rng.f32(n, -2, 2), v = rng.f32(n), dout = rng.f32(n);
    const double theta = 10000.0;
    check_op(be(),
             [&](Arena& a) -> Outputs {
               Tensor dx = a.out(shape);
               a.be().rope_backward_overwrite(dx, a.in(shape, dout), 3, static_cast<float>(theta));
               return {{"dx", a.get(dx)}};
             },
             {ref::rope_bwd(to_double(dout), c.B, c.S, c.H, c.hd, 3, theta)}, kBwd);
    const Tensor td = be().from_f32(shape, dout);
    expect_same_as_zero_then_add(
        be(), {shape}, [&](std::vector<Tensor>& o) { be().rope_backward(o[0], td, 3, static_cast<float>(theta)); },
        [&](std::vector<Tensor>& o) { be().rope_backward_overwrite(o[0], td, 3, static_cast<float>(theta)); });

    const V qd = to_double(q), kd = to_double(k), vd = to_double(v);
    V out, lse, dq, dk, dv;
    ref::attention_fwd(out, lse, qd, kd, vd, c.B, c.S, c.H, c.hd, scale);
    ref::attention_bwd(dq, dk, dv, to_double(dout), qd, kd, vd, c.B, c.S, c.H, c.hd, scale);
    const std::vector<float> out_f(out.begin(), out.end()), lse_f(lse.begin(), lse.end());
    check_op(be(),
             [&](Arena& a) -> Outputs {
               Tensor tq = a.out(shape), tk = a.out(shape), tv = a.out(shape);
               a.be().attention_backward_overwrite(tq, tk, tv, a.in(shape, dout), a.in(shape, q), a.in(shape, k),
                                                   a.in(shape, v), a.in(shape, out_f),
                                                   a.in({c.B, c.H, c.S}, lse_f), scale);
               return {{"dq", a.get(tq)}, {"dk", a.get(tk)}, {"dv", a.get(tv)}};
             },
             {dq, dk, dv}, kBwd);
    const Tensor tq = be().from_f32(shape, q), tk = be().from_f32(shape, k), tv = be().from_f32(shape, v),
                 to = be().from_f32(shape, out_f), tl = be().from_f32({c.B, c.H, c.S}, lse_f);
    expect_same_as_zero_then_add(
        be(), {shape, shape, shape},
        [&](std::vector<Tensor>& o) { be().attention_backward(o[0], o[1], o[2], td, tq, tk, tv, to, tl, scale); },
        [&](std::vector<Tensor>& o) {
          be().attention_backward_overwrite(o[0], o[1], o[2], td, tq, tk, tv, to, tl, scale);
        });
  }
}

// The clip factor inside AdamW: bitwise what scale() then AdamW gives, the
// gradients untouched, and grad_scale = 1 the plain update.
TEST_P(KernelsOverwrite, AdamWFusedClipFactor) {
  Rng rng(135);
  for (int64_t n : {1, 7, 1000, 4099}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const auto p0 = rng.f32(n), m0 = rng.f32(n, -0.1f, 0.1f), v0 = rng.f32(n, 0.001f, 0.1f), g = rng.f32(n);
    for (float factor : {1.0f, 0.37f, 1e-3f}) {
      AdamWParams hp;
      hp.lr = 3e-3f;
      hp.weight_decay = 0.1f;
      hp.step = 3;
      // Separate pass: scale the gradients, then AdamW.
      const Tensor pa = be().from_f32({n}, p0), ma = be().from_f32({n}, m0), va = be().from_f32({n}, v0),
                   ga = be().from_f32({n}, g);
      be().scale(ga, factor);
      be().adamw(pa, ga, ma, va, hp);
      // Fused.
      const Tensor pb = be().from_f32({n}, p0), mb = be().from_f32({n}, m0), vb = be().from_f32({n}, v0),
                   gb = be().from_f32({n}, g);
      hp.grad_scale = factor;
      be().adamw(pb, gb, mb, vb, hp);
      EXPECT_TRUE(same_bits(be().download_f32(pa), be().download_f32(pb))) << "param, factor " << factor;
      EXPECT_TRUE(same_bits(be().download_f32(ma), be().download_f32(mb))) << "m, factor " << factor;
      EXPECT_TRUE(same_bits(be().download_f32(va), be().download_f32(vb))) << "v, factor " << factor;
      EXPECT_TRUE(same_bits(be().download_f32(gb), g)) << "grad written, factor " << factor;
      // And against float64 AdamW on the scaled gradient.
      V p = to_double(p0), m = to_double(m0), v = to_double(v0), gs = to_double(g);
      for (double& x : gs) x *= static_cast<double>(factor);
      ref::adamw_step(p, m, v, gs, {3e-3, 0.9, 0.95, 1e-8, 0.1}, 3);
      EXPECT_TRUE(near(be().download_f32(pb), p, {1e-6, 1e-5}));
      EXPECT_TRUE(near(be().download_f32(mb), m, {1e-6, 1e-5}));
    }
  }
}

TROUPE_INSTANTIATE_BACKENDS(KernelsOverwrite);

}  // namespace
}  // namespace troupe::kernels::testing
