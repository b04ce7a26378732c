// Entry point of the `troupe` executable.
//
// Before anything else, the BLAS kernels: OpenBLAS 0.3.21 (Debian 12's)
// picks its kernels by CPU model when the library loads and falls back to its
// SSE3 "Prescott" kernels on models it does not know (recent Intel Xeons
// among them): sgemm runs 5-8x slower than with the AVX-512 ones on such a
// machine (bench/RESULTS.md, "Performance II: tiled attention, grouped GEMM,
// cross-entropy"). OpenBLAS reads OPENBLAS_CORETYPE only as it loads, so when
// it fell back although the CPU has AVX-512 (its SkylakeX kernels) or AVX2 and
// FMA (Haswell), troupe runs itself again, once, with the variable set. A
// user's own OPENBLAS_CORETYPE is left alone (e.g. "Prescott" to keep the old
// kernels); the log's first line names the kernels in use.
#include <cblas.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "launch/cli.hpp"

namespace {

// The OpenBLAS core type this CPU should use when OpenBLAS fell back to
// Prescott; nullptr when it did not fall back or the CPU has nothing better.
const char* better_openblas_core() {
  if (std::getenv("OPENBLAS_CORETYPE") != nullptr) return nullptr;  // the user chose
  const char* core = openblas_get_corename();
  if (core == nullptr || std::strcmp(core, "Prescott") != 0) return nullptr;
  __builtin_cpu_init();
  if (__builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512dq") &&
      __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512cd"))
    return "SkylakeX";
  if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return "Haswell";
  return nullptr;
}

}  // namespace

int main(int argc, char** argv) {
  if (const char* core = better_openblas_core()) {
    ::setenv("OPENBLAS_CORETYPE", core, 1);
    ::execv("/proc/self/exe", argv);  // returns only on failure: go on with what loaded
  }
  return troupe::launch::run_cli(argc, argv);
}
