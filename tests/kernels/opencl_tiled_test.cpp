// The OpenCL backend's tiled attention and radix-sorted embedding backward at
// shapes the shared per-op tests do not reach: sequences of several 64-row
// blocks and 32-row tiles with ragged ends, head dims that are not a multiple
// of the kernels' 8-float vectors (up to MAX_HD = 256), views at element
// offsets, long token sequences with hot ids and vocabularies that need 1 to 4
// radix passes. Attention is checked against the float64 reference (whose
// backward tests/kernels/kernels_attention_test.cpp checks against finite differences;
// one case here checks against finite differences directly); the embedding
// backward bitwise against a sequential float32 sum in position order, the
// order the backend promises. Attention runs at several block and tile caps
// (opencl_set_attention_caps); every case repeats bitwise, and the embedding
// result is the same bits whatever the sort's work-group size.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "kernels/opencl_context.hpp"
#include "tests/kernels/kernels_reference.hpp"
#include "tests/kernels/opencl_test_util.hpp"

namespace troupe::kernels {
namespace {

using ref::V;

using cltest::randv;

V to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

// Every element within atol + rtol * |want|; names the worst one otherwise.
void expect_near(const std::vector<float>& got, const V& want, double atol, double rtol,
                 const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  size_t bad = 0, worst = 0;
  double worst_err = -1.0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(got[i] - want[i]);
    if (!(err <= atol + rtol * std::abs(want[i]))) ++bad;  // NaN counts as bad
    if (!(err <= worst_err)) worst_err = err, worst = i;
  }
  EXPECT_EQ(bad, 0u) << what << ": " << bad << " of " << got.size() << " off; worst [" << worst
                     << "] got " << got[worst] << " want " << want[worst];
}

void expect_same_bits(const std::vector<float>& a, const std::vector<float>& b,
                      const std::string& what) {
  ASSERT_EQ(a.size(), b.size()) << what;
  EXPECT_EQ(std::memcmp(a.data(), b.data(), a.size() * sizeof(float)), 0) << what;
}

struct AttnCase {
  int64_t B, S, H, hd;
};

std::string label(const AttnCase& c) {
  return "B=" + std::to_string(c.B) + " S=" + std::to_string(c.S) + " H=" + std::to_string(c.H) +
         " hd=" + std::to_string(c.hd);
}

// The kernels take 64 rows per work-group and stage 32-row tiles: S = 64 ends
// on a block edge, 65 and 97 go past one, 257 and 600 have many blocks with a
// ragged last one; hd 3, 13, 40, 100 leave a partial 8-float vector, 256 is MAX_HD.
const AttnCase kAttn[] = {{1, 64, 1, 8},  {2, 65, 2, 13}, {1, 97, 3, 40}, {1, 257, 2, 32},
                          {1, 600, 1, 3}, {1, 130, 1, 100}, {1, 70, 1, 256}};

struct AttnRun {
  std::vector<float> out, lse, dq, dk, dv;
};

// Forward, then backward accumulating into dq0/dk0/dv0, on q, k, v, dout that
// are views at odd element offsets into larger buffers.
AttnRun run_attention(Backend& be, const AttnCase& c, const std::vector<float>& q,
                      const std::vector<float>& k, const std::vector<float>& v,
                      const std::vector<float>& dout, const std::vector<float>& g0) {
  const Shape shape{c.B, c.S, c.H, c.hd};
  const int64_t n = shape_numel(shape);
  auto at_offset = [&](const std::vector<float>& x, int64_t off) {
    std::vector<float> buf(static_cast<size_t>(n + off), 7.0f);
    std::copy(x.begin(), x.end(), buf.begin() + off);
    return be.from_f32({n + off}, buf).view(off, shape);
  };
  Tensor tq = at_offset(q, 3), tk = at_offset(k, 5), tv = at_offset(v, 1);
  Tensor out = be.empty(shape), lse = be.empty({c.B, c.H, c.S});
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));
  be.attention_forward(out, lse, tq, tk, tv, scale);
  Tensor dq = be.from_f32(shape, g0), dk = be.from_f32(shape, g0), dv = be.from_f32(shape, g0);
  be.attention_backward(dq, dk, dv, at_offset(dout, 11), tq, tk, tv, out, lse, scale);
  return {be.download_f32(out), be.download_f32(lse), be.download_f32(dq), be.download_f32(dk),
          be.download_f32(dv)};
}

