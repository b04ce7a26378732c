// Which OpenBLAS kernels this process runs. Results depend on the kernel
// family, not on the CPU that runs it, so troupe picks the family itself
// instead of OpenBLAS's detection: by default the "portable" one (OpenBLAS's
// Haswell kernels: AVX2 + FMA), the same on every x86-64 CPU that has them,
// Intel or AMD, so the same spec and seed give the same checkpoint bytes on
// all of them. `topology.host_kernels = "native"` takes the fastest family the
// CPU runs (SkylakeX's AVX-512 kernels where present; bench/results/same_bits.md "Same
// bits on every CPU" has the cost). troupe's own host kernels are built
// without -march and with -ffp-contract=off; the AVX2 clones of the vectorized
// ones give the bits of the baseline ones (kernels/host_ops.hpp), and every CPU
// with AVX2 runs the same clone. The libm functions they call (log, exp, pow,
// sin, cos) are glibc's, which runs its FMA variants on every CPU with AVX2
// and FMA. So OpenBLAS's family is the only choice there is.
//
// OpenBLAS reads OPENBLAS_CORETYPE only as the library loads, hence the
// re-exec. A value the user set is left alone (and named in the run log).
#pragma once

#include <cstdint>
#include <string>

namespace troupe::kernels {

enum class HostKernels : uint8_t { portable, native };  // "portable", "native"
const char* host_kernels_name(HostKernels k);

// The OpenBLAS core type of the portable family.
inline constexpr const char* kPortableBlasCore = "Haswell";

// The core type OpenBLAS runs in this process ("Haswell", "SkylakeX", ...).
std::string blas_core();

// The core type `k` names on this CPU; "" when this CPU cannot run the
// portable family (no AVX2 + FMA): OpenBLAS's own detection then.
std::string blas_core_for(HostKernels k);

// Called first thing by `troupe`'s main and by the bench programs' mains. Sets
// what OpenBLAS reads when it loads and re-executes this program with `argv`,
// once, at most:
// - OPENBLAS_CORETYPE = the portable family, unless the user set it;
// - OPENBLAS_THREAD_TIMEOUT = kOpenblasThreadTimeout: OpenBLAS's idle worker
//   threads otherwise spin (calling sched_yield) for ~2^28 cycles after each
//   multi-threaded call (the benches' peak measurements make such calls).
// Returns only when nothing was to be done or the exec failed (then the
// process goes on with what loaded).
void configure_openblas(char** argv);
// log2 of the cycles an idle OpenBLAS thread spins before it sleeps (4 is
// OpenBLAS's minimum).
inline constexpr const char* kOpenblasThreadTimeout = "4";

// After the spec is read: when the family it asks for is not the one loaded
// and troupe (not the user) chose the loaded one, re-executes with `argv` and
// the family's core type. Returns otherwise.
void select_host_kernels(HostKernels k, char** argv);

// One line for the run log: the core type in use and where it came from
// ("Haswell (portable: the same bits on every x86-64 CPU with AVX2 and FMA)",
// "SkylakeX (set by OPENBLAS_CORETYPE in the environment)", ...). `k` is the
// family the spec asked for; `warning` is set when the bits are not the
// portable family's although the spec asked for it.
std::string describe_host_kernels(HostKernels k, bool* warning = nullptr);

}  // namespace troupe::kernels
