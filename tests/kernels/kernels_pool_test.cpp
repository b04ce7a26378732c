// The host backend's threads (kernels/host_pool.hpp): HostPool hands out every
// item once and rethrows a body's exception; a 2-thread host backend, which
// runs grouped GEMM groups, attention heads and the row blocks of a large GEMM
// concurrently with single-threaded BLAS, gives the same bits as a 1-thread
// one (at shapes where OpenBLAS's own results differ between 1 and 2 threads,
// e.g. 67x129x33), the float64 reference's values, and the same bits on every
// run, also while another device's backend computes at the same time; grouped
// GEMMs whose outputs overlap still accumulate in order.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <cstring>
#include <functional>
#include <memory>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "kernels/host_pool.hpp"
#include "tests/kernels/kernels_harness.hpp"
#include "tests/kernels/kernels_reference.hpp"

namespace troupe::kernels::testing {
namespace {

using Results = std::vector<std::vector<float>>;

// Runs `fn` on a fresh host backend with `threads` threads.
Results on_host(int threads, const std::function<Results(Backend&)>& fn) {
  BackendOptions o;
  o.threads = threads;
  std::unique_ptr<Backend> b = make_backend(o);
  return fn(*b);
}

bool bitwise_equal(const Results& a, const Results& b) {
  if (a.size() != b.size()) return false;
  for (size_t i = 0; i < a.size(); ++i)
    if (a[i].size() != b[i].size() ||
        std::memcmp(a[i].data(), b[i].data(), a[i].size() * sizeof(float)) != 0)
      return false;
  return true;
}

TEST(HostPool, RunsEveryItemOnceOnEveryThreadCount) {
  for (int threads : {1, 2, 3}) {
    host::HostPool pool(threads);
    EXPECT_EQ(pool.size(), threads);
    for (int64_t n : {0, 1, 2, 7, 100}) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      std::atomic<int> bad_worker{0};
      pool.run(n, [&](int64_t i, int worker) {
        if (worker < 0 || worker >= threads) ++bad_worker;
        ++hits[static_cast<size_t>(i)];
      });
      for (int64_t i = 0; i < n; ++i) EXPECT_EQ(hits[static_cast<size_t>(i)].load(), 1);
      EXPECT_EQ(bad_worker.load(), 0);
    }
  }
}

TEST(HostPool, RethrowsAfterEveryItemRan) {
  host::HostPool pool(2);
  std::atomic<int> ran{0};
  EXPECT_THROW(pool.run(16,
                        [&](int64_t i, int) {
                          ++ran;
                          if (i == 5) throw std::runtime_error("item 5");
                        }),
               std::runtime_error);
  EXPECT_EQ(ran.load(), 16);
  // The pool still works after an exception.
  std::atomic<int> again{0};
  pool.run(8, [&](int64_t, int) { ++again; });
  EXPECT_EQ(again.load(), 8);
}

TEST(HostPool, NestedRunIsAPlainLoopOnItsCaller) {
  host::HostPool pool(2);
  std::vector<std::atomic<int>> hits(12);
  pool.run(3, [&](int64_t i, int outer) {
    pool.run(4, [&](int64_t j, int inner) {
      EXPECT_EQ(inner, 0);
      ++hits[static_cast<size_t>(i * 4 + j)];
    });
    (void)outer;
  });
  for (auto& h : hits) EXPECT_EQ(h.load(), 1);
}

// Attention forward + backward (overwrite and accumulate) at odd sizes: more
// heads than threads, S across the query-block (32) and key-tile (128) edges.
Results attention_chain(Backend& b, int64_t B, int64_t S, int64_t H, int64_t hd) {
  Rng rng(90 + S);
  const Shape hs{B, S, H, hd};
  const int64_t n = shape_numel(hs);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  Tensor q = b.from_f32(hs, rng.f32(n, -2, 2)), k = b.from_f32(hs, rng.f32(n, -2, 2));
  Tensor v = b.from_f32(hs, rng.f32(n)), dout = b.from_f32(hs, rng.f32(n));
  Tensor out = b.zeros(hs), lse = b.zeros({B, H, S});
  Tensor dq = b.zeros(hs), dk = b.zeros(hs), dv = b.zeros(hs);
  b.attention_forward(out, lse, q, k, v, scale);
  b.attention_backward_overwrite(dq, dk, dv, dout, q, k, v, out, lse, scale);
  b.attention_backward(dq, dk, dv, dout, q, k, v, out, lse, scale);  // now 2x
  return {b.download_f32(out), b.download_f32(lse), b.download_f32(dq), b.download_f32(dk),
          b.download_f32(dv)};
}

TEST(HostThreads, AttentionSameBitsOnOneAndTwoThreadsAndMatchesReference) {
  struct Case {
    int64_t B, S, H, hd;
  };
  for (const Case& c : {Case{3, 150, 5, 6}, Case{1, 129, 3, 32}, Case{2, 33, 1, 4},
                        Case{1, 300, 2, 8}}) {
    SCOPED_TRACE("B=" + std::to_string(c.B) + " S=" + std::to_string(c.S));
    auto run = [&](Backend& b) { return attention_chain(b, c.B, c.S, c.H, c.hd); };
    const Results two = on_host(2, run);
    const Results two_again = on_host(2, run);
    const Results one = on_host(1, run);
    EXPECT_TRUE(bitwise_equal(two, two_again)) << "2 threads, two runs";
    EXPECT_TRUE(bitwise_equal(two, one)) << "2 threads vs 1 thread";
    // Values: the float64 reference (dq, dk, dv were accumulated twice).
    Rng rng(90 + c.S);
    const int64_t n = c.B * c.S * c.H * c.hd;
    const auto q = rng.f32(n, -2, 2), k = rng.f32(n, -2, 2), v = rng.f32(n), d = rng.f32(n);
    const float scale = 1.0f / std::sqrt(static_cast<float>(c.hd));  // as attention_chain
    ref::V out, lse, dq, dk, dv;
    ref::attention_fwd(out, lse, to_double(q), to_double(k), to_double(v), c.B, c.S, c.H, c.hd,
                       scale);
    ref::attention_bwd(dq, dk, dv, to_double(d), to_double(q), to_double(k), to_double(v), c.B,
                       c.S, c.H, c.hd, scale);
    for (ref::V* g : {&dq, &dk, &dv})
      for (double& x : *g) x *= 2.0;
    const Tol fwd{2e-5, 1e-4}, bwd{2e-4, 1e-4};
    EXPECT_TRUE(near(two[0], out, fwd)) << "out";
    EXPECT_TRUE(near(two[1], lse, fwd)) << "lse";
    EXPECT_TRUE(near(two[2], dq, bwd)) << "dq";
    EXPECT_TRUE(near(two[3], dk, bwd)) << "dk";
    EXPECT_TRUE(near(two[4], dv, bwd)) << "dv";
  }
}

// Grouped GEMM with per-group shapes where OpenBLAS's 1- and 2-thread results
// differ; each group then runs on one thread with one BLAS thread.
// One group per entry of `ms` (its rows), each with its own k x n matrix of
// B; A's and C's rows stacked in order. *rows: the total.
std::vector<GemmGroup> stacked_groups(const std::vector<int64_t>& ms, int64_t n, int64_t k, int64_t* rows) {
  std::vector<GemmGroup> groups;
  *rows = 0;
  for (size_t e = 0; e < ms.size(); ++e) {
    groups.push_back({ms[e], n, k, *rows * k, static_cast<int64_t>(e) * k * n, *rows * n});
    *rows += ms[e];
  }
  return groups;
}

Results grouped(Backend& b, bool ta, bool tb, float beta, const std::vector<GemmGroup>& groups,
                const std::vector<float>& a, const std::vector<float>& bm,
                const std::vector<float>& c0) {
  Tensor c = b.from_f32({static_cast<int64_t>(c0.size())}, c0);
  b.gemm_grouped(ta, tb, 0.75f, b.from_f32({static_cast<int64_t>(a.size())}, a),
                 b.from_f32({static_cast<int64_t>(bm.size())}, bm), beta, c, groups);
  return {b.download_f32(c)};
}

TEST(HostThreads, GroupedGemmSameBitsOnOneAndTwoThreadsAndMatchesReference) {
  const std::vector<int64_t> ms = {67, 0, 129, 1, 300, 67, 5};
  const int64_t n = 129, k = 33;
  Rng rng(91);
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, tb = t & 2;
    const float beta = t == 3 ? 0.5f : 0.0f;
    SCOPED_TRACE("ta=" + std::to_string(ta) + " tb=" + std::to_string(tb));
    int64_t rows = 0;
    const std::vector<GemmGroup> groups = stacked_groups(ms, n, k, &rows);
    const auto a = rng.f32(rows * k), bm = rng.f32(ms.size() * k * n), c0 = rng.f32(rows * n);
    auto run = [&](Backend& b) { return grouped(b, ta, tb, beta, groups, a, bm, c0); };
    const Results two = on_host(2, run), two_again = on_host(2, run), one = on_host(1, run);
    EXPECT_TRUE(bitwise_equal(two, two_again)) << "2 threads, two runs";
    EXPECT_TRUE(bitwise_equal(two, one)) << "2 threads vs 1 thread";
    std::vector<double> want = to_double(c0);
    for (const GemmGroup& g : groups) {
      const auto cg = ref::gemm(ta, tb, g.m, g.n, g.k, 0.75, to_double(a), to_double(bm), beta,
                                to_double(c0), g.a_offset, g.b_offset, g.c_offset);
      std::copy(cg.begin(), cg.end(), want.begin() + g.c_offset);
    }
    EXPECT_TRUE(near(two[0], want, Tol{1e-5, 1e-5}));
  }
}

