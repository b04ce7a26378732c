# troupe_runtime: the in-process actor runtime (devices, pipeline-rank actors,
# optimizer-shard actors, coordinator, expert-shard actors and the MoE
# dispatch/combine codec). CAF stays inside actors/*.cpp;
# actors/runtime.hpp and actors/device.hpp are CAF-free.
add_library(troupe_runtime STATIC
  ${CMAKE_CURRENT_LIST_DIR}/device.cpp
  ${CMAKE_CURRENT_LIST_DIR}/stage_actor.cpp
  ${CMAKE_CURRENT_LIST_DIR}/optimizer_actor.cpp
  ${CMAKE_CURRENT_LIST_DIR}/coordinator.cpp
  ${CMAKE_CURRENT_LIST_DIR}/supervisor.cpp
  ${CMAKE_CURRENT_LIST_DIR}/runtime.cpp
  ${CMAKE_CURRENT_LIST_DIR}/trace.cpp
  ${CMAKE_CURRENT_LIST_DIR}/moe_messages.cpp
  ${CMAKE_CURRENT_LIST_DIR}/expert_actor.cpp
  # sim devices: pipeline-rank actors on a virtual clock (sim_runtime.hpp)
  ${CMAKE_CURRENT_LIST_DIR}/sim_costs.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sim_runtime.cpp
  ${CMAKE_CURRENT_LIST_DIR}/sim_trace.cpp
)
target_compile_options(troupe_runtime PRIVATE ${TROUPE_WARNINGS})
target_link_libraries(troupe_runtime PUBLIC troupe_actors troupe_schedule troupe_model Threads::Threads)
