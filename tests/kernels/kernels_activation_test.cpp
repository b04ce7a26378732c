// SiLU, SwiGLU, row softmax and cross-entropy tests on every backend: forward
// against float64, backward against finite differences (small cases) and the
// analytic float64 backward, accumulating into random gradients.
#include <gtest/gtest.h>

#include "tests/kernels/kernels_harness.hpp"
#include "tests/kernels/kernels_reference.hpp"

namespace troupe::kernels::testing {
namespace {

using ref::V;

constexpr Tol kFwd{1e-6, 1e-5};
constexpr Tol kBwd{1e-5, 1e-4};
constexpr Tol kRefVsFd{1e-7, 1e-6};

class KernelsActivation : public BackendTest {};

TEST_P(KernelsActivation, Silu) {
  Rng rng(30);
  for (int64_t n : {1, 7, 33, 1000, 4097}) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const auto x = rng.f32(n, -8, 8), dout = rng.f32(n), dx0 = rng.f32(n);
    check_op(
        be(),
        [&](Arena& a) -> Outputs {
          Tensor o = a.out({n});
          a.be().silu_forward(o, a.in({n}, x));
          return {{"out", a.get(o)}};
        },
        {ref::silu_fwd(to_double(x))}, kFwd);
    const V grad = ref::silu_bwd(to_double(dout), to_double(x));
    const auto run = [&](Arena& a) -> Outputs {
      Tensor dx = a.in({n}, dx0);
      a.be().silu_backward(dx, a.in({n}, dout), a.in({n}, x));
      return {{"dx", a.get(dx)}};
    };
    if (n <= 40) {
      const V fd = ref::numeric_grad(ref::silu_fwd, to_double(x), to_double(dout));
      EXPECT_TRUE(near(grad, fd, kRefVsFd));
      check_op(be(), run, {add(to_double(dx0), fd)}, kBwd);
    }
    check_op(be(), run, {add(to_double(dx0), grad)}, kBwd);
  }
}

TEST_P(KernelsActivation, SwiGlu) {
  struct Case {
    int64_t T, F;
  };
  const Case cases[] = {{1, 1}, {7, 3}, {5, 17}, {33, 64}, {3, 257}};
  Rng rng(31);
  for (const Case& c : cases) {
    SCOPED_TRACE("T=" + std::to_string(c.T) + " F=" + std::to_string(c.F));
    const int64_t n = c.T * c.F;
    const auto g = rng.f32(n, -6, 6), u = rng.f32(n, -2, 2), dout = rng.f32(n);
    const auto dg0 = rng.f32(n), du0 = rng.f32(n);
    check_op(
        be(),
        [&](Arena& a) -> Outputs {
          Tensor o = a.out({c.T, c.F});
          a.be().swiglu_forward(o, a.in({c.T, c.F}, g), a.in({c.T, c.F}, u));
          return {{"out", a.get(o)}};
        },
        {ref::swiglu_fwd(to_double(g), to_double(u))}, kFwd);
    V dg, du;
    ref::swiglu_bwd(dg, du, to_double(dout), to_double(g), to_double(u));
    const auto run = [&](Arena& a) -> Outputs {
      Tensor tdg = a.in({c.T, c.F}, dg0), tdu = a.in({c.T, c.F}, du0);
      a.be().swiglu_backward(tdg, tdu, a.in({c.T, c.F}, dout), a.in({c.T, c.F}, g),
                             a.in({c.T, c.F}, u));
      return {{"dgate", a.get(tdg)}, {"dup", a.get(tdu)}};
    };
    if (n <= 100) {
      const V fg = ref::numeric_grad([&](const V& x) { return ref::swiglu_fwd(x, to_double(u)); },
                                     to_double(g), to_double(dout));
      const V fu = ref::numeric_grad([&](const V& x) { return ref::swiglu_fwd(to_double(g), x); },
                                     to_double(u), to_double(dout));
      EXPECT_TRUE(near(dg, fg, kRefVsFd));
      EXPECT_TRUE(near(du, fu, kRefVsFd));
      check_op(be(), run, {add(to_double(dg0), fg), add(to_double(du0), fu)}, kBwd);
    }
    check_op(be(), run, {add(to_double(dg0), dg), add(to_double(du0), du)}, kBwd);
  }
}

TEST_P(KernelsActivation, Softmax) {
  struct Case {
    int64_t T, E;
  };
  const Case cases[] = {{1, 1}, {7, 3}, {33, 9}, {4, 64}, {2, 256}};
  Rng rng(32);
  for (const Case& c : cases) {
    SCOPED_TRACE("T=" + std::to_string(c.T) + " E=" + std::to_string(c.E));
    const int64_t n = c.T * c.E;
    const auto x = rng.f32(n, -5, 5), dout = rng.f32(n), dx0 = rng.f32(n);
    const V y = ref::softmax_fwd(to_double(x), c.T, c.E);
    check_op(
        be(),
        [&](Arena& a) -> Outputs {
          Tensor o = a.out({c.T, c.E});
          a.be().softmax_forward(o, a.in({c.T, c.E}, x));
          return {{"out", a.get(o)}};
        },
        {y}, kFwd);
    check_op(
        be(),
        [&](Arena& a) -> Outputs {
          Tensor t = a.in({c.T, c.E}, x);
          a.be().softmax_forward(t, t);  // in place
          return {{"out (in place)", a.get(t)}};
        },
        {y}, kFwd);
    const V grad = ref::softmax_bwd(to_double(dout), y, c.T, c.E);
    const std::vector<float> y_f(y.begin(), y.end());
    const auto run = [&](Arena& a) -> Outputs {
      Tensor dx = a.in({c.T, c.E}, dx0);
      a.be().softmax_backward(dx, a.in({c.T, c.E}, dout), a.in({c.T, c.E}, y_f));
      return {{"dx", a.get(dx)}};
    };
    if (n <= 300) {
      const V fd = ref::numeric_grad([&](const V& v) { return ref::softmax_fwd(v, c.T, c.E); },
                                     to_double(x), to_double(dout));
      EXPECT_TRUE(near(grad, fd, kRefVsFd));
      check_op(be(), run, {add(to_double(dx0), fd)}, kBwd);
    }
    check_op(be(), run, {add(to_double(dx0), grad)}, kBwd);
  }
}

TEST_P(KernelsActivation, CrossEntropyWithIgnoreIndex) {
  struct Case {
    int64_t T, V;
    int32_t ignore;
  };
  const Case cases[] = {{1, 3, -100}, {7, 17, -100}, {33, 256, -1}, {5, 1, -100}, {9, 5, 2}};
  Rng rng(33);
  for (const Case& c : cases) {
    SCOPED_TRACE("T=" + std::to_string(c.T) + " V=" + std::to_string(c.V) +
                 " ignore=" + std::to_string(c.ignore));
    const auto logits = rng.f32(c.T * c.V, -4, 4), dl0 = rng.f32(c.T * c.V);
    auto targets = rng.i32(c.T, 0, static_cast<int32_t>(c.V - 1));
    for (int64_t t = 1; t < c.T; t += 3) targets[t] = c.ignore;  // every third token ignored
    int64_t count = 0;
    for (int32_t t : targets) count += t != c.ignore;
    const float grad_scale = 1.0f / static_cast<float>(count ? count : 1);
    const V losses = ref::cross_entropy_fwd(to_double(logits), targets, c.ignore, c.T, c.V);
    check_op(be(),
             [&](Arena& a) -> Outputs {
               Tensor l = a.out({c.T});
               a.be().cross_entropy_forward(l, a.in({c.T, c.V}, logits), a.in_i32({c.T}, targets),
                                            c.ignore);
               return {{"losses", a.get(l)}};
             },
             {losses}, {1e-5, 1e-5});
    const V grad =
        ref::cross_entropy_bwd(to_double(logits), targets, c.ignore, grad_scale, c.T, c.V);
    const auto run = [&](Arena& a) -> Outputs {
      Tensor dl = a.in({c.T, c.V}, dl0);
      a.be().cross_entropy_backward(dl, a.in({c.T, c.V}, logits), a.in_i32({c.T}, targets),
                                    c.ignore, grad_scale);
      return {{"dlogits", a.get(dl)}};
    };
    if (c.T * c.V <= 150) {
      const V fd = ref::numeric_grad(
          [&](const V& l) { return ref::cross_entropy_fwd(l, targets, c.ignore, c.T, c.V); },
          to_double(logits), V(static_cast<size_t>(c.T), grad_scale));
      EXPECT_TRUE(near(grad, fd, kRefVsFd));
      check_op(be(), run, {add(to_double(dl0), fd)}, kBwd);
    }
    check_op(be(), run, {add(to_double(dl0), grad)}, kBwd);
  }
}

TEST_P(KernelsActivation, CrossEntropyRejectsBadTargets) {
  Backend& b = be();
  Tensor logits = b.zeros({2, 4}), losses = b.zeros({2});
  EXPECT_THROW(
      b.cross_entropy_forward(losses, logits, b.from_i32({2}, std::vector<int32_t>{0, 4}), -100),
      std::invalid_argument);
  EXPECT_THROW(b.cross_entropy_backward(logits, logits,
                                        b.from_i32({2}, std::vector<int32_t>{-2, 1}), -100, 1.0f),
               std::invalid_argument);
  EXPECT_THROW(b.cross_entropy_forward(b.zeros({3}), logits,
                                       b.from_i32({2}, std::vector<int32_t>{0, 1}), -100),
               std::invalid_argument);
}

TROUPE_INSTANTIATE_BACKENDS(KernelsActivation);

}  // namespace
}  // namespace troupe::kernels::testing