TEST(HostThreads, GroupedGemmWithOverlappingOutputsAccumulatesInOrder) {
  // Three groups add into the same 40 x 24 block of C (beta = 1): with two
  // threads they must not race, so the backend runs them one after another.
  const int64_t m = 40, n = 24, k = 16;
  Rng rng(92);
  const auto a = rng.f32(3 * m * k), bm = rng.f32(3 * k * n), c0 = rng.f32(m * n);
  std::vector<GemmGroup> groups;
  for (int64_t e = 0; e < 3; ++e) groups.push_back({m, n, k, e * m * k, e * k * n, 0});
  std::vector<double> want = to_double(c0);
  for (const GemmGroup& g : groups)
    want = ref::gemm(false, false, m, n, k, 0.75, to_double(a), to_double(bm), 1.0, want,
                     g.a_offset, g.b_offset, 0);
  auto run = [&](Backend& b) { return grouped(b, false, false, 1.0f, groups, a, bm, c0); };
  const Results two = on_host(2, run), one = on_host(1, run);
  EXPECT_TRUE(near(two[0], want, Tol{1e-5, 1e-5}));
  EXPECT_TRUE(bitwise_equal(two, one));
}

// A model's activations are views of one arena buffer: A and C of a grouped
// GEMM in the same buffer, at disjoint ranges, still run one group per thread
// (the bits of a 1-thread run, where OpenBLAS's 2-thread bits differ).
TEST(HostThreads, GroupedGemmWithAAndCInOneBufferRunsConcurrently) {
  const std::vector<int64_t> ms = {67, 129, 1, 300, 67};
  const int64_t n = 129, k = 33;
  Rng rng(93);
  std::vector<GemmGroup> groups;
  int64_t rows = 0;
  for (size_t e = 0; e < ms.size(); ++e) rows += ms[e];
  const int64_t c_at = rows * k + 5;  // C after A in the same buffer
  int64_t r = 0;
  for (size_t e = 0; e < ms.size(); ++e) {
    groups.push_back({ms[e], n, k, r * k, static_cast<int64_t>(e) * k * n, c_at + r * n});
    r += ms[e];
  }
  const auto buf = rng.f32(c_at + rows * n), bm = rng.f32(static_cast<int64_t>(ms.size()) * k * n);
  auto run = [&](Backend& b) {
    Tensor t = b.from_f32({static_cast<int64_t>(buf.size())}, buf);
    b.gemm_grouped(false, true, 0.75f, t, b.from_f32({static_cast<int64_t>(bm.size())}, bm), 0.0f, t, groups);
    return Results{b.download_f32(t)};
  };
  const Results two = on_host(2, run), one = on_host(1, run);
  EXPECT_TRUE(bitwise_equal(two, one)) << "2 threads vs 1 thread";
  std::vector<double> want = to_double(buf);
  for (const GemmGroup& g : groups) {
    const auto cg = ref::gemm(false, true, g.m, g.n, g.k, 0.75, to_double(buf), to_double(bm), 0.0, want,
                              g.a_offset, g.b_offset, g.c_offset);
    std::copy(cg.begin(), cg.end(), want.begin() + g.c_offset);
  }
  EXPECT_TRUE(near(two[0], want, Tol{1e-5, 1e-5}));
}

