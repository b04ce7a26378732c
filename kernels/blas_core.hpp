// Which OpenBLAS kernels this process runs, and the one re-exec that undoes
// OpenBLAS 0.3.21's fallback to its SSE3 "Prescott" kernels on CPUs it does
// not know (recent Xeons among them: sgemm 5-8x slower than with the AVX-512
// kernels; bench/RESULTS.md "OpenBLAS's kernel fallback"). OpenBLAS reads
// OPENBLAS_CORETYPE only as the library loads, hence the re-exec. Called
// first thing by `troupe`'s main and by the bench programs' mains.
#pragma once

#include <string>

namespace troupe::kernels {

// The core type OpenBLAS picked for this process ("SkylakeX", "Prescott", ...).
std::string blas_core();

// OpenBLAS reads its settings when it loads, so they are set here and this
// program re-executed with `argv`, once, at most:
// - OPENBLAS_CORETYPE when OpenBLAS fell back to Prescott although the CPU
//   has AVX-512 (its SkylakeX kernels) or AVX2 and FMA (Haswell);
// - OPENBLAS_THREAD_TIMEOUT = kOpenblasThreadTimeout: OpenBLAS's idle worker
//   threads otherwise spin (calling sched_yield) for ~2^28 cycles after each
//   multi-threaded call, on the cores the host backend's own threads
//   (HostPool: grouped GEMMs, attention, elementwise ops) then run on.
// A variable the user set is left alone. Returns only when nothing was to
// be done or the exec failed (then the process goes on with what loaded).
void configure_openblas(char** argv);
// log2 of the cycles an idle OpenBLAS thread spins before it sleeps (4 is
// OpenBLAS's minimum).
inline constexpr const char* kOpenblasThreadTimeout = "4";

}  // namespace troupe::kernels
