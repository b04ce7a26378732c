// GEMM tests on every backend: plain (all transposes, alpha/beta, degenerate
// sizes), strided-batched (padding, a shared B) and grouped (per-expert shapes,
// m = 0 groups), each against a float64 reference.
#include <gtest/gtest.h>

#include <sstream>

#include "tests/kernels/kernels_harness.hpp"
#include "tests/kernels/kernels_reference.hpp"

namespace troupe::kernels::testing {
namespace {

// Values in [-1,1), sums of up to ~100 products: float32 error stays well below this.
constexpr Tol kTol{2e-5, 2e-5};

class KernelsGemm : public BackendTest {};

struct Dims {
  int64_t m, n, k;
};

TEST_P(KernelsGemm, AllTransposesAlphaBeta) {
  const Dims dims[] = {{1, 1, 1}, {7, 17, 3}, {33, 5, 64}, {16, 16, 16}, {3, 130, 9}, {2, 3, 0}};
  const std::pair<float, float> ab[] = {{1.0f, 0.0f}, {0.5f, -1.5f}, {-2.0f, 1.0f}};
  Rng rng(1);
  for (const Dims& d : dims)
    for (int t = 0; t < 4; ++t)
      for (auto [alpha, beta] : ab) {
        const bool ta = t & 1, tb = t & 2;
        std::ostringstream label;
        label << "m=" << d.m << " n=" << d.n << " k=" << d.k << " ta=" << ta << " tb=" << tb
              << " alpha=" << alpha << " beta=" << beta;
        SCOPED_TRACE(label.str());
        const auto a = rng.f32(d.m * d.k), b = rng.f32(d.k * d.n), c0 = rng.f32(d.m * d.n);
        const Shape sa = ta ? Shape{d.k, d.m} : Shape{d.m, d.k};
        const Shape sb = tb ? Shape{d.n, d.k} : Shape{d.k, d.n};
        // beta == 0: C is poisoned with NaN and must not be read (BLAS semantics).
        const auto want = ref::gemm(ta, tb, d.m, d.n, d.k, alpha, to_double(a), to_double(b), beta,
                                    to_double(c0));
        check_op(
            be(),
            [&](Arena& ar) -> Outputs {
              Tensor c = beta == 0.0f ? ar.out({d.m, d.n}) : ar.in({d.m, d.n}, c0);
              ar.be().gemm(ta, tb, d.m, d.n, d.k, alpha, ar.in(sa, a), ar.in(sb, b), beta, c);
              return {{"c", ar.get(c)}};
            },
            {want}, kTol);
      }
}

TEST_P(KernelsGemm, StridedBatched) {
  struct Case {
    Dims d;
    int64_t batch, pad_a, pad_b, pad_c;
    bool shared_b;  // stride_b = 0: every batch uses the same B
  };
  const Case cases[] = {{{7, 5, 3}, 1, 0, 0, 0, false},
                        {{4, 17, 6}, 3, 2, 1, 3, false},
                        {{9, 8, 33}, 4, 0, 5, 0, true},
                        {{1, 1, 1}, 5, 1, 1, 1, false}};
  Rng rng(2);
  for (const Case& cs : cases)
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      const Dims d = cs.d;
      const float alpha = 0.75f, beta = (t == 3) ? 0.0f : -0.5f;
      std::ostringstream label;
      label << "m=" << d.m << " n=" << d.n << " k=" << d.k << " batch=" << cs.batch << " ta=" << ta
            << " tb=" << tb << " shared_b=" << cs.shared_b;
      SCOPED_TRACE(label.str());
      const int64_t sa = d.m * d.k + cs.pad_a, sc = d.m * d.n + cs.pad_c;
      const int64_t sb = cs.shared_b ? 0 : d.k * d.n + cs.pad_b;
      const int64_t na = sa * cs.batch, nb = cs.shared_b ? d.k * d.n : sb * cs.batch,
                    nc = sc * cs.batch;
      const auto a = rng.f32(na), b = rng.f32(nb), c0 = rng.f32(nc);
      // Padding between C matrices keeps its initial value.
      std::vector<double> want = to_double(c0);
      for (int64_t i = 0; i < cs.batch; ++i) {
        const auto ci = ref::gemm(ta, tb, d.m, d.n, d.k, alpha, to_double(a), to_double(b), beta,
                                  to_double(c0), i * sa, i * sb, i * sc);
        std::copy(ci.begin(), ci.end(), want.begin() + i * sc);
      }
      check_op(
          be(),
          [&](Arena& ar) -> Outputs {
            Tensor c = ar.in({nc}, c0);
            ar.be().gemm_strided_batched(ta, tb, d.m, d.n, d.k, alpha, ar.in({na}, a), sa,
                                         ar.in({nb}, b), sb, beta, c, sc, cs.batch);
            return {{"c", ar.get(c)}};
          },
          {want}, kTol);
    }
}

TEST_P(KernelsGemm, GroupedPerExpertShapes) {
  // MoE layout: A = tokens packed by expert, B = one weight matrix per expert,
  // C = outputs packed like A. Different m per group, including m = 0.
  const std::vector<std::vector<int64_t>> ms = {
      {5, 0, 3, 17, 1}, {0, 0, 4}, {33}, {1, 2, 3, 4, 5, 6, 7, 0, 9}};
  const int64_t k = 7, n = 9;
  Rng rng(3);
  for (const auto& m_per : ms)
    for (int t = 0; t < 4; ++t) {
      const bool ta = t & 1, tb = t & 2;
      const float alpha = t == 1 ? -1.25f : 1.0f, beta = t >= 2 ? 0.5f : 0.0f;
      std::ostringstream label;
      label << "groups=" << m_per.size() << " ta=" << ta << " tb=" << tb << " beta=" << beta;
      SCOPED_TRACE(label.str());
      std::vector<GemmGroup> groups;
      int64_t rows = 0;
      for (size_t e = 0; e < m_per.size(); ++e) {
        const int64_t m = m_per[e];
        groups.push_back({m, n, k, rows * k, static_cast<int64_t>(e) * k * n, rows * n});
        rows += m;
      }
      const int64_t E = static_cast<int64_t>(m_per.size());
      const auto a = rng.f32(rows * k), b = rng.f32(E * k * n), c0 = rng.f32(rows * n);
      std::vector<double> want(c0.size());
      for (const GemmGroup& g : groups) {
        const auto cg = ref::gemm(ta, tb, g.m, g.n, g.k, alpha, to_double(a), to_double(b), beta,
                                  to_double(c0), g.a_offset, g.b_offset, g.c_offset);
        std::copy(cg.begin(), cg.end(), want.begin() + g.c_offset);
      }
      check_op(
          be(),
          [&](Arena& ar) -> Outputs {
            Tensor c = beta == 0.0f ? ar.out({rows, n}) : ar.in({rows, n}, c0);
            ar.be().gemm_grouped(ta, tb, alpha, ar.in({rows * k}, a), ar.in({E, k, n}, b), beta, c,
                                 groups);
            return {{"c", ar.get(c)}};
          },
          {want}, kTol);
    }
}

TEST_P(KernelsGemm, RejectsMismatchedShapes) {
  Backend& b = be();
  Tensor a = b.zeros({4, 3}), w = b.zeros({3, 5}), c = b.zeros({4, 5}), small = b.zeros({4, 4});
  EXPECT_NO_THROW(b.gemm(false, false, 4, 5, 3, 1.0f, a, w, 0.0f, c));
  EXPECT_THROW(b.gemm(false, false, 4, 5, 3, 1.0f, a, w, 0.0f, small), std::invalid_argument);
  EXPECT_THROW(b.gemm(false, false, 4, 5, 4, 1.0f, a, w, 0.0f, c), std::invalid_argument);
  EXPECT_THROW(b.gemm(false, false, -1, 5, 3, 1.0f, a, w, 0.0f, c), std::invalid_argument);
  Tensor ids = b.zeros({12}, DType::i32);
  EXPECT_THROW(b.gemm(false, false, 4, 5, 3, 1.0f, ids, w, 0.0f, c), std::invalid_argument);
  EXPECT_THROW(b.gemm_strided_batched(false, false, 4, 5, 3, 1.0f, a, 12, w, 15, 0.0f, c, 20, 2),
               std::invalid_argument);
  const GemmGroup too_far[] = {{4, 5, 3, 0, 0, 1}};
  EXPECT_THROW(b.gemm_grouped(false, false, 1.0f, a, w, 0.0f, c, too_far), std::invalid_argument);
}

TROUPE_INSTANTIATE_BACKENDS(KernelsGemm);

}  // namespace
}  // namespace troupe::kernels::testing