// A group that reads (as A) what an earlier group writes in the same buffer
// sees the written values: such groups run in order.
TEST(HostThreads, GroupedGemmReadingAnEarlierGroupsOutputRunsInOrder) {
  const int64_t m = 24, n = 16, k = 16;  // n == k: group 0's output is group 1's input
  Rng rng(94);
  const auto buf = rng.f32(3 * m * k), bm = rng.f32(2 * k * n);
  const std::vector<GemmGroup> groups{{m, n, k, 0, 0, m * k}, {m, n, k, m * k, k * n, 2 * m * k}};
  std::vector<double> want = to_double(buf);
  for (const GemmGroup& g : groups) {
    const auto cg = ref::gemm(false, false, m, n, k, 0.75, want, to_double(bm), 0.0, want, g.a_offset, g.b_offset,
                              g.c_offset);
    std::copy(cg.begin(), cg.end(), want.begin() + g.c_offset);
  }
  auto run = [&](Backend& b) {
    Tensor t = b.from_f32({static_cast<int64_t>(buf.size())}, buf);
    b.gemm_grouped(false, false, 0.75f, t, b.from_f32({static_cast<int64_t>(bm.size())}, bm), 0.0f, t, groups);
    return Results{b.download_f32(t)};
  };
  const Results two = on_host(2, run), one = on_host(1, run);
  EXPECT_TRUE(near(two[0], want, Tol{1e-5, 1e-5}));
  EXPECT_TRUE(bitwise_equal(two, one));
}

