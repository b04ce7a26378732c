# CAF scheduler settings of the runtime (actors/transport/caf_scheduler.hpp).
if(TARGET troupe_runtime)
  troupe_add_gtest(runtime_scheduler_tests
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/runtime_scheduler_test.cpp
    LIBS troupe_runtime
    LABELS runtime)
endif()
