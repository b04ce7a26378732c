# bench_rollouts: one RL step's rollouts, whole-batch against continuous batching (model/, rl/).
if(TARGET troupe_rl)
  add_executable(bench_rollouts ${CMAKE_CURRENT_LIST_DIR}/rollouts.cpp)
  target_compile_options(bench_rollouts PRIVATE ${TROUPE_WARNINGS})
  target_link_libraries(bench_rollouts PRIVATE troupe_rl)
endif()
