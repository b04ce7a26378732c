# bench_kernels: GEMM GFLOP/s vs raw cblas_sgemm and memory-bound op GB/s vs
# memcpy, per backend, on the quickstart model's shapes (bench/kernels.cpp).
add_executable(bench_kernels ${CMAKE_CURRENT_LIST_DIR}/kernels.cpp)
target_compile_options(bench_kernels PRIVATE ${TROUPE_WARNINGS})
target_link_libraries(bench_kernels PRIVATE troupe_kernels)
