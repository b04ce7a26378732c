# Tests of the rl/ library: verifiers and the addition task (with the written
# width of model/data_addition.cpp), group advantages, policy losses, scoring
# sampled groups into a training batch, and all of it learning a bandit.
if(TARGET troupe_rl)
  troupe_add_gtest(rl_tests
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/rl_task_test.cpp
            ${CMAKE_CURRENT_LIST_DIR}/rl_group_test.cpp
            ${CMAKE_CURRENT_LIST_DIR}/rl_loss_test.cpp
            ${CMAKE_CURRENT_LIST_DIR}/rl_rollout_test.cpp
            ${CMAKE_CURRENT_LIST_DIR}/rl_learning_test.cpp
            ${CMAKE_CURRENT_LIST_DIR}/rl_staleness_test.cpp
            ${CMAKE_CURRENT_LIST_DIR}/rl_row_buckets_test.cpp
    LIBS troupe_rl
    LABELS rl)
endif()
if(TARGET troupe_rl)
  # A user's task: JSONL prompts, text rewards, and rl.reward = "command" (the
  # program as a persistent child: protocol, crashes, hangs, bad replies, ...).
  troupe_add_gtest(rl_reward_command_tests
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/rl_reward_command_test.cpp
            ${CMAKE_CURRENT_LIST_DIR}/rl_task_jsonl_test.cpp
    LIBS troupe_rl
    LABELS rl)
endif()
if(TARGET troupe_rl)
  # The synchronous RL loop: learning, determinism, resume, init checkpoints.
  troupe_add_gtest(rl_trainer_tests
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/rl_trainer_test.cpp
    LIBS troupe_rl
    LABELS rl)
endif()
if(TARGET troupe)
  troupe_add_bitwise(rl_cli_script LABELS rl
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/rl_cli_test.sh $<TARGET_FILE:troupe> ${PROJECT_SOURCE_DIR})
  # run.mode = "sft_rl" (the built-in default's two-phase job): each phase
  # equals its standalone run bit for bit, the summary, resume.
  troupe_add_bitwise(main_job_script LABELS rl
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/main_job_test.sh $<TARGET_FILE:troupe> ${PROJECT_SOURCE_DIR})
endif()
if(TARGET troupe_runtime AND TARGET troupe_rl)
  # Decoupled RL on actors: fixed-lag equivalence, determinism, staleness and
  # exactly-once under killed generator / reward actors (tests/rl/rl_actors_test.cpp).
  troupe_add_gtest(rl_actors_tests
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/rl_actors_test.cpp
    LIBS troupe_runtime troupe_rl
    LABELS rl)
  # The rollout buffer's admission and the generator's sync fence, message
  # by message on CAF's deterministic test coordinator (tests/rl/rl_protocol_test.cpp).
  troupe_add_gtest(rl_protocol_tests
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/rl_protocol_test.cpp
    LIBS troupe_runtime troupe_rl
    LABELS rl)
endif()
if(TARGET troupe_rl)
  # The learned reward model: BCE and head gradients against float64
  # references, labelling, end-to-end training (tests/rl/rl_reward_model_test.cpp).
  troupe_add_gtest(rl_reward_model_tests
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/rl_reward_model_test.cpp
            ${CMAKE_CURRENT_LIST_DIR}/../model/model_reference.cpp
    LIBS troupe_rl
    LABELS rl)
endif()
if(TARGET troupe_runtime AND TARGET troupe_rl)
  # The RL policy update on the actor runtime (rl.trainer = "actors"): the
  # last-stage policy head against the batch loss, against the in-process
  # update, and kill-and-replay of the trainer's actors in decoupled RL.
  troupe_add_gtest(rl_runtime_trainer_tests
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/rl_runtime_trainer_test.cpp
    LIBS troupe_runtime troupe_rl
    LABELS rl)
endif()
if(TARGET troupe AND MPIRUN_EXECUTABLE)
  # Decoupled RL with generators on another process (tests/rl/rl_mpi_test.sh):
  # bitwise the 1-process run, with a killed remote generator, and after
  # losing the generator process.
  troupe_add_bitwise(rl_mpi LABELS mpi rl
    COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/rl_mpi_test.sh $<TARGET_FILE:troupe> ${MPIRUN_EXECUTABLE}
            $<TARGET_FILE:troupe_with_hooks>)
endif()
if(TARGET troupe_runtime)
  # The RL messages across processes: bitwise round trips and hostile input
  # (tests/rl/rl_wire_test.cpp).
  troupe_add_gtest(rl_wire_tests
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/rl_wire_test.cpp
    LIBS troupe_runtime
    LABELS rl)
endif()
