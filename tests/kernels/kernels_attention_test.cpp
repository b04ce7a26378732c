// Causal attention tests on every backend: forward (out and lse) against a
// naive float64 reference; backward (dq, dk, dv accumulated into random
// values) against finite differences on small shapes and the analytic float64
// backward on all shapes, including sequences longer than one query block.
#include <gtest/gtest.h>

#include <cmath>

#include "tests/kernels/kernels_harness.hpp"
#include "tests/kernels/kernels_reference.hpp"

namespace troupe::kernels::testing {
namespace {

using ref::V;

constexpr Tol kFwd{2e-5, 1e-4};
constexpr Tol kBwd{1e-4, 1e-4};
constexpr Tol kRefVsFd{1e-7, 1e-6};

class KernelsAttention : public BackendTest {};

struct Case {
  int64_t B, S, H, hd;
};

std::string label(const Case& c) {
  return "B=" + std::to_string(c.B) + " S=" + std::to_string(c.S) + " H=" + std::to_string(c.H) +
         " hd=" + std::to_string(c.hd);
}

// The host kernel tiles queries by 32 and keys by 128: S = 32 and 128 end on
// a tile edge, 33 and 129 go one past it, 300 has three key tiles (the last
// partial) and an online-softmax rescale in every block past the first tile.
const Case kCases[] = {{1, 1, 1, 2},   {2, 7, 3, 6},   {1, 9, 2, 4},   {1, 33, 2, 16},
                       {1, 70, 1, 8},  {2, 130, 2, 4}, {1, 17, 4, 32}, {1, 32, 1, 4},
                       {1, 128, 1, 4}, {1, 129, 2, 8}, {1, 300, 2, 6}};

TEST_P(KernelsAttention, Forward) {
  Rng rng(20);
  for (const Case& c : kCases) {
    SCOPED_TRACE(label(c));
    const Shape shape{c.B, c.S, c.H, c.hd};
    const int64_t n = shape_numel(shape);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
    const auto q = rng.f32(n, -2, 2), k = rng.f32(n, -2, 2), v = rng.f32(n);
    V out, lse;
    ref::attention_fwd(out, lse, to_double(q), to_double(k), to_double(v), c.B, c.S, c.H, c.hd,
                       scale);
    check_op(
        be(),
        [&](Arena& a) -> Outputs {
          Tensor o = a.out(shape), l = a.out({c.B, c.H, c.S});
          a.be().attention_forward(o, l, a.in(shape, q), a.in(shape, k), a.in(shape, v), scale);
          return {{"out", a.get(o)}, {"lse", a.get(l)}};
        },
        {out, lse}, kFwd);
  }
}

TEST_P(KernelsAttention, Backward) {
  Rng rng(21);
  for (const Case& c : kCases) {
    SCOPED_TRACE(label(c));
    const Shape shape{c.B, c.S, c.H, c.hd};
    const int64_t n = shape_numel(shape);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
    const auto q = rng.f32(n, -2, 2), k = rng.f32(n, -2, 2), v = rng.f32(n);
    const auto dout = rng.f32(n), dq0 = rng.f32(n), dk0 = rng.f32(n), dv0 = rng.f32(n);
    const V qd = to_double(q), kd = to_double(k), vd = to_double(v);
    V out, lse, dq, dk, dv;
    ref::attention_fwd(out, lse, qd, kd, vd, c.B, c.S, c.H, c.hd, scale);
    ref::attention_bwd(dq, dk, dv, to_double(dout), qd, kd, vd, c.B, c.S, c.H, c.hd, scale);
    // The backward gets the forward's out and lse (here: the reference's, rounded).
    const std::vector<float> out_f(out.begin(), out.end()), lse_f(lse.begin(), lse.end());
    const auto run = [&](Arena& a) -> Outputs {
      Tensor tq = a.in(shape, dq0), tk = a.in(shape, dk0), tv = a.in(shape, dv0);
      a.be().attention_backward(tq, tk, tv, a.in(shape, dout), a.in(shape, q), a.in(shape, k),
                                a.in(shape, v), a.in(shape, out_f), a.in({c.B, c.H, c.S}, lse_f),
                                scale);
      return {{"dq", a.get(tq)}, {"dk", a.get(tk)}, {"dv", a.get(tv)}};
    };
    if (n <= 300) {
      const auto fwd = [&](const V& qq, const V& kk, const V& vv) {
        V o, l;
        ref::attention_fwd(o, l, qq, kk, vv, c.B, c.S, c.H, c.hd, scale);
        return o;
      };
      const V g = to_double(dout);
      const V fq = ref::numeric_grad([&](const V& x) { return fwd(x, kd, vd); }, qd, g);
      const V fk = ref::numeric_grad([&](const V& x) { return fwd(qd, x, vd); }, kd, g);
      const V fv = ref::numeric_grad([&](const V& x) { return fwd(qd, kd, x); }, vd, g);
      EXPECT_TRUE(near(dq, fq, kRefVsFd)) << "reference dq vs finite differences";
      EXPECT_TRUE(near(dk, fk, kRefVsFd)) << "reference dk vs finite differences";
      EXPECT_TRUE(near(dv, fv, kRefVsFd)) << "reference dv vs finite differences";
      check_op(be(), run,
               {add(to_double(dq0), fq), add(to_double(dk0), fk), add(to_double(dv0), fv)}, kBwd);
    }
    check_op(be(), run, {add(to_double(dq0), dq), add(to_double(dk0), dk), add(to_double(dv0), dv)},
             kBwd);
  }
}

TEST_P(KernelsAttention, RejectsMismatchedShapes) {
  Backend& b = be();
  Tensor q = b.zeros({1, 4, 2, 4}), k = b.zeros({1, 4, 2, 4}), v = b.zeros({1, 4, 2, 4});
  Tensor out = b.zeros({1, 4, 2, 4}), lse = b.zeros({1, 2, 4});
  EXPECT_NO_THROW(b.attention_forward(out, lse, q, k, v, 0.5f));
  EXPECT_THROW(b.attention_forward(out, b.zeros({1, 2, 3}), q, k, v, 0.5f), std::invalid_argument);
  EXPECT_THROW(b.attention_forward(out, lse, q, b.zeros({1, 4, 4, 2}), v, 0.5f),
               std::invalid_argument);
  EXPECT_THROW(b.attention_forward(out, lse, b.zeros({4, 2, 4}), k, v, 0.5f),
               std::invalid_argument);
}

// Cached attention: S new queries per sequence at per-sequence positions
// against a cache of C rows (rows past pos+S hold junk that must never be read).
struct CachedCase {
  int64_t B, S, C, H, hd;
  std::vector<int32_t> pos;
};

TEST_P(KernelsAttention, CachedForward) {
  const CachedCase cases[] = {{1, 1, 1, 1, 2, {0}},
                              {3, 1, 9, 2, 4, {0, 8, 3}},
                              {2, 4, 12, 3, 6, {5, 0}},
                              {4, 1, 70, 2, 16, {69, 1, 33, 0}},
                              {2, 3, 20, 4, 32, {17, 9}}};
  Rng rng(22);
  for (const CachedCase& c : cases) {
    SCOPED_TRACE("B=" + std::to_string(c.B) + " S=" + std::to_string(c.S) + " C=" +
                 std::to_string(c.C));
    const Shape qs{c.B, c.S, c.H, c.hd}, cs{c.B, c.C, c.H, c.hd};
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
    const auto q = rng.f32(shape_numel(qs), -2, 2);
    const auto kc = rng.f32(shape_numel(cs), -2, 2), vc = rng.f32(shape_numel(cs));
    const V want = ref::attention_cached_fwd(to_double(q), to_double(kc), to_double(vc), c.pos,
                                             c.B, c.S, c.C, c.H, c.hd, scale);
    check_op(
        be(),
        [&](Arena& a) -> Outputs {
          Tensor o = a.out(qs);
          a.be().attention_cached(o, a.in(qs, q), a.in(cs, kc), a.in(cs, vc), c.pos, scale);
          return {{"out", a.get(o)}};
        },
        {want}, kFwd);
  }
}

// With the whole sequence as new queries at position 0, cached attention is
// causal attention: the decoder's prefill and training paths agree.
TEST_P(KernelsAttention, CachedEqualsCausalOnFullSequence) {
  Rng rng(23);
  const int64_t B = 2, S = 11, H = 2, hd = 8;
  const Shape shape{B, S, H, hd};
  const int64_t n = shape_numel(shape);
  const auto q = rng.f32(n, -2, 2), k = rng.f32(n, -2, 2), v = rng.f32(n);
  Backend& b = be();
  Tensor tq = b.from_f32(shape, q), tk = b.from_f32(shape, k), tv = b.from_f32(shape, v);
  Tensor o1 = b.zeros(shape), o2 = b.zeros(shape), lse = b.zeros({B, H, S});
  b.attention_forward(o1, lse, tq, tk, tv, 0.3f);
  const std::vector<int32_t> pos{0, 0};
  b.attention_cached(o2, tq, tk, tv, pos, 0.3f);
  const auto a1 = b.download_f32(o1), a2 = b.download_f32(o2);
  EXPECT_TRUE(near(a2, to_double(a1), Tol{1e-6, 1e-5}));
}

TEST_P(KernelsAttention, CachedRejectsBadPositionsAndShapes) {
  Backend& b = be();
  Tensor q = b.zeros({2, 2, 2, 4}), out = b.zeros({2, 2, 2, 4});
  Tensor kc = b.zeros({2, 5, 2, 4}), vc = b.zeros({2, 5, 2, 4});
  const std::vector<int32_t> ok{3, 0}, past_end{4, 0}, negative{0, -1}, short_pos{0};
  EXPECT_NO_THROW(b.attention_cached(out, q, kc, vc, ok, 0.5f));
  EXPECT_THROW(b.attention_cached(out, q, kc, vc, past_end, 0.5f), std::invalid_argument);
  EXPECT_THROW(b.attention_cached(out, q, kc, vc, negative, 0.5f), std::invalid_argument);
  EXPECT_THROW(b.attention_cached(out, q, kc, vc, short_pos, 0.5f), std::invalid_argument);
  EXPECT_THROW(b.attention_cached(out, q, b.zeros({2, 5, 1, 4}), vc, ok, 0.5f),
               std::invalid_argument);
  EXPECT_THROW(b.attention_cached(out, q, kc, b.zeros({2, 6, 2, 4}), ok, 0.5f),
               std::invalid_argument);
}

// RoPE at per-sequence positions plus the cache write of a decoding chunk:
// q, k rotated in place, the cache rows at pos[b].. replaced, others kept.
TEST_P(KernelsAttention, RopeKvAppend) {
  const CachedCase cases[] = {{1, 1, 1, 1, 2, {0}},
                              {3, 1, 9, 2, 4, {0, 8, 3}},
                              {2, 4, 12, 3, 6, {5, 0}},
                              {2, 3, 2000, 2, 16, {1500, 1997}}};  // large positions
  Rng rng(24);
  const float theta = 10000.0f;
  for (const CachedCase& c : cases) {
    SCOPED_TRACE("B=" + std::to_string(c.B) + " S=" + std::to_string(c.S) + " C=" +
                 std::to_string(c.C));
    const Shape qs{c.B, c.S, c.H, c.hd}, cs{c.B, c.C, c.H, c.hd};
    const auto q = rng.f32(shape_numel(qs)), k = rng.f32(shape_numel(qs)), v = rng.f32(shape_numel(qs));
    const auto kc = rng.f32(shape_numel(cs)), vc = rng.f32(shape_numel(cs));
    V wq = to_double(q), wk = to_double(k), wkc = to_double(kc), wvc = to_double(vc);
    ref::rope_kv_append(wq, wk, to_double(v), wkc, wvc, c.pos, c.B, c.S, c.C, c.H, c.hd, theta);
    check_op(
        be(),
        [&](Arena& a) -> Outputs {
          Tensor tq = a.in(qs, q), tk = a.in(qs, k), tkc = a.in(cs, kc), tvc = a.in(cs, vc);
          a.be().rope_kv_append(tq, tk, a.in(qs, v), tkc, tvc, c.pos, theta);
          return {{"q", a.get(tq)}, {"k", a.get(tk)}, {"k_cache", a.get(tkc)}, {"v_cache", a.get(tvc)}};
        },
        {wq, wk, wkc, wvc}, Tol{1e-5, 1e-5});
  }
  // Same rotation as rope_forward at pos_offset = pos[b].
  Backend& b = be();
  const Shape qs{2, 3, 2, 8};
  const auto x = rng.f32(shape_numel(qs));
  Tensor q = b.from_f32(qs, x), k = b.from_f32(qs, x), v = b.zeros(qs);
  Tensor kc = b.zeros({2, 10, 2, 8}), vc = b.zeros({2, 10, 2, 8});
  b.rope_kv_append(q, k, v, kc, vc, std::vector<int32_t>{4, 7}, 10000.0f);
  for (int64_t s = 0; s < 2; ++s) {
    Tensor one = b.from_f32({1, 3, 2, 8}, std::vector<float>(x.begin() + s * 48, x.begin() + (s + 1) * 48));
    b.rope_forward(one, one, s == 0 ? 4 : 7, 10000.0f);
    const auto want = b.download_f32(one), got = b.download_f32(q.view(s * 48, {48}));
    EXPECT_TRUE(near(got, to_double(want), Tol{1e-6, 1e-6})) << "sequence " << s;
  }
}

TEST_P(KernelsAttention, RopeKvAppendRejectsBadPositions) {
  Backend& b = be();
  Tensor q = b.zeros({2, 2, 2, 4}), k = b.zeros({2, 2, 2, 4}), v = b.zeros({2, 2, 2, 4});
  Tensor kc = b.zeros({2, 5, 2, 4}), vc = b.zeros({2, 5, 2, 4});
  EXPECT_NO_THROW(b.rope_kv_append(q, k, v, kc, vc, std::vector<int32_t>{3, 0}, 1e4f));
  EXPECT_THROW(b.rope_kv_append(q, k, v, kc, vc, std::vector<int32_t>{4, 0}, 1e4f), std::invalid_argument);
  EXPECT_THROW(b.rope_kv_append(q, k, v, kc, vc, std::vector<int32_t>{-1, 0}, 1e4f), std::invalid_argument);
  EXPECT_THROW(b.rope_kv_append(q, k, v, kc, vc, std::vector<int32_t>{0}, 1e4f), std::invalid_argument);
  EXPECT_THROW(b.rope_kv_append(q, k, b.zeros({2, 2, 2, 2}), kc, vc, std::vector<int32_t>{0, 0}, 1e4f),
               std::invalid_argument);
}

TROUPE_INSTANTIATE_BACKENDS(KernelsAttention);

}  // namespace
}  // namespace troupe::kernels::testing
