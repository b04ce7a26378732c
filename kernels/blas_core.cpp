// OpenBLAS's kernel family: troupe's choice, and the re-exec that applies it (see blas_core.hpp).
#include "kernels/blas_core.hpp"

#include <cblas.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

namespace troupe::kernels {

namespace {

// Set beside OPENBLAS_CORETYPE when troupe chose the value, so a later step
// (the spec's family, a child process) can tell troupe's choice from the user's.
constexpr const char* kChosenByTroupe = "TROUPE_OPENBLAS_CORETYPE";

bool cpu_has_avx2_fma() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}

bool cpu_has_avx512() {
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl") &&
         __builtin_cpu_supports("avx512cd");
}

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

// True when OPENBLAS_CORETYPE holds troupe's choice (or nothing).
bool core_chosen_by_troupe() {
  const char* core = env("OPENBLAS_CORETYPE");
  const char* mark = env(kChosenByTroupe);
  return !core || (mark && std::strcmp(core, mark) == 0);
}

void choose_core(const std::string& core) {
  ::setenv("OPENBLAS_CORETYPE", core.c_str(), 1);
  ::setenv(kChosenByTroupe, core.c_str(), 1);
}

}  // namespace

const char* host_kernels_name(HostKernels k) {
  switch (k) {
    case HostKernels::portable: return "portable";
    case HostKernels::native: return "native";
  }
  return "?";
}

std::string blas_core() {
  const char* core = openblas_get_corename();
  return core ? core : "unknown";
}

std::string blas_core_for(HostKernels k) {
  if (!cpu_has_avx2_fma()) return "";
  if (k == HostKernels::native && cpu_has_avx512()) return "SkylakeX";
  return kPortableBlasCore;
}

void configure_openblas(char** argv) {
  bool again = false;
  const std::string portable = blas_core_for(HostKernels::portable);
  if (!env("OPENBLAS_CORETYPE") && !portable.empty()) {
    choose_core(portable);
    again = true;
  }
  if (!env("OPENBLAS_THREAD_TIMEOUT")) {
    ::setenv("OPENBLAS_THREAD_TIMEOUT", kOpenblasThreadTimeout, 1);
    again = true;
  }
  if (again) ::execv("/proc/self/exe", argv);  // returns only on failure
}

void select_host_kernels(HostKernels k, char** argv) {
  const std::string want = blas_core_for(k);
  if (want.empty() || !core_chosen_by_troupe()) return;
  const char* core = env("OPENBLAS_CORETYPE");
  if (core && want == core) return;
  choose_core(want);
  ::execv("/proc/self/exe", argv);  // returns only on failure
}

std::string describe_host_kernels(HostKernels k, bool* warning) {
  const std::string core = blas_core();
  const std::string portable = blas_core_for(HostKernels::portable);
  bool off_portable = false;
  std::string why;
  if (portable.empty()) {
    why = "OpenBLAS's choice: this CPU lacks AVX2 or FMA, so the portable family cannot run and bits may differ from "
          "other CPUs'";
    off_portable = k == HostKernels::portable;
  } else if (!core_chosen_by_troupe()) {
    why = "set by OPENBLAS_CORETYPE in the environment";
    off_portable = k == HostKernels::portable && core != portable;
    if (off_portable) why += "; not the portable family (" + portable + "): bits may differ from other CPUs'";
  } else if (k == HostKernels::portable) {
    why = "portable: the same bits on every x86-64 CPU with AVX2 and FMA";
  } else if (core == portable) {
    why = "native: on this CPU the portable family, the same bits on every x86-64 CPU with AVX2 and FMA";
  } else {
    why = "native: this CPU's fastest; bits may differ from the portable family's";
  }
  if (warning) *warning = off_portable;
  return core + " (" + why + ")";
}

}  // namespace troupe::kernels
