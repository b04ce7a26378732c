// Memory, elementwise ops and views on every backend: upload/download, fill,
// copy (f32 and i32), add (also in place), axpy, scale, and ops run on views of
// one flat buffer at offsets (as ParamLayout hands them out).
#include <gtest/gtest.h>

#include "tests/kernels/kernels_harness.hpp"
#include "tests/kernels/kernels_reference.hpp"

namespace troupe::kernels::testing {
namespace {

using ref::V;

constexpr Tol kExact{0.0, 0.0};
constexpr Tol kFwd{1e-7, 1e-6};

class KernelsMemory : public BackendTest {};

const int64_t kSizes[] = {1, 7, 33, 1000, 4099};

TEST_P(KernelsMemory, UploadDownloadRoundTrip) {
  Rng rng(50);
  for (int64_t n : kSizes) {
    const auto x = rng.f32(n);
    const auto ids = rng.i32(n, -1000, 1000);
    check_op(
        be(),
        [&](Arena& a) -> Outputs {
          return {{"f32", a.get(a.in({n}, x))}, {"i32", a.get_i32(a.in_i32({n}, ids))}};
        },
        {to_double(x), to_double(to_float(ids))}, kExact);
  }
  Backend& b = be();
  Tensor z = b.zeros({3, 5}, DType::i32);
  EXPECT_EQ(b.download_i32(z), std::vector<int32_t>(15, 0));
  EXPECT_EQ(b.download_f32(b.zeros({4})), std::vector<float>(4, 0.0f));
  EXPECT_THROW(b.upload_f32(b.zeros({4}), std::vector<float>(5, 1.0f)), std::invalid_argument);
  EXPECT_THROW(b.upload_i32(b.zeros({4}), std::vector<int32_t>(4, 1)), std::invalid_argument);
  EXPECT_ANY_THROW(b.empty({2, -1}));
}

TEST_P(KernelsMemory, FillCopy) {
  Rng rng(51);
  for (int64_t n : kSizes) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const auto x = rng.f32(n);
    const auto ids = rng.i32(n, -5, 5);
    check_op(
        be(),
        [&](Arena& a) -> Outputs {
          Tensor t = a.out({n});
          a.be().fill(t, 0.375f);
          return {{"fill", a.get(t)}};
        },
        {V(static_cast<size_t>(n), 0.375)}, kExact);
    check_op(
        be(),
        [&](Arena& a) -> Outputs {
          Tensor d = a.out({n}), di = a.out_i32({n});
          a.be().copy(d, a.in({n}, x));
          a.be().copy(di, a.in_i32({n}, ids));
          return {{"copy f32", a.get(d)}, {"copy i32", a.get_i32(di)}};
        },
        {to_double(x), to_double(to_float(ids))}, kExact);
  }
  EXPECT_THROW(be().copy(be().zeros({3}), be().zeros({4})), std::invalid_argument);
  EXPECT_THROW(be().copy(be().zeros({3}), be().zeros({3}, DType::i32)), std::invalid_argument);
}

TEST_P(KernelsMemory, AddAxpyScale) {
  Rng rng(52);
  for (int64_t n : kSizes) {
    SCOPED_TRACE("n=" + std::to_string(n));
    const auto x = rng.f32(n), y = rng.f32(n);
    const V xd = to_double(x), yd = to_double(y);
    V sum(xd.size()), axpy(xd.size()), scaled(xd.size());
    for (size_t i = 0; i < xd.size(); ++i) {
      sum[i] = xd[i] + yd[i];
      axpy[i] = yd[i] + 0.3 * xd[i];
      scaled[i] = -1.75 * xd[i];
    }
    check_op(
        be(),
        [&](Arena& a) -> Outputs {
          Tensor o = a.out({n}), in_place = a.in({n}, x), ty = a.in({n}, y), tx = a.in({n}, x);
          a.be().add(o, a.in({n}, x), a.in({n}, y));
          a.be().add(in_place, in_place, a.in({n}, y));  // out aliases a
          a.be().axpy(ty, 0.3f, a.in({n}, x));
          a.be().scale(tx, -1.75f);
          return {{"add", a.get(o)},
                  {"add in place", a.get(in_place)},
                  {"axpy", a.get(ty)},
                  {"scale", a.get(tx)}};
        },
        {sum, sum, axpy, scaled}, kFwd);
  }
  EXPECT_THROW(be().add(be().zeros({3}), be().zeros({3}), be().zeros({4})), std::invalid_argument);
  EXPECT_THROW(be().axpy(be().zeros({3}), 1.0f, be().zeros({2})), std::invalid_argument);
}

// Parameters live in one flat buffer; layers see named views at offsets.
TEST_P(KernelsMemory, OpsOnViewsOfOneFlatBuffer) {
  Rng rng(53);
  const int64_t m = 5, k = 7, n = 3;
  const int64_t off_a = 3, off_b = off_a + m * k + 2, off_c = off_b + k * n + 1;
  const int64_t off_w = off_c + m * n + 5, total = off_w + n + 4;
  const auto flat = rng.f32(total);
  const V fd = to_double(flat);
  const V c = ref::gemm(false, false, m, n, k, 1.0, fd, fd, 0.0, {}, off_a, off_b, 0);
  V want = fd;
  std::copy(c.begin(), c.end(), want.begin() + off_c);
  // then rows 1..3 of C += w (add_row on a rows() view of the C view)
  for (int64_t r = 1; r < 4; ++r)
    for (int64_t j = 0; j < n; ++j) want[off_c + r * n + j] += fd[off_w + j];
  // then the w view is scaled in place
  for (int64_t j = 0; j < n; ++j) want[off_w + j] *= 2.0;
  check_op(be(),
           [&](Arena& ar) -> Outputs {
             Tensor all = ar.in({total}, flat);
             Tensor a = all.view(off_a, {m, k}), b = all.view(off_b, {k, n});
             Tensor cv = all.view(off_c, {m, n}), w = all.view(off_w, {n});
             ar.be().gemm(false, false, m, n, k, 1.0f, a, b, 0.0f, cv);
             ar.be().add_row(cv.rows(1, 4), w, 1.0f);
             ar.be().scale(w, 2.0f);
             return {{"flat buffer", ar.get(all)}};
           },
           {want}, {1e-6, 1e-6});
}

TROUPE_INSTANTIATE_BACKENDS(KernelsMemory);

}  // namespace
}  // namespace troupe::kernels::testing
