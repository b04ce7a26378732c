# bench_sim_actors: sim devices (actors/sim/sim_runtime.hpp) — wall time to
# simulate one step of 1,024 devices through the actors vs the discrete-event
# simulator on the same op lists, in the same run. Prints a table, writes JSON.
if(TARGET troupe_runtime)
  add_executable(bench_sim_actors ${CMAKE_CURRENT_LIST_DIR}/sim_actors.cpp)
  target_compile_options(bench_sim_actors PRIVATE ${TROUPE_WARNINGS})
  target_link_libraries(bench_sim_actors PRIVATE troupe_runtime)
endif()
