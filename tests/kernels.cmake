# Kernel op tests: one gtest binary; every case runs on each backend ("host",
# and "opencl" when it can be created; TROUPE_REQUIRE_OPENCL=1 makes a missing
# OpenCL backend fail instead of skip).
troupe_add_gtest(kernels_tests
  SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/kernels_harness.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kernels_reference.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kernels_gemm_test.cpp
  LIBS troupe_kernels
  TIMEOUT 900
  LABELS kernels)
