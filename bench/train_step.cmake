# bench_train_step: tokens/s and MFU of the single-process trainer (model/).
if(TARGET troupe_model)
  add_executable(bench_train_step ${CMAKE_CURRENT_LIST_DIR}/train_step.cpp)
  target_compile_options(bench_train_step PRIVATE ${TROUPE_WARNINGS})
  target_link_libraries(bench_train_step PRIVATE troupe_model ${BLAS_LIBRARIES})
endif()

# bench_bw_split: the B/W split of the Stage backward against the full
# backward (model/stage.hpp), B and W timed apart.
if(TARGET troupe_model)
  add_executable(bench_bw_split ${CMAKE_CURRENT_LIST_DIR}/bw_split.cpp)
  target_compile_options(bench_bw_split PRIVATE ${TROUPE_WARNINGS})
  target_link_libraries(bench_bw_split PRIVATE troupe_model ${BLAS_LIBRARIES})
endif()
