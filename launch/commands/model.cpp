// `troupe eval`, `troupe sample`, `troupe export`, `troupe import`: commands
// that work on a checkpoint with the model library. The checkpoint defaults to
// the spec's checkpoint directory (<out_dir>/checkpoint), so
// `troupe run S && troupe eval S` evaluates what the run saved.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <spdlog/spdlog.h>

#include "launch/cli.hpp"
#include "launch/spec/keys.hpp"
#include "launch/train_options.hpp"
#include "model/checkpoint.hpp"
#include "model/generate.hpp"
#include "model/params.hpp"
#include "model/safetensors.hpp"
#include "model/tokenizer.hpp"
#include "model/jsonl.hpp"
#include "model/atomic_file.hpp"

namespace troupe::launch {

namespace {

std::string checkpoint_of(const CliOptions& o, const Spec& spec) {
  return o.checkpoint.empty() ? spec.checkpoint_dir() : o.checkpoint;
}

// Runs `body`, mapping the model library's errors onto exit codes.
template <class F>
int guarded(const char* what, F&& body) {
  try {
    return body();
  } catch (const model::CheckpointError& e) {
    std::fprintf(stderr, "troupe %s: %s\n", what, e.what());
    return kExitBadInput;
  } catch (const model::SafetensorsError& e) {
    std::fprintf(stderr, "troupe %s: %s\n", what, e.what());
    return kExitBadInput;
  } catch (const model::TokenizerError& e) {
    std::fprintf(stderr, "troupe %s: %s\n", what, e.what());
    return kExitBadInput;
  } catch (const model::JsonlError& e) {
    std::fprintf(stderr, "troupe %s: %s\n", what, e.what());
    return kExitBadInput;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "troupe %s: %s\n", what, e.what());
    return kExitRuntime;
  }
}

// eval and sample run the checkpoint's model: a `--set model.KEY=...` that
// disagrees with it would be ignored, so it is an error naming both values.
// Returns kExitOk or kExitBadSpec (after printing). Throws
// model::CheckpointError for a missing or damaged checkpoint.
int check_model_overrides(const CliOptions& o, const Spec& spec, const std::string& dir, const char* what) {
  bool any = false;
  for (const Override& ov : o.overrides) any = any || ov.path.rfind("model.", 0) == 0;
  if (!any) return kExitOk;
  Spec asked = spec, saved = spec;
  saved.model = model::load_checkpoint(dir).config;
  int rc = kExitOk;
  for (size_t i = 0; i < o.overrides.size(); ++i) {
    const Override& ov = o.overrides[i];
    if (ov.path.rfind("model.", 0) != 0) continue;
    // A key set twice takes its last value: only that one can disagree.
    bool later = false;
    for (size_t j = i + 1; j < o.overrides.size(); ++j) later = later || o.overrides[j].path == ov.path;
    if (later) continue;
    for (const KeyDef& def : spec_keys()) {
      if (def.path() != ov.path) continue;
      const std::string want = key_value_text(def, asked), have = key_value_text(def, saved);
      if (want != have) {
        std::fprintf(stderr,
                     "troupe %s: --set %s=%s disagrees with the checkpoint %s (%s = %s); %s uses the checkpoint's "
                     "model: drop the --set or pick a checkpoint of that model\n",
                     what, ov.path.c_str(), ov.value.c_str(), dir.c_str(), ov.path.c_str(), have.c_str(), what);
        rc = kExitBadSpec;
      }
    }
  }
  return rc;
}

}  // namespace

int command_eval(const CliOptions& o, const Spec& spec) {
  return guarded("eval", [&] {
    const std::string dir = checkpoint_of(o, spec);
    if (const int rc = check_model_overrides(o, spec, dir, "eval"); rc != kExitOk) return rc;
    const model::EvalMetrics m = model::evaluate(dir, spec.data, spec.run.eval_batches, backend_options(spec));
    std::printf("checkpoint %s (step %lld)\nval_loss %.6f\n", dir.c_str(), static_cast<long long>(m.step), m.val_loss);
    if (!std::isnan(m.accuracy)) {
      std::printf("exact_match %.4f (%lld problems)\ndigit_accuracy", m.accuracy, static_cast<long long>(m.problems));
      for (double d : m.digit_accuracy) std::printf(" %.4f", d);
      std::printf("  (per answer position, in the order generated)\ncontext_accuracy");
      for (double c : m.context_accuracy) std::printf(" %.4f", c);
      std::printf("  (after 0, 1, ... earlier problems)\n");
      if (!m.size_accuracy.empty()) {
        std::printf("size_accuracy");
        for (double z : m.size_accuracy) std::printf(" %.4f", z);
        std::printf("  (by problem size 0, 1, ...: the scratchpad task's operand width; nan: none drawn)\n");
      }
    }
    return static_cast<int>(kExitOk);
  });
}

