// OpenBLAS's kernel choice and the re-exec that undoes its fallback (see blas_core.hpp).
#include "kernels/blas_core.hpp"

#include <cblas.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace troupe::kernels {

std::string blas_core() {
  const char* core = openblas_get_corename();
  return core ? core : "unknown";
}

namespace {

// The core type this CPU should use when OpenBLAS fell back to Prescott;
// nullptr when it did not fall back, the user chose, or nothing is better.
const char* better_core() {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return nullptr;
  if (blas_core() != "Prescott") return nullptr;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512cd"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return nullptr;
}

}  // namespace

void configure_openblas(char** argv) {
  bool again = false;
  if (const char* core = better_core()) {
    ::setenv("OPENBLAS_CORETYPE", core, 1);  // also stops a second re-exec
    again = true;
  }
  if (std::getenv("OPENBLAS_THREAD_TIMEOUT") == nullptr) {
    ::setenv("OPENBLAS_THREAD_TIMEOUT", kOpenblasThreadTimeout, 1);
    again = true;
  }
  if (again) ::execv("/proc/self/exe", argv);  // returns only on failure
}

}  // namespace troupe::kernels
