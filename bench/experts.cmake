# bench_experts_overlap: runtime step time with expert-shard actors, with and
# without DualPipe's compute/communication overlap, vs experts inside the
# stages and vs model::Trainer, in the same run (bench/experts_overlap.cpp).
if(TARGET troupe_runtime)
  add_executable(bench_experts_overlap ${CMAKE_CURRENT_LIST_DIR}/experts_overlap.cpp)
  target_compile_options(bench_experts_overlap PRIVATE ${TROUPE_WARNINGS})
  target_link_libraries(bench_experts_overlap PRIVATE troupe_runtime)
endif()
