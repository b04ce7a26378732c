# troupe_schedule: pipeline schedules as pure functions (sequential, 1F1B,
# ZB-H1, DualPipe, DualPipeV) and the discrete-event simulator that runs them
# against a cost model. Pure C++20: no CAF, no backend.
add_library(troupe_schedule STATIC
  ${CMAKE_CURRENT_LIST_DIR}/schedule.cpp
  ${CMAKE_CURRENT_LIST_DIR}/schedule_dualpipe.cpp
  ${CMAKE_CURRENT_LIST_DIR}/pipeline_sim.cpp
)
target_compile_options(troupe_schedule PRIVATE ${TROUPE_WARNINGS})
