// The spec checks of [model], [data], [topology] against each other, the
// schedule's rules, [[elastic]] events and the checkpoint directory.
#include "launch/spec/parser.hpp"
#include "model/tokenizer.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include "actors/degrees.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>

#include "actors/names.hpp"
#include "actors/schedule/schedule.hpp"
#include "launch/phases.hpp"
#include "launch/spec/keys.hpp"
#include "launch/run_plan.hpp"
#include "model/checkpoint.hpp"
#include "model/data.hpp"
#include "model/params.hpp"
#include "rl/task.hpp"


namespace troupe::launch::spec_detail {

// The topology's degrees against the model and the batch: the rules
// runtime::validate applies too (actors/degrees.hpp), each reported at its key.
void check_degrees(const Spec& s, SpecSites& p) {
  const auto& t = s.topology;
  runtime::Degrees d;
  d.schedule = t.schedule;
  d.stages = t.stages;
  d.devices = t.devices;
  d.microbatches = t.microbatches;
  d.data_parallel = t.data_parallel;
  d.optimizer_shards = t.optimizer_shards;
  d.expert_shards = t.expert_shards;
  d.expert_actors = t.expert_shards > 1;
  d.processes = t.processes;
  d.batch_size = s.data.batch_size;
  for (const runtime::DegreeProblem& x : runtime::degree_problems(d, s.model)) {
    const char* key = "topology.stages";
    switch (x.key) {
      case runtime::DegreeKey::stages: key = "topology.stages"; break;
      case runtime::DegreeKey::schedule: key = "topology.schedule"; break;
      case runtime::DegreeKey::microbatches: key = "topology.microbatches"; break;
      case runtime::DegreeKey::batch_size: key = "data.batch_size"; break;
      case runtime::DegreeKey::expert_shards: key = "topology.expert_shards"; break;
      case runtime::DegreeKey::processes: key = "topology.processes"; break;
      case runtime::DegreeKey::optimizer_shards: key = "topology.optimizer_shards"; break;
    }
    p.error(p.where(key), x.message);
  }
}

// Rules that involve more than one key. Each message names the keys and values.
void check_cross_fields(const Spec& s, SpecSites& p) {
  const auto& m = s.model;
  const auto& t = s.topology;
  auto v = [](int64_t x) { return std::to_string(x); };
  if (m.d_model % m.n_heads != 0)
    p.error(p.where("model.n_heads"), "[model] n_heads = " + v(m.n_heads) + " must divide d_model = " + v(m.d_model));
  else if ((m.d_model / m.n_heads) % 2 != 0)
    p.error(p.where("model.n_heads"), "[model] head size d_model/n_heads = " + v(m.d_model / m.n_heads) + " must be even (RoPE rotates pairs)");
  if (m.ffn == model::Ffn::moe && m.top_k > m.n_experts)
    p.error(p.where("model.top_k"), "[model] top_k = " + v(m.top_k) + " must be <= n_experts = " + v(m.n_experts));
  if (m.ffn == model::Ffn::moe && m.balance == moe::Balance::bias && m.bias_update_rate <= 0)
    p.error(p.where("model.bias_update_rate"), "[model] balance = \"bias\" needs bias_update_rate > 0");
  check_degrees(s, p);
  if (t.processes <= t.devices && !t.device_processes.empty()) {
    try {
      device_process_list(s);
    } catch (const std::invalid_argument& e) {
      p.error(p.where("topology.device_processes"), "[topology] device_processes = \"" + t.device_processes + "\": " + e.what());
    }
  }
  if (!t.auth_dir.empty() && t.auth == runtime::ClusterAuth::none)
    p.error(p.where("topology.auth_dir"), "[topology] auth_dir is the key of auth = \"tls\", but auth = \"none\"");
  if (t.ring_bytes != 0 && (t.ring_bytes < 65536 || (t.ring_bytes & (t.ring_bytes - 1)) != 0))
    p.error(p.where("topology.ring_bytes"), "[topology] ring_bytes = " + v(t.ring_bytes) +
                                                " must be 0 (no ring) or a power of two of at least 65536");
  // troupe's placement policy (the runtime could share a device): one device per pipeline rank.
  if (t.stages * t.data_parallel > t.devices)
    p.error(p.where("topology.devices"), "[topology] devices = " + v(t.devices) + " is fewer than stages * data_parallel = " + v(t.stages * t.data_parallel));
  check_sim(s, p);
  if (s.data.source == model::DataKind::text && s.data.path.empty())
    p.error(p.where("data.source"), "[data] source = \"text\" needs [data] path (the text file to train on)");
  if (s.data.source == model::DataKind::text && m.vocab_size < 256)
    p.error(p.where("model.vocab_size"), "[model] vocab_size = " + v(m.vocab_size) + " is too small for byte-level text (needs 256)");
  const bool jsonl = s.data.source == model::DataKind::jsonl;
  if (jsonl && s.data.path.empty())
    p.error(p.where("data.source"), "[data] source = \"jsonl\" needs [data] path (the JSONL file of prompt/completion records)");
  if (s.data.source != model::DataKind::text && !jsonl && !s.data.path.empty())
    p.error(p.where("data.path"), "[data] path is only used with source = \"text\" or \"jsonl\"");
  if (!jsonl && s.rl_section.prompts.empty())
    for (const char* key : {"data.eval_path", "data.prompt_field", "data.completion_field", "tokenizer.kind", "tokenizer.model"})
      if (p.set_at(key))
      {
        const std::string k = key;
        p.error(p.where(key), "[" + k.substr(0, k.find('.')) + "] " + k.substr(k.find('.') + 1) +
                                  " applies to a user's data: data.source = \"jsonl\" or rl.prompts");
      }
  const bool scratchpad = s.data.source == model::DataKind::scratchpad;
  if (!scratchpad && s.data.digits > 9)
    p.error(p.where("data.digits"), "[data] digits = " + v(s.data.digits) + " is out of range for source = \"" +
                                        model::data_kind_name(s.data.source) + "\" (allowed 1 .. 9; \"scratchpad\" allows up to 64)");
  if (!scratchpad && s.data.width > 9) {
    p.error(p.where("data.width"), "[data] width = " + v(s.data.width) + " is out of range for source = \"" +
                                       model::data_kind_name(s.data.source) + "\" (allowed 0 .. 9; \"scratchpad\" allows up to 64)");
  } else if (scratchpad) {
    if (s.data.width > s.data.digits)
      p.error(p.where("data.width"), "[data] width = " + v(s.data.width) + " is the widest operand of the scratchpad task's training rows: at most digits = " + v(s.data.digits) + " (or 0, meaning digits)");
  } else if (s.data.width != 0 && s.data.source != model::DataKind::addition) {
    p.error(p.where("data.width"), "[data] width = " + v(s.data.width) + " needs source = \"addition\" (the padded format) or \"scratchpad\", got source = \"" + model::data_kind_name(s.data.source) + "\"");
  } else if (s.data.width != 0 && s.data.width < s.data.digits) {
    p.error(p.where("data.width"), "[data] width = " + v(s.data.width) + " must be >= digits = " + v(s.data.digits) + " (or 0, meaning digits)");
  }
  if (!s.data.target_pairs.empty()) {
    if (s.data.source == model::DataKind::text || scratchpad || jsonl) {
      p.error(p.where("data.target_pairs"), std::string("[data] target_pairs needs source = \"addition\" or \"addition_plain\", got source = \"") + model::data_kind_name(s.data.source) + "\"");
    } else {
      try {
        (void)model::parse_addition_target(s.data.target_pairs, s.data.target_column);
        if (s.data.target_column >= s.data.digits)
          p.error(p.where("data.target_column"), "[data] target_column = " + v(s.data.target_column) + " must be below digits = " + v(s.data.digits) + " (column 0 is the units)");
      } catch (const std::invalid_argument& e) {
        p.error(p.where("data.target_pairs"), std::string("[data] ") + e.what());
      }
    }
  }
}

// [[elastic]] against the rest of the spec: a run with expert-shard actors
// (in one process or several: a new shard is spawned on the process its
// device belongs to), steps inside the run and increasing, shard counts the
// experts can be split into.
void check_elastic(const Spec& s, SpecSites& p) {
  auto v = [](int64_t x) { return std::to_string(x); };
  int64_t prev = 0;
  for (size_t i = 0; i < s.elastic.size(); ++i) {
    if (!p.elastic_ok(i)) continue;  // reported while parsing
    const ElasticConfig& e = s.elastic[i];
    if (!uses_runtime(s) || s.model.ffn != model::Ffn::moe || s.topology.expert_shards < 2) {
      p.error(p.elastic_where(i, ""), "[[elastic]] scale events need expert-shard actors: the actor runtime, [model] ffn = "
                                     "\"moe\" and [topology] expert_shards >= 2 (expert_shards = " +
                                         v(s.topology.expert_shards) + "; 1 keeps the experts inside the stages)");
      continue;
    }
    if (e.at_step < 1 || e.at_step > s.run.steps)
      p.error(p.elastic_where(i, "at_step"), "[[elastic]] at_step = " + v(e.at_step) + " is out of range (allowed 1 .. [run] steps = " +
                                                v(s.run.steps) + ")");
    else if (e.at_step <= prev)
      p.error(p.elastic_where(i, "at_step"), "[[elastic]] at_step = " + v(e.at_step) +
                                                " must be greater than the previous event's at_step = " + v(prev) +
                                                " (events in step order, one per step)");
    if (e.expert_shards < 1 || e.expert_shards > s.model.n_experts)
      p.error(p.elastic_where(i, "expert_shards"), "[[elastic]] expert_shards = " + v(e.expert_shards) +
                                                      " is out of range (allowed 1 .. [model] n_experts = " +
                                                      v(s.model.n_experts) + "; a shard holds at least one expert)");
    prev = std::max(prev, e.at_step);
  }
}

// The checkpoint directory is checked before anything runs: a save into a
// regular file, or into a non-empty directory that is not a checkpoint (which
// save_checkpoint never replaces), would fail only at the end of the run.
// Why directory `dir` (which does not exist) could not be created, or "":
// its nearest existing ancestor must be a directory in which a directory
// can be made (probed by making and removing one).
std::string uncreatable_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::path at = fs::absolute(dir, ec);
  if (ec) return ec.message();
  while (at.has_parent_path() && at != at.parent_path() && !fs::exists(fs::symlink_status(at, ec)))
    at = at.parent_path();
  if (!fs::is_directory(at, ec)) return at.string() + " is not a directory";
  const fs::path probe = at / (".troupe-probe-" + std::to_string(::getpid()));
  if (::mkdir(probe.c_str(), 0700) != 0) return "cannot make a directory in " + at.string() + " (" + std::strerror(errno) + ")";
  ::rmdir(probe.c_str());
  return "";
}

