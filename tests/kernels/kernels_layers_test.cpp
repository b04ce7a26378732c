// Embedding, RMSNorm and RoPE tests on every backend: forward against the
// float64 reference, backward against finite differences (small cases) and
// the analytic float64 backward (all cases), accumulating into random grads.
#include <gtest/gtest.h>

#include <cmath>
#include <sstream>

#include "tests/kernels/kernels_harness.hpp"
#include "tests/kernels/kernels_reference.hpp"

namespace troupe::kernels::testing {
namespace {

using ref::V;

constexpr Tol kFwd{1e-5, 1e-5};
constexpr Tol kBwd{1e-4, 1e-4};      // sums over a row or over tokens
constexpr Tol kRefVsFd{1e-7, 1e-6};  // float64 analytic vs float64 finite differences

class KernelsLayers : public BackendTest {};

// ---- embedding ------------------------------------------------------------------

TEST_P(KernelsLayers, Embedding) {
  struct Case {
    int64_t V, D, T;
  };
  const Case cases[] = {{5, 3, 7}, {17, 17, 33}, {256, 64, 1}, {3, 16, 40}, {1, 2, 3}};
  Rng rng(10);
  for (const Case& c : cases) {
    SCOPED_TRACE("V=" + std::to_string(c.V) + " D=" + std::to_string(c.D) +
                 " T=" + std::to_string(c.T));
    const auto table = rng.f32(c.V * c.D), dout = rng.f32(c.T * c.D), dt0 = rng.f32(c.V * c.D);
    const auto ids = rng.i32(c.T, 0, static_cast<int32_t>(c.V - 1));  // repeats when T > V
    check_op(
        be(),
        [&](Arena& a) -> Outputs {
          Tensor out = a.out({c.T, c.D});
          a.be().embedding_forward(out, a.in({c.V, c.D}, table), a.in_i32({c.T}, ids));
          return {{"out", a.get(out)}};
        },
        {ref::embedding_fwd(to_double(table), ids, c.D)}, kFwd);

    const V grad = ref::embedding_bwd(to_double(dout), ids, c.V, c.D);
    if (c.V * c.D <= 300) {
      const V fd = ref::numeric_grad([&](const V& t) { return ref::embedding_fwd(t, ids, c.D); },
                                     to_double(table), to_double(dout));
      EXPECT_TRUE(near(grad, fd, kRefVsFd)) << "reference backward vs finite differences";
    }
    check_op(
        be(),
        [&](Arena& a) -> Outputs {
          Tensor dt = a.in({c.V, c.D}, dt0);
          a.be().embedding_backward(dt, a.in({c.T, c.D}, dout), a.in_i32({c.T}, ids));
          return {{"dtable", a.get(dt)}};
        },
        {add(to_double(dt0), grad)}, kFwd);
  }
}

TEST_P(KernelsLayers, EmbeddingRejectsBadIds) {
  Backend& b = be();
  Tensor table = b.zeros({4, 3}), out = b.zeros({2, 3});
  const std::vector<int32_t> bad_hi = {1, 4}, bad_lo = {-1, 0};
  EXPECT_THROW(b.embedding_forward(out, table, b.from_i32({2}, bad_hi)), std::invalid_argument);
  EXPECT_THROW(b.embedding_backward(table, out, b.from_i32({2}, bad_lo)), std::invalid_argument);
  EXPECT_THROW(
      b.embedding_forward(b.zeros({3, 3}), table, b.from_i32({2}, std::vector<int32_t>{0, 1})),
      std::invalid_argument);
}

// ---- RMSNorm --------------------------------------------------------------------

TEST_P(KernelsLayers, RmsNorm) {
  struct Case {
    int64_t T, D;
  };
  const Case cases[] = {{1, 3}, {7, 17}, {33, 64}, {4, 1}, {2, 130}, {5, 6}};
  const float eps = 1e-5f;
  Rng rng(11);
  for (const Case& c : cases) {
    SCOPED_TRACE("T=" + std::to_string(c.T) + " D=" + std::to_string(c.D));
    const auto x = rng.f32(c.T * c.D), w = rng.f32(c.D, 0.5f, 1.5f), dout = rng.f32(c.T * c.D);
    const auto dx0 = rng.f32(c.T * c.D), dw0 = rng.f32(c.D);
    V out, rstd;
    ref::rmsnorm_fwd(out, rstd, to_double(x), to_double(w), c.T, c.D, eps);
    check_op(
        be(),
        [&](Arena& a) -> Outputs {
          Tensor o = a.out({c.T, c.D}), r = a.out({c.T});
          a.be().rmsnorm_forward(o, r, a.in({c.T, c.D}, x), a.in({c.D}, w), eps);
          return {{"out", a.get(o)}, {"rstd", a.get(r)}};
        },
        {out, rstd}, kFwd);

    V dx, dw;
    ref::rmsnorm_bwd(dx, dw, to_double(dout), to_double(x), to_double(w), c.T, c.D, eps);
    const std::vector<float> rstd_f(rstd.begin(), rstd.end());
    const auto run_bwd = [&](Arena& a) -> Outputs {
      Tensor tdx = a.in({c.T, c.D}, dx0), tdw = a.in({c.D}, dw0);
      a.be().rmsnorm_backward(tdx, tdw, a.in({c.T, c.D}, dout), a.in({c.T, c.D}, x), a.in({c.D}, w),
                              a.in({c.T}, rstd_f));
      return {{"dx", a.get(tdx)}, {"dw", a.get(tdw)}};
    };
    if (c.T * c.D <= 120) {
      const auto fwd_x = [&](const V& xv) {
        V o, r;
        ref::rmsnorm_fwd(o, r, xv, to_double(w), c.T, c.D, eps);
        return o;
      };
      const auto fwd_w = [&](const V& wv) {
        V o, r;
        ref::rmsnorm_fwd(o, r, to_double(x), wv, c.T, c.D, eps);
        return o;
      };
      const V fdx = ref::numeric_grad(fwd_x, to_double(x), to_double(dout));
      const V fdw = ref::numeric_grad(fwd_w, to_double(w), to_double(dout));
      EXPECT_TRUE(near(dx, fdx, kRefVsFd)) << "reference dx vs finite differences";
      EXPECT_TRUE(near(dw, fdw, kRefVsFd)) << "reference dw vs finite differences";
      check_op(be(), run_bwd, {add(to_double(dx0), fdx), add(to_double(dw0), fdw)}, kBwd);
    }
    check_op(be(), run_bwd, {add(to_double(dx0), dx), add(to_double(dw0), dw)}, kBwd);
  }
}

// ---- RoPE ---------------------------------------------------------------------------

TEST_P(KernelsLayers, Rope) {
  struct Case {
    int64_t B, S, H, hd, pos;
  };
  const Case cases[] = {
      {1, 1, 1, 2, 0}, {2, 7, 3, 6, 5}, {1, 33, 2, 16, 1000}, {3, 4, 1, 64, 0}, {1, 3, 4, 2, 17}};
  const float theta = 10000.0f;
  // Angles of positions near 1000 in float32 carry ~1e-4 relative error on a device
  // that computes them in single precision; the host uses double angles.
  const Tol tol{1e-4, 1e-4};
  Rng rng(12);
  for (const Case& c : cases) {
    SCOPED_TRACE("B=" + std::to_string(c.B) + " S=" + std::to_string(c.S) +
                 " H=" + std::to_string(c.H) + " hd=" + std::to_string(c.hd) +
                 " pos_offset=" + std::to_string(c.pos));
    const Shape shape{c.B, c.S, c.H, c.hd};
    const int64_t n = shape_numel(shape);
    const auto x = rng.f32(n), dout = rng.f32(n), dx0 = rng.f32(n);
    const V want = ref::rope_fwd(to_double(x), c.B, c.S, c.H, c.hd, c.pos, theta);
    check_op(
        be(),
        [&](Arena& a) -> Outputs {
          Tensor o = a.out(shape);
          a.be().rope_forward(o, a.in(shape, x), c.pos, theta);
          return {{"out", a.get(o)}};
        },
        {want}, tol);
    check_op(
        be(),
        [&](Arena& a) -> Outputs {  // in place: out aliases x
          Tensor t = a.in(shape, x);
          a.be().rope_forward(t, t, c.pos, theta);
          return {{"out (in place)", a.get(t)}};
        },
        {want}, tol);

    const V grad = ref::rope_bwd(to_double(dout), c.B, c.S, c.H, c.hd, c.pos, theta);
    const auto run_bwd = [&](Arena& a) -> Outputs {
      Tensor dx = a.in(shape, dx0);
      a.be().rope_backward(dx, a.in(shape, dout), c.pos, theta);
      return {{"dx", a.get(dx)}};
    };
    if (n <= 300) {
      const V fd = ref::numeric_grad(
          [&](const V& xv) { return ref::rope_fwd(xv, c.B, c.S, c.H, c.hd, c.pos, theta); },
          to_double(x), to_double(dout));
      EXPECT_TRUE(near(grad, fd, kRefVsFd)) << "reference backward vs finite differences";
      check_op(be(), run_bwd, {add(to_double(dx0), fd)}, tol);
    }
    check_op(be(), run_bwd, {add(to_double(dx0), grad)}, tol);
  }
}

// The host keeps the last sin/cos table per thread: calls that alternate
// theta and the position offset at one shape must each get their own table.
TEST_P(KernelsLayers, RopeAlternatingThetaAndOffset) {
  const Shape shape{2, 5, 2, 8};
  Rng rng(13);
  const auto x = rng.f32(shape_numel(shape));
  for (int round = 0; round < 2; ++round)
    for (const auto& [theta, pos] : {std::pair<float, int64_t>{10000.0f, 0}, {500.0f, 0}, {500.0f, 7}, {10000.0f, 7}}) {
      SCOPED_TRACE("theta=" + std::to_string(theta) + " pos=" + std::to_string(pos));
      const V want = ref::rope_fwd(to_double(x), 2, 5, 2, 8, pos, theta);
      check_op(
          be(),
          [&](Arena& a) -> Outputs {
            Tensor o = a.out(shape);
            a.be().rope_forward(o, a.in(shape, x), pos, theta);
            return {{"out", a.get(o)}};
          },
          {want}, Tol{1e-5, 1e-5});
    }
}

TEST_P(KernelsLayers, RopeRejectsOddHeadDim) {
  Tensor x = be().zeros({1, 2, 1, 3});
  EXPECT_THROW(be().rope_forward(x, x, 0, 10000.0f), std::invalid_argument);
  Tensor y = be().zeros({1, 2, 1, 4}), z = be().zeros({1, 2, 2, 2});
  EXPECT_THROW(be().rope_forward(z, y, 0, 10000.0f), std::invalid_argument);
}

TROUPE_INSTANTIATE_BACKENDS(KernelsLayers);

}  // namespace
}  // namespace troupe::kernels::testing
