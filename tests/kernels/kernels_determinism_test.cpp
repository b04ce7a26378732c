// Determinism and shape conventions on every backend: a chain of ops with
// reductions and scatters (grouped GEMM, attention, RMSNorm, cross-entropy,
// combine, embedding with repeated ids) gives bitwise-identical results when
// run twice on fresh tensors; [B,S,D] tensors behave as [B*S, D].
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "kernels/blas_core.hpp"
#include "tests/kernels/kernels_harness.hpp"

namespace troupe::kernels::testing {
namespace {

class KernelsDeterminism : public BackendTest {};

std::vector<std::vector<float>> run_chain(Backend& b) {
  Rng rng(70);
  const int64_t B = 2, S = 70, H = 2, hd = 8, D = H * hd, T = B * S, V = 33, E = 4, K = 2;
  const Shape hs{B, S, H, hd};
  Tensor q = b.from_f32(hs, rng.f32(T * D, -2, 2)), k = b.from_f32(hs, rng.f32(T * D, -2, 2));
  Tensor v = b.from_f32(hs, rng.f32(T * D)), dout = b.from_f32(hs, rng.f32(T * D));
  Tensor out = b.zeros(hs), lse = b.zeros({B, H, S});
  Tensor dq = b.zeros(hs), dk = b.zeros(hs), dv = b.zeros(hs);
  b.attention_forward(out, lse, q, k, v, 0.35f);
  b.attention_backward(dq, dk, dv, dout, q, k, v, out, lse, 0.35f);

  Tensor x = out.reshape({T, D}), w = b.from_f32({D}, rng.f32(D)), y = b.zeros({T, D});
  Tensor rstd = b.zeros({T}), dx = b.zeros({T, D}), dw = b.zeros({D});
  b.rmsnorm_forward(y, rstd, x, w, 1e-5f);
  b.rmsnorm_backward(dx, dw, dq.reshape({T, D}), x, w, rstd);

  Tensor wv = b.from_f32({D, V}, rng.f32(D * V)), logits = b.zeros({T, V});
  b.gemm(false, false, T, V, D, 1.0f, y, wv, 0.0f, logits);
  Tensor targets = b.from_i32({T}, rng.i32(T, -1, static_cast<int32_t>(V - 1)));
  Tensor losses = b.zeros({T}), dlogits = b.zeros({T, V});
  b.cross_entropy_forward(losses, logits, targets, -1);
  b.cross_entropy_backward(dlogits, logits, targets, -1, 1.0f / T);

  // Experts: every (token, choice) row in a permutation, grouped GEMM, combine back.
  std::vector<int32_t> slots(T * K);
  for (int64_t i = 0; i < T * K; ++i) slots[i] = static_cast<int32_t>((i * 37) % (T * K));
  Tensor ts = b.from_i32({T, K}, slots), cw = b.from_f32({T, K}, rng.f32(T * K, 0.1f, 1.0f));
  std::vector<int32_t> src_rows(T * K);
  for (int64_t i = 0; i < T * K; ++i) src_rows[slots[i]] = static_cast<int32_t>(i / K);
  Tensor xe = b.zeros({T * K, D}), ye = b.zeros({T * K, D});
  b.gather_rows(xe, dx, b.from_i32({T * K}, src_rows));
  Tensor we = b.from_f32({E, D, D}, rng.f32(E * D * D));
  const int64_t per = T * K / E;
  std::vector<GemmGroup> groups;
  for (int64_t e = 0; e < E; ++e)
    groups.push_back({per, D, D, e * per * D, e * D * D, e * per * D});
  b.gemm_grouped(false, false, 1.0f, xe, we, 0.0f, ye, groups);
  Tensor comb = b.zeros({T, D}), dy = b.zeros({T * K, D}), dcw = b.zeros({T, K});
  b.combine_forward(comb, ye, ts, cw);
  b.combine_backward(dy, dcw, comb, ye, ts, cw);

  Tensor table = b.zeros({5, D});
  b.embedding_backward(table, comb, b.from_i32({T}, rng.i32(T, 0, 4)));  // many repeats
  Tensor norm = b.from_f32({1}, std::vector<float>{static_cast<float>(b.squared_norm(dy))});
  b.synchronize();
  std::vector<std::vector<float>> res;
  for (const Tensor& t :
       {out, lse, dq, dk, dv, dx, dw, losses, dlogits, ye, comb, dy, dcw, table, norm})
    res.push_back(b.download_f32(t));
  return res;
}

TEST_P(KernelsDeterminism, RepeatedRunsAreBitwiseIdentical) {
  const auto first = run_chain(be());
  const auto second = run_chain(be());
  ASSERT_EQ(first.size(), second.size());
  for (size_t i = 0; i < first.size(); ++i) {
    ASSERT_EQ(first[i].size(), second[i].size());
    EXPECT_EQ(std::memcmp(first[i].data(), second[i].data(), first[i].size() * sizeof(float)), 0)
        << "output " << i << " differs between two identical runs";
    for (float f : first[i]) ASSERT_TRUE(std::isfinite(f)) << "output " << i << " not finite";
  }
}

TEST_P(KernelsDeterminism, LeadingDimensionsFlattenToRows) {
  Rng rng(71);
  const auto x = rng.f32(2 * 3 * 5), w = rng.f32(5);
  Backend& b = be();
  Tensor o3 = b.zeros({2, 3, 5}), r3 = b.zeros({6}), o2 = b.zeros({6, 5}), r2 = b.zeros({6});
  b.rmsnorm_forward(o3, r3, b.from_f32({2, 3, 5}, x), b.from_f32({5}, w), 1e-5f);
  b.rmsnorm_forward(o2, r2, b.from_f32({6, 5}, x), b.from_f32({5}, w), 1e-5f);
  EXPECT_EQ(b.download_f32(o3), b.download_f32(o2));
  EXPECT_EQ(b.download_f32(r3), b.download_f32(r2));
  Tensor s3 = b.zeros({2, 3, 5}), s2 = b.zeros({6, 5});
  b.softmax_forward(s3, b.from_f32({2, 3, 5}, x));
  b.softmax_forward(s2, b.from_f32({6, 5}, x));
  EXPECT_EQ(b.download_f32(s3), b.download_f32(s2));
}

TROUPE_INSTANTIATE_BACKENDS(KernelsDeterminism);

// Test binaries run the kernel family troupe picks at start-up
// (tests/gtest_main.cpp), not what OpenBLAS detects (Cooperlake on AMD Zen 4):
// the portable family, or the one OPENBLAS_CORETYPE names when a user (or a
// bitwise-matrix cell) set it.
TEST(KernelFamily, TestsRunTheFamilyTroupeChooses) {
  const char* core = std::getenv("OPENBLAS_CORETYPE");
  const char* mark = std::getenv("TROUPE_OPENBLAS_CORETYPE");
  const std::string portable = blas_core_for(HostKernels::portable);
  if (portable.empty()) GTEST_SKIP() << "this CPU lacks AVX2 or FMA: OpenBLAS picks the family";
  ASSERT_NE(core, nullptr) << "configure_openblas did not set OPENBLAS_CORETYPE";
  if (mark && std::strcmp(core, mark) == 0)
    EXPECT_EQ(blas_core(), portable) << "the tests run OpenBLAS's detection instead of troupe's portable family";
  else
    EXPECT_EQ(blas_core(), core) << "OPENBLAS_CORETYPE=" << core << " was not applied";
}

}  // namespace
}  // namespace troupe::kernels::testing