void check_checkpoint_dir(const Spec& s, SpecSites& p) {
  if (s.topology.device_kind == DeviceKind::sim) return;  // a sim run saves nothing
  namespace fs = std::filesystem;
  const std::string dir = s.checkpoint_dir();
  const char* key = s.checkpoint.dir.empty() ? "run.out_dir" : "checkpoint.dir";
  std::error_code ec;
  const auto st = fs::status(dir, ec);
  if (ec || !fs::exists(st)) {
    // Created by the first save, after all the training: make sure now that
    // it can be, at the nearest part of the path that exists.
    if (const std::string why = uncreatable_dir(dir); !why.empty())
      p.error(p.where(key), "checkpoint directory " + dir + " cannot be created: " + why +
                                "; the run would train and then lose its checkpoint (set [checkpoint] dir elsewhere)");
    return;
  }
  if (!fs::is_directory(st)) {
    p.error(p.where(key), "checkpoint directory " + dir + " exists and is not a directory; the run's checkpoint "
                          "could not be saved there (set [checkpoint] dir to a new or checkpoint directory)");
    return;
  }
  if (!fs::is_empty(dir, ec) && !ec && !model::checkpoint_exists(dir))
    p.error(p.where(key), "checkpoint directory " + dir + " is a non-empty directory that holds no checkpoint; the "
                          "run would not overwrite it and would lose its final save (set [checkpoint] dir elsewhere)");
}

