# Tests of the model I/O half: data sources, checkpoints, safetensors, sampling
# (all compiled into troupe_model from model/).
if(TARGET troupe_model)
  troupe_add_gtest(modelio_data_test
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/data_addition_test.cpp
            ${CMAKE_CURRENT_LIST_DIR}/data_scratchpad_test.cpp
            ${CMAKE_CURRENT_LIST_DIR}/data_text_test.cpp
    LIBS troupe_model
    LABELS modelio)
  troupe_add_gtest(modelio_sampling_test
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/sampling_test.cpp
    LIBS troupe_model
    LABELS modelio)
  troupe_add_gtest(modelio_checkpoint_test
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/checkpoint_test.cpp
            ${CMAKE_CURRENT_LIST_DIR}/checkpoint_corruption_test.cpp
    LIBS troupe_model troupe_schemas zstd::libzstd_shared
    LABELS modelio)
  # A user's data: tokenizers (bytes, SentencePiece: training, loading, bad
  # files) and JSONL records (strict reading, the split, rows).
  troupe_add_gtest(modelio_tokenizer_test
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/model_tokenizer_test.cpp
            ${CMAKE_CURRENT_LIST_DIR}/data_jsonl_test.cpp
    LIBS troupe_model
    LABELS modelio)
  troupe_add_gtest(modelio_safetensors_test
    SOURCES ${CMAKE_CURRENT_LIST_DIR}/safetensors_test.cpp
    LIBS troupe_model
    LABELS modelio)
  # The optional cross-check with the reference Python implementation needs
  # the interpreter path; the test skips when safetensors/torch is absent.
  find_package(Python3 COMPONENTS Interpreter QUIET)
  if(Python3_Interpreter_FOUND)
    target_compile_definitions(modelio_safetensors_test PRIVATE
      TROUPE_PYTHON3="${Python3_EXECUTABLE}")
  endif()
endif()
