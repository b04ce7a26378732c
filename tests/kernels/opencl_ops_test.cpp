// OpenCL ops at shapes larger than the shared per-op tables use (rows wider
// than a work-group, many 32-row chunks, long sequences, big vocabularies,
// repeated ids, ties in top-k): each case runs on the host backend and, for
// several row-reduction work-group sizes (1 as on CPU devices, up to 256 as on
// GPUs), twice on OpenCL; OpenCL must match host within tolerance and repeat
// itself bitwise.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <numeric>
#include <string>
#include <vector>

#include "kernels/opencl_context.hpp"
#include "tests/kernels/opencl_test_util.hpp"

namespace troupe::kernels {
namespace {

using Outs = std::vector<std::pair<std::string, std::vector<float>>>;
using Case = std::function<Outs(Backend&)>;

using cltest::randv;

Backend& host() {
  static std::unique_ptr<Backend> h = make_backend(BackendOptions{});
  return *h;
}

void compare_once(Backend& cl, const Case& c, const Outs& want, double atol, double rtol) {
  const Outs got = c(cl);
  const Outs again = c(cl);
  ASSERT_EQ(got.size(), want.size());
  for (size_t o = 0; o < got.size(); ++o) {
    const auto& [name, g] = got[o];
    const auto& w = want[o].second;
    ASSERT_EQ(g.size(), w.size()) << name;
    size_t bad = 0, worst = 0;
    double worst_err = 0.0;
    for (size_t i = 0; i < g.size(); ++i) {
      const double err = std::abs(static_cast<double>(g[i]) - w[i]);
      if (!(err <= atol + rtol * std::abs(static_cast<double>(w[i])))) {
        ++bad;
        if (!(err <= worst_err)) worst_err = err, worst = i;
      }
    }
    EXPECT_EQ(bad, 0u) << name << ": " << bad << " of " << g.size() << " differ from host; worst ["
                       << worst << "] opencl " << g[worst] << " host " << w[worst];
    ASSERT_EQ(again[o].second.size(), g.size());
    EXPECT_EQ(std::memcmp(again[o].second.data(), g.data(), g.size() * sizeof(float)), 0)
        << name << ": two OpenCL runs differ (non-deterministic)";
  }
}

void compare(Backend& cl, const Case& c, double atol, double rtol) {
  const Outs want = c(host());
  const size_t default_cap = opencl_row_group_cap(cl);
  for (size_t cap : {size_t{1}, size_t{8}, size_t{256}}) {
    SCOPED_TRACE("row work-group cap " + std::to_string(cap));
    opencl_set_row_group_cap(cl, cap);
    compare_once(cl, c, want, atol, rtol);
  }
  opencl_set_row_group_cap(cl, default_cap);
}

std::vector<float> as_float(const std::vector<int32_t>& v) { return {v.begin(), v.end()}; }

TEST(OpenclOps, EmbeddingWithManyRepeatedIds) {
  TROUPE_REQUIRE_OPENCL_BACKEND(cl);
  const int64_t V = 50, D = 70, T = 600;
  std::vector<int32_t> ids(T);
  for (int64_t t = 0; t < T; ++t) ids[t] = static_cast<int32_t>((t * t + 3 * t) % V);
  compare(cl, [&](Backend& be) -> Outs {
    Tensor table = be.from_f32({V, D}, randv(V * D, 1));
    Tensor tok = be.from_i32({T}, ids);
    Tensor out = be.empty({T, D});
    be.embedding_forward(out, table, tok);
    Tensor dtable = be.from_f32({V, D}, randv(V * D, 2));
    be.embedding_backward(dtable, be.from_f32({T, D}, randv(T * D, 3)), tok);
    return {{"out", be.download_f32(out)}, {"dtable", be.download_f32(dtable)}};
  }, 1e-5, 1e-5);
}

TEST(OpenclOps, RmsnormWideRowsManyChunks) {
  TROUPE_REQUIRE_OPENCL_BACKEND(cl);
  const int64_t T = 70, D = 600;
  compare(cl, [&](Backend& be) -> Outs {
    Tensor x = be.from_f32({T, D}, randv(T * D, 4, -2, 2)), w = be.from_f32({D}, randv(D, 5));
    Tensor out = be.empty({T, D}), rstd = be.empty({T});
    be.rmsnorm_forward(out, rstd, x, w, 1e-5f);
    Tensor dx = be.from_f32({T, D}, randv(T * D, 6)), dw = be.from_f32({D}, randv(D, 7));
    be.rmsnorm_backward(dx, dw, be.from_f32({T, D}, randv(T * D, 8)), x, w, rstd);
    return {{"out", be.download_f32(out)}, {"rstd", be.download_f32(rstd)},
            {"dx", be.download_f32(dx)}, {"dw", be.download_f32(dw)}};
  }, 1e-5, 1e-4);
}

TEST(OpenclOps, RopeAtLargePositions) {
  TROUPE_REQUIRE_OPENCL_BACKEND(cl);
  const int64_t B = 2, S = 300, H = 2, hd = 64, n = B * S * H * hd;
  compare(cl, [&](Backend& be) -> Outs {
    Tensor x = be.from_f32({B, S, H, hd}, randv(n, 9));
    Tensor out = be.empty({B, S, H, hd});
    be.rope_forward(out, x, 1000, 10000.0f);
    be.rope_forward(x, x, 1000, 10000.0f);  // in place
    Tensor dx = be.from_f32({B, S, H, hd}, randv(n, 10));
    be.rope_backward(dx, out, 1000, 10000.0f);
    return {{"out", be.download_f32(out)}, {"inplace", be.download_f32(x)},
            {"dx", be.download_f32(dx)}};
  }, 1e-5, 1e-5);
}

TEST(OpenclOps, AttentionLongerSequence) {
  TROUPE_REQUIRE_OPENCL_BACKEND(cl);
  const int64_t B = 2, S = 70, H = 3, hd = 64, n = B * S * H * hd;
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  compare(cl, [&](Backend& be) -> Outs {
    Tensor q = be.from_f32({B, S, H, hd}, randv(n, 11, -2, 2));
    Tensor k = be.from_f32({B, S, H, hd}, randv(n, 12, -2, 2));
    Tensor v = be.from_f32({B, S, H, hd}, randv(n, 13));
    Tensor out = be.empty({B, S, H, hd}), lse = be.empty({B, H, S});
    be.attention_forward(out, lse, q, k, v, scale);
    Tensor dq = be.from_f32({B, S, H, hd}, randv(n, 14)), dk = be.zeros({B, S, H, hd});
    Tensor dv = be.zeros({B, S, H, hd});
    be.attention_backward(dq, dk, dv, be.from_f32({B, S, H, hd}, randv(n, 15)), q, k, v, out, lse,
                          scale);
    return {{"out", be.download_f32(out)}, {"lse", be.download_f32(lse)},
            {"dq", be.download_f32(dq)},   {"dk", be.download_f32(dk)},
            {"dv", be.download_f32(dv)}};
  }, 2e-5, 2e-4);
}

TEST(OpenclOps, CrossEntropyLargeVocabWithIgnored) {
  TROUPE_REQUIRE_OPENCL_BACKEND(cl);
  const int64_t T = 40, V = 1000;
  std::vector<int32_t> tgt(T);
  for (int64_t t = 0; t < T; ++t) tgt[t] = t % 7 == 3 ? -100 : static_cast<int32_t>((t * 37) % V);
  compare(cl, [&](Backend& be) -> Outs {
    Tensor logits = be.from_f32({T, V}, randv(T * V, 16, -8, 8));
    Tensor targets = be.from_i32({T}, tgt), losses = be.empty({T});
    be.cross_entropy_forward(losses, logits, targets, -100);
    Tensor d = be.from_f32({T, V}, randv(T * V, 17));
    be.cross_entropy_backward(d, logits, targets, -100, 1.0f / 35.0f);
    return {{"losses", be.download_f32(losses)}, {"dlogits", be.download_f32(d)}};
  }, 1e-5, 1e-5);
}

TEST(OpenclOps, RouterSoftmaxTopkWithTies) {
  TROUPE_REQUIRE_OPENCL_BACKEND(cl);
  const int64_t T = 100, E = 64, K = 6;
  std::vector<float> x = randv(T * E, 18, -3, 3);
  for (float& v : x) v = std::round(v * 2.0f) / 2.0f;  // coarse values: many exact ties
  std::vector<float> bias(E, 0.0f);
  for (int64_t e = 0; e < E; e += 5) bias[e] = 0.5f;
  for (bool renorm : {false, true}) {
    compare(cl, [&](Backend& be) -> Outs {
      Tensor xs = be.from_f32({T, E}, x), p = be.empty({T, E});
      be.softmax_forward(p, xs);
      Tensor w = be.empty({T, K}), ids = be.empty({T, K}, DType::i32);
      be.topk_forward(w, ids, xs, be.from_f32({E}, bias), renorm);  // raw scores: exact ties
      Tensor w2 = be.empty({T, K}), ids2 = be.empty({T, K}, DType::i32);
      be.topk_forward(w2, ids2, p, Tensor(), renorm);
      Tensor dp = be.from_f32({T, E}, randv(T * E, 19));
      be.topk_backward(dp, be.from_f32({T, K}, randv(T * K, 20)), w2, ids2, p, renorm);
      Tensor dx = be.from_f32({T, E}, randv(T * E, 21));
      be.softmax_backward(dx, dp, p);
      return {{"p", be.download_f32(p)},       {"w", be.download_f32(w)},
              {"ids", as_float(be.download_i32(ids))}, {"w2", be.download_f32(w2)},
              {"ids2", as_float(be.download_i32(ids2))}, {"dp", be.download_f32(dp)},
              {"dx", be.download_f32(dx)}};
    }, 1e-5, 1e-5);
  }
}

TEST(OpenclOps, SumRowsAndAddRowOverManyRows) {
  TROUPE_REQUIRE_OPENCL_BACKEND(cl);
  const int64_t T = 1000, E = 37;
  compare(cl, [&](Backend& be) -> Outs {
    Tensor x = be.from_f32({T, E}, randv(T * E, 22));
    Tensor s = be.from_f32({E}, randv(E, 23));
    be.sum_rows(s, x);
    be.add_row(x, be.from_f32({E}, randv(E, 24)), -0.75f);
    return {{"sum", be.download_f32(s)}, {"x", be.download_f32(x)}};
  }, 1e-5, 1e-5);
}

TEST(OpenclOps, PermutationRoundTrip) {
  TROUPE_REQUIRE_OPENCL_BACKEND(cl);
  const int64_t T = 64, K = 2, D = 96, N = T * K;
  // Slot (t, j) -> a shuffled row; every 9th routed copy is dropped (-1).
  std::vector<int32_t> perm(N);
  std::iota(perm.begin(), perm.end(), 0);
  for (int64_t i = N - 1; i > 0; --i) std::swap(perm[i], perm[(i * 7919) % (i + 1)]);
  std::vector<int32_t> slots(N), idx(N);
  for (int64_t s = 0; s < N; ++s) {
    slots[s] = s % 9 == 4 ? -1 : perm[s];
    idx[perm[s]] = static_cast<int32_t>(s / K);  // row perm[s] holds token s / K
  }
  compare(cl, [&](Backend& be) -> Outs {
    Tensor x = be.from_f32({T, D}, randv(T * D, 25));
    Tensor sl = be.from_i32({T, K}, slots), ix = be.from_i32({N}, idx);
    Tensor y = be.empty({N, D});
    be.gather_rows(y, x, ix);
    Tensor back = be.from_f32({T, D}, randv(T * D, 26));
    be.sum_slots(back, y, sl);
    Tensor weights = be.from_f32({T, K}, randv(T * K, 27, 0, 1));
    Tensor out = be.from_f32({T, D}, randv(T * D, 28));
    be.combine_forward(out, y, sl, weights);
    Tensor dy = be.from_f32({N, D}, randv(N * D, 29)), dw = be.from_f32({T, K}, randv(T * K, 30));
    be.combine_backward(dy, dw, be.from_f32({T, D}, randv(T * D, 31)), y, sl, weights);
    return {{"y", be.download_f32(y)}, {"back", be.download_f32(back)},
            {"out", be.download_f32(out)}, {"dy", be.download_f32(dy)},
            {"dw", be.download_f32(dw)}};
  }, 1e-5, 1e-5);
}

TEST(OpenclOps, ActivationsAndAdamWOnLongVectors) {
  TROUPE_REQUIRE_OPENCL_BACKEND(cl);
  const int64_t n = 100003;
  compare(cl, [&](Backend& be) -> Outs {
    Tensor g = be.from_f32({n}, randv(n, 32, -6, 6)), u = be.from_f32({n}, randv(n, 33));
    Tensor s = be.empty({n}), sw = be.empty({n});
    be.silu_forward(s, g);
    be.swiglu_forward(sw, g, u);
    Tensor dg = be.from_f32({n}, randv(n, 34)), du = be.from_f32({n}, randv(n, 35));
    Tensor dout = be.from_f32({n}, randv(n, 36));
    be.silu_backward(dg, dout, g);
    be.swiglu_backward(dg, du, dout, g, u);
    Tensor p = be.from_f32({n}, randv(n, 37)), m = be.zeros({n}), v = be.zeros({n});
    AdamWParams hp;
    hp.weight_decay = 0.1f;
    for (int step = 1; step <= 2; ++step) {
      hp.step = step;
      be.adamw(p, step == 1 ? dg : du, m, v, hp);
    }
    return {{"silu", be.download_f32(s)}, {"swiglu", be.download_f32(sw)},
            {"dg", be.download_f32(dg)},  {"du", be.download_f32(du)},
            {"p", be.download_f32(p)},    {"m", be.download_f32(m)},
            {"v", be.download_f32(v)}};
  }, 1e-6, 1e-5);
}

TEST(OpenclOps, GemmLargerThanTiles) {
  TROUPE_REQUIRE_OPENCL_BACKEND(cl);
  const int64_t m = 130, n = 70, k = 300;
  for (int tr = 0; tr < 4; ++tr) {
    const bool ta = tr & 1, tb = tr & 2;
    compare(cl, [&](Backend& be) -> Outs {
      Tensor a = be.from_f32({m * k}, randv(m * k, 38)), b = be.from_f32({k * n}, randv(k * n, 39));
      Tensor c = be.from_f32({m * n}, randv(m * n, 40));
      be.gemm(ta, tb, m, n, k, 0.5f, a, b, -1.0f, c);
      return {{"c", be.download_f32(c)}};
    }, 1e-4, 1e-4);
  }
}

}  // namespace
}  // namespace troupe::kernels