// Block and tile caps: the defaults (64-row blocks, 32-row tiles), then
// smaller ones as devices with little __local memory or small work-groups
// get them: tiles smaller than a vector (4, 1) and blocks smaller than a
// tile, down to one row per group.
struct Caps {
  size_t block, tile;
};
const Caps kCaps[] = {{64, 32}, {16, 8}, {8, 4}, {4, 16}, {1, 1}};

TEST(OpenclTiled, AttentionMatchesFloat64AcrossTilesAndRepeats) {
  TROUPE_REQUIRE_OPENCL_BACKEND(cl);
  uint64_t seed = 100;
  for (const AttnCase& c : kAttn) {
    SCOPED_TRACE(label(c));
    const size_t n = static_cast<size_t>(c.B * c.S * c.H * c.hd);
    const double scale = 1.0 / std::sqrt(static_cast<double>(static_cast<float>(c.hd)));
    const auto q = randv(n, ++seed, -2, 2), k = randv(n, ++seed, -2, 2), v = randv(n, ++seed);
    const auto dout = randv(n, ++seed), g0 = randv(n, ++seed);
    V out, lse, dq, dk, dv;
    const V qd = to_double(q), kd = to_double(k), vd = to_double(v);
    ref::attention_fwd(out, lse, qd, kd, vd, c.B, c.S, c.H, c.hd, scale);
    ref::attention_bwd(dq, dk, dv, to_double(dout), qd, kd, vd, c.B, c.S, c.H, c.hd, scale);
    for (size_t i = 0; i < n; ++i) dq[i] += g0[i], dk[i] += g0[i], dv[i] += g0[i];
    for (const Caps& caps : kCaps) {
      SCOPED_TRACE("block cap " + std::to_string(caps.block) + ", tile cap " +
                   std::to_string(caps.tile));
      opencl_set_attention_caps(cl, caps.block, caps.tile);
      const AttnRun got = run_attention(cl, c, q, k, v, dout, g0);
      expect_near(got.out, out, 2e-5, 1e-4, "out");
      expect_near(got.lse, lse, 2e-5, 1e-4, "lse");
      // The backward starts from the float forward's out and lse; hd 256 and
      // 600-long rows add more float rounding than the shared tests' shapes.
      expect_near(got.dq, dq, 2e-4, 2e-4, "dq");
      expect_near(got.dk, dk, 2e-4, 2e-4, "dk");
      expect_near(got.dv, dv, 2e-4, 2e-4, "dv");
      const AttnRun again = run_attention(cl, c, q, k, v, dout, g0);
      expect_same_bits(again.out, got.out, "out repeats");
      expect_same_bits(again.lse, got.lse, "lse repeats");
      expect_same_bits(again.dq, got.dq, "dq repeats");
      expect_same_bits(again.dk, got.dk, "dk repeats");
      expect_same_bits(again.dv, got.dv, "dv repeats");
    }
  }
  opencl_set_attention_caps(cl, 64, 32);
}

TEST(OpenclTiled, AttentionCapsAreChecked) {
  TROUPE_REQUIRE_OPENCL_BACKEND(cl);
  EXPECT_THROW(opencl_set_attention_caps(cl, 128, 32), std::invalid_argument);
  EXPECT_THROW(opencl_set_attention_caps(cl, 64, 64), std::invalid_argument);
  EXPECT_THROW(opencl_set_attention_caps(cl, 48, 32), std::invalid_argument);
  EXPECT_THROW(opencl_set_attention_caps(cl, 64, 0), std::invalid_argument);
  EXPECT_NO_THROW(opencl_set_attention_caps(cl, 64, 32));
}

