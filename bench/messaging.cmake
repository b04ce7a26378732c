# bench_messaging: Envelope cost in-process (vs. a bare message) and across
# processes (CAF middleman vs. MPI point-to-point), see bench/messaging.cpp.
# Run: mpirun --allow-run-as-root --oversubscribe -np 2 bench_messaging [--json PATH]
if(NOT TARGET troupe_mpi)
  include(${PROJECT_SOURCE_DIR}/launch/mpi.cmake)
endif()
add_executable(bench_messaging ${CMAKE_CURRENT_LIST_DIR}/messaging.cpp)
target_compile_options(bench_messaging PRIVATE ${TROUPE_WARNINGS})
target_link_libraries(bench_messaging PRIVATE troupe_actors troupe_mpi MPI::MPI_CXX caf)
