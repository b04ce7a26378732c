# bench_blas_bits: what decides OpenBLAS sgemm's bits under the loaded kernel
# family (thread count, row and column splits, concurrent callers); bench/blas_bits.cpp.
add_executable(bench_blas_bits ${CMAKE_CURRENT_LIST_DIR}/blas_bits.cpp)
target_compile_options(bench_blas_bits PRIVATE ${TROUPE_WARNINGS})
target_link_libraries(bench_blas_bits PRIVATE ${BLAS_LIBRARIES} Threads::Threads)
