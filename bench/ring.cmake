# bench_ring: step messages between two processes of one host through the
# shared-memory ring against MPI and CAF's TCP middleman (bench/ring.cpp).
# Run: mpirun --allow-run-as-root --oversubscribe -np 2 --mca btl self,vader bench_ring [--json PATH]
if(NOT TARGET troupe_mpi)
  include(${PROJECT_SOURCE_DIR}/launch/mpi.cmake)
endif()
add_executable(bench_ring ${CMAKE_CURRENT_LIST_DIR}/ring.cpp)
target_compile_options(bench_ring PRIVATE ${TROUPE_WARNINGS})
target_link_libraries(bench_ring PRIVATE troupe_actors troupe_mpi MPI::MPI_CXX caf)
