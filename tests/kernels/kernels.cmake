# Kernel op tests: one gtest binary; every case runs on each backend ("host",
# and "opencl" when it can be created; TROUPE_REQUIRE_OPENCL=1 makes a missing
# OpenCL backend fail instead of skip). CMAKE_CURRENT_LIST_DIR: this file's dir.
troupe_add_gtest(kernels_tests
  SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/kernels_harness.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kernels_reference.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kernels_memory_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kernels_gemm_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kernels_layers_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kernels_attention_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kernels_activation_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kernels_routing_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kernels_optim_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kernels_overwrite_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kernels_determinism_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kernels_pool_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kernels_invariant_test.cpp
  LIBS troupe_kernels
  TIMEOUT 300
  LABELS kernels)
# The host backend's same-bits tests (threads, concurrent devices, repeated
# runs, GEMM) under each kernel family: the bitwise matrix (tests/CMakeLists.txt).
troupe_add_bitwise(kernels_bitwise LABELS kernels
  COMMAND $<TARGET_FILE:kernels_tests>
          --gtest_filter=HostThreads.*:HostPool.*:Backends/KernelsDeterminism.*/host:Backends/KernelsGemm.*/host:BatchInvariantGemm.*)
