// Test harness for the per-op kernel tests (see kernels_harness.hpp).
#include "tests/kernels/kernels_harness.hpp"

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <map>
#include <memory>
#include <sstream>

namespace troupe::kernels::testing {
namespace {

constexpr int64_t kGuard = 7;            // sentinel elements after each view
constexpr float kSentinel = 7777.25f;    // f32 guard value
constexpr int32_t kSentinelI = -777777;  // i32 guard and poison value

struct Slot {
  std::unique_ptr<Backend> backend;
  std::string error;
};

std::map<std::string, Slot>& backend_cache() {
  static std::map<std::string, Slot> cache;
  return cache;
}

// The cached backends go before main returns. Left to the exit handlers, the
// OpenCL backend's destructor waited (clFinish) on work a test had enqueued
// without waiting for it, and PoCL then compiled that kernel with LLVM's
// static pass registry already destroyed (it was created after the cache, so
// its exit handler ran first): "Failed to create kernel compiler pass
// inline-kernels" and an abort after PASSED. Seen under parallel ctest, when
// PoCL's compile had not finished by exit; every time with a cold PoCL cache
// (POCL_CACHE_DIR=$(mktemp -d)).
class ReleaseBackends : public ::testing::Environment {
 public:
  void TearDown() override { backend_cache().clear(); }
};
[[maybe_unused]] ::testing::Environment* const kReleaseBackends =
    ::testing::AddGlobalTestEnvironment(new ReleaseBackends);

}  // namespace

Backend* backend_or_null(const std::string& name, std::string* why) {
  auto& cache = backend_cache();
  auto it = cache.find(name);
  if (it == cache.end()) {
    Slot s;
    try {
      BackendOptions o;
      o.kind = parse_backend_kind(name);
      s.backend = make_backend(o);
    } catch (const std::exception& e) {
      s.error = e.what();
    }
    it = cache.emplace(name, std::move(s)).first;
  }
  if (why) *why = it->second.error;
  return it->second.backend.get();
}

Backend& host_backend() {
  std::string why;
  Backend* b = backend_or_null("host", &why);
  if (!b) throw std::runtime_error("host backend unavailable: " + why);
  return *b;
}

void BackendTest::SetUp() {
  std::string why;
  be_ = backend_or_null(GetParam(), &why);
  if (be_) return;
  const char* req = std::getenv("TROUPE_REQUIRE_OPENCL");
  const bool required = GetParam() != "opencl" || (req && std::string(req) == "1");
  if (required) FAIL() << "backend '" << GetParam() << "' cannot be created: " << why;
  GTEST_SKIP() << "backend '" << GetParam() << "' unavailable: " << why;
}

uint64_t Rng::next() {
  uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double Rng::uniform(double lo, double hi) {
  return lo + (hi - lo) * static_cast<double>(next() >> 11) * 0x1.0p-53;
}

int32_t Rng::integer(int32_t lo, int32_t hi) {
  return lo + static_cast<int32_t>(next() % static_cast<uint64_t>(hi - lo + 1));
}

std::vector<float> Rng::f32(size_t n, float lo, float hi) {
  std::vector<float> v(n);
  for (float& x : v) {
    do x = static_cast<float>(uniform(lo, hi));
    while (x == 0.0f);
  }
  return v;
}

std::vector<int32_t> Rng::i32(size_t n, int32_t lo, int32_t hi) {
  std::vector<int32_t> v(n);
  for (int32_t& x : v) x = integer(lo, hi);
  return v;
}

std::vector<double> to_double(const std::vector<float>& v) { return {v.begin(), v.end()}; }

std::vector<float> to_float(const std::vector<int32_t>& v) {
  std::vector<float> o(v.size());
  for (size_t i = 0; i < v.size(); ++i) o[i] = static_cast<float>(v[i]);
  return o;
}

std::vector<double> add(const std::vector<double>& a, const std::vector<double>& b) {
  std::vector<double> o(a.size());
  for (size_t i = 0; i < a.size(); ++i) o[i] = a[i] + b[i];
  return o;
}

namespace {
template <class G>
::testing::AssertionResult near_impl(const std::vector<G>& got, const std::vector<double>& want,
                                     Tol tol) {
  if (got.size() != want.size())
    return ::testing::AssertionFailure() << "size " << got.size() << " != expected " << want.size();
  size_t bad = 0, worst = 0;
  double worst_excess = -1.0;
  std::ostringstream first;
  for (size_t i = 0; i < got.size(); ++i) {
    const double err = std::abs(static_cast<double>(got[i]) - want[i]);
    const double lim = tol.atol + tol.rtol * std::abs(want[i]);
    if (!(err <= lim)) {  // also catches NaN
      if (bad < 5) first << "\n  [" << i << "] got " << got[i] << " want " << want[i];
      ++bad;
      const double excess = std::isnan(err) ? std::numeric_limits<double>::infinity() : err / lim;
      if (excess > worst_excess) worst_excess = excess, worst = i;
    }
  }
  if (bad == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << bad << " of " << got.size() << " elements outside atol " << tol.atol << " + rtol "
         << tol.rtol << "; worst [" << worst << "] got " << got[worst] << " want " << want[worst]
         << first.str();
}
}  // namespace

::testing::AssertionResult near(const std::vector<float>& got, const std::vector<double>& want,
                                Tol tol) {
  return near_impl(got, want, tol);
}

::testing::AssertionResult near(const std::vector<double>& got, const std::vector<double>& want,
                                Tol tol) {
  return near_impl(got, want, tol);
}

Tensor Arena::place(Shape shape, DType dtype) {
  const int64_t n = shape_numel(shape);
  const int64_t pad = offset_ > 0 ? offset_ + kGuard : 0;
  Tensor whole = be_.empty({n + pad}, dtype);
  if (pad) {
    if (dtype == DType::f32) {
      be_.upload_f32(whole, std::vector<float>(static_cast<size_t>(n + pad), kSentinel));
    } else {
      be_.upload_i32(whole, std::vector<int32_t>(static_cast<size_t>(n + pad), kSentinelI));
    }
  }
  Tensor view = whole.view(pad ? offset_ : 0, std::move(shape));
  placed_.emplace_back(whole, view);
  return view;
}

Tensor Arena::in(Shape shape, const std::vector<float>& data) {
  Tensor t = place(std::move(shape), DType::f32);
  be_.upload_f32(t, data);
  return t;
}

Tensor Arena::in_i32(Shape shape, const std::vector<int32_t>& data) {
  Tensor t = place(std::move(shape), DType::i32);
  be_.upload_i32(t, data);
  return t;
}

Tensor Arena::out(Shape shape) {
  Tensor t = place(std::move(shape), DType::f32);
  be_.upload_f32(t, std::vector<float>(static_cast<size_t>(t.numel()),
                                       std::numeric_limits<float>::quiet_NaN()));
  return t;
}

Tensor Arena::out_i32(Shape shape) {
  Tensor t = place(std::move(shape), DType::i32);
  be_.upload_i32(t, std::vector<int32_t>(static_cast<size_t>(t.numel()), kSentinelI));
  return t;
}

std::vector<float> Arena::get(const Tensor& t) {
  be_.synchronize();
  return be_.download_f32(t);
}

std::vector<float> Arena::get_i32(const Tensor& t) {
  be_.synchronize();
  return to_float(be_.download_i32(t));
}

::testing::AssertionResult Arena::guards_intact() {
  be_.synchronize();
  for (const auto& [whole, view] : placed_) {
    if (whole.numel() == view.numel()) continue;
    const int64_t lo = view.offset() - whole.offset(), hi = lo + view.numel();
    std::vector<int32_t> bits(static_cast<size_t>(whole.numel()));
    be_.download(bits.data(), whole, whole.bytes());  // raw bits: works for both dtypes
    int32_t sentinel = kSentinelI;
    if (whole.dtype() == DType::f32) std::memcpy(&sentinel, &kSentinel, sizeof sentinel);
    for (int64_t i = 0; i < whole.numel(); ++i)
      if ((i < lo || i >= hi) && bits[static_cast<size_t>(i)] != sentinel)
        return ::testing::AssertionFailure()
               << "element " << i << " outside view [" << lo << ", " << hi << ") of "
               << shape_str(view.shape()) << " was overwritten";
  }
  return ::testing::AssertionSuccess();
}

void check_op(Backend& be, const Run& run, const std::vector<std::vector<double>>& want, Tol tol) {
  Outputs first;
  for (int64_t offset : {0, 3}) {
    SCOPED_TRACE(offset ? "views at element offset 3" : "whole buffers");
    Arena arena(be, offset);
    Outputs got = run(arena);
    ASSERT_EQ(got.size(), want.size()) << "case returned a different number of outputs";
    for (size_t i = 0; i < got.size(); ++i)
      EXPECT_TRUE(near(got[i].second, want[i], tol)) << "output '" << got[i].first << "'";
    EXPECT_TRUE(arena.guards_intact());
    if (offset == 0) first = std::move(got);
  }
  if (be.name() == "host") return;
  SCOPED_TRACE("direct comparison with the host backend");
  Arena arena(host_backend(), 0);
  const Outputs host = run(arena);
  for (size_t i = 0; i < host.size(); ++i)
    EXPECT_TRUE(near(first[i].second, to_double(host[i].second), tol))
        << "output '" << first[i].first << "' vs host";
}

}  // namespace troupe::kernels::testing