// The elementwise ops a 2-thread host backend splits across its threads
// (fill, SiLU, SwiGLU, AdamW, RoPE; large enough to split) give the bits of a
// 1-thread one, in place and accumulating alike.
TEST(HostThreads, ElementwiseOpsSameBitsOnOneAndTwoThreads) {
  const int64_t n = 3 * (int64_t{1} << 15) + 77;  // three parts' worth, odd tail
  Rng rng(95);
  const auto a = rng.f32(n), b = rng.f32(n), c = rng.f32(n), d = rng.f32(n, 0.0f, 0.5f);
  const int64_t B = 6, S = 128, H = 4, hd = 32;  // RoPE: 6 sequences of 16384 floats
  const auto x = rng.f32(B * S * H * hd), y = rng.f32(B * S * H * hd);
  auto run = [&](Backend& be) {
    Results out;
    Tensor t = be.from_f32({n}, a);
    be.fill(t.view(5, {n - 9}), 0.25f);
    out.push_back(be.download_f32(t));
    Tensor s = be.empty({n});
    be.silu_forward(s, be.from_f32({n}, a));
    out.push_back(be.download_f32(s));
    Tensor ds = be.from_f32({n}, c);
    be.silu_backward(ds, be.from_f32({n}, b), be.from_f32({n}, a));
    out.push_back(be.download_f32(ds));
    Tensor o = be.empty({n});
    be.swiglu_forward(o, be.from_f32({n}, a), be.from_f32({n}, b));
    out.push_back(be.download_f32(o));
    Tensor dg = be.from_f32({n}, c), du = be.from_f32({n}, d);
    be.swiglu_backward(dg, du, be.from_f32({n}, c), be.from_f32({n}, a), be.from_f32({n}, b));
    out.push_back(be.download_f32(dg));
    out.push_back(be.download_f32(du));
    be.swiglu_backward_overwrite(dg, du, be.from_f32({n}, b), be.from_f32({n}, a), be.from_f32({n}, c));
    out.push_back(be.download_f32(dg));
    out.push_back(be.download_f32(du));
    AdamWParams hp;
    hp.step = 2;
    hp.weight_decay = 0.1f;
    hp.grad_scale = 0.5f;
    Tensor p = be.from_f32({n}, a), m = be.from_f32({n}, b), v = be.from_f32({n}, d);
    be.adamw(p, be.from_f32({n}, c), m, v, hp);
    Tensor mo = be.empty({n}), vo = be.empty({n});
    be.adamw_to(p, be.from_f32({n}, a), m, v, mo, vo, hp);
    for (const Tensor* r : {&p, &m, &v, &mo, &vo}) out.push_back(be.download_f32(*r));
    const Shape shape{B, S, H, hd};
    Tensor r = be.empty(shape);
    be.rope_forward(r, be.from_f32(shape, x), 3, 10000.0f);
    out.push_back(be.download_f32(r));
    Tensor dr = be.from_f32(shape, y);
    be.rope_backward(dr, be.from_f32(shape, x), 3, 10000.0f);
    out.push_back(be.download_f32(dr));
    return out;
  };
  const Results two = on_host(2, run), one = on_host(1, run);
  EXPECT_TRUE(bitwise_equal(two, one));
}

