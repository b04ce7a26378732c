# Expert parallelism: the Dispatch/Combine codec and its receiver-side checks
# (actors/transport/moe_messages.hpp), and the expert-shard actor driven standalone
# (actors/experts/expert_shard.hpp).
if(TARGET troupe_runtime)
  troupe_add_gtest(moe_messages_test
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/moe_messages_test.cpp
    LIBS troupe_runtime
    TIMEOUT 120
    LABELS experts)
  troupe_add_gtest(runtime_expert_actor_test
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/../actors/runtime_expert_actor_test.cpp
    LIBS troupe_runtime
    TIMEOUT 120
    LABELS experts)
endif()

# Two processes under mpirun: rank 0 hosts an expert shard, rank 1 dispatches
# to it through the middleman and checks the Combines bitwise; malformed
# dispatches cross the wire and are rejected while the shard keeps serving.
if(TARGET troupe_runtime)
  if(NOT TARGET troupe_mpi)
    include(${PROJECT_SOURCE_DIR}/launch/mpi.cmake)
  endif()
  add_executable(experts_two_process ${CMAKE_CURRENT_LIST_DIR}/../actors/experts_two_process.cpp)
  target_compile_options(experts_two_process PRIVATE ${TROUPE_WARNINGS})
  target_link_libraries(experts_two_process PRIVATE troupe_runtime troupe_mpi caf)
  if(MPIRUN_EXECUTABLE)
    add_test(NAME experts_two_process
      COMMAND ${MPIRUN_EXECUTABLE} --allow-run-as-root --oversubscribe -np 2 $<TARGET_FILE:experts_two_process>)
    set_tests_properties(experts_two_process PROPERTIES TIMEOUT 180 LABELS experts)
  endif()
endif()
