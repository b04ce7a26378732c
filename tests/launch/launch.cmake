# Tests of launch/: spec parsing and validation (incl. the bad-spec corpus in
# tests/launch/bad_specs/), topology resolution, and the `troupe` CLI end to end.
troupe_add_gtest(launch_spec_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/launch_spec_test.cpp LIBS troupe_spec LABELS launch)
target_compile_definitions(launch_spec_test PRIVATE TROUPE_SOURCE_DIR="${PROJECT_SOURCE_DIR}")

if(TARGET troupe_launch)
  troupe_add_gtest(launch_topology_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/launch_topology_test.cpp LIBS troupe_launch LABELS launch)
  troupe_add_gtest(launch_calibrate_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/launch_calibrate_test.cpp LIBS troupe_launch LABELS launch)
endif()

# CLI: every shipped example spec validates through the real executable.
file(GLOB TROUPE_EXAMPLE_SPECS CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/launch/specs/*.toml)
foreach(spec IN LISTS TROUPE_EXAMPLE_SPECS)
  get_filename_component(spec_name ${spec} NAME_WE)
  # rl_addition and rm_addition start from the checkpoint rl_addition's header
  # says how to make: tests/rl/rl_cli_test.sh validates both against one (and
  # without one: exit 4).
  if(spec_name STREQUAL "rl_addition" OR spec_name STREQUAL "rm_addition")
    continue()
  endif()
  # rl_reasoning starts from sft_reasoning's checkpoint: validated from a
  # fresh initialisation instead (the missing checkpoint is an error).
  if(spec_name STREQUAL "rl_reasoning")
    add_test(NAME cli_validate_rl_reasoning COMMAND troupe validate ${spec} --set rl.init=\"\")
    set_tests_properties(cli_validate_rl_reasoning PROPERTIES LABELS cli PASS_REGULAR_EXPRESSION "32 slots per generator")
    continue()
  endif()
  add_test(NAME cli_validate_${spec_name} COMMAND troupe validate ${spec})
  set_tests_properties(cli_validate_${spec_name} PROPERTIES LABELS cli PASS_REGULAR_EXPRESSION "ok")
endforeach()
# The own-task example (launch/specs/own_task/): its SFT spec, and its RL spec
# from a fresh initialisation (its init is the SFT run's checkpoint).
add_test(NAME cli_validate_own_task_sft COMMAND troupe validate ${PROJECT_SOURCE_DIR}/launch/specs/own_task/sft.toml)
set_tests_properties(cli_validate_own_task_sft PROPERTIES LABELS cli PASS_REGULAR_EXPRESSION "tokenizer: sentencepiece model [^\n]*words.model [(]bpe, vocab 512")
add_test(NAME cli_validate_own_task_rl COMMAND troupe validate ${PROJECT_SOURCE_DIR}/launch/specs/own_task/rl.toml --set rl.init=\"\")
set_tests_properties(cli_validate_own_task_rl PROPERTIES LABELS cli PASS_REGULAR_EXPRESSION "reward: command [[]python3 reward.py[]]")
# [[elastic]]: validate prints the expert placement before and after each event.
add_test(NAME cli_validate_elastic_placement COMMAND troupe validate ${PROJECT_SOURCE_DIR}/launch/specs/elastic_experts.toml)
set_tests_properties(cli_validate_elastic_placement PROPERTIES LABELS cli
  PASS_REGULAR_EXPRESSION "expert shards 4 -> 8 per MoE layer[^\n]*\nexpert placement, steps 31..40: 8 expert shard[(]s[)] per MoE layer\n    expert:0/0 +experts 0..0 on device 0")
troupe_add_bitwise(cli_script THREADS 1 2 TIMEOUT 900 LABELS cli
  COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/cli_test.sh $<TARGET_FILE:troupe> ${PROJECT_SOURCE_DIR})
# validate says what run will say: the same exit status and message for each
# spec a run would reject, before any training.
add_test(NAME validate_run_agreement COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/validate_run_test.sh $<TARGET_FILE:troupe>)
set_tests_properties(validate_run_agreement PROPERTIES LABELS cli TIMEOUT 300)
# A user's own task through the CLI: tokenizer, JSONL SFT and RL, a reward program.
add_test(NAME own_task COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/own_task_test.sh $<TARGET_FILE:troupe> ${PROJECT_SOURCE_DIR})
set_tests_properties(own_task PROPERTIES LABELS "cli;rl" TIMEOUT 600)
# A SIGKILL during a checkpoint save: the next run removes the dead process's temporary directory.
add_test(NAME checkpoint_leftovers COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/checkpoint_leftovers_test.sh $<TARGET_FILE:troupe>)
set_tests_properties(checkpoint_leftovers PROPERTIES LABELS cli TIMEOUT 300)
# `troupe launch`: mpirun's flags, signals forwarded to process 0, process 0's status returned.
add_test(NAME launch_script COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/launch_test.sh $<TARGET_FILE:troupe>)
set_tests_properties(launch_script PROPERTIES LABELS "cli;mpi" TIMEOUT 600 SKIP_RETURN_CODE 77 RUN_SERIAL TRUE)
# troupe's choice of kernel family: the default equals the forced portable
# family, `native` the forced fastest one, and the bits do not depend on the
# threads per device.
add_test(NAME kernel_family_script COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/kernel_family_test.sh $<TARGET_FILE:troupe>)
set_tests_properties(kernel_family_script PROPERTIES LABELS "bitwise;cli" TIMEOUT 600 SKIP_RETURN_CODE 77)
# `troupe dashboard` / `report` / `plot` on real short runs, in headless
# Chromium (skipped, exit 77, only when Chromium is absent).
add_test(NAME dashboard_browser COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/dashboard_test.sh $<TARGET_FILE:troupe> ${PROJECT_SOURCE_DIR})
set_tests_properties(dashboard_browser PROPERTIES LABELS "cli;dashboard" TIMEOUT 600 SKIP_RETURN_CODE 77)
# troupe as a package: install to a temporary prefix, build a consumer with find_package(troupe).
add_test(NAME package_consumer COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/package_test.sh ${PROJECT_BINARY_DIR} ${PROJECT_SOURCE_DIR})
set_tests_properties(package_consumer PROPERTIES LABELS "package" TIMEOUT 600)
# `troupe calibrate` on a tiny model: the [sim] table validates, round-trips
# and drives a sim run; bad input gets clear errors (no timing asserted).
add_test(NAME calibrate_script COMMAND bash ${CMAKE_CURRENT_LIST_DIR}/calibrate_test.sh $<TARGET_FILE:troupe>)
set_tests_properties(calibrate_script PROPERTIES LABELS cli TIMEOUT 300)
if(TARGET troupe_launch)
  # rollouts.jsonl from a real RL trainer, read back (log.rollouts).
  troupe_add_gtest(launch_rollouts_test SOURCES ${CMAKE_CURRENT_LIST_DIR}/launch_rollouts_test.cpp
    LIBS troupe_launch nlohmann_json::nlohmann_json LABELS launch rl)
endif()
