// Entry point of the `troupe` executable. Before anything else it sets what
// OpenBLAS reads when it loads (kernels/blas_core.hpp: its kernels where it
// fell back to the slow SSE3 ones, and how long its idle threads spin) by
// running itself again once; the run log's first line names the kernels in use.
#include "kernels/blas_core.hpp"
#include "launch/cli.hpp"

int main(int argc, char** argv) {
  troupe::kernels::configure_openblas(argv);
  return troupe::launch::run_cli(argc, argv);
}