void check_supported(Spec& s, SpecSites& p) {
  for (const auto& def : spec_keys()) {
    if (!def.unsupported) continue;
    if (std::string why = def.unsupported(s); !why.empty())
      p.error(p.where(def.path()), def.label() + " = " + key_value_text(def, s) + ": " + why);
  }
}

// The data source must be buildable (file present, long enough, sequences fit)
// and its tokens must fit the model's vocabulary.
void check_tokenizer(Spec& s, SpecSites& p) {
  if (s.data.source != model::DataKind::jsonl && s.rl_section.prompts.empty()) return;
  const model::TokenizerConfig& t = s.data.tokenizer;
  if (t.kind == "sentencepiece" && t.model.empty()) {
    p.error(p.where("tokenizer.kind"), "[tokenizer] kind = \"sentencepiece\" needs model = FILE.model (`troupe tokenizer train` makes one)");
    return;
  }
  if (t.kind == "bytes" && !t.model.empty()) {
    p.error(p.where("tokenizer.model"), "[tokenizer] model is a SentencePiece file: set kind = \"sentencepiece\" with it");
    return;
  }
  try {
    const auto tok = model::make_tokenizer(t);
    // The model carries the tokenizer into its checkpoints (kind and file bytes).
    s.model.tokenizer_kind = t.kind;
    s.model.tokenizer_model = tok->model_bytes();
    s.data.tokenizer.model_bytes = tok->model_bytes();  // read once: every later user takes these bytes
    s.data.tokenizer.in_use = true;
    // model.vocab_size follows from the tokenizer; one set by hand must agree.
    if (!p.set_at("model.vocab_size")) s.model.vocab_size = tok->vocab_size();
    else if (s.model.vocab_size != tok->vocab_size())
      p.error(p.where("model.vocab_size"), "[model] vocab_size = " + std::to_string(s.model.vocab_size) +
                                               " disagrees with the tokenizer's " + std::to_string(tok->vocab_size()) +
                                               " (" + tok->describe() + "); leave vocab_size out and it follows the tokenizer");
  } catch (const std::exception& e) {
    p.error(p.where(t.model.empty() ? "tokenizer.kind" : "tokenizer.model"), std::string("[tokenizer] ") + e.what());
  }
}

