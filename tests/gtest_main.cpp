// The main of every GoogleTest binary. It runs the tests under troupe's own
// choice of OpenBLAS kernel family, exactly as `troupe` and the benches do at
// start-up (kernels::configure_openblas: the portable family unless
// OPENBLAS_CORETYPE is set), instead of whatever OpenBLAS detects on this CPU
// (Cooperlake or SkylakeX on AVX-512 machines). A family set in the
// environment (a bitwise-matrix cell, a full-suite run under one family) is
// kept, so the suite can still be run under each family on purpose.
#include <gtest/gtest.h>

#include "kernels/blas_core.hpp"

int main(int argc, char** argv) {
  troupe::kernels::configure_openblas(argv);  // may re-execute this binary, before gtest reads argv
  testing::InitGoogleTest(&argc, argv);
  return RUN_ALL_TESTS();
}