// The gradient itself, against central differences of the float64 forward, on
// a sequence of two blocks and three tiles (so rows of different blocks and
// tiles all contribute to every dk, dv row near the start).
TEST(OpenclTiled, AttentionGradientMatchesFiniteDifferences) {
  TROUPE_REQUIRE_OPENCL_BACKEND(cl);
  const AttnCase c{1, 70, 2, 5};
  const size_t n = static_cast<size_t>(c.B * c.S * c.H * c.hd);
  const double scale = 1.0 / std::sqrt(static_cast<double>(static_cast<float>(c.hd)));
  const auto q = randv(n, 1, -2, 2), k = randv(n, 2, -2, 2), v = randv(n, 3), dout = randv(n, 4);
  const AttnRun got = run_attention(cl, c, q, k, v, dout, std::vector<float>(n, 0.0f));
  const V qd = to_double(q), kd = to_double(k), vd = to_double(v), g = to_double(dout);
  auto fwd = [&](const V& qq, const V& kk, const V& vv) {
    V o, l;
    ref::attention_fwd(o, l, qq, kk, vv, c.B, c.S, c.H, c.hd, scale);
    return o;
  };
  expect_near(got.dq, ref::numeric_grad([&](const V& x) { return fwd(x, kd, vd); }, qd, g), 1e-4,
              1e-4, "dq vs finite differences");
  expect_near(got.dk, ref::numeric_grad([&](const V& x) { return fwd(qd, x, vd); }, kd, g), 1e-4,
              1e-4, "dk vs finite differences");
  expect_near(got.dv, ref::numeric_grad([&](const V& x) { return fwd(qd, kd, x); }, vd, g), 1e-4,
              1e-4, "dv vs finite differences");
}

// The overwrite variant writes every gradient element (NaN in the outputs
// must go) and gives the bits of zero-fill-then-accumulate.
TEST(OpenclTiled, AttentionBackwardOverwriteIsFillThenAccumulate) {
  TROUPE_REQUIRE_OPENCL_BACKEND(cl);
  const Shape shape{2, 97, 2, 13};
  const int64_t n = shape_numel(shape);
  const float scale = 0.3f;
  Tensor q = cl.from_f32(shape, randv(n, 5, -2, 2)), k = cl.from_f32(shape, randv(n, 6, -2, 2));
  Tensor v = cl.from_f32(shape, randv(n, 7)), dout = cl.from_f32(shape, randv(n, 8));
  Tensor out = cl.empty(shape), lse = cl.empty({2, 2, 97});
  cl.attention_forward(out, lse, q, k, v, scale);
  const std::vector<float> nan(static_cast<size_t>(n), std::numeric_limits<float>::quiet_NaN());
  Tensor dq = cl.from_f32(shape, nan), dk = cl.from_f32(shape, nan), dv = cl.from_f32(shape, nan);
  cl.attention_backward_overwrite(dq, dk, dv, dout, q, k, v, out, lse, scale);
  Tensor zq = cl.zeros(shape), zk = cl.zeros(shape), zv = cl.zeros(shape);
  cl.attention_backward(zq, zk, zv, dout, q, k, v, out, lse, scale);
  expect_same_bits(cl.download_f32(dq), cl.download_f32(zq), "dq");
  expect_same_bits(cl.download_f32(dk), cl.download_f32(zk), "dk");
  expect_same_bits(cl.download_f32(dv), cl.download_f32(zv), "dv");
}

// ---- embedding backward ----

// dtable0 plus, for each id, its tokens' dout rows added one by one in
// position order: the promised summation order, in float32.
std::vector<float> sequential_embedding_bwd(std::vector<float> dtable, const std::vector<float>& dout,
                                            const std::vector<int32_t>& ids, int64_t D) {
  for (size_t t = 0; t < ids.size(); ++t)
    for (int64_t d = 0; d < D; ++d)
      dtable[static_cast<size_t>(ids[t] * D + d)] += dout[t * static_cast<size_t>(D) + d];
  return dtable;
}

struct EmbCase {
  int64_t T, D, V;
  int hot_percent;  // share of tokens that are id V/2
};

