# Messaging: Cap'n Proto envelopes (round trips, malformed input, fuzzing,
# actors) and a two-process test over CAF's middleman, launched by mpirun.
if(NOT TARGET troupe_mpi)
  include(${PROJECT_SOURCE_DIR}/launch/mpi.cmake)
endif()

add_library(troupe_messaging_samples STATIC ${CMAKE_CURRENT_LIST_DIR}/messaging_samples.cpp)
target_compile_options(troupe_messaging_samples PRIVATE ${TROUPE_WARNINGS})
target_link_libraries(troupe_messaging_samples PUBLIC troupe_actors)

troupe_add_gtest(messaging_test
  SOURCES
    ${CMAKE_CURRENT_LIST_DIR}/messaging_roundtrip_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/messaging_malformed_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/messaging_fuzz_test.cpp
    ${CMAKE_CURRENT_LIST_DIR}/messaging_actor_test.cpp
  LIBS troupe_messaging_samples troupe_actors troupe_schemas caf zstd::libzstd_shared
  TIMEOUT 300
  LABELS messaging)

# Two processes: rank 0 publishes an actor, rank 1 connects; envelopes of
# every kind and several sizes go both ways. Exit code != 0 on any mismatch.
add_executable(messaging_two_process ${CMAKE_CURRENT_LIST_DIR}/messaging_two_process.cpp)
target_compile_options(messaging_two_process PRIVATE ${TROUPE_WARNINGS})
target_link_libraries(messaging_two_process PRIVATE troupe_messaging_samples troupe_mpi troupe_actors caf)
if(MPIRUN_EXECUTABLE)
  add_test(NAME messaging_two_process
    COMMAND ${MPIRUN_EXECUTABLE} --allow-run-as-root --oversubscribe -np 2 $<TARGET_FILE:messaging_two_process>)
  # The program has its own deadlines (request timeouts, connection timeout);
  # this is the backstop should mpirun itself hang.
  set_tests_properties(messaging_two_process PROPERTIES TIMEOUT 180 LABELS messaging)
endif()
