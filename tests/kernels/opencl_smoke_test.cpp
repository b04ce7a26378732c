// OpenCL backend smoke tests: upload / op / download round trips, element
// offsets, GEMM overwriting NaN when beta == 0, bad indices reported by op name
// (eagerly, and lazily at synchronize), and tensors from another backend rejected.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <limits>
#include <stdexcept>
#include <thread>
#include <vector>

#include "kernels/opencl_context.hpp"
#include "tests/kernels/opencl_test_util.hpp"

namespace troupe::kernels {
namespace {

TEST(OpenclSmoke, UploadOpDownload) {
  TROUPE_REQUIRE_OPENCL_BACKEND(be);
  Tensor x = be.from_f32({2, 3}, std::vector<float>{1, 2, 3, 4, 5, 6});
  Tensor y = be.from_f32({2, 3}, std::vector<float>{10, 20, 30, 40, 50, 60});
  Tensor z = be.empty({2, 3});
  be.add(z, x, y);      // 11 22 33 44 55 66
  be.scale(z, 0.5f);    // 5.5 11 16.5 22 27.5 33
  be.axpy(z, 2.0f, x);  // 7.5 15 22.5 30 37.5 45
  EXPECT_EQ(be.download_f32(z), (std::vector<float>{7.5f, 15, 22.5f, 30, 37.5f, 45}));
  Tensor c = be.empty({2, 3});
  be.copy(c, z);
  EXPECT_EQ(be.download_f32(c), be.download_f32(z));
  Tensor i = be.from_i32({3}, std::vector<int32_t>{-1, 0, 2147483647});
  EXPECT_EQ(be.download_i32(i), (std::vector<int32_t>{-1, 0, 2147483647}));
  Tensor zi = be.zeros({5}, DType::i32);
  EXPECT_EQ(be.download_i32(zi), std::vector<int32_t>(5, 0));
}

TEST(OpenclSmoke, ViewsUseElementOffsets) {
  TROUPE_REQUIRE_OPENCL_BACKEND(be);
  Tensor whole = be.zeros({10});
  Tensor mid = whole.view(3, {4});
  be.fill(mid, 2.0f);
  be.scale(mid.view(1, {2}), 3.0f);
  EXPECT_EQ(be.download_f32(whole), (std::vector<float>{0, 0, 0, 2, 6, 6, 2, 0, 0, 0}));
  std::vector<float> part(2);
  be.download(part.data(), whole.view(4, {2}), 2 * sizeof(float));
  EXPECT_EQ(part, (std::vector<float>{6, 6}));
}

TEST(OpenclSmoke, GemmWithOffsetsAndBetaZeroOverwritesNaN) {
  TROUPE_REQUIRE_OPENCL_BACKEND(be);
  // A [2x3] and B [3x2] stored 5 elements into their buffers; C starts as NaN.
  std::vector<float> abuf(11, 99.0f), bbuf(11, 99.0f);
  const float a[6] = {1, 2, 3, 4, 5, 6}, b[6] = {1, 0, 0, 1, 1, 1};
  for (int i = 0; i < 6; ++i) abuf[5 + i] = a[i], bbuf[5 + i] = b[i];
  Tensor A = be.from_f32({11}, abuf), B = be.from_f32({11}, bbuf);
  Tensor C = be.from_f32({4}, std::vector<float>(4, std::numeric_limits<float>::quiet_NaN()));
  be.gemm(false, false, 2, 2, 3, 1.0f, A.view(5, {2, 3}), B.view(5, {3, 2}), 0.0f, C);
  EXPECT_EQ(be.download_f32(C), (std::vector<float>{4, 5, 10, 11}));
  // beta = 1 accumulates; k = 0 leaves beta * C.
  be.gemm(false, false, 2, 2, 3, 1.0f, A.view(5, {2, 3}), B.view(5, {3, 2}), 1.0f, C);
  EXPECT_EQ(be.download_f32(C), (std::vector<float>{8, 10, 20, 22}));
  be.gemm(false, false, 2, 2, 0, 1.0f, A, B, 0.5f, C);
  EXPECT_EQ(be.download_f32(C), (std::vector<float>{4, 5, 10, 11}));
}

TEST(OpenclSmoke, BadIdsAreReportedByOpAndTheBackendRecovers) {
  TROUPE_REQUIRE_OPENCL_BACKEND(be);
  Tensor table = be.zeros({4, 3});
  Tensor out = be.empty({2, 3});
  Tensor bad = be.from_i32({2}, std::vector<int32_t>{1, 4});
  try {
    be.embedding_forward(out, table, bad);
    FAIL() << "an id equal to the vocabulary size was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_CONTAINS(e.what(), "opencl embedding_forward: bad input: token id outside [0, vocab)");
  }
  // The error word is cleared: good input works again and syncs cleanly.
  Tensor good = be.from_i32({2}, std::vector<int32_t>{1, 3});
  EXPECT_NO_THROW(be.embedding_forward(out, table, good));
  EXPECT_NO_THROW(be.synchronize());

  Tensor logits = be.zeros({2, 5}), losses = be.empty({2});
  Tensor targets = be.from_i32({2}, std::vector<int32_t>{-100, 7});
  EXPECT_THROW(be.cross_entropy_forward(losses, logits, targets, -100), std::invalid_argument);
  Tensor slots = be.from_i32({2, 1}, std::vector<int32_t>{0, 9});
  Tensor src = be.zeros({3, 3}), dst = be.zeros({2, 3});
  EXPECT_THROW(be.sum_slots(dst, src, slots), std::invalid_argument);
  Tensor idx = be.from_i32({1}, std::vector<int32_t>{-2});
  Tensor g = be.empty({1, 3});
  EXPECT_THROW(be.gather_rows(g, src, idx), std::invalid_argument);
  // combine_backward scatters into rows of dy: a row named twice would race.
  Tensor dup = be.from_i32({2, 2}, std::vector<int32_t>{0, 1, 2, 1});
  Tensor w = be.zeros({2, 2}), dy = be.zeros({3, 3}), dw = be.zeros({2, 2});
  try {
    be.combine_backward(dy, dw, dst, src, dup, w);
    FAIL() << "a duplicated slot was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_CONTAINS(e.what(), "a row of y is named by two slots");
  }
  Tensor uniq = be.from_i32({2, 2}, std::vector<int32_t>{0, -1, 2, 1});
  EXPECT_NO_THROW(be.combine_backward(dy, dw, dst, src, uniq, w));
}

TEST(OpenclSmoke, LazyChecksReportAtSynchronize) {
  TROUPE_REQUIRE_OPENCL_BACKEND(shared);
  setenv("TROUPE_OPENCL_LAZY_CHECKS", "1", 1);
  BackendOptions o;
  o.kind = troupe::kernels::BackendKind::opencl;
  auto be = make_backend(o);
  unsetenv("TROUPE_OPENCL_LAZY_CHECKS");
  Tensor table = be->zeros({4, 3}), out = be->empty({1, 3});
  Tensor bad = be->from_i32({1}, std::vector<int32_t>{-1});
  EXPECT_NO_THROW(be->embedding_forward(out, table, bad));  // deferred
  try {
    be->synchronize();
    FAIL() << "synchronize did not report the bad id";
  } catch (const std::invalid_argument& e) {
    EXPECT_CONTAINS(e.what(), "opencl synchronize: bad input: token id outside [0, vocab)");
  }
  EXPECT_NO_THROW(be->synchronize());  // reported once, then cleared
}

TEST(OpenclSmoke, ForeignAndMisshapenTensorsAreRejected) {
  TROUPE_REQUIRE_OPENCL_BACKEND(be);
  BackendOptions ho;
  auto host = make_backend(ho);
  Tensor h = host->zeros({4});
  Tensor c = be.zeros({4});
  try {
    be.add(c, c, h);
    FAIL() << "a host tensor was accepted";
  } catch (const std::invalid_argument& e) {
    EXPECT_CONTAINS(e.what(), "belongs to another backend");
  }
  EXPECT_THROW(be.add(c, c, be.zeros({5})), std::invalid_argument);
  EXPECT_THROW(be.fill(be.zeros({2}, DType::i32), 1.0f), std::invalid_argument);
  EXPECT_THROW(be.copy(c.view(0, {3}), c.view(1, {3})), std::invalid_argument);  // overlap
  EXPECT_THROW(be.upload(c, std::vector<float>(5).data(), 5 * sizeof(float)),
               std::invalid_argument);
  EXPECT_THROW(be.gemm(false, false, 2, 2, 2, 1.0f, c, c, 0.0f, be.zeros({3})),
               std::invalid_argument);
  Tensor q = be.zeros({1, 2, 1, 300});  // head dim above the kernel's limit
  Tensor lse = be.zeros({1, 1, 2});
  EXPECT_THROW(be.attention_forward(q, lse, q, q, q, 1.0f), std::invalid_argument);
}

TEST(OpenclSmoke, SquaredNormSumsInDouble) {
  TROUPE_REQUIRE_OPENCL_BACKEND(be);
  std::vector<float> v(100003);
  double want = 0.0;
  for (size_t i = 0; i < v.size(); ++i) {
    v[i] = static_cast<float>(std::sin(0.001 * static_cast<double>(i)) * 3.0);
    want += static_cast<double>(v[i]) * v[i];
  }
  Tensor x = be.from_f32({static_cast<int64_t>(v.size())}, v);
  const double got = be.squared_norm(x);
  EXPECT_NEAR(got, want, 1e-5 * want);
  EXPECT_EQ(be.squared_norm(x), got);  // bitwise repeatable
  EXPECT_EQ(be.squared_norm(x.view(0, {0})), 0.0);
}

// Many same-sign squares: plain float partial sums over thousands of elements
// drift by ~1e-4 relative; the kernel's compensated sums must stay near 1e-6.
TEST(OpenclSmoke, SquaredNormStaysAccurateOnLongVectors) {
  TROUPE_REQUIRE_OPENCL_BACKEND(be);
  const int64_t n = int64_t{1} << 23;
  std::vector<float> v(static_cast<size_t>(n));
  double want = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    v[static_cast<size_t>(i)] = 1.0f + static_cast<float>(i % 1000) * 1e-3f;
    want += static_cast<double>(v[static_cast<size_t>(i)]) * v[static_cast<size_t>(i)];
  }
  Tensor x = be.from_f32({n}, v);
  const double got = be.squared_norm(x);
  EXPECT_NEAR(got, want, 2e-6 * want);
}

// Devices are threads with a backend each: two backends running GEMMs and
// kernels at the same time must both get exact results.
TEST(OpenclSmoke, TwoBackendsOnTwoThreads) {
  TROUPE_REQUIRE_OPENCL_BACKEND(shared);
  auto work = [](int seed, std::string* error) {
    try {
      BackendOptions o;
      o.kind = troupe::kernels::BackendKind::opencl;
      auto be = make_backend(o);
      const int64_t n = 24 + seed;  // different shapes per thread
      std::vector<float> a(static_cast<size_t>(n * n));
      for (size_t i = 0; i < a.size(); ++i) a[i] = static_cast<float>((i * 7 + seed) % 5);
      Tensor A = be->from_f32({n, n}, a), C = be->empty({n, n});
      Tensor I = be->zeros({n, n});
      std::vector<float> eye(static_cast<size_t>(n * n), 0.0f);
      for (int64_t i = 0; i < n; ++i) eye[static_cast<size_t>(i * n + i)] = 1.0f;
      be->upload_f32(I, eye);
      for (int rep = 0; rep < 20; ++rep) {
        be->gemm(rep % 2, false, n, n, n, 1.0f, rep % 2 ? I : A, rep % 2 ? A : I, 0.0f, C);
        be->scale(C, 2.0f);
        std::vector<float> got = be->download_f32(C);
        for (size_t i = 0; i < a.size(); ++i)
          if (got[i] != 2.0f * a[i]) {
            *error = "thread " + std::to_string(seed) + " rep " + std::to_string(rep) +
                     ": wrong element " + std::to_string(i);
            return;
          }
      }
    } catch (const std::exception& e) {
      *error = e.what();
    }
  };
  std::string e1, e2;
  std::thread t1(work, 1, &e1), t2(work, 2, &e2);
  t1.join();
  t2.join();
  EXPECT_EQ(e1, "");
  EXPECT_EQ(e2, "");
}

}  // namespace
}  // namespace troupe::kernels
