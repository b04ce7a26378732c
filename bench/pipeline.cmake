# bench_pipeline_sim: schedules on the discrete-event simulator (bubble vs the
# published formulas, and a 1,024-device simulated step). Prints tables, writes JSON.
if(TARGET troupe_schedule)
  add_executable(bench_pipeline_sim ${CMAKE_CURRENT_LIST_DIR}/pipeline_sim.cpp)
  target_compile_options(bench_pipeline_sim PRIVATE ${TROUPE_WARNINGS})
  target_link_libraries(bench_pipeline_sim PRIVATE troupe_schedule)
endif()
