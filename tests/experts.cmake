# Expert parallelism: the Dispatch/Combine codec and its receiver-side checks
# (actors/moe_messages.hpp), and the expert-shard actor driven standalone
# (actors/expert_shard.hpp).
if(TARGET troupe_runtime)
  troupe_add_gtest(moe_messages_test
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/moe_messages_test.cpp
    LIBS troupe_runtime
    TIMEOUT 120
    LABELS experts)
  troupe_add_gtest(runtime_expert_actor_test
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/runtime_expert_actor_test.cpp
    LIBS troupe_runtime
    TIMEOUT 120
    LABELS experts)
endif()
