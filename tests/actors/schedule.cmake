# Pipeline schedules and the discrete-event simulator (actors/schedule*,
# actors/pipeline_sim*): structure, simulator behaviour, bubble vs formulas.
if(TARGET troupe_schedule)
  troupe_add_gtest(schedule_tests
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/schedule_structure_test.cpp
            ${CMAKE_CURRENT_LIST_DIR}/schedule_sim_test.cpp
            ${CMAKE_CURRENT_LIST_DIR}/schedule_bubble_test.cpp
    LIBS troupe_schedule
    TIMEOUT 300
    LABELS schedule)
endif()
