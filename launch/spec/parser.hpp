// Internal to launch/spec/: what the spec checks (check_*.cpp) share with the
// TOML reader (parse.cpp). SpecSites is where every key of a spec was set (a
// file position, or a --set override) plus the diagnostics found so far; the
// checks read the first and append to the second. Each check reports every
// problem of its concern at the key that causes it, and load() runs them all.
#pragma once

#include <cstddef>
#include <filesystem>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "actors/plan.hpp"
#include "launch/spec/spec.hpp"

namespace troupe::launch::spec_detail {

// Where a key was set: a file position, or a command-line override.
struct Pos {
  std::string file;
  int line = 0;
  int column = 0;
};

class SpecSites {
 public:
  explicit SpecSites(Spec& spec) : spec_(spec) {}

  void error(const Pos& p, std::string message);
  void warn(const Pos& p, std::string message);  // into Spec::warnings; the spec still loads
  // Keys the spec file itself set (not --set overrides).
  size_t keys_set_in_file(const std::string& file) const;
  std::vector<Diagnostic>& diagnostics() { return diags_; }
  // run.mode as the spec file wrote it, before --set overrides: a two-phase
  // file ("sft_rl") may be run as its phase 1 alone with --set run.mode="pretrain".
  RunMode file_mode = RunMode::pretrain;

  // Position of an [[elastic]] or [[faults]] entry's key (or of the entry),
  // and whether the entry itself parsed (its cross-checks are skipped if not).
  Pos elastic_where(size_t index, const std::string& key) const;
  bool elastic_ok(size_t index) const { return index < elastic_ok_.size() && elastic_ok_[index]; }
  Pos fault_where(size_t index, const std::string& key) const;
  bool fault_ok(size_t index) const { return index < fault_ok_.size() && fault_ok_[index]; }
  // Where the first key of `section` was set, or nullptr when none was.
  const Pos* first_set_in(const std::string& section) const;
  // Where the first key whose path starts with `prefix` ("sim.ep_") was set, or nullptr.
  const Pos* first_set_with_prefix(const std::string& prefix) const;
  // Where `path` ("section.key") was set, or nullptr when it was not.
  const Pos* set_at(const std::string& path) const;
  // Position of a key if it was set, else of its section header, else the file.
  Pos where(const std::string& path) const;

  // The topology plan spec `s` would run (resolve_topology), made once for
  // every check that reads it; null when the topology itself is invalid (it
  // is reported on its keys).
  const runtime::Plan* topology_plan(const Spec& s);

 protected:
  Spec& spec_;
  std::vector<Diagnostic> diags_;
  std::map<std::string, Pos> set_;
  std::map<std::string, Pos> section_pos_;
  std::map<std::pair<size_t, std::string>, Pos> fault_pos_;
  std::vector<bool> fault_ok_;
  std::map<std::pair<size_t, std::string>, Pos> elastic_pos_;
  std::vector<bool> elastic_ok_;
  const Spec* plan_of_ = nullptr;  // the spec topology_plan() was made for
  std::optional<runtime::Plan> plan_;
};

// A number as the key table writes ranges: integers without a fraction.
std::string num_text(double v);

// Parses `text` (null: no file, the key defaults), applies the overrides,
// runs every check; throws SpecError with all problems found (parse.cpp).
Spec load(const std::string* text, const std::string& source, const std::vector<Override>& overrides,
          const std::filesystem::path& base_dir);

// check_topology.cpp
void check_degrees(const Spec& s, SpecSites& p);
void check_cross_fields(const Spec& s, SpecSites& p);
void check_elastic(const Spec& s, SpecSites& p);
void check_checkpoint_dir(const Spec& s, SpecSites& p);
void check_supported(Spec& s, SpecSites& p);
void check_data(const Spec& s, SpecSites& p);
// A user's tokenizer: loads, and sets model.vocab_size when the spec leaves it out.
void check_tokenizer(Spec& s, SpecSites& p);
void check_warnings(const Spec& s, SpecSites& p, bool from_file);
// memory.cpp
void check_memory(const Spec& s, SpecSites& p);
// check_faults.cpp
void check_faults(const Spec& s, SpecSites& p);
void check_rl_faults(const Spec& s, SpecSites& p);
void check_chaos(const Spec& s, SpecSites& p);
void check_rl_chaos(const Spec& s, SpecSites& p, const Pos& at);
// check_sim.cpp
void check_sim(const Spec& s, SpecSites& p);
// check_rl.cpp
bool rl_topology_ok(const Spec& s);
void convert_rl(Spec& s, SpecSites& p);
void check_rl_inputs(const Spec& s, SpecSites& p);
void check_phase_keys(const Spec& s, SpecSites& p);
void check_sft_rl(Spec& s, SpecSites& p);

}  // namespace troupe::launch::spec_detail
