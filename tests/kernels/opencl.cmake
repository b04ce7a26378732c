# OpenCL backend tests: device selection and error names, the cl_mem pool,
# smoke tests, OpenCL-vs-host / determinism checks at larger shapes, and the
# tiled attention and sorted embedding backward against float64 / sequential sums. Without
# an OpenCL platform they skip, unless TROUPE_REQUIRE_OPENCL=1 (then they fail).
troupe_add_gtest(opencl_tests
  SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/opencl_device_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/opencl_pool_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/opencl_smoke_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/opencl_ops_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/opencl_tiled_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/kernels_reference.cpp
  LIBS troupe_kernels
  TIMEOUT 900
  LABELS opencl kernels)
