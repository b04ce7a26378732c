# The runtime across processes (placement, bring-up, failure watch): part of
# troupe_runtime. Included after runtime.cmake (fragments load in name order).
target_sources(troupe_runtime PRIVATE
  ${CMAKE_CURRENT_LIST_DIR}/placement.cpp
  ${CMAKE_CURRENT_LIST_DIR}/runtime_cluster.cpp
)
