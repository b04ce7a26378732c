# bench_generate: KV-cache generation tokens/s against the full-recompute Generator (model/).
if(TARGET troupe_model)
  add_executable(bench_generate ${CMAKE_CURRENT_LIST_DIR}/generate.cpp)
  target_compile_options(bench_generate PRIVATE ${TROUPE_WARNINGS})
  target_link_libraries(bench_generate PRIVATE troupe_model)
endif()