int command_sample(const CliOptions& o, const Spec& spec) {
  if (o.prompt.empty()) {
    std::fprintf(stderr, "troupe sample: --prompt TEXT is required\n");
    return kExitUsage;
  }
  if (o.max_new_tokens < 1 || o.top_p <= 0.0 || o.top_p > 1.0 || o.temperature < 0.0) {
    std::fprintf(stderr, "troupe sample: need --max-new-tokens >= 1, 0 < --top-p <= 1, --temperature >= 0\n");
    return kExitUsage;
  }
  return guarded("sample", [&] {
    model::SampleOptions s;
    s.checkpoint_dir = checkpoint_of(o, spec);
    if (const int rc = check_model_overrides(o, spec, s.checkpoint_dir, "sample"); rc != kExitOk) return rc;
    s.data = spec.data;
    s.prompt = o.prompt;
    s.max_new_tokens = o.max_new_tokens;
    s.sampling.temperature = o.temperature;
    s.sampling.top_p = o.top_p;
    s.seed = static_cast<uint64_t>(spec.run.seed);
    s.backend = backend_options(spec);
    const model::SampleResult r = model::sample(s);
    std::printf("%s%s\n", o.prompt.c_str(), r.text.c_str());
    return static_cast<int>(kExitOk);
  });
}

int command_export(const CliOptions& o, const Spec& spec) {
  if (o.format != "safetensors") {
    std::fprintf(stderr, "troupe export: --format safetensors is required (the only format so far)\n");
    return kExitUsage;
  }
  if (o.file.empty()) {
    std::fprintf(stderr, "troupe export: --output FILE is required\n");
    return kExitUsage;
  }
  return guarded("export", [&] {
    const std::string dir = checkpoint_of(o, spec);
    const model::TrainingState st = model::load_checkpoint(dir);
    const model::ParamLayout layout = model::build_param_layout(st.config);
    model::export_safetensors(o.file, layout, st.params,
                              {{"format", "pt"}, {"troupe_step", std::to_string(st.step)}});
    std::printf("wrote %zu tensors (%lld parameters) from %s to %s\n", layout.entries().size(),
                static_cast<long long>(layout.total()), dir.c_str(), o.file.c_str());
    // A SentencePiece tokenizer the checkpoint stores goes beside the weights:
    // <dir of FILE>/tokenizer.model, the file SentencePiece itself loads.
    if (st.config.tokenizer_kind == "sentencepiece") {
      const std::filesystem::path parent = std::filesystem::path(o.file).parent_path();
      const std::string tok = (parent.empty() ? std::filesystem::path("tokenizer.model") : parent / "tokenizer.model").string();
      model::write_file_atomically(tok, st.config.tokenizer_model);
      std::printf("wrote the checkpoint's tokenizer (sentencepiece, hash %s) to %s\n",
                  model::tokenizer_hash_hex(model::tokenizer_hash(st.config.tokenizer_model)).c_str(), tok.c_str());
    }
    return static_cast<int>(kExitOk);
  });
}

int command_import(const CliOptions& o, const Spec& spec) {
  if (o.file.empty()) {
    std::fprintf(stderr, "troupe import: --input FILE is required\n");
    return kExitUsage;
  }
  return guarded("import", [&] {
    const std::string dir = checkpoint_of(o, spec);
    const model::ParamLayout layout = model::build_param_layout(spec.model);
    model::TrainingState st;
    st.config = spec.model;
    st.seed = static_cast<uint64_t>(spec.run.seed);
    st.params = model::import_safetensors(o.file, layout);
    model::save_checkpoint(dir, st, layout);
    std::printf("imported %zu tensors from %s into checkpoint %s (step 0, no optimizer state)\n",
                layout.entries().size(), o.file.c_str(), dir.c_str());
    return static_cast<int>(kExitOk);
  });
}

}  // namespace troupe::launch
