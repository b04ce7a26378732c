# troupe_mpi: ranks started by mpirun find each other's CAF ports through MPI.
# Included from launch/CMakeLists.txt (and, guarded by if(NOT TARGET troupe_mpi),
# from tests/actors/messaging.cmake), so paths are relative to this file.
add_library(troupe_mpi STATIC ${CMAKE_CURRENT_LIST_DIR}/mpi_bootstrap.cpp)
target_compile_options(troupe_mpi PRIVATE ${TROUPE_WARNINGS})
target_link_libraries(troupe_mpi PUBLIC caf PRIVATE MPI::MPI_CXX)
# `troupe run` under mpirun (launch/commands/run.cpp) uses the bootstrap.
if(TARGET troupe_launch)
  target_link_libraries(troupe_launch PRIVATE troupe_mpi)
endif()
