# Tests of the actor runtime (actors/runtime.cmake) and of the pipeline-stage
# split of the model it runs (model/stage.hpp).
if(TARGET troupe_model)
  troupe_add_gtest(runtime_stage_tests
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/runtime_stage_test.cpp
    LIBS troupe_model
    LABELS runtime)
endif()
if(TARGET troupe_runtime)
  troupe_add_gtest(runtime_tests
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/runtime_equivalence_test.cpp
    LIBS troupe_runtime
    TIMEOUT 300
    LABELS runtime)
endif()
if(TARGET troupe_runtime)
  troupe_add_gtest(runtime_slice_sum_tests
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/runtime_slice_sum_test.cpp
    LIBS troupe_runtime
    TIMEOUT 60
    LABELS runtime)
  troupe_add_gtest(runtime_trace_tests
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/runtime_trace_test.cpp
    LIBS troupe_runtime
    TIMEOUT 120
    LABELS runtime)
endif()
if(TARGET troupe_runtime)
  troupe_add_gtest(runtime_expert_tests
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/runtime_expert_test.cpp
    LIBS troupe_runtime
    TIMEOUT 300
    LABELS runtime experts)
endif()
if(TARGET troupe_runtime)
  # Sim devices: the actor simulation against the discrete-event simulator.
  troupe_add_gtest(runtime_sim_tests
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/runtime_sim_test.cpp
    LIBS troupe_runtime
    TIMEOUT 300
    LABELS runtime)
  # Synchronous against decoupled RL on sim devices (closed forms, staleness).
  troupe_add_gtest(rl_sim_tests
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/../rl/rl_sim_test.cpp
    LIBS troupe_runtime
    TIMEOUT 120
    LABELS runtime)
  # Expert parallelism on sim devices (closed forms, EPLB against static and balanced).
  troupe_add_gtest(ep_sim_tests
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/ep_sim_test.cpp
    LIBS troupe_runtime
    TIMEOUT 60
    LABELS runtime)
  # Device failures on sim devices: goodput of replay against checkpoint-restart.
  troupe_add_gtest(sim_faults_tests
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/sim_faults_test.cpp
    LIBS troupe_runtime
    TIMEOUT 60
    LABELS runtime)
  # Adaptive failure suspicion and the activity clock (no actors).
  troupe_add_gtest(suspicion_tests
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/suspicion_test.cpp
    LIBS troupe_runtime
    TIMEOUT 60
    LABELS runtime)
  # The fault injector's partition rule and the loss detector, with plain CAF actors.
  troupe_add_gtest(fault_injector_tests
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/fault_injector_test.cpp
    LIBS troupe_runtime
    TIMEOUT 60
    LABELS runtime)
  troupe_add_gtest(runtime_fault_tests
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/runtime_fault_test.cpp
    LIBS troupe_runtime
    TIMEOUT 120
    LABELS runtime)
  # [chaos]: the seeded nemesis and a run of 50+ faults against the fault-free run.
  troupe_add_gtest(runtime_chaos_tests
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/runtime_chaos_test.cpp
    LIBS troupe_runtime
    TIMEOUT 120
    LABELS runtime)
  # Both, whole, in the bitwise matrix (kernel families x threads per device).
  troupe_add_bitwise(runtime_fault_tests THREADS 1 2 LABELS runtime COMMAND $<TARGET_FILE:runtime_fault_tests>)
  troupe_add_bitwise(runtime_chaos_tests THREADS 1 2 LABELS runtime COMMAND $<TARGET_FILE:runtime_chaos_tests>)
  # Elastic experts: scale events against static placement, bitwise.
  troupe_add_gtest(runtime_elastic_tests
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/runtime_elastic_test.cpp
    LIBS troupe_runtime
    TIMEOUT 300
    LABELS runtime experts)
  # Elastic experts under failure: shrink past the restart budget, a kill while loading.
  troupe_add_gtest(runtime_elastic_shrink_tests
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/runtime_elastic_shrink_test.cpp
    LIBS troupe_runtime
    TIMEOUT 300
    LABELS runtime experts)
  # Redundant experts: copies of hot experts against static placement.
  troupe_add_gtest(runtime_elastic_replicas_tests
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/runtime_elastic_replicas_test.cpp
    LIBS troupe_runtime
    TIMEOUT 300
    LABELS runtime experts)
  # eplb's migration-cost gate and incremental moves.
  troupe_add_gtest(runtime_elastic_gate_tests
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/runtime_elastic_gate_test.cpp
    LIBS troupe_runtime
    TIMEOUT 300
    LABELS runtime experts)
endif()
if(TARGET troupe_runtime)
  # Resume from a checkpoint on the runtime (and across runtime and Trainer).
  troupe_add_gtest(runtime_resume_tests
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/runtime_resume_test.cpp
    LIBS troupe_runtime
    TIMEOUT 120
    LABELS runtime)
endif()
if(TARGET troupe_runtime)
  # The coordinator's replay on CAF's deterministic test coordinator: a kill
  # at every point of a step, a lost message found by its deadline, no sleeps
  # (tests/actors/runtime_deterministic_test.cpp).
  troupe_add_gtest(runtime_deterministic_tests
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/runtime_deterministic_test.cpp
    LIBS troupe_runtime
    TIMEOUT 300
    LABELS runtime)
endif()
