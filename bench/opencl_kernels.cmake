# bench_opencl_kernels: OpenCL attention and embedding-backward ms per call over
# a range of sizes (bench/opencl_kernels.cpp); compare two builds' JSON with
# bench/opencl_kernels_compare.py.
add_executable(bench_opencl_kernels ${CMAKE_CURRENT_LIST_DIR}/opencl_kernels.cpp)
target_compile_options(bench_opencl_kernels PRIVATE ${TROUPE_WARNINGS})
target_link_libraries(bench_opencl_kernels PRIVATE troupe_kernels)