// One GEMM large enough to be split by rows over the backend's threads
// (host::sgemm_rows), every transpose, beta 0 and 0.5.
Results one_gemm(Backend& b, bool ta, bool tb, float beta, int64_t m, int64_t n, int64_t k,
                 const std::vector<float>& a, const std::vector<float>& bm, const std::vector<float>& c0) {
  Tensor c = b.from_f32({m, n}, c0);
  b.gemm(ta, tb, m, n, k, 0.75f, b.from_f32({m * k}, a), b.from_f32({k * n}, bm), beta, c);
  return {b.download_f32(c)};
}

TEST(HostThreads, GemmSameBitsOnOneTwoAndThreeThreadsAndMatchesReference) {
  // 701 rows: whole blocks of 12 and a ragged end, 8.7M multiply-adds, so 2
  // and 3 threads each get a part; 241 rows: 2 parts of 10 blocks and 1 row
  // (every row must be computed); 128 rows: a weight gradient's d_model.
  const int64_t n = 97, k = 129;
  Rng rng(92);
  for (int64_t m : {701, 241, 128})
  for (int t = 0; t < 4; ++t) {
    const bool ta = t & 1, tb = t & 2;
    const float beta = t == 3 ? 0.5f : 0.0f;
    SCOPED_TRACE("m=" + std::to_string(m) + " ta=" + std::to_string(ta) + " tb=" + std::to_string(tb));
    const auto a = rng.f32(m * k), bm = rng.f32(k * n), c0 = rng.f32(m * n);
    auto run = [&](Backend& b) { return one_gemm(b, ta, tb, beta, m, n, k, a, bm, c0); };
    const Results one = on_host(1, run), two = on_host(2, run), three = on_host(3, run);
    EXPECT_TRUE(bitwise_equal(one, two)) << "2 threads vs 1 thread";
    EXPECT_TRUE(bitwise_equal(one, three)) << "3 threads vs 1 thread";
    const auto want = ref::gemm(ta, tb, m, n, k, 0.75, to_double(a), to_double(bm), beta, to_double(c0));
    EXPECT_TRUE(near(two[0], want, Tol{1e-5, 1e-5}));
  }
}

// Two devices computing at once, each a 2-thread backend on its own thread:
// every result has the bits it has when computed alone. The pool used to set
// OpenBLAS's process-wide thread count to 1 for each region and back after
// it, which changed the count, and under the Haswell kernels the bits, of the
// other device's GEMM in flight (the bitwise matrix runs this test under each
// kernel family).
TEST(HostThreads, ConcurrentDevicesKeepTheirBits) {
  const int64_t m = 480, n = 96, k = 200;
  Rng rng(93);
  const auto a = rng.f32(m * k), bm = rng.f32(k * n), c0 = rng.f32(m * n);
  const std::vector<int64_t> ms = {120, 67, 200, 93};
  int64_t rows = 0;
  const std::vector<GemmGroup> groups = stacked_groups(ms, n, k, &rows);
  const auto ga = rng.f32(rows * k), gb = rng.f32(ms.size() * k * n), gc = rng.f32(rows * n);
  // Device 0 runs large GEMMs (split over its threads), device 1 grouped
  // GEMMs (a pool region each), 100 times each, at the same time.
  auto gemm = [&](Backend& b) { return one_gemm(b, false, true, 0.0f, m, n, k, a, bm, c0); };
  auto group = [&](Backend& b) { return grouped(b, false, false, 0.0f, groups, ga, gb, gc); };
  const Results gemm_alone = on_host(2, gemm), group_alone = on_host(2, group);
  std::atomic<int> differ{0};
  auto device = [&](const std::function<Results(Backend&)>& work, const Results& alone) {
    BackendOptions o;
    o.threads = 2;
    std::unique_ptr<Backend> b = make_backend(o);
    for (int i = 0; i < 100; ++i)
      if (!bitwise_equal(work(*b), alone)) ++differ;
  };
  std::thread d0(device, gemm, std::cref(gemm_alone)), d1(device, group, std::cref(group_alone));
  d0.join();
  d1.join();
  EXPECT_EQ(differ.load(), 0) << "of 200 results computed while another device ran";
}

}  // namespace
}  // namespace troupe::kernels::testing
