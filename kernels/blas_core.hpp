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

// When OpenBLAS fell back to Prescott although the CPU has AVX-512 (its
// SkylakeX kernels) or AVX2 and FMA (Haswell), and OPENBLAS_CORETYPE is not
// set (a user's own choice is left alone): sets it and re-executes this
// program with `argv`. Returns only when nothing was to be done or the exec
// failed (then the process goes on with what loaded).
void use_native_blas_kernels(char** argv);

}  // namespace troupe::kernels
