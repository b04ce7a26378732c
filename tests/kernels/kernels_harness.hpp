// Test harness for the per-op kernel tests (ggml style): every case runs on
// every backend ("host" always, "opencl" when it can be created), against a
// float64 reference, with poisoned outputs, guarded views at odd offsets, and
// a direct comparison with the host backend.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "kernels/backend.hpp"

namespace troupe::kernels::testing {

// Backend by name, created once per process; nullptr (and the reason) if it
// cannot be created.
Backend* backend_or_null(const std::string& name, std::string* why);
Backend& host_backend();

// Value-parameterized over the backend name. An "opencl" backend that cannot
// be created is skipped, unless TROUPE_REQUIRE_OPENCL=1, where it fails.
class BackendTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override;
  Backend& be() { return *be_; }

 private:
  Backend* be_ = nullptr;
};

#define TROUPE_INSTANTIATE_BACKENDS(Suite)                                                \
  INSTANTIATE_TEST_SUITE_P(Backends, Suite,                                               \
                           ::testing::Values(std::string("host"), std::string("opencl")), \
                           [](const ::testing::TestParamInfo<std::string>& i) { return i.param; })

// Deterministic inputs (splitmix64), identical on every platform.
class Rng {
 public:
  explicit Rng(uint64_t seed) : s_(seed) {}
  uint64_t next();
  double uniform(double lo, double hi);
  int32_t integer(int32_t lo, int32_t hi);  // in [lo, hi]
  // n values in [lo, hi), none of them zero (so a missed input is never masked).
  std::vector<float> f32(size_t n, float lo = -1.0f, float hi = 1.0f);
  std::vector<int32_t> i32(size_t n, int32_t lo, int32_t hi);

 private:
  uint64_t s_;
};

std::vector<double> to_double(const std::vector<float>& v);
std::vector<float> to_float(const std::vector<int32_t>& v);
std::vector<double> add(const std::vector<double>& a, const std::vector<double>& b);

// |got - want| <= atol + rtol * |want| elementwise (NaN always fails).
struct Tol {
  double atol, rtol;
};
::testing::AssertionResult near(const std::vector<float>& got, const std::vector<double>& want,
                                Tol tol);
// The same for two float64 vectors (checks the reference against finite differences).
::testing::AssertionResult near(const std::vector<double>& got, const std::vector<double>& want,
                                Tol tol);

// Allocates the tensors of one test run. With offset > 0 every tensor is a
// view starting `offset` elements into a larger buffer whose other elements
// hold a sentinel; guards_intact() then proves no op wrote outside its view.
class Arena {
 public:
  Arena(Backend& be, int64_t offset) : be_(be), offset_(offset) {}
  Backend& be() { return be_; }
  Tensor in(Shape shape, const std::vector<float>& data);
  Tensor in_i32(Shape shape, const std::vector<int32_t>& data);
  Tensor out(Shape shape);      // f32 filled with NaN
  Tensor out_i32(Shape shape);  // i32 filled with a sentinel
  std::vector<float> get(const Tensor& t);
  std::vector<float> get_i32(const Tensor& t);  // as floats (exact for small ints)
  ::testing::AssertionResult guards_intact();

 private:
  Tensor place(Shape shape, DType dtype);
  Backend& be_;
  int64_t offset_;
  std::vector<std::pair<Tensor, Tensor>> placed_;  // (whole buffer, view)
};

// One op case: builds its tensors in the arena, runs, returns named outputs.
using Outputs = std::vector<std::pair<std::string, std::vector<float>>>;
using Run = std::function<Outputs(Arena&)>;

// Runs `run` on `be` plainly and as views at an odd offset; checks each output
// against `want` within `tol`, the guards, and (for a backend other than host)
// the host backend's outputs within `tol` too.
void check_op(Backend& be, const Run& run, const std::vector<std::vector<double>>& want, Tol tol);

}  // namespace troupe::kernels::testing
