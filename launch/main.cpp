// Entry point of the `troupe` executable. Before anything else it undoes
// OpenBLAS's fallback to its slow SSE3 kernels on CPUs it does not know, by
// running itself again once with OPENBLAS_CORETYPE set (kernels/blas_core.hpp);
// the run log's first line names the kernels in use.
#include "kernels/blas_core.hpp"
#include "launch/cli.hpp"

int main(int argc, char** argv) {
  troupe::kernels::use_native_blas_kernels(argv);
  return troupe::launch::run_cli(argc, argv);
}
