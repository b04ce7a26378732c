# Tests of the MoE decoder (model/) and the MoE pieces (moe/).
if(TARGET troupe_model)
  troupe_add_gtest(model_tests
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/model_gradcheck.cpp
            ${CMAKE_CURRENT_LIST_DIR}/model_reference.cpp
            ${CMAKE_CURRENT_LIST_DIR}/model_params_test.cpp
            ${CMAKE_CURRENT_LIST_DIR}/model_trainer_test.cpp
    LIBS troupe_model
    LABELS model)
endif()
if(TARGET troupe_model)
  troupe_add_gtest(model_stage_resume_tests
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/model_stage_resume_test.cpp
    LIBS troupe_model
    LABELS model)
endif()
if(TARGET troupe_model)
  # The B/W split of the Stage backward against the unsplit backward.
  troupe_add_gtest(model_stage_split_tests
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/model_stage_split_test.cpp
    LIBS troupe_model
    LABELS model)
endif()
if(TARGET troupe_moe)
  troupe_add_gtest(moe_tests
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/../moe/moe_dispatch_test.cpp
            ${CMAKE_CURRENT_LIST_DIR}/../moe/moe_experts_test.cpp
            ${CMAKE_CURRENT_LIST_DIR}/../moe/moe_placement_test.cpp
    LIBS troupe_moe
    LABELS moe)
endif()
if(TARGET troupe_model)
  # KV-cache decoding and batched sampling against the full recompute.
  troupe_add_gtest(model_kv_tests
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/model_kv_test.cpp
            ${CMAKE_CURRENT_LIST_DIR}/continuous_batch_test.cpp
    LIBS troupe_model
    LABELS model)
  # The policy-gradient head against the float64 reference.
  troupe_add_gtest(model_policy_head_tests
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/model_policy_head_test.cpp
            ${CMAKE_CURRENT_LIST_DIR}/model_reference.cpp
    LIBS troupe_model
    LABELS model)
endif()
