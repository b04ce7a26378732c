# bench_faults: goodput at one fault per 10 steps, MTTR per role (kills) in
# one process, and the cost of the Envelope frame's CRC-32 trailer.
if(TARGET troupe_runtime AND TARGET troupe_spec)
  add_executable(bench_faults ${CMAKE_CURRENT_LIST_DIR}/faults.cpp)
  target_compile_options(bench_faults PRIVATE ${TROUPE_WARNINGS})
  target_link_libraries(bench_faults PRIVATE troupe_runtime troupe_spec)
endif()
