// The host backend's batch-invariant GEMM (Backend::set_batch_invariant):
// right against a float64 reference, and a row of C the same bits whatever m,
// its position, the other rows, the call form (plain, batched, grouped) and
// the backend's thread count. That is what lets a continuous batch put a
// sequence in any slot (model/continuous_batch.hpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <sstream>

#include "kernels/backend.hpp"
#include "tests/kernels/kernels_harness.hpp"
#include "tests/kernels/kernels_reference.hpp"

namespace troupe::kernels::testing {
namespace {

std::unique_ptr<Backend> host(int threads) {
  BackendOptions o;
  o.threads = threads;
  auto be = make_backend(o);
  EXPECT_TRUE(be->supports_batch_invariant());
  EXPECT_FALSE(be->set_batch_invariant(true));  // off by default
  return be;
}

std::vector<float> run_gemm(Backend& be, bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                            const std::vector<float>& a, const std::vector<float>& b, float beta,
                            const std::vector<float>& c0) {
  Tensor A = be.empty(ta ? Shape{k, m} : Shape{m, k}), B = be.empty(tb ? Shape{n, k} : Shape{k, n});
  Tensor C = be.empty({m, n});
  be.upload_f32(A, a);
  be.upload_f32(B, b);
  be.upload_f32(C, c0);
  be.gemm(ta, tb, m, n, k, alpha, A, B, beta, C);
  std::vector<float> out(static_cast<size_t>(m * n));
  be.download(out.data(), C, out.size() * sizeof(float));
  return out;
}

TEST(BatchInvariantGemm, MatchesFloat64ReferenceForEveryTranspose) {
  auto be = host(1);
  Rng rng(3);
  const int64_t dims[][3] = {{1, 1, 1}, {7, 17, 3}, {33, 5, 64}, {3, 130, 9}, {2, 3, 0}, {5, 9, 131}};
  for (const auto& d : dims)
    for (int t = 0; t < 4; ++t)
      for (auto [alpha, beta] : {std::pair{1.0f, 0.0f}, std::pair{0.5f, -1.5f}}) {
        const bool ta = t & 1, tb = t & 2;
        const int64_t m = d[0], n = d[1], k = d[2];
        SCOPED_TRACE(::testing::Message() << "m=" << m << " n=" << n << " k=" << k << " ta=" << ta << " tb=" << tb);
        const auto a = rng.f32(m * k), b = rng.f32(k * n), c0 = rng.f32(m * n);
        const auto got = run_gemm(*be, ta, tb, m, n, k, alpha, a, b, beta, c0);
        const auto want = ref::gemm(ta, tb, m, n, k, alpha, to_double(a), to_double(b), beta, to_double(c0));
        for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], 1e-5 * (1.0 + std::abs(want[i]))) << i;
      }
}

// Row `r` of A placed at position p of an m-row A whose other rows are other
// data: row p of C must be the same bits for every (m, p), every thread count,
// and for A B^T computed from a B stored either way (the fast and the strided
// path sum in one order).
TEST(BatchInvariantGemm, ARowIsTheSameBitsWhateverShareTheCall) {
  Rng rng(5);
  for (int64_t k : {1, 7, 8, 9, 64, 130})
    for (int64_t n : {1, 5, 130}) {
      SCOPED_TRACE(::testing::Message() << "k=" << k << " n=" << n);
      const auto row = rng.f32(k), bt = rng.f32(n * k), others = rng.f32(40 * k);
      std::vector<float> b(static_cast<size_t>(k * n));  // B [k,n] = bt^T
      for (int64_t j = 0; j < n; ++j)
        for (int64_t kk = 0; kk < k; ++kk) b[kk * n + j] = bt[j * k + kk];
      std::vector<float> want;
      for (int threads : {1, 3}) {
        auto be = host(threads);
        for (int64_t m : {1, 2, 3, 12, 13, 40})
          for (int64_t p : {int64_t{0}, m / 2, m - 1}) {
            std::vector<float> a(others.begin(), others.begin() + m * k);
            std::copy(row.begin(), row.end(), a.begin() + p * k);
            for (bool tb : {true, false}) {
              const auto c = run_gemm(*be, false, tb, m, n, k, 1.0f, a, tb ? bt : b, 0.0f,
                                      std::vector<float>(static_cast<size_t>(m * n), 0.0f));
              const std::vector<float> got(c.begin() + p * n, c.begin() + (p + 1) * n);
              if (want.empty()) want = got;
              ASSERT_EQ(0, std::memcmp(want.data(), got.data(), want.size() * sizeof(float)))
                  << "threads " << threads << " m " << m << " p " << p << " tb " << tb;
            }
          }
      }
    }
}

// The grouped call (one GEMM per expert) gives a token's row the same bits
// as the plain call, whichever group and offset it lands in.
TEST(BatchInvariantGemm, GroupedAndBatchedRowsEqualThePlainCall) {
  auto be = host(2);
  Rng rng(9);
  const int64_t k = 24, n = 11;
  const auto a = rng.f32(10 * k), w = rng.f32(n * k);
  const auto plain = run_gemm(*be, false, true, 10, n, k, 1.0f, a, w, 0.0f, std::vector<float>(10 * n, 0.0f));
  Tensor A = be->empty({10, k}), W = be->empty({2 * n * k}), C = be->empty({10, n});
  be->upload_f32(A, a);
  std::vector<float> w2(w);
  w2.insert(w2.end(), w.begin(), w.end());  // two "experts" with the same weights
  be->upload_f32(W, w2);
  const GemmGroup groups[] = {{3, n, k, 0, 0, 0}, {7, n, k, 3 * k, n * k, 3 * n}};
  be->gemm_grouped(false, true, 1.0f, A, W, 0.0f, C, groups);
  std::vector<float> grouped(10 * n);
  be->download(grouped.data(), C, grouped.size() * sizeof(float));
  EXPECT_EQ(0, std::memcmp(plain.data(), grouped.data(), grouped.size() * sizeof(float)));
  be->gemm_strided_batched(false, true, 5, n, k, 1.0f, A, 5 * k, W, 0, 0.0f, C, 5 * n, 2);
  std::vector<float> batched(10 * n);
  be->download(batched.data(), C, batched.size() * sizeof(float));
  EXPECT_EQ(0, std::memcmp(plain.data(), batched.data(), batched.size() * sizeof(float)));
}

// Off again, the backend is BLAS (a row's bits may change with m there: that
// is why the mode exists; this only checks the switch reports its state).
TEST(BatchInvariantGemm, TheSwitchReportsThePreviousSetting) {
  auto be = host(1);  // leaves it on
  EXPECT_TRUE(be->set_batch_invariant(false));
  EXPECT_FALSE(be->set_batch_invariant(false));
}

}  // namespace
}  // namespace troupe::kernels::testing
