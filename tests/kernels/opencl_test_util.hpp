// Shared by the OpenCL tests: one OpenCL backend per process (PoCL compiles the
// program once), skipped when no OpenCL device exists unless
// TROUPE_REQUIRE_OPENCL=1, in which case the test fails with the reason.
#pragma once

#include <gtest/gtest.h>

#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.hpp"

// EXPECT_CONTAINS(text, part): text (a std::string) contains part; prints text otherwise.
#define EXPECT_CONTAINS(text, part)                                       \
  EXPECT_NE(std::string(text).find(part), std::string::npos)             \
      << "expected to find \"" << (part) << "\" in:\n" << (text)

namespace troupe::kernels::cltest {

// n floats uniform in [lo, hi) from a xorshift64 stream seeded by `seed`.
inline std::vector<float> randv(size_t n, uint64_t seed, float lo = -1.0f, float hi = 1.0f) {
  std::vector<float> v(n);
  uint64_t s = seed * 0x9e3779b97f4a7c15ull + 1;
  for (float& x : v) {
    s ^= s << 13, s ^= s >> 7, s ^= s << 17;  // xorshift64
    x = lo + (hi - lo) * static_cast<float>((s >> 11) * 0x1.0p-53);
  }
  return v;
}

inline bool opencl_required() {
  const char* v = std::getenv("TROUPE_REQUIRE_OPENCL");
  return v && std::string(v) == "1";
}

struct SharedOpencl {
  std::unique_ptr<Backend> be;
  std::string error;
  bool tried = false;
};
inline SharedOpencl& shared_opencl_state() {
  static SharedOpencl s;
  return s;
}

// The shared backend, or nullptr with the reason in *why.
inline Backend* shared_opencl(std::string* why) {
  SharedOpencl& s = shared_opencl_state();
  if (!s.tried) {
    s.tried = true;
    try {
      BackendOptions o;
      o.kind = kernels::BackendKind::opencl;
      s.be = make_backend(o);
    } catch (const std::exception& e) {
      s.error = e.what();
    }
  }
  *why = s.error;
  return s.be.get();
}

// The shared backend goes before main returns, while PoCL's LLVM is whole:
// left to the exit handlers, its destructor's clFinish could make PoCL compile
// a pending kernel after LLVM's statics were destroyed, and abort
// (tests/kernels/kernels_harness.cpp, ReleaseBackends).
class ReleaseSharedOpencl : public ::testing::Environment {
 public:
  void TearDown() override { shared_opencl_state().be.reset(); }
};
inline ::testing::Environment* const kReleaseSharedOpencl =
    ::testing::AddGlobalTestEnvironment(new ReleaseSharedOpencl);

// In a TEST body: TROUPE_REQUIRE_OPENCL_BACKEND(be); declares Backend& be or skips/fails.
#define TROUPE_REQUIRE_OPENCL_BACKEND(var)                                            \
  std::string var##_why;                                                               \
  ::troupe::kernels::Backend* var##_ptr = ::troupe::kernels::cltest::shared_opencl(&var##_why); \
  if (!var##_ptr) {                                                                    \
    if (::troupe::kernels::cltest::opencl_required())                                 \
      FAIL() << "OpenCL backend required but unavailable: " << var##_why;              \
    GTEST_SKIP() << "no OpenCL backend: " << var##_why;                               \
  }                                                                                    \
  ::troupe::kernels::Backend& var = *var##_ptr;                                       \
  (void)var

}  // namespace troupe::kernels::cltest
