# bench_moe: MoE dispatch + combine through Envelopes in-process and across 2
# processes, next to MPI_Alltoallv of the same bytes (bench/moe.cpp).
# Run: bench_moe [--json PATH]; mpirun --allow-run-as-root --oversubscribe -np 2 bench_moe [--json PATH]
if(NOT TARGET troupe_mpi)
  include(${PROJECT_SOURCE_DIR}/launch/mpi.cmake)
endif()
add_executable(bench_moe ${CMAKE_CURRENT_LIST_DIR}/moe.cpp)
target_compile_options(bench_moe PRIVATE ${TROUPE_WARNINGS})
target_link_libraries(bench_moe PRIVATE troupe_runtime troupe_mpi MPI::MPI_CXX caf)