void check_data(const Spec& s, SpecSites& p) {
  const std::string key = s.data.source == model::DataKind::text || s.data.source == model::DataKind::jsonl ? "data.path" : "data.source";
  try {
    const auto source = model::make_data_source(s.data, static_cast<uint64_t>(s.run.seed), s.model.seq_len);
    if (s.data.source == model::DataKind::jsonl) return;  // its vocabulary is the tokenizer's (check_tokenizer)
    if (source->vocab_size() > s.model.vocab_size)
      p.error(p.where("model.vocab_size"), "[model] vocab_size = " + std::to_string(s.model.vocab_size) +
                                               " is smaller than the data's vocabulary (" +
                                               std::to_string(source->vocab_size()) + " tokens, " +
                                               source->describe() + ")");
  } catch (const std::exception& e) {
    p.error(p.where(key), "[data] " + std::string(e.what()));
  }
}

}  // namespace troupe::launch::spec_detail

namespace troupe::launch::spec_detail {

void check_warnings(const Spec& s, SpecSites& p, bool from_file) {
  const auto v = [](int64_t x) { return std::to_string(x); };
  if (from_file && p.keys_set_in_file(s.source) == 0)
    p.warn(Pos{s.source, 0, 0}, "the spec file sets no key: every value is its default, a " +
                                    std::string(run_mode_name(s.run.mode)) + " run of the key defaults (`troupe keys` "
                                    "lists them; `troupe run` with no SPEC runs the built-in default job)");
  // A warmup longer than the run: the LR climbs linearly the whole time and
  // ends at steps / warmup of the configured value.
  const auto warmup = [&](int64_t warm, int64_t steps, const char* warm_key, const char* steps_key) {
    if (warm > steps && steps > 0)
      p.warn(p.where(warm_key), std::string(warm_key) + " = " + v(warm) + " is longer than the run (" + steps_key +
                                    " = " + v(steps) + "): the learning rate never reaches its value (it ends at " +
                                    v(100 * steps / warm) + "% of it)");
  };
  if (s.run.mode == RunMode::sft_rl) {
    warmup(s.optim.warmup_steps, s.run.steps, "optim.warmup_steps", "run.steps");
    warmup(s.rl_section.warmup_steps, s.rl_section.steps, "rl.warmup_steps", "rl.steps");
  } else {
    warmup(s.optim.warmup_steps, s.run.steps, "optim.warmup_steps", "run.steps");
  }
  if (s.log.rollouts > 0 && s.run.mode != RunMode::rl && s.run.mode != RunMode::sft_rl)
    p.warn(p.where("log.rollouts"), "log.rollouts = " + v(s.log.rollouts) +
                                        " has no effect: only online RL samples rollouts (run.mode = \"rl\" or \"sft_rl\")");
  if (s.topology.processes > 1 && s.topology.interface == "0.0.0.0")
    p.warn(p.where("topology.interface"),
           std::string("topology.interface = \"0.0.0.0\" listens on every interface of each host") +
               (s.topology.auth == runtime::ClusterAuth::none
                    ? "; with auth = \"none\" anyone who reaches the ports can talk to the actors"
                    : " (auth = \"tls\": only holders of the cluster key are let in)"));
}

}  // namespace troupe::launch::spec_detail
