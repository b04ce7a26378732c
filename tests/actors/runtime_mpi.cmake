# The actor runtime across processes, under mpirun (tests/actors/runtime_mpi_test.sh):
# identical checkpoints to the single-process runtime, lost/hung process
# reports, world-size checks.
# troupe_with_hooks: the real CLI plus the test hooks of TROUPE_TEST_FAULT
# (a process that kills or stops itself), which production never reads.
if(TARGET troupe_launch)
  add_executable(troupe_with_hooks ${CMAKE_CURRENT_LIST_DIR}/../launch/troupe_with_hooks.cpp)
  target_link_libraries(troupe_with_hooks PRIVATE troupe_launch)
endif()
if(TARGET troupe AND MPIRUN_EXECUTABLE)
  troupe_add_bitwise(runtime_mpi THREADS 1 2 LABELS mpi runtime
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/runtime_mpi_test.sh $<TARGET_FILE:troupe> ${MPIRUN_EXECUTABLE}
            $<TARGET_FILE:tls_rogue_client> $<TARGET_FILE:troupe_with_hooks>)
  # Surviving the loss of process 1 of 2 (process kill / stop from the spec).
  add_test(NAME runtime_procloss
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/runtime_procloss_test.sh $<TARGET_FILE:troupe> ${MPIRUN_EXECUTABLE})
  set_tests_properties(runtime_procloss PROPERTIES LABELS "mpi;runtime" TIMEOUT 600)
endif()

# Two hosts made of network namespaces on this machine (tests/actors/runtime_netns_test.sh):
# off loopback, no shared memory, TLS; identical checkpoints, a rogue refused.
if(TARGET troupe AND MPIRUN_EXECUTABLE)
  add_test(NAME runtime_netns
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/runtime_netns_test.sh $<TARGET_FILE:troupe> ${MPIRUN_EXECUTABLE}
            $<TARGET_FILE:tls_rogue_client>)
  set_tests_properties(runtime_netns PROPERTIES LABELS "mpi;runtime;netns" TIMEOUT 600 SKIP_RETURN_CODE 77)
endif()

# The placement function alone (no processes needed).
if(TARGET troupe_runtime)
  troupe_add_gtest(runtime_mpi_placement_test
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/runtime_mpi_placement_test.cpp
    LIBS troupe_runtime
    TIMEOUT 60
    LABELS runtime)
endif()

# The shared-memory bulk path of the envelope transport, in one process.
if(TARGET troupe_messaging_samples)
  troupe_add_gtest(runtime_mpi_bulk_test
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/runtime_mpi_bulk_test.cpp
    LIBS troupe_messaging_samples troupe_actors caf
    TIMEOUT 60
    LABELS messaging)
endif()

# Two processes of one run as two Runtimes in one test process (no mpirun).
if(TARGET troupe_runtime)
  troupe_add_gtest(runtime_mpi_inproc_test
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/runtime_mpi_inproc_test.cpp
    LIBS troupe_runtime
    TIMEOUT 120
    LABELS runtime)
endif()

# TCP_NODELAY on the middleman's connections (actors/transport/tcp_nodelay.hpp).
troupe_add_gtest(transport_tcp_nodelay_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/transport_tcp_nodelay_test.cpp
  LIBS troupe_actors
  TIMEOUT 60
  LABELS messaging)

# Mutual TLS between processes ([topology] auth): the cluster key and refusal
# of peers without it (in one process, two CAF systems).
troupe_add_gtest(cluster_tls_test
  SOURCES ${CMAKE_CURRENT_LIST_DIR}/cluster_tls_test.cpp
  LIBS troupe_runtime
  TIMEOUT 120
  LABELS runtime)
add_executable(tls_rogue_client ${CMAKE_CURRENT_LIST_DIR}/tls_rogue_client.cpp)
target_link_libraries(tls_rogue_client PRIVATE troupe_runtime)

# Elastic experts across processes ([[elastic]], eplb) under mpirun
# (tests/actors/runtime_elastic_mpi_test.sh): the same checkpoint as static placement
# and as one process.
if(TARGET troupe AND MPIRUN_EXECUTABLE)
  troupe_add_bitwise(runtime_elastic_mpi THREADS 1 2 LABELS mpi runtime
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/runtime_elastic_mpi_test.sh $<TARGET_FILE:troupe> ${MPIRUN_EXECUTABLE}
            ${PROJECT_SOURCE_DIR}/launch/specs)
endif()

# The shared-memory ring between processes of one host (actors/transport/shm_ring.hpp)
# and the ring transport's decoder as a fuzz surface.
if(TARGET troupe_messaging_samples)
  troupe_add_gtest(transport_ring_test
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/transport_ring_test.cpp
    LIBS troupe_messaging_samples troupe_actors caf
    TIMEOUT 120
    LABELS messaging)
  troupe_add_gtest(transport_ring_actors_test
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/transport_ring_actors_test.cpp
    LIBS troupe_actors caf
    TIMEOUT 180
    LABELS messaging)
endif()
