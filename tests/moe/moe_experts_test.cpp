// Grouped-GEMM expert compute against float64 loops, and placement
// independence: a sub-group of experts (as one expert shard would run it)
// gives bitwise the same rows as the full group.
#include <cmath>
#include <random>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backend.hpp"
#include "moe/arena.hpp"
#include "moe/experts.hpp"

namespace troupe::moe {
namespace {

using kernels::Tensor;

std::vector<float> randn(size_t n, uint64_t seed, float s = 0.5f) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> d(0.0f, s);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

double silu(double x) { return x / (1.0 + std::exp(-x)); }

struct Fixture {
  static constexpr int64_t E = 4, D = 8, F = 6;
  std::vector<int64_t> counts = {3, 0, 5, 2};
  int64_t N = 10;
  std::vector<float> xs, wg, wu, wd, dy;
  Fixture() {
    xs = randn(N * D, 1);
    wg = randn(E * F * D, 2);
    wu = randn(E * F * D, 3);
    wd = randn(E * D * F, 4);
    dy = randn(N * D, 5);
  }
  int64_t expert_of(int64_t row) const {
    int64_t r0 = 0;
    for (int64_t e = 0; e < E; ++e) {
      if (row < r0 + counts[e]) return e;
      r0 += counts[e];
    }
    return -1;
  }
};

TEST(Experts, GroupedForwardBackwardMatchFloat64Loops) {
  auto be = kernels::make_backend({});
  Fixture f;
  const int64_t E = f.E, D = f.D, F = f.F, N = f.N;
  Arena a(*be);
  const Tensor xs = be->from_f32({N, D}, f.xs);
  ExpertWeights w{be->from_f32({E, F, D}, f.wg), be->from_f32({E, F, D}, f.wu),
                  be->from_f32({E, D, F}, f.wd)};
  ExpertWeights dw{be->zeros({E, F, D}), be->zeros({E, F, D}), be->zeros({E, D, F})};
  ExpertActs acts{a.f32({N, F}), a.f32({N, F}), a.f32({N, F})};
  ExpertActs scratch{a.f32({N, F}), a.f32({N, F}), a.f32({N, F})};
  const Tensor y = a.f32({N, D}), dxs = a.f32({N, D});
  const Tensor dy = be->from_f32({N, D}, f.dy);
  experts_forward(*be, y, acts, xs, w, f.counts);
  experts_backward(*be, dxs, dw, scratch, dy, xs, acts, w, f.counts);
  const auto y32 = be->download_f32(y), dx32 = be->download_f32(dxs);
  const auto dg32 = be->download_f32(dw.gate), du32 = be->download_f32(dw.up),
             dd32 = be->download_f32(dw.down);

  std::vector<double> dg(E * F * D, 0.0), du(E * F * D, 0.0), dd(E * D * F, 0.0);
  for (int64_t r = 0; r < N; ++r) {
    const int64_t e = f.expert_of(r);
    const float* x = &f.xs[r * D];
    std::vector<double> g(F), u(F), act(F), dact(F, 0.0);
    for (int64_t j = 0; j < F; ++j) {
      g[j] = u[j] = 0.0;
      for (int64_t i = 0; i < D; ++i) {
        g[j] += f.wg[(e * F + j) * D + i] * x[i];
        u[j] += f.wu[(e * F + j) * D + i] * x[i];
      }
      act[j] = silu(g[j]) * u[j];
    }
    for (int64_t o = 0; o < D; ++o) {
      double s = 0.0;
      for (int64_t j = 0; j < F; ++j) {
        s += f.wd[(e * D + o) * F + j] * act[j];
        dact[j] += f.wd[(e * D + o) * F + j] * f.dy[r * D + o];
        dd[(e * D + o) * F + j] += f.dy[r * D + o] * act[j];
      }
      EXPECT_NEAR(y32[r * D + o], s, 1e-5 * (1 + std::fabs(s))) << "y row " << r;
    }
    std::vector<double> dx(D, 0.0);
    for (int64_t j = 0; j < F; ++j) {
      const double sg = 1.0 / (1.0 + std::exp(-g[j]));
      const double dgj = dact[j] * u[j] * sg * (1.0 + g[j] * (1.0 - sg));
      const double duj = dact[j] * silu(g[j]);
      for (int64_t i = 0; i < D; ++i) {
        dx[i] += dgj * f.wg[(e * F + j) * D + i] + duj * f.wu[(e * F + j) * D + i];
        dg[(e * F + j) * D + i] += dgj * x[i];
        du[(e * F + j) * D + i] += duj * x[i];
      }
    }
    for (int64_t i = 0; i < D; ++i)
      EXPECT_NEAR(dx32[r * D + i], dx[i], 1e-5 * (1 + std::fabs(dx[i]))) << "dx row " << r;
  }
  for (size_t i = 0; i < dg.size(); ++i) {
    EXPECT_NEAR(dg32[i], dg[i], 1e-5 * (1 + std::fabs(dg[i])));
    EXPECT_NEAR(du32[i], du[i], 1e-5 * (1 + std::fabs(du[i])));
    EXPECT_NEAR(dd32[i], dd[i], 1e-5 * (1 + std::fabs(dd[i])));
  }
  // Expert 1 got no rows: its gradients stay exactly zero.
  for (int64_t i = 0; i < F * D; ++i) EXPECT_EQ(dg32[F * D + i], 0.0f);
}

TEST(Experts, SubGroupIsBitwiseTheSameAsTheFullGroup) {
  auto be = kernels::make_backend({});
  Fixture f;
  const int64_t E = f.E, D = f.D, F = f.F, N = f.N;
  Arena a(*be);
  const Tensor xs = be->from_f32({N, D}, f.xs);
  const Tensor wg = be->from_f32({E, F, D}, f.wg), wu = be->from_f32({E, F, D}, f.wu),
               wd = be->from_f32({E, D, F}, f.wd);
  ExpertActs acts{a.f32({N, F}), a.f32({N, F}), a.f32({N, F})};
  const Tensor y = a.f32({N, D});
  experts_forward(*be, y, acts, xs, {wg, wu, wd}, f.counts);
  const auto full = be->download_f32(y);

  // Experts 2..3 alone: rows 3..9 of the permuted input, weights [2, ...] views.
  const int64_t r0 = 3, n = 7;
  const Tensor xs_sub = be->from_f32({n, D}, std::vector<float>(f.xs.begin() + r0 * D, f.xs.end()));
  ExpertWeights sub{wg.view(2 * F * D, {2, F, D}), wu.view(2 * F * D, {2, F, D}),
                    wd.view(2 * D * F, {2, D, F})};
  ExpertActs acts2{a.f32({n, F}), a.f32({n, F}), a.f32({n, F})};
  const Tensor y2 = a.f32({n, D});
  const std::vector<int64_t> sub_counts = {5, 2};
  experts_forward(*be, y2, acts2, xs_sub, sub, sub_counts);
  const auto part = be->download_f32(y2);
  for (int64_t i = 0; i < n * D; ++i) ASSERT_EQ(part[i], full[r0 * D + i]) << i;
}

TEST(Experts, MismatchedCountsAreRejected) {
  auto be = kernels::make_backend({});
  Fixture f;
  Arena a(*be);
  const Tensor xs = be->from_f32({f.N, f.D}, f.xs);
  ExpertWeights w{be->zeros({f.E, f.F, f.D}), be->zeros({f.E, f.F, f.D}), be->zeros({f.E, f.D, f.F})};
  ExpertActs acts{a.f32({f.N, f.F}), a.f32({f.N, f.F}), a.f32({f.N, f.F})};
  const Tensor y = a.f32({f.N, f.D});
  EXPECT_THROW(experts_forward(*be, y, acts, xs, w, std::vector<int64_t>{1, 2}), std::invalid_argument);
  EXPECT_THROW(experts_forward(*be, y, acts, xs, w, std::vector<int64_t>{10, 1, 0, 0}),
               std::invalid_argument);
}

}  // namespace
}  // namespace troupe::moe