// V = 1: one segment; 15/16/17 around one radix digit (16 as a key needs a
// second pass); 256 and 50000: 3 and 4 passes. T = 20000 would take the old
// all-pairs rank 4e8 comparisons. D = 13 leaves a partial 8-column group.
const EmbCase kEmb[] = {{1, 8, 1, 0},       {300, 13, 1, 0},    {777, 16, 15, 0},
                        {777, 16, 16, 0},   {777, 16, 17, 30},  {2048, 128, 256, 50},
                        {20000, 24, 50000, 40}, {5000, 13, 300, 90}};

std::vector<int32_t> emb_ids(const EmbCase& c, uint64_t seed) {
  std::vector<int32_t> ids(static_cast<size_t>(c.T));
  uint64_t s = seed;
  for (int32_t& id : ids) {
    s = s * 6364136223846793005ull + 1442695040888963407ull;
    const int64_t r = static_cast<int64_t>(s >> 33);
    id = static_cast<int32_t>(r % 100 < c.hot_percent ? c.V / 2 : (r / 100) % c.V);
  }
  return ids;
}

TEST(OpenclTiled, EmbeddingBackwardSumsInPositionOrderAtAnyGroupSize) {
  TROUPE_REQUIRE_OPENCL_BACKEND(cl);
  const size_t default_cap = opencl_row_group_cap(cl);
  uint64_t seed = 200;
  for (const EmbCase& c : kEmb) {
    SCOPED_TRACE("T=" + std::to_string(c.T) + " D=" + std::to_string(c.D) +
                 " V=" + std::to_string(c.V));
    const auto ids = emb_ids(c, ++seed);
    const auto dout = randv(static_cast<size_t>(c.T * c.D), ++seed);
    const auto dtable0 = randv(static_cast<size_t>(c.V * c.D), ++seed);
    const std::vector<float> want = sequential_embedding_bwd(dtable0, dout, ids, c.D);
    Tensor tok = cl.from_i32({c.T}, ids), tdout = cl.from_f32({c.T, c.D}, dout);
    // The row cap sets the sort's work-group size (1 on CPU devices by default).
    for (size_t cap : {size_t{1}, size_t{8}, size_t{256}}) {
      SCOPED_TRACE("sort work-group cap " + std::to_string(cap));
      opencl_set_row_group_cap(cl, cap);
      for (int rep = 0; rep < 2; ++rep) {
        Tensor dtable = cl.from_f32({c.V, c.D}, dtable0);
        cl.embedding_backward(dtable, tdout, tok);
        expect_same_bits(cl.download_f32(dtable), want, "dtable");
      }
    }
    opencl_set_row_group_cap(cl, default_cap);
  }
}

TEST(OpenclTiled, EmbeddingBackwardReportsBadIdsAndKeepsWorking) {
  TROUPE_REQUIRE_OPENCL_BACKEND(cl);
  const int64_t V = 20, D = 9;
  const std::vector<int32_t> bad = {3, -1, 7, 20, 3, 1 << 20, -1};
  Tensor dtable = cl.zeros({V, D});
  const auto dout = randv(bad.size() * D, 9);
  try {
    cl.embedding_backward(dtable, cl.from_f32({static_cast<int64_t>(bad.size()), D}, dout),
                          cl.from_i32({static_cast<int64_t>(bad.size())}, bad));
    cl.synchronize();
    ADD_FAILURE() << "bad ids were not reported";
  } catch (const std::invalid_argument& e) {
    EXPECT_CONTAINS(e.what(), "opencl embedding_backward: bad input: token id outside [0, vocab)");
  }
  const std::vector<int32_t> good = {3, 19, 0, 3};
  const auto dout2 = randv(good.size() * D, 10);
  Tensor fresh = cl.zeros({V, D});
  cl.embedding_backward(fresh, cl.from_f32({4, D}, dout2), cl.from_i32({4}, good));
  expect_same_bits(cl.download_f32(fresh),
                   sequential_embedding_bwd(std::vector<float>(V * D, 0.0f), dout2, good, D),
                   "dtable after the error");
}

}  // namespace
}  // namespace troupe::kernels
