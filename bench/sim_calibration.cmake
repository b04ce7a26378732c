# bench_sim_calibration: the sim calibrated by `troupe calibrate` against the
# real runtime (1F1B, DualPipe on 2 host devices), real steps interleaved with
# the calibration rounds. Prints predicted vs measured, writes JSON.
if(TARGET troupe_launch)
  add_executable(bench_sim_calibration ${CMAKE_CURRENT_LIST_DIR}/sim_calibration.cpp)
  target_compile_options(bench_sim_calibration PRIVATE ${TROUPE_WARNINGS})
  target_link_libraries(bench_sim_calibration PRIVATE troupe_launch)
endif()
