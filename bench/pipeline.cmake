# bench_pipeline_sim: schedules on the discrete-event simulator (bubble vs the
# published formulas, and a 1,024-device simulated step). Prints tables, writes JSON.
if(TARGET troupe_schedule)
  add_executable(bench_pipeline_sim ${CMAKE_CURRENT_LIST_DIR}/pipeline_sim.cpp)
  target_compile_options(bench_pipeline_sim PRIVATE ${TROUPE_WARNINGS})
  target_link_libraries(bench_pipeline_sim PRIVATE troupe_schedule)
endif()

# bench_pipeline_real: step time of the actor runtime (1 device sequential,
# 2 devices 1F1B / DualPipe / DualPipeV) vs model::Trainer in the same run.
if(TARGET troupe_runtime)
  add_executable(bench_pipeline_real ${CMAKE_CURRENT_LIST_DIR}/pipeline_real.cpp)
  target_compile_options(bench_pipeline_real PRIVATE ${TROUPE_WARNINGS})
  target_link_libraries(bench_pipeline_real PRIVATE troupe_runtime)
endif()
