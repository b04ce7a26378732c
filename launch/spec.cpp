// Launch-spec parsing and validation with toml++. Every problem becomes a
// Diagnostic (file:line:col + message) and all of them are reported together.
#include "launch/spec.hpp"

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
#include <toml++/toml.h>

#include "actors/supervision/faults.hpp"
#include "actors/schedule/schedule.hpp"
#include "launch/phases.hpp"
#include "launch/spec_keys.hpp"
#include "actors/rl/rl_plan.hpp"
#include "launch/topology.hpp"
#include "model/checkpoint.hpp"
#include "model/data.hpp"
#include "model/params.hpp"
#include "rl/task.hpp"

namespace troupe::launch {

extern const char* const kDefaultSpecText;  // launch/specs/default.toml, embedded

std::string Diagnostic::str() const {
  std::ostringstream os;
  os << file;
  if (line > 0) os << ':' << line << ':' << column;
  os << ": error: " << message;
  return os.str();
}

static std::string join_diagnostics(const std::vector<Diagnostic>& ds) {
  std::string s;
  for (const auto& d : ds) {
    if (!s.empty()) s += '\n';
    s += d.str();
  }
  return s;
}

SpecError::SpecError(std::vector<Diagnostic> diagnostics)
    : std::runtime_error(join_diagnostics(diagnostics)), diagnostics_(std::move(diagnostics)) {}

std::string Spec::out_dir() const { return run.out_dir.empty() ? "runs/" + run.name : run.out_dir; }
std::string Spec::checkpoint_dir() const {
  return checkpoint.dir.empty() ? out_dir() + "/checkpoint" : checkpoint.dir;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      const size_t sub = prev[j - 1] + (a[i - 1] == b[j - 1] ? 0 : 1);
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, sub});
    }
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

namespace {

const std::vector<std::string> kSections = {"run", "model", "data", "optim", "topology", "experts", "checkpoint", "log", "sim", "rl", "chaos"};

// Where a key was set: a file position, or a command-line override.
struct Pos {
  std::string file;
  int line = 0;
  int column = 0;
};

Pos pos_of(const toml::source_region& r, const std::string& fallback_file) {
  Pos p;
  p.file = r.path ? std::string(*r.path) : fallback_file;
  p.line = static_cast<int>(r.begin.line);
  p.column = static_cast<int>(r.begin.column);
  return p;
}

// First letters of the underscore-separated words: "learning_rate" -> "lr".
std::string initials(const std::string& word) {
  std::string out;
  for (size_t i = 0; i < word.size(); ++i)
    if (i == 0 || word[i - 1] == '_') out += word[i];
  return out;
}

// Closest candidate within a small edit distance (or whose name is the
// word's initials, for abbreviations such as lr), or "".
std::string closest(const std::string& word, const std::vector<std::string>& candidates) {
  if (word.find('_') != std::string::npos)
    for (const auto& c : candidates)
      if (c.size() >= 2 && c == initials(word)) return c;
  std::string best;
  size_t best_d = std::max<size_t>(2, word.size() / 3) + 1;
  for (const auto& c : candidates) {
    const size_t d = edit_distance(word, c);
    if (d < best_d) best_d = d, best = c;
  }
  return best;
}

std::string join(const std::vector<std::string>& xs, const char* sep = ", ") {
  std::string s;
  for (const auto& x : xs) {
    if (!s.empty()) s += sep;
    s += x;
  }
  return s;
}

const char* node_type_name(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return "string";
    case toml::node_type::integer: return "integer";
    case toml::node_type::floating_point: return "float";
    case toml::node_type::boolean: return "boolean";
    case toml::node_type::date: return "date";
    case toml::node_type::time: return "time";
    case toml::node_type::date_time: return "date-time";
    case toml::node_type::array: return "array";
    case toml::node_type::table: return "table";
    default: return "value";
  }
}

std::string node_text(const toml::node& n) {
  std::ostringstream os;
  if (auto s = n.as_string()) os << '"' << s->get() << '"';
  else if (n.is_table()) os << "{...}";
  else if (n.is_array()) os << "[...]";
  else if (auto f = n.as_floating_point()) os << f->get();
  else n.visit([&](auto&& v) { os << v; });
  return os.str();
}

std::string num_text(double v) {
  std::ostringstream os;
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (std::fabs(v) >= 1e9) os << v;
  else if (v == std::floor(v)) os << static_cast<long long>(v);
  else os << v;
  return os.str();
}

class Parser {
 public:
  explicit Parser(Spec& spec) : spec_(spec) {}

  void error(const Pos& p, std::string message) {
    diags_.push_back({p.file, p.line, p.column, std::move(message)});
  }
  std::vector<Diagnostic>& diagnostics() { return diags_; }
  // run.mode as the spec file wrote it, before --set overrides: a two-phase
  // file ("sft_rl") may be run as its phase 1 alone with --set run.mode="pretrain".
  RunMode file_mode = RunMode::pretrain;

  void parse_document(const std::string& text, const std::string& file) {
    toml::table root;
    try {
      root = toml::parse(text, file);
    } catch (const toml::parse_error& e) {
      error(pos_of(e.source(), file), "invalid TOML: " + std::string(e.description()));
      return;
    }
    // spec_version first: a spec for a newer format gets that one error, not
    // a list of keys this troupe does not know.
    for (auto&& [key, node] : root) {
      if (key.str() != "spec_version") continue;
      const toml::node* v = &node;
      const Pos vp = pos_of(key.source(), file);
      if (auto i = v->as_integer(); i && i->get() > kSpecVersion) {
        error(vp, "spec_version = " + std::to_string(i->get()) + " is newer than this troupe reads (spec_version <= " +
                      std::to_string(kSpecVersion) + "): upgrade troupe, or write the spec for version " +
                      std::to_string(kSpecVersion));
        return;
      }
      apply("", "spec_version", *v, vp);
    }
    for (auto&& [k, node] : root) {
      const std::string section(k.str());
      const Pos kp = pos_of(k.source(), file);
      if (section == "spec_version") continue;  // applied above
      if (section == "faults") {
        parse_faults(node, kp);
        continue;
      }
      if (section == "elastic") {
        parse_elastic(node, kp);
        continue;
      }
      if (std::find(kSections.begin(), kSections.end(), section) == kSections.end()) {
        std::string msg = "unknown section [" + section + "]";
        if (auto c = closest(section, kSections); !c.empty()) msg += "; did you mean [" + c + "]?";
        msg += " (valid sections: " + join(kSections) + ")";
        if (!node.is_table()) {
          // A bare key at top level: perhaps it belongs in a section.
          if (auto owner = section_of(section); !owner.empty())
            msg = "key '" + section + "' must be inside a section: put it under [" + owner + "]";
        }
        error(kp, msg);
        continue;
      }
      if (!node.is_table()) {
        error(kp, "'" + section + "' must be a table ([" + section + "]), got " + node_type_name(node));
        continue;
      }
      section_pos_[section] = kp;
      for (auto&& [key, value] : *node.as_table()) {
        const Pos vp = pos_of(key.source(), file);
        // [chaos] kinds and roles: a TOML list of strings is the same as the
        // comma-separated string the key table holds.
        if (section == "chaos" && value.is_array() && (key.str() == "kinds" || key.str() == "roles")) {
          std::string joined;
          bool ok = true;
          for (const toml::node& e : *value.as_array()) {
            if (auto str = e.as_string()) joined += (joined.empty() ? "" : ",") + str->get();
            else ok = false;
          }
          if (!ok) error(vp, "[chaos] " + std::string(key.str()) + ": expected a list of strings, got " + node_text(value));
          else (key.str() == "kinds" ? spec_.chaos.kinds : spec_.chaos.roles) = joined;
          set_["chaos." + std::string(key.str())] = vp;
          continue;
        }
        apply(section, std::string(key.str()), value, vp);
      }
    }
  }

  // [[faults]]: an array of tables, each {at_step, target, kind, at_message}.
  // The key table cannot describe arrays of tables, so this is by hand; the
  // checks that need other sections are in check_faults().
  void parse_faults(const toml::node& node, const Pos& kp) {
    const toml::array* arr = node.as_array();
    if (!arr || !arr->is_array_of_tables()) {
      error(kp, "faults must be an array of tables: write each entry as [[faults]] with at_step, target and kind");
      return;
    }
    static const std::vector<std::string> keys = {"at_step", "target", "kind",        "at_message", "count",
                                                  "delay_ms", "duration_ms", "factor", "duration_steps"};
    for (const toml::node& entry_node : *arr) {
      const toml::table& entry = *entry_node.as_table();
      const Pos ep = pos_of(entry.source(), kp.file);
      FaultConfig f;
      bool has_step = false, has_target = false, ok = true;
      const size_t index = spec_.faults.size();
      for (auto&& [k, v] : entry) {
        const std::string key(k.str());
        const Pos p = pos_of(k.source(), kp.file);
        fault_pos_[{index, key}] = p;
        if (key == "at_step" || key == "at_message" || key == "count" || key == "duration_steps") {
          auto i = v.as_integer();
          if (!i) {
            error(p, "[[faults]] " + key + ": expected an integer, got " + node_type_name(v) + " " + node_text(v));
            ok = false;
            continue;
          }
          if (key == "at_step") f.at_step = i->get(), has_step = true;
          else if (key == "count" && (i->get() < 1 || i->get() > 1000000000))
            error(p, "[[faults]] count = " + node_text(v) + " is out of range (allowed 1 .. 1e9)"), ok = false;
          else if (key == "count") f.count = i->get();
          else if (key == "duration_steps" && (i->get() < 1 || i->get() > 1000000000))
            error(p, "[[faults]] duration_steps = " + node_text(v) + " is out of range (allowed 1 .. 1e9)"), ok = false;
          else if (key == "duration_steps") f.steps = i->get();
          else if (i->get() < 0) error(p, "[[faults]] at_message = " + node_text(v) + " must be >= 0 (0: a seeded point)"), ok = false;
          else f.at_message = i->get();
        } else if (key == "delay_ms" || key == "duration_ms" || key == "factor") {
          double x = 0;
          if (auto fl = v.as_floating_point()) x = fl->get();
          else if (auto in = v.as_integer()) x = static_cast<double>(in->get());
          else {
            error(p, "[[faults]] " + key + ": expected a number, got " + node_type_name(v) + " " + node_text(v));
            ok = false;
            continue;
          }
          if (key == "factor") {
            if (!std::isfinite(x) || x < 1 || x > 1000)
              error(p, "[[faults]] factor = " + node_text(v) + " is out of range (allowed 1 .. 1000: how many times slower)"), ok = false;
            else f.factor = x;
          } else if (!std::isfinite(x) || x <= 0 || x > 3.6e6)
            error(p, "[[faults]] " + key + " = " + node_text(v) + " is out of range (allowed > 0 .. 3600000 ms)"), ok = false;
          else (key == "delay_ms" ? f.delay_ms : f.duration_ms) = x;
        } else if (key == "target" || key == "kind") {
          auto str = v.as_string();
          if (!str) {
            error(p, "[[faults]] " + key + ": expected a string, got " + node_type_name(v) + " " + node_text(v));
            ok = false;
            continue;
          }
          if (key == "kind") {
            const std::string kind = str->get();
            bool known = false;
            std::vector<std::string> names;
            std::vector<runtime::FaultKind> kinds(std::begin(runtime::kFaultKinds), std::end(runtime::kFaultKinds));
            kinds.push_back(runtime::FaultKind::stop);  // process targets only (check_faults)
            for (runtime::FaultKind k : kinds) {
              names.push_back(std::string("\"") + runtime::fault_kind_name(k) + "\"");
              if (kind == runtime::fault_kind_name(k)) f.kind = k, known = true;
            }
            if (!known) error(p, "[[faults]] kind = \"" + kind + "\" is not one of " + join(names)), ok = false;
          } else {
            f.target = str->get(), has_target = true;
            bool gen = false;
            int index = 0;
            if (!runtime::parse_fault_target(f.target) && !runtime::parse_rl_fault_target(f.target, gen, index) &&
                !runtime::parse_process_target(f.target, index) && !runtime::is_rl_buffer_target(f.target))
              error(p, "[[faults]] target = \"" + f.target + "\" is not an actor: write \"stage:K\" (pipeline rank K), "
                       "\"stage:K/replica:R\" (of data-parallel replica R), \"optimizer:K\" (optimizer shard K), "
                       "\"expert:L/S\" (expert shard S of MoE layer L; \"expert:L/S/replica:R\"), \"process:P\" (a whole "
                       "process, kind kill or stop), or in an RL run \"generator:K\", \"reward:K\" or \"rollout_buffer\""), ok = false;
          }
        } else {
          std::string msg = "unknown key '" + key + "' in [[faults]]";
          std::string c = closest(key, keys);
          if (c.empty() && std::find(keys.begin(), keys.end(), "at_" + key) != keys.end()) c = "at_" + key;
          if (!c.empty()) msg += "; did you mean '" + c + "'?";
          error(p, msg + " (valid keys: " + join(keys) + ")");
          ok = false;
        }
      }
      if (!has_step) error(ep, "[[faults]] entry needs at_step (the 1-based step to hit)"), ok = false;
      if (!has_target) error(ep, "[[faults]] entry needs target (\"stage:K\", \"optimizer:K\" or \"expert:L/S\")"), ok = false;
      fault_pos_[{index, ""}] = ep;
      spec_.faults.push_back(f);
      fault_ok_.push_back(ok);
    }
  }
  // [[elastic]]: an array of tables, each {at_step, expert_shards}; the
  // checks against the rest of the spec are in check_elastic().
  void parse_elastic(const toml::node& node, const Pos& kp) {
    const toml::array* arr = node.as_array();
    if (!arr || !arr->is_array_of_tables()) {
      error(kp, "elastic must be an array of tables: write each scale event as [[elastic]] with at_step and expert_shards");
      return;
    }
    static const std::vector<std::string> keys = {"at_step", "expert_shards"};
    for (const toml::node& entry_node : *arr) {
      const toml::table& entry = *entry_node.as_table();
      const Pos ep = pos_of(entry.source(), kp.file);
      ElasticConfig e;
      bool has_step = false, has_shards = false, ok = true;
      const size_t index = spec_.elastic.size();
      for (auto&& [k, v] : entry) {
        const std::string key(k.str());
        const Pos p = pos_of(k.source(), kp.file);
        elastic_pos_[{index, key}] = p;
        if (std::find(keys.begin(), keys.end(), key) == keys.end()) {
          std::string msg = "unknown key '" + key + "' in [[elastic]]";
          if (const std::string c = closest(key, keys); !c.empty()) msg += "; did you mean '" + c + "'?";
          error(p, msg + " (valid keys: " + join(keys) + ")");
          ok = false;
          continue;
        }
        (key == "at_step" ? has_step : has_shards) = true;  // present: a bad value is its own error
        auto i = v.as_integer();
        if (!i || i->get() < -1000000000 || i->get() > 1000000000) {
          error(p, "[[elastic]] " + key + ": expected an integer, got " + node_type_name(v) + " " + node_text(v));
          ok = false;
          continue;
        }
        if (key == "at_step") e.at_step = i->get();
        else e.expert_shards = static_cast<int>(i->get());
      }
      if (!has_step) error(ep, "[[elastic]] entry needs at_step (the 1-based step that first runs on the new placement)"), ok = false;
      if (!has_shards) error(ep, "[[elastic]] entry needs expert_shards (the new number of expert shards per MoE layer)"), ok = false;
      elastic_pos_[{index, ""}] = ep;
      spec_.elastic.push_back(e);
      elastic_ok_.push_back(ok);
    }
  }
  Pos elastic_where(size_t index, const std::string& key) const {
    if (auto it = elastic_pos_.find({index, key}); it != elastic_pos_.end()) return it->second;
    if (auto it = elastic_pos_.find({index, ""}); it != elastic_pos_.end()) return it->second;
    return Pos{spec_.source, 0, 0};
  }
  bool elastic_ok(size_t index) const { return index < elastic_ok_.size() && elastic_ok_[index]; }

  // Position of a [[faults]] entry's key (or of the entry).
  Pos fault_where(size_t index, const std::string& key) const {
    if (auto it = fault_pos_.find({index, key}); it != fault_pos_.end()) return it->second;
    if (auto it = fault_pos_.find({index, ""}); it != fault_pos_.end()) return it->second;
    return Pos{spec_.source, 0, 0};
  }
  bool fault_ok(size_t index) const { return index < fault_ok_.size() && fault_ok_[index]; }

  void apply_override(const Override& o) {
    const std::string where = "--set " + o.path + "=" + o.value;
    const Pos p{where, 0, 0};
    const auto dot = o.path.find('.');
    if (dot == std::string::npos || dot == 0 || dot + 1 == o.path.size()) {
      error(p, "override must look like section.key=value (e.g. run.steps=10)");
      return;
    }
    const std::string section = o.path.substr(0, dot), key = o.path.substr(dot + 1);
    if (std::find(kSections.begin(), kSections.end(), section) == kSections.end()) {
      std::string msg = "unknown section [" + section + "]";
      if (auto c = closest(section, kSections); !c.empty()) msg += "; did you mean [" + c + "]?";
      error(p, msg + " (valid sections: " + join(kSections) + ")");
      return;
    }
    toml::table t;
    try {
      t = toml::parse("v = " + o.value, where);
    } catch (const toml::parse_error& e) {
      // A bare word is taken as a string, so --set run.name=demo works unquoted.
      const bool bare_word = !o.value.empty() && o.value.find_first_of("\"'[]{}=#, ") == std::string::npos;
      if (!bare_word) {
        error(p, "invalid value: " + std::string(e.description()));
        return;
      }
      t.insert_or_assign("v", o.value);
    }
    apply(section, key, *t.get("v"), p);
  }

  void apply(const std::string& section, const std::string& key, const toml::node& value, const Pos& p) {
    const KeyDef* def = find(section, key);
    if (!def) {
      std::vector<std::string> valid;
      for (const auto& d : spec_keys())
        if (d.section == section) valid.push_back(d.key);
      std::string msg = "unknown key '" + key + "' in [" + section + "]";
      if (auto c = closest(key, valid); !c.empty()) msg += "; did you mean '" + c + "'?";
      else if (auto owner = section_of(key); !owner.empty()) msg += "; '" + key + "' belongs in [" + owner + "]";
      error(p, msg + " (valid keys: " + join(valid) + ")");
      return;
    }
    const std::string name = def->label();
    if (set_.count(def->path()) && set_[def->path()].file == p.file) {
      error(p, name + " is set twice");
      return;
    }
    void* field = def->field(spec_);
    switch (def->type) {
      case KeyType::Int: {
        auto v = value.as_integer();
        if (!v) return type_error(*def, value, p);
        const double x = static_cast<double>(v->get());
        if (x < def->min || x > def->max) return range_error(*def, value, p);
        *static_cast<int64_t*>(field) = v->get();
        break;
      }
      case KeyType::Float: {
        double x;
        if (auto f = value.as_floating_point()) x = f->get();
        else if (auto i = value.as_integer()) x = static_cast<double>(i->get());
        else return type_error(*def, value, p);
        if (!std::isfinite(x) || x < def->min || x > def->max) return range_error(*def, value, p);
        *static_cast<double*>(field) = x;
        break;
      }
      case KeyType::Bool: {
        auto b = value.as_boolean();
        if (!b) return type_error(*def, value, p);
        *static_cast<bool*>(field) = b->get();
        break;
      }
      case KeyType::String:
      case KeyType::Choice: {
        auto s = value.as_string();
        if (!s) return type_error(*def, value, p);
        const std::string v = s->get();
        const auto choice = std::find(def->choices.begin(), def->choices.end(), v);
        if (!def->choices.empty() && choice == def->choices.end()) {
          std::vector<std::string> quoted;
          for (const auto& c : def->choices) quoted.push_back("\"" + c + "\"");
          std::string msg = name + " = \"" + v + "\" is not one of " + join(quoted);
          if (auto c = closest(v, def->choices); !c.empty()) msg += "; did you mean \"" + c + "\"?";
          return error(p, msg);
        }
        if (def->type == KeyType::Choice) def->set_choice(field, static_cast<size_t>(choice - def->choices.begin()));
        else *static_cast<std::string*>(field) = v;
        break;
      }
      case KeyType::FloatList: {
        const toml::array* arr = value.as_array();
        if (!arr) return type_error(*def, value, p);
        std::vector<double> xs;
        for (const toml::node& e : *arr) {
          double x;
          if (auto f = e.as_floating_point()) x = f->get();
          else if (auto i = e.as_integer()) x = static_cast<double>(i->get());
          else return error(p, name + ": expected an array of numbers, got " + node_text(value));
          if (!std::isfinite(x) || x < def->min || x > def->max)
            return error(p, name + ": " + node_text(e) + " is out of range (allowed " + num_text(def->min) + " .. " +
                                num_text(def->max) + ")");
          xs.push_back(x);
        }
        *static_cast<std::vector<double>*>(field) = std::move(xs);
        break;
      }
    }
    set_[def->path()] = p;
  }

  // Where the first key of `section` was set (a file position, or an
  // override), or nullptr when none was.
  const Pos* first_set_in(const std::string& section) const {
    for (const auto& [path, pos] : set_)
      if (path.rfind(section + ".", 0) == 0) return &pos;
    return nullptr;
  }

  // Where the first key whose path starts with `prefix` ("sim.ep_") was set, or nullptr.
  const Pos* first_set_with_prefix(const std::string& prefix) const {
    for (const auto& [path, pos] : set_)
      if (path.rfind(prefix, 0) == 0) return &pos;
    return nullptr;
  }

  // Where `path` ("section.key") was set, or nullptr when it was not.
  const Pos* set_at(const std::string& path) const {
    auto it = set_.find(path);
    return it == set_.end() ? nullptr : &it->second;
  }

  // Position of a key if it was set, else of its section header, else the file.
  Pos where(const std::string& path) const {
    if (auto it = set_.find(path); it != set_.end()) return it->second;
    const std::string section = path.substr(0, path.find('.'));
    if (auto it = section_pos_.find(section); it != section_pos_.end()) return it->second;
    return Pos{spec_.source, 0, 0};
  }

 private:
  static const KeyDef* find(const std::string& section, const std::string& key) {
    for (const auto& d : spec_keys())
      if (d.section == section && d.key == key) return &d;
    return nullptr;
  }
  static std::string section_of(const std::string& key) {
    for (const auto& d : spec_keys())
      if (d.key == key) return d.section;
    return "";
  }
  void type_error(const KeyDef& def, const toml::node& value, const Pos& p) {
    std::string msg = def.label() + ": expected " +
                      (def.type == KeyType::Int || def.type == KeyType::FloatList ? "an " : "a ") + key_type_name(def.type) +
                      ", got " + node_type_name(value) + " " + node_text(value);
    if (def.type == KeyType::Int && value.is_floating_point()) msg += " (write it without a fraction)";
    if (value.is_string() && def.type != KeyType::String && def.type != KeyType::Choice) msg += " (remove the quotes)";
    error(p, msg);
  }
  void range_error(const KeyDef& def, const toml::node& value, const Pos& p) {
    error(p, def.label() + " = " + node_text(value) +
                 " is out of range (allowed " + num_text(def.min) + " .. " + num_text(def.max) + ")");
  }

  Spec& spec_;
  std::vector<Diagnostic> diags_;
  std::map<std::string, Pos> set_;
  std::map<std::string, Pos> section_pos_;
  std::map<std::pair<size_t, std::string>, Pos> fault_pos_;
  std::vector<bool> fault_ok_;
  std::map<std::pair<size_t, std::string>, Pos> elastic_pos_;
  std::vector<bool> elastic_ok_;
};

// [[elastic]] against the rest of the spec: a run with expert-shard actors
// (in one process or several: a new shard is spawned on the process its
// device belongs to), steps inside the run and increasing, shard counts the
// experts can be split into.
void check_elastic(const Spec& s, Parser& p) {
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

// [[faults]] against the rest of the spec: the step exists, the target
// exists in the topology, and the spec runs on the actor runtime.
void check_rl_faults(const Spec& s, Parser& p);

// A [[faults]] entry on "process:P" (kind kill or stop): what the
// recovery across processes supports (README "Failure injection").
void check_process_fault(const Spec& s, Parser& p, size_t i, int proc) {
  const FaultConfig& f = s.faults[i];
  auto v = [](int64_t x) { return std::to_string(x); };
  const Pos at = p.fault_where(i, "target");
  const int64_t n = s.topology.processes;
  if (f.kind != runtime::FaultKind::kill && f.kind != runtime::FaultKind::stop)
    p.error(p.fault_where(i, "kind"), std::string("[[faults]] kind = \"") + runtime::fault_kind_name(f.kind) +
                                         "\" does not apply to a process: a process target takes \"kill\" (SIGKILL) "
                                         "or \"stop\" (SIGSTOP)");
  if (f.at_message != 0)
    p.error(p.fault_where(i, "at_message"), "[[faults]] at_message applies to actor kills; a process is hit as its step starts");
  if (f.at_step < 1 || f.at_step > s.run.steps)
    p.error(p.fault_where(i, "at_step"), "[[faults]] at_step = " + v(f.at_step) + " is out of range (allowed 1 .. [run] steps = " +
                                            v(s.run.steps) + ")");
  if (!uses_runtime(s) || s.topology.device_kind == DeviceKind::sim || s.run.mode != RunMode::pretrain) {
    p.error(at, "[[faults]] target = \"" + f.target + "\" needs a multi-process run of the actor runtime (real devices, run.mode = \"pretrain\")");
    return;
  }
  if (n < 2) {
    p.error(at, "[[faults]] target = \"" + f.target + "\": a process fault needs [topology] processes = 2 (this run has 1 "
                "process; to kill an actor name it, e.g. \"stage:1\")");
    return;
  }
  if (proc >= n) {
    p.error(at, "[[faults]] target = \"" + f.target + "\" does not exist: [topology] processes = " + v(n) +
                    " (processes 0.." + v(n - 1) + ")");
    return;
  }
  if (proc == 0) {
    p.error(at, "[[faults]] target = \"process:0\" cannot be recovered: process 0 holds the coordinator (the "
                "supervisor, the committed snapshot and the run's output); only process 1 of a 2-process run can be lost and recovered");
    return;
  }
  if (n > 2)
    p.error(at, "[[faults]] target = \"" + f.target + "\": recovering a lost process is built for 2 processes only "
                "([topology] processes = " + v(n) + "): the other survivors would keep stale handles to the lost actors");
  if (s.topology.process_loss != runtime::ProcessLoss::recover)
    p.error(at, "[[faults]] target = \"" + f.target + "\" with [topology] process_loss = \"fail\": the run would just "
                "stop; set process_loss = \"recover\"");
}

// The parameters fault `i`'s kind needs, reported at its kind key (one rule
// for actor runtime and RL faults alike).
void check_fault_parameters(const FaultConfig& f, Parser& p, size_t i) {
  if (f.kind == runtime::FaultKind::delay && f.delay_ms <= 0)
    p.error(p.fault_where(i, "kind"), "[[faults]] kind = \"delay\" needs delay_ms (how late each message arrives, ms)");
  if (f.kind == runtime::FaultKind::pause && f.duration_ms <= 0)
    p.error(p.fault_where(i, "kind"), "[[faults]] kind = \"pause\" needs duration_ms (how long the actor receives nothing)");
  if (f.kind == runtime::FaultKind::partition && f.duration_ms <= 0)
    p.error(p.fault_where(i, "kind"), "[[faults]] kind = \"partition\" needs duration_ms (how long the target's device is cut off from the rest)");
  if (f.kind == runtime::FaultKind::slow && f.factor <= 1)
    p.error(p.fault_where(i, "kind"), "[[faults]] kind = \"slow\" needs factor > 1 (how many times slower its device runs)");
}

void check_faults(const Spec& s, Parser& p) {
  if (s.run.mode == RunMode::rl) return check_rl_faults(s, p);
  // An RL actor (generator:K, reward:K, rollout_buffer) named in a run that
  // has none: reported once here, skipped below.
  std::vector<bool> rl_target(s.faults.size(), false);
  for (size_t i = 0; i < s.faults.size(); ++i) {
    int n = 0;
    if (!p.fault_ok(i) || runtime::parse_fault_target(s.faults[i].target) ||
        runtime::parse_process_target(s.faults[i].target, n))
      continue;
    rl_target[i] = true;
    p.error(p.fault_where(i, "target"), "[[faults]] target = \"" + s.faults[i].target + "\" is an actor of a decoupled "
                                        "RL run (run.mode = \"rl\" with rl.sync = \"fixed_lag\" or \"latest\"); this "
                                        "run has mode = \"" + run_mode_name(s.run.mode) + "\": its actors are stage:K, "
                                        "optimizer:K, expert:L/S and process:P");
  }
  if (s.run.mode == RunMode::reward_model) {
    for (size_t i = 0; i < s.faults.size(); ++i)
      if (p.fault_ok(i))
        p.error(p.fault_where(i, ""), "[[faults]] in a reward-model run: it trains in one process, with no actors to kill");
    return;
  }
  auto v = [](int64_t x) { return std::to_string(x); };
  // One actor, one step, one fault: a second entry would silently collapse
  // into the first (the supervisor kills an actor once per step attempt).
  // A process target counts as role -1.
  std::map<std::tuple<int, int, int, int, int64_t>, size_t> seen;
  for (size_t i = 0; i < s.faults.size(); ++i) {
    if (!p.fault_ok(i) || rl_target[i]) continue;
    int proc = 0;
    const bool is_proc = runtime::parse_process_target(s.faults[i].target, proc);
    const auto t = is_proc ? runtime::FaultTarget{runtime::Role::Coordinator, proc, 0, 0}
                           : *runtime::parse_fault_target(s.faults[i].target);
    const auto key = std::make_tuple(is_proc ? -1 : static_cast<int>(t.role), t.index, t.replica, t.shard, s.faults[i].at_step);
    const auto [it, fresh] = seen.emplace(key, i);
    if (!fresh) {
      const Pos first = p.fault_where(it->second, "");
      p.error(p.fault_where(i, ""), "[[faults]] entry repeats the one at line " + std::to_string(first.line) +
                                       " (target \"" + s.faults[i].target + "\", at_step = " + v(s.faults[i].at_step) +
                                       "): one actor takes at most one fault per step");
    }
  }
  // Whether a target exists is the plan's answer (the actors the runtime
  // would spawn, by their one naming scheme); the message says which
  // setting leaves it out. No plan: the topology itself is invalid and is
  // reported on its keys.
  std::optional<runtime::Plan> plan;
  if (uses_runtime(s) && !s.faults.empty()) {
    try {
      plan = resolve_topology(s);
    } catch (const std::exception&) {
    }
  }
  for (size_t i = 0; i < s.faults.size(); ++i) {
    if (!p.fault_ok(i) || rl_target[i]) continue;  // reported while parsing
    const FaultConfig& f = s.faults[i];
    if (int proc = 0; runtime::parse_process_target(f.target, proc)) {
      check_process_fault(s, p, i, proc);
      continue;
    }
    if (f.kind == runtime::FaultKind::stop) {
      p.error(p.fault_where(i, "kind"), "[[faults]] kind = \"stop\" stops a whole process: its target must be "
                                       "\"process:P\" (to freeze one actor use kind = \"pause\")");
      continue;
    }
    if (!uses_runtime(s)) {
      p.error(p.fault_where(i, ""), "[[faults]] needs the actor runtime (supervised actors); this single-device sequential "
                                   "spec runs in the single-process trainer (use e.g. [topology] schedule = \"1f1b\")");
      continue;
    }
    if (s.topology.device_kind == DeviceKind::sim) {
      p.error(p.fault_where(i, ""), "[[faults]] needs real devices: sim devices ([topology] device_kind = \"sim\") run "
                                   "no supervised actors, so a fault would be silently ignored");
      continue;
    }
    check_fault_parameters(f, p, i);
    if (s.topology.processes > 1)
      p.error(p.fault_where(i, ""), "[[faults]] runs in one process only for now: the supervisor restarts actors on its "
                                   "own devices ([topology] processes = " + v(s.topology.processes) + "); a whole process can be hit: target = \"process:1\"");
    if (f.at_step < 1 || f.at_step > s.run.steps)
      p.error(p.fault_where(i, "at_step"), "[[faults]] at_step = " + v(f.at_step) + " is out of range (allowed 1 .. [run] steps = " +
                                              v(s.run.steps) + ")");
    const auto t = runtime::parse_fault_target(f.target);
    // With [[elastic]] events an expert shard must exist in the fault's step.
    std::optional<runtime::Plan> at_step;
    if (plan && t->role == runtime::Role::Expert && !s.elastic.empty()) {
      try {
        runtime::RuntimeOptions ro = runtime_options(s);
        ro.expert_shards = runtime::expert_shards_at(ro, f.at_step);
        at_step = runtime::make_plan(ro);
      } catch (const std::exception&) {  // a bad event: reported on its keys
      }
    }
    const runtime::Plan* pl = at_step ? &*at_step : plan ? &*plan : nullptr;
    if (!pl || pl->target(*t)) continue;
    const Pos at = p.fault_where(i, "target");
    const std::string gone = "[[faults]] target = \"" + f.target + "\" does not exist: ";
    const int dp = plan->data_parallel;
    if (t->role == runtime::Role::Expert) {
      const bool moe_layer = std::find(plan->moe_layers.begin(), plan->moe_layers.end(), t->index) != plan->moe_layers.end();
      if (!plan->expert_parallel())
        p.error(at, gone + "expert-shard actors need [model] ffn = \"moe\" and [topology] expert_shards > 1 (expert_shards = " +
                        v(s.topology.expert_shards) + ")");
      else if (!moe_layer)
        p.error(at, gone + "[model] n_layers = " + v(s.model.n_layers) + " (MoE layers 0.." + v(s.model.n_layers - 1) + ")");
      else if (t->shard >= pl->expert_shards)
        p.error(at, gone + (at_step ? "in step " + v(f.at_step) + " (after [[elastic]]) there are " + v(pl->expert_shards) +
                                          " expert shard(s) per layer"
                                    : "[topology] expert_shards = " + v(pl->expert_shards)) +
                        " (shards 0.." + v(pl->expert_shards - 1) + " per layer)");
      else
        p.error(at, gone + "[topology] data_parallel = " + v(dp) + " (replicas 0.." + v(dp - 1) + ")");
      continue;
    }
    const bool rank = t->role == runtime::Role::Rank;  // a pipeline rank, named "stage:K"
    const int n = rank ? plan->sl.num_ranks : plan->num_shards();
    if (t->index >= n)
      p.error(at, gone + "[topology] " + (rank ? "stages = " : "optimizer_shards = ") + v(n) + " (indices 0.." + v(n - 1) + ")");
    else
      p.error(at, gone + "[topology] data_parallel = " + v(dp) + " (replicas 0.." + v(dp - 1) + ")");
  }
}

// [[faults]] of an RL run: kills of the decoupled actors (actors/rl/), which
// only rl.sync = "fixed_lag" / "latest" have, and lost weight syncs (drop) on
// generators.
void check_rl_faults(const Spec& s, Parser& p) {
  auto v = [](int64_t x) { return std::to_string(x); };
  const RlSection& r = s.rl_section;
  std::map<std::pair<std::string, int64_t>, size_t> seen;
  for (size_t i = 0; i < s.faults.size(); ++i) {
    if (!p.fault_ok(i)) continue;  // reported while parsing
    const FaultConfig& f = s.faults[i];
    if (!rl::decoupled(r.sync)) {
      p.error(p.fault_where(i, ""), "[[faults]] in an RL run need [rl] sync = \"fixed_lag\" or \"latest\" (generator and reward actors "
                                    "under a supervisor); the synchronous loop has no actors to kill");
      continue;
    }
    bool gen = false;
    int index = 0;
    if (is_trainer_fault_target(f.target)) {
      // The trainer's runtime actors (rl.trainer = "actors"): their existence
      // is the runtime's check (check_rl_trainer).
      if (!rl_trainer_on_actors(s))
        p.error(p.fault_where(i, "target"), "[[faults]] target = \"" + f.target + "\" is an actor of the trainer's "
                                            "runtime, which this run has only with [rl] trainer = \"actors\" (the "
                                            "trainer is one actor here)");
      else if (f.kind == runtime::FaultKind::stop)
        p.error(p.fault_where(i, "kind"), "[[faults]] kind = \"stop\" stops a whole process: its target must be "
                                          "\"process:P\" (to freeze one actor use kind = \"pause\")");
      else
        check_fault_parameters(f, p, i);
    } else if (runtime::is_rl_buffer_target(f.target)) {
      if (f.kind != runtime::FaultKind::kill)
        p.error(p.fault_where(i, "kind"), std::string("[[faults]] kind = \"") + runtime::fault_kind_name(f.kind) +
                                          "\" on rollout_buffer: the buffer takes kills only");
    } else if (int proc = 0; runtime::parse_process_target(f.target, proc)) {
      // A generator process lost: it SIGKILLs itself at its first job of
      // at_step or later; its generators restart on process 0.
      const int64_t n = s.topology.processes;
      if (f.kind != runtime::FaultKind::kill)
        p.error(p.fault_where(i, "kind"), std::string("[[faults]] kind = \"") + runtime::fault_kind_name(f.kind) +
                                          "\" on " + f.target + ": in an RL run a process takes \"kill\" (SIGKILL)");
      else if (f.at_message != 0)
        p.error(p.fault_where(i, "at_message"), "[[faults]] at_message applies to actor kills; a generator process is "
                                                "hit at its first job of at_step or later");
      else if (n < 2 || proc < 1 || proc >= n)
        p.error(p.fault_where(i, "target"), "[[faults]] target = \"" + f.target + "\": in an RL run only a generator "
                                            "process can be lost, process 1.." + v(n - 1) + " ([topology] processes = " +
                                            v(n) + ")");
      else if (s.topology.process_loss != runtime::ProcessLoss::recover)
        p.error(p.fault_where(i, "target"), "[[faults]] target = \"" + f.target + "\" with [topology] process_loss = "
                                            "\"fail\": the run would just stop; set process_loss = \"recover\"");
      if (f.at_step < 1 || f.at_step > s.run.steps)
        p.error(p.fault_where(i, "at_step"), "[[faults]] at_step = " + v(f.at_step) + " is out of range (allowed 1 .. [run] steps = " +
                                                v(s.run.steps) + ")");
      continue;
    } else if (!runtime::parse_rl_fault_target(f.target, gen, index)) {
      p.error(p.fault_where(i, "target"), "[[faults]] target = \"" + f.target + "\" is not an actor of an RL run: write "
                                          "\"generator:K\", \"reward:K\" (\"reward_model:K\" with rl.reward = \"model\") "
                                          "or \"rollout_buffer\"");
      continue;
    }
    if (is_trainer_fault_target(f.target)) {
      // checked above
    } else if (runtime::is_rl_buffer_target(f.target)) {
      if (f.kind == runtime::FaultKind::kill && f.at_message > runtime::kRlKillPoints)
        p.error(p.fault_where(i, "at_message"), "[[faults]] at_message = " + v(f.at_message) + " is out of range for " +
                                                f.target + ": 0 (a seeded point) or 1 (on receiving an admission), 2 "
                                                "(after storing it, before telling the coordinator) or 3 (after)");
    } else {
      const bool rm = r.reward == rl::RewardSource::model;
      const int64_t n = gen ? r.generators : r.reward_actors;
      if (!gen && f.target != runtime::rl_reward_actor_name(rm, index))
        p.error(p.fault_where(i, "target"), "[[faults]] target = \"" + f.target + "\": the reward actors of this run are " +
                                            (rm ? "reward_model:K (rl.reward = \"model\")" : "reward:K (the rule verifier)"));
      else if (index >= n)
        p.error(p.fault_where(i, "target"), "[[faults]] target = \"" + f.target + "\" does not exist: [rl] " +
                                            (gen ? "generators = " : "reward_actors = ") + v(n) + " (" +
                                            (gen ? "generator:0.." : runtime::rl_reward_actor_name(rm, 0) + "..") + v(n - 1) + ")");
      if (f.kind == runtime::FaultKind::drop && !gen)
        p.error(p.fault_where(i, "kind"), "[[faults]] kind = \"drop\" on " + f.target + ": drops act on weight syncs, "
                                          "which only generators receive; use \"kill\" on reward actors");
      else if (!runtime::rl_fault_kind(f.kind))
        p.error(p.fault_where(i, "kind"), std::string("[[faults]] kind = \"") + runtime::fault_kind_name(f.kind) +
                                          "\" is not supported on RL actors yet: use \"kill\", \"duplicate\", \"delay\", "
                                          "\"pause\" (or \"drop\": a generator loses its next `count` weight syncs)");
      else
        check_fault_parameters(f, p, i);
      if (f.kind == runtime::FaultKind::kill && f.at_message > runtime::kRlKillPoints)
        p.error(p.fault_where(i, "at_message"), "[[faults]] at_message = " + v(f.at_message) + " is out of range for " +
                                                f.target + ": 0 (a seeded point) or 1 (on receiving its job), 2 (after "
                                                "computing, before sending) or 3 (after sending)");
    }
    if (f.at_step < 1 || f.at_step > s.run.steps)
      p.error(p.fault_where(i, "at_step"), "[[faults]] at_step = " + v(f.at_step) + " is out of range (allowed 1 .. [run] steps = " +
                                              v(s.run.steps) + ")");
    const auto [it, fresh] = seen.emplace(std::make_pair(f.target, f.at_step), i);
    if (!fresh)
      p.error(p.fault_where(i, ""), "[[faults]] entry repeats the one at line " + std::to_string(p.fault_where(it->second, "").line) +
                                       " (target \"" + f.target + "\", at_step = " + v(f.at_step) +
                                       "): one actor takes at most one fault per step");
  }
}

// The runtime's schedule rules, from the schedule library itself (one source
// of truth): each replica runs `microbatches` chunks through `stages` ranks.
void check_schedule(const Spec& s, Parser& p) {
  const auto& t = s.topology;
  auto v = [](int64_t x) { return std::to_string(x); };
  const std::string sched_name(sched::to_string(t.schedule));
  sched::Layout layout;
  try {
    layout = sched::make_layout(t.schedule, static_cast<int>(t.stages), static_cast<int>(t.microbatches));
  } catch (const std::invalid_argument& e) {
    p.error(p.where("topology.microbatches"), "[topology] microbatches = " + v(t.microbatches) + " does not fit schedule = \"" +
                                                 sched_name + "\" with stages = " + v(t.stages) + ": " + e.what());
    return;
  }
  if (layout.num_stages > s.model.n_layers && t.stages <= s.model.n_layers)  // else the stages rule fired
    p.error(p.where("topology.stages"), "[topology] schedule = \"" + sched_name + "\" with stages = " + v(t.stages) + " cuts the model into " +
                                            v(layout.num_stages) + " stages, more than [model] n_layers = " + v(s.model.n_layers));
}

// The expert-parallel sim model: one EP rank per device, FLOPs over rates.
void check_ep_sim(const Spec& s, Parser& p) {
  const auto& t = s.topology;
  auto v = [](int64_t x) { return std::to_string(x); };
  const std::string why = " for the expert-parallel sim model ([topology] device_kind = \"sim\" with expert_shards = " + v(t.expert_shards) + ")";
  if (s.run.mode != RunMode::pretrain) p.error(p.where("run.mode"), "[run] mode must be \"pretrain\"" + why);
  if (s.model.ffn != model::Ffn::moe) return;  // expert_shards > 1 with a dense model is reported by the cross-field rules
  if (t.devices != t.expert_shards)
    p.error(p.where("topology.devices"), "[topology] devices = " + v(t.devices) + " must equal expert_shards = " + v(t.expert_shards) + why + " (one EP rank per device)");
  if (t.stages != 1 || t.data_parallel != 1)
    p.error(p.where(t.stages != 1 ? "topology.stages" : "topology.data_parallel"), "[topology] stages and data_parallel must be 1" + why);
  if (s.sim.model != sim::CostModel::flops)
    p.error(p.set_at("sim.cost_model") ? p.where("sim.cost_model") : p.where("topology.expert_shards"),
            "[sim] cost_model must be \"flops\"" + why + ": expert time is FLOPs over gflops");
  const int64_t slots = s.sim.ep_slots_per_device;
  if (slots > 0 && slots * t.devices < s.model.n_experts)
    p.error(p.where("sim.ep_slots_per_device"), "[sim] ep_slots_per_device = " + v(slots) + " gives " + v(slots * t.devices) +
                                                    " slots on " + v(t.devices) + " devices, fewer than [model] n_experts = " + v(s.model.n_experts));
  if (slots > s.model.n_experts)
    p.error(p.where("sim.ep_slots_per_device"), "[sim] ep_slots_per_device = " + v(slots) + " is more than [model] n_experts = " +
                                                    v(s.model.n_experts) + " (a device holds distinct experts)");
  if (s.experts.policy != runtime::ExpertPolicy::static_split || !s.elastic.empty())
    p.error(p.where(s.elastic.empty() ? "experts.policy" : "topology.expert_shards"),
            "[experts] and [[elastic]] drive the actor runtime's expert shards; the sim model places by [sim] ep_rebalance_every" + why);
}

// cost_model = "measured": one forward and backward time per stage of the
// schedule's layout (as `troupe calibrate` writes them), weights within them.
void check_measured_costs(const Spec& s, Parser& p) {
  const auto& c = s.sim;
  const auto& t = s.topology;
  int64_t stages = 0;
  try {
    stages = sched::make_layout(t.schedule, static_cast<int>(t.stages), static_cast<int>(t.microbatches)).num_stages;
  } catch (const std::invalid_argument&) {
    return;  // the topology rules report it
  }
  const std::string need = " must have one value per pipeline stage: " + std::to_string(stages) + " (schedule \"" +
                           std::string(sched::to_string(t.schedule)) + "\", stages = " + std::to_string(t.stages) + ")";
  auto count = [&](const char* key, const std::vector<double>& v, bool may_be_empty) {
    if ((v.empty() && may_be_empty) || static_cast<int64_t>(v.size()) == stages) return true;
    p.error(p.where(std::string("sim.") + key), std::string("[sim] ") + key + " has " + std::to_string(v.size()) +
                                                     " value(s); with cost_model = \"measured\" it" + need);
    return false;
  };
  count("stage_forward_ms", c.stage_forward_ms, false);
  const bool b_ok = count("stage_backward_ms", c.stage_backward_ms, false);
  if (!count("stage_weight_ms", c.stage_weight_ms, true) || !b_ok) return;
  for (size_t i = 0; i < c.stage_weight_ms.size(); ++i)
    if (c.stage_weight_ms[i] > c.stage_backward_ms[i]) {
      p.error(p.where("sim.stage_weight_ms"), "[sim] stage_weight_ms[" + std::to_string(i) + "] = " + num_text(c.stage_weight_ms[i]) +
                                                  " must be <= stage_backward_ms[" + std::to_string(i) + "] = " +
                                                  num_text(c.stage_backward_ms[i]) + " (W is part of the full backward)");
      return;
    }
}

// Sim devices: one simulated device per pipeline rank of each replica, and
// [sim] keys only where they mean something.
void check_sim(const Spec& s, Parser& p) {
  const auto& t = s.topology;
  auto v = [](int64_t x) { return std::to_string(x); };
  if (t.device_kind != DeviceKind::sim) {
    if (const Pos* at = p.first_set_in("sim"))
      p.error(*at, std::string("[sim] keys apply only to [topology] device_kind = \"sim\" (this spec has device_kind = \"") +
                       device_kind_name(t.device_kind) + "\")");
    return;
  }
  // A key of another cost model would be ignored: say so instead.
  const std::pair<const char*, sim::CostModel> model_keys[] = {
      {"forward_ms", sim::CostModel::fixed},        {"backward_ms", sim::CostModel::fixed},
      {"weight_ms", sim::CostModel::fixed},         {"gflops", sim::CostModel::flops},
      {"gbps", sim::CostModel::flops},              {"stage_forward_ms", sim::CostModel::measured},
      {"stage_backward_ms", sim::CostModel::measured}, {"stage_weight_ms", sim::CostModel::measured}};
  for (const auto& [key, model] : model_keys) {
    if (model == s.sim.model) continue;
    if (const Pos* at = p.set_at(std::string("sim.") + key))
      p.error(*at, std::string("[sim] ") + key + " applies only to cost_model = \"" + sim::cost_model_name(model) +
                       "\" (this spec has cost_model = \"" + sim::cost_model_name(s.sim.model) + "\")");
  }
  if (s.sim.model == sim::CostModel::measured) check_measured_costs(s, p);
  if (s.sim.weight_ms > s.sim.backward_ms)
    p.error(p.where("sim.weight_ms"), "[sim] weight_ms = " + num_text(s.sim.weight_ms) +
                                          " must be <= backward_ms = " + num_text(s.sim.backward_ms) +
                                          " (W is the weight-gradient part of the full backward)");
  if (is_ep_sim(s)) {
    check_ep_sim(s, p);
    return;
  }
  if (const Pos* at = p.first_set_with_prefix("sim.ep_"))
    p.error(*at, "[sim] ep_* keys apply only to the expert-parallel sim model ([topology] expert_shards > 1)");
  // RL on sim devices splits the devices into generators and trainers itself.
  if (s.run.mode == RunMode::pretrain && t.devices > t.stages * t.data_parallel)
    p.error(p.where("topology.devices"), "[topology] devices = " + v(t.devices) + " must equal stages * data_parallel = " +
                                             v(t.stages * t.data_parallel) +
                                             " with device_kind = \"sim\" (one simulated device per pipeline rank)");
}

// Rules that involve more than one key. Each message names the keys and values.
void check_cross_fields(const Spec& s, Parser& p) {
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
  if (t.stages > m.n_layers)
    p.error(p.where("topology.stages"), "[topology] stages = " + v(t.stages) + " must be <= [model] n_layers = " + v(m.n_layers));
  if ((t.schedule == sched::Kind::dualpipe || t.schedule == sched::Kind::dualpipev) && t.stages % 2 != 0)
    p.error(p.where("topology.schedule"), "[topology] schedule = \"" + std::string(sched::to_string(t.schedule)) + "\" needs an even number of stages, got stages = " + v(t.stages));
  else if (uses_runtime(s))
    check_schedule(s, p);
  const int64_t per_step = t.microbatches * t.data_parallel;
  if (s.data.batch_size % per_step != 0)
    p.error(p.where("data.batch_size"), "[data] batch_size = " + v(s.data.batch_size) +
                                          " must be divisible by [topology] microbatches * data_parallel = " + v(per_step));
  if (m.ffn == model::Ffn::moe && t.expert_shards > m.n_experts)
    p.error(p.where("topology.expert_shards"), "[topology] expert_shards = " + v(t.expert_shards) + " must be <= [model] n_experts = " + v(m.n_experts));
  if (m.ffn == model::Ffn::dense && t.expert_shards > 1)
    p.error(p.where("topology.expert_shards"), "[topology] expert_shards = " + v(t.expert_shards) + " needs [model] ffn = \"moe\"");
  if (t.processes > t.devices)
    p.error(p.where("topology.processes"), "[topology] processes = " + v(t.processes) + " must be <= devices = " + v(t.devices));
  else if (!t.device_processes.empty()) {
    try {
      device_process_list(s);
    } catch (const std::invalid_argument& e) {
      p.error(p.where("topology.device_processes"), "[topology] device_processes = \"" + t.device_processes + "\": " + e.what());
    }
  }
  if (!t.auth_dir.empty() && t.auth == runtime::ClusterAuth::none)
    p.error(p.where("topology.auth_dir"), "[topology] auth_dir is the key of auth = \"tls\", but auth = \"none\"");
  if (t.stages * t.data_parallel > t.devices)
    p.error(p.where("topology.devices"), "[topology] devices = " + v(t.devices) + " is fewer than stages * data_parallel = " + v(t.stages * t.data_parallel));
  if (uses_runtime(s) && t.optimizer_shards > 1) {
    int64_t params = 0;
    try {
      params = model::build_param_layout(m).total();
    } catch (const std::exception&) {
      params = 0;  // the model's own problems are reported above
    }
    if (params > 0 && t.optimizer_shards > params)
      p.error(p.where("topology.optimizer_shards"), "[topology] optimizer_shards = " + v(t.optimizer_shards) +
                                                        " is more than the model's " + v(params) + " parameters");
  }
  check_sim(s, p);
  if (s.data.source == model::DataKind::text && s.data.path.empty())
    p.error(p.where("data.source"), "[data] source = \"text\" needs [data] path (the text file to train on)");
  if (s.data.source == model::DataKind::text && m.vocab_size < 256)
    p.error(p.where("model.vocab_size"), "[model] vocab_size = " + v(m.vocab_size) + " is too small for byte-level text (needs 256)");
  if (s.data.source != model::DataKind::text && !s.data.path.empty())
    p.error(p.where("data.path"), "[data] path is only used with source = \"text\"");
  if (s.data.width != 0 && s.data.source != model::DataKind::addition)
    p.error(p.where("data.width"), "[data] width = " + v(s.data.width) + " needs source = \"addition\" (the padded format), got source = \"" + model::data_kind_name(s.data.source) + "\"");
  else if (s.data.width != 0 && s.data.width < s.data.digits)
    p.error(p.where("data.width"), "[data] width = " + v(s.data.width) + " must be >= digits = " + v(s.data.digits) + " (or 0, meaning digits)");
  if (!s.data.target_pairs.empty()) {
    if (s.data.source == model::DataKind::text) {
      p.error(p.where("data.target_pairs"), "[data] target_pairs needs source = \"addition\" or \"addition_plain\", got source = \"text\"");
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

// The decoupled RL actors run on [topology] devices (generators may sit on
// other processes); every other topology degree stays at 1.
bool rl_topology_ok(const Spec& s) {
  const auto& t = s.topology;
  return t.stages == 1 && t.schedule == sched::Kind::sequential && t.optimizer_shards == 1 && t.data_parallel == 1 &&
         t.expert_shards == 1;
}

// Decoupled RL on [topology] processes = N > 1: the trainer's devices are on
// process 0 and every other process holds at least one generator.
void check_rl_processes(const Spec& s, Parser& p) {
  const int64_t n = s.topology.processes;
  if (n <= 1 || s.topology.processes > s.topology.devices) return;  // the latter is reported on its key
  auto v = [](int64_t x) { return std::to_string(x); };
  if (s.topology.device_kind == DeviceKind::sim) return;
  std::vector<int> dp;
  try {
    dp = device_processes(s);
  } catch (const std::exception&) {
    return;  // a bad device_processes: reported on its key
  }
  const int trainer = rl_trainer_devices(s);
  for (int d = 0; d < trainer && d < static_cast<int>(dp.size()); ++d)
    if (dp[static_cast<size_t>(d)] != 0) {
      p.error(p.where("topology.processes"), "[topology] processes = " + v(n) + ": the RL trainer's device " + v(d) +
                                                 " would be on process " + v(dp[static_cast<size_t>(d)]) + "; the trainer " +
                                                 "runs on process 0 (its devices 0.." + v(trainer - 1) +
                                                 "), generators on the others: add devices or set device_processes");
      return;
    }
  // A version crosses as one envelope, and envelopes are bounded
  // (DecodeLimits::max_message_bytes): a larger model could never sync.
  int64_t params = 0;
  try {
    params = model::build_param_layout(s.model).total();
  } catch (const std::exception&) {
  }
  const uint64_t limit = runtime::kRlMaxMessageBytes;
  if (static_cast<uint64_t>(params) * sizeof(float) + (1u << 20) > limit) {
    p.error(p.where("topology.processes"), "[topology] processes = " + v(n) + ": the model's " + v(params) +
                                               " parameters (" + v(params * 4 / (1 << 20)) + " MiB per version) exceed " +
                                               "the " + v(static_cast<int64_t>(limit >> 20)) + " MiB a message may carry, so "
                                               "no weight sync could reach a generator on another process");
    return;
  }
  const std::vector<int> gp = rl_generator_processes(s);
  for (int64_t q = 1; q < n; ++q)
    if (std::find(gp.begin(), gp.end(), static_cast<int>(q)) == gp.end()) {
      p.error(p.where("topology.processes"), "[topology] processes = " + v(n) + ": process " + v(q) + " would hold no " +
                                                 "generator (rl.generators = " + v(s.rl_section.generators) + " on devices " +
                                                 v(trainer) + ".." + v(s.topology.devices - 1) + "); in decoupled RL the " +
                                                 "processes after 0 hold generators only");
      return;
    }
}

// rl.trainer = "actors": decoupled RL whose policy update runs on the
// [topology]'s pipeline ranks, expert and optimizer shards; the runtime's own
// rules (micro-batches against the RL batch, schedule, shards) say what fits.
void check_rl_trainer(const Spec& s, Parser& p) {
  const RlSection& r = s.rl_section;
  auto v = [](int64_t x) { return std::to_string(x); };
  if (!rl::decoupled(s.rl.sync)) {
    p.error(p.where("rl.trainer"), "[rl] trainer = \"actors\" trains the policy on the actor runtime beside generator and "
                                   "reward actors: it needs sync = \"fixed_lag\" or \"latest\"");
    return;
  }
  const int trainer = rl_trainer_devices(s);
  if (trainer > s.topology.devices)
    p.error(p.where(r.trainer_devices > 0 ? "rl.trainer_devices" : "topology.devices"),
            "[rl] trainer = \"actors\" puts the trainer on " + v(trainer) + " device(s) (" +
                (r.trainer_devices > 0 ? std::string("trainer_devices") : std::string("stages x data_parallel")) +
                ") but [topology] devices = " + v(s.topology.devices));
  const int64_t rows = r.prompts_per_step * r.group_size, mbs = s.topology.microbatches * s.topology.data_parallel;
  if (rows % mbs != 0) {
    p.error(p.where("topology.microbatches"), "[rl] trainer = \"actors\": the RL batch of " + v(rows) +
                                                  " rows (prompts_per_step x group_size) must split into [topology] "
                                                  "microbatches x data_parallel = " + v(mbs) + " equal micro-batches");
    return;
  }
  // The trainer's actors a [[faults]] entry names must exist in its plan.
  std::optional<runtime::Plan> plan;
  try {
    plan = runtime::make_plan(rl_trainer_runtime(s));
  } catch (const std::exception&) {  // a bad topology: reported on its own keys
    return;
  }
  for (size_t i = 0; i < s.faults.size(); ++i) {
    const auto t = runtime::parse_fault_target(s.faults[i].target);
    if (t && p.fault_ok(i) && !plan->target(*t))
      p.error(p.fault_where(i, "target"), "[[faults]] target = \"" + s.faults[i].target + "\" is not an actor of the "
                                          "trainer's runtime (stage:0.." + v(plan->sl.num_ranks - 1) + ", optimizer:0.." +
                                          v(plan->num_shards() - 1) +
                                          (plan->expert_parallel() ? ", expert:L/0.." + v(plan->expert_shards - 1) : std::string()) +
                                          "; `troupe validate` lists them)");
  }
}

// [rl] becomes rl::RlConfig once, here: the loss's preset, then every key the
// spec sets. Its own rules come from rl::check_config; the rules that involve
// other sections follow.
void convert_rl(Spec& s, Parser& p) {
  const RlSection& r = s.rl_section;
  auto v = [](int64_t x) { return std::to_string(x); };
  rl::RlConfig c = rl::rl_preset(rl::parse_loss_kind(r.loss), r.max_new_tokens);
  c.init = r.init;
  c.task = r.task;
  c.prompts_per_step = r.prompts_per_step;
  c.group_size = r.group_size;
  c.max_new_tokens = r.max_new_tokens;
  c.temperature = r.temperature;
  c.top_p = r.top_p;
  c.updates_per_batch = r.updates_per_batch;
  if (r.clip_low >= 0) c.policy.clip_low = r.clip_low;
  if (r.clip_high >= 0) c.policy.clip_high = r.clip_high;
  if (r.behaviour_weight_cap >= 0) c.policy.behaviour_weight_cap = r.behaviour_weight_cap;
  c.policy.kl_coef = r.kl_coef;
  if (r.advantage_std != "auto") c.advantage.scale_by_std = r.advantage_std == "on";
  if (r.dynamic_sampling != "auto") c.advantage.drop_zero_variance = r.dynamic_sampling == "on";
  c.verifier.partial_credit = r.partial_credit;
  c.verifier.format_penalty = r.format_penalty;
  c.sync = r.sync;
  c.max_staleness = r.max_staleness;
  c.generators = r.generators;
  c.reward_actors = r.reward_actors;
  c.sync_deadline_ms = r.sync_deadline_ms;
  c.recompute_kv = r.recompute_kv;
  c.rm_prompts = r.rm_prompts;
  c.rm_batch = r.rm_batch;
  c.rm_loss = r.rm_loss;
  c.reward = r.reward;
  c.reward_model = r.reward_model;
  s.rl = c;
  if (s.run.mode == RunMode::pretrain) {
    // Phase 1 of a two-phase file alone (--set run.mode="pretrain"): its [rl]
    // section is phase 2's and is ignored.
    if (p.file_mode == RunMode::sft_rl) return;
    if (const Pos* at = p.first_set_in("rl"))
      p.error(*at, std::string("[rl] keys apply only to [run] mode = \"rl\", \"reward_model\" or \"sft_rl\" (this spec has mode = \"") + run_mode_name(s.run.mode) + "\")");
    return;
  }
  if (s.run.mode != RunMode::reward_model)
    if (const Pos* at = p.set_at("rl.rm_loss"))
      p.error(*at, std::string("[rl] rm_loss applies to [run] mode = \"reward_model\" (it is how a reward model trains; "
                               "this spec has mode = \"") + run_mode_name(s.run.mode) + "\")");
  if (s.run.mode == RunMode::reward_model) {
    // One process, one device: the RM trainer (rl/rm_trainer.hpp).
    if (c.sync != rl::SyncMode::synchronous)
      p.error(p.where("rl.sync"), "[rl] sync = \"" + std::string(rl::sync_mode_name(c.sync)) + "\": run.mode = \"reward_model\" "
                                  "trains in one process without actors; leave sync = \"synchronous\"");
    if (s.topology.device_kind == DeviceKind::sim)
      p.error(p.where("topology.device_kind"), "[topology] device_kind = \"sim\": run.mode = \"reward_model\" trains a real "
                                               "model (use \"host\" or \"opencl\")");
    else if (uses_runtime(s))
      p.error(p.where("run.mode"), "[run] mode = \"reward_model\" trains on one device in one process; set [topology] devices = 1, "
                                   "stages = 1, schedule = \"sequential\", expert_shards = 1, optimizer_shards = 1, data_parallel = 1");
    if (c.reward == rl::RewardSource::model)
      p.error(p.where("rl.reward"), "[rl] reward = \"model\" applies to run.mode = \"rl\"; a reward-model run trains on the "
                                    "rule verifier's labels");
    if (s.model.vocab_size < 17)
      p.error(p.where("model.vocab_size"), "[model] vocab_size = " + v(s.model.vocab_size) + ": the reward model reads its "
                                           "score from the last three token ids (marker, yes, no), which must lie above the "
                                           "addition task's 14 tokens; use vocab_size >= 17");
  }
  for (const rl::ConfigProblem& prob : rl::check_config(c))
    p.error(p.where("rl." + prob.key), "[rl] " + prob.key + ": " + prob.message);
  if (s.run.mode == RunMode::reward_model) {
    // placement checked above
  } else if (s.topology.device_kind == DeviceKind::sim) {
    // The synchronous-vs-decoupled timing model (actors/sim/rl_sim.hpp); no math.
    if (s.topology.devices < 2)
      p.error(p.where("topology.devices"), "[run] mode = \"rl\" on sim devices compares synchronous and decoupled RL, "
                                           "which splits the devices: devices must be >= 2");
    // The timing model runs in process 0 alone: processes after 0 would wait
    // for generators that are never placed (mpirun would hang).
    if (s.topology.processes > 1)
      p.error(p.where("topology.processes"), "[topology] processes = " + v(s.topology.processes) + ": [run] mode = \"rl\" "
                                             "on sim devices simulates every device in one process; set processes = 1");
  } else if (r.trainer == "actors") {
    check_rl_trainer(s, p);
    check_rl_processes(s, p);
  } else if (rl::decoupled(c.sync) && rl_topology_ok(s)) {
    check_rl_processes(s, p);
  } else if (rl::decoupled(c.sync))
    p.error(p.where("run.mode"), "[run] mode = \"rl\" with sync = \"" + std::string(rl::sync_mode_name(c.sync)) + "\" runs its actors on [topology] "
                                 "devices (the trainer on device 0, generators on the others); set stages = 1, schedule = "
                                 "\"sequential\", expert_shards = 1, optimizer_shards = 1, data_parallel = 1 "
                                 "(this spec has stages = " + v(s.topology.stages) + ", schedule = \"" +
                                 std::string(sched::to_string(s.topology.schedule)) + "\")");
  else if (!rl::decoupled(c.sync) && uses_runtime(s))
    p.error(p.where("run.mode"), "[run] mode = \"rl\" with sync = \"synchronous\" runs the RL loop on one device in one process "
                                 "(rl.sync = \"fixed_lag\" or \"latest\" runs generator and reward actors); set [topology] devices = 1, "
                                 "stages = 1, schedule = \"sequential\", expert_shards = 1, optimizer_shards = 1, "
                                 "data_parallel = 1 (this spec has devices = " + v(s.topology.devices) + ", stages = " +
                                 v(s.topology.stages) + ", schedule = \"" + std::string(sched::to_string(s.topology.schedule)) + "\")");
  if (s.data.source != model::DataKind::addition && s.data.source != model::DataKind::addition_plain)
    p.error(p.where("data.source"), "[rl] task = \"" + r.task + "\" draws its problems from [data] source = \"addition\" or "
                                    "\"addition_plain\" (this spec has \"" + model::data_kind_name(s.data.source) + "\")");
}

// [rl] against the task and the init checkpoint: prompts and completions fit
// the context, answers fit max_new_tokens, and init holds this spec's model.
// A missing or damaged init is left to `run` / `validate`, which report it as
// a bad input file (exit 4) naming the file.
void check_rl_inputs(const Spec& s, Parser& p) {
  if (s.run.mode == RunMode::pretrain) return;
  const RlSection& r = s.rl_section;
  auto v = [](int64_t x) { return std::to_string(x); };
  try {
    const auto task = rl::make_addition_task(s.data, static_cast<uint64_t>(s.run.seed), s.rl.verifier);
    const rl::Prompt probe = task->train_prompt(0);
    const int64_t prompt = static_cast<int64_t>(probe.tokens.size()), answer = static_cast<int64_t>(probe.answer.size());
    if (prompt + r.max_new_tokens > s.model.seq_len)
      p.error(p.where("rl.max_new_tokens"), "[rl] max_new_tokens = " + v(r.max_new_tokens) + " does not fit: the task's prompts are " +
                                                v(prompt) + " tokens and [model] seq_len = " + v(s.model.seq_len) +
                                                " (at most " + v(s.model.seq_len - prompt) + " new tokens)");
    else if (r.max_new_tokens < answer)
      p.error(p.where("rl.max_new_tokens"), "[rl] max_new_tokens = " + v(r.max_new_tokens) + " is shorter than the task's answers (" +
                                                v(answer) + " tokens with the EOS): no completion could be right");
  } catch (const std::exception& e) {
    p.error(p.where("rl.task"), "[rl] task: " + std::string(e.what()));
  }
  if (!r.reward_model.empty()) {
    try {
      const model::TrainingState st = model::load_checkpoint(r.reward_model);
      const std::string diff = model::config_difference(s.model, st.config);
      if (!diff.empty())
        p.error(p.where("rl.reward_model"), "[rl] reward_model = \"" + r.reward_model + "\": the checkpoint's model differs from [model] (" +
                                                diff + "; [model] first, the checkpoint second)");
    } catch (const model::CheckpointError&) {
      // reported by run/validate as a bad input file
    }
  }
  if (r.init.empty()) return;
  try {
    const model::TrainingState st = model::load_checkpoint(r.init);
    const std::string diff = model::config_difference(s.model, st.config);
    if (!diff.empty())
      p.error(p.where("rl.init"), "[rl] init = \"" + r.init + "\": the checkpoint's model differs from [model] (" + diff +
                                      "; [model] first, the checkpoint second)");
  } catch (const model::CheckpointError&) {
    // reported by run/validate as a bad input file
  }
}

// The checkpoint directory is checked before anything runs: a save into a
// regular file, or into a non-empty directory that is not a checkpoint (which
// save_checkpoint never replaces), would fail only at the end of the run.
void check_checkpoint_dir(const Spec& s, Parser& p) {
  if (s.topology.device_kind == DeviceKind::sim) return;  // a sim run saves nothing
  namespace fs = std::filesystem;
  const std::string dir = s.checkpoint_dir();
  const char* key = s.checkpoint.dir.empty() ? "run.out_dir" : "checkpoint.dir";
  std::error_code ec;
  const auto st = fs::status(dir, ec);
  if (ec || !fs::exists(st)) return;  // created by the first save
  if (!fs::is_directory(st)) {
    p.error(p.where(key), "checkpoint directory " + dir + " exists and is not a directory; the run's checkpoint "
                          "could not be saved there (set [checkpoint] dir to a new or checkpoint directory)");
    return;
  }
  if (!fs::is_empty(dir, ec) && !ec && !model::checkpoint_exists(dir))
    p.error(p.where(key), "checkpoint directory " + dir + " is a non-empty directory that holds no checkpoint; the "
                          "run would not overwrite it and would lose its final save (set [checkpoint] dir elsewhere)");
}

void check_supported(Spec& s, Parser& p) {
  for (const auto& def : spec_keys()) {
    if (!def.unsupported) continue;
    if (std::string why = def.unsupported(s); !why.empty())
      p.error(p.where(def.path()), def.label() + " = " + key_value_text(def, s) + ": " + why);
  }
}

// The data source must be buildable (file present, long enough, sequences fit)
// and its tokens must fit the model's vocabulary.
void check_data(const Spec& s, Parser& p) {
  const std::string key = s.data.source == model::DataKind::text ? "data.path" : "data.source";
  try {
    const auto source = model::make_data_source(s.data, static_cast<uint64_t>(s.run.seed), s.model.seq_len);
    if (source->vocab_size() > s.model.vocab_size)
      p.error(p.where("model.vocab_size"), "[model] vocab_size = " + std::to_string(s.model.vocab_size) +
                                               " is smaller than the data's vocabulary (" +
                                               std::to_string(source->vocab_size()) + " tokens, " +
                                               source->describe() + ")");
  } catch (const std::exception& e) {
    p.error(p.where(key), "[data] " + std::string(e.what()));
  }
}

// [chaos] in an RL run: decoupled (the synchronous loop has no actors) and
// only the roles and kinds its actors take.
void check_rl_chaos(const Spec& s, Parser& p, const Pos& at) {
  if (!rl::decoupled(s.rl_section.sync)) {  // [rl] as written: convert_rl runs after the checks
    p.error(at, "[chaos] needs supervised actors: this RL run is the synchronous loop in one process (rl.sync = "
                "\"synchronous\"); use rl.sync = \"fixed_lag\" or \"latest\" for generator and reward actors");
    return;
  }
  const runtime::ChaosOptions c = chaos_options(s);
  for (runtime::Role r : c.roles)
    if (r != runtime::Role::Generator && r != runtime::Role::Reward)
      p.error(p.where("chaos.roles"), std::string("[chaos] roles names \"") + runtime::role_name(r) +
                                          "\", which an RL run has no actors of (its roles: generator, reward)");
  bool drops_only = !c.kinds.empty();
  for (runtime::FaultKind k : c.kinds) {
    drops_only = drops_only && k == runtime::FaultKind::drop;
    if (!runtime::rl_fault_kind(k))
      p.error(p.where("chaos.kinds"), std::string("[chaos] kinds names \"") + runtime::fault_kind_name(k) +
                                          "\", which RL actors do not take yet (kill, drop, duplicate, delay, pause)");
  }
  if (drops_only && c.roles.size() == 1 && c.roles[0] == runtime::Role::Reward)
    p.error(p.where("chaos.kinds"), "[chaos] kinds = \"drop\" with roles = \"reward\": drops act on weight syncs, "
                                    "which only generators receive");
}

// [chaos]: the kinds and roles are known, the run can take faults, and
// every role named has actors in this topology.
void check_chaos(const Spec& s, Parser& p) {
  const ChaosConfig& c = s.chaos;
  std::string why;
  try {
    (void)chaos_options(s);
  } catch (const std::invalid_argument& e) {
    why = e.what();
  }
  if (!why.empty()) {
    p.error(p.where(why.rfind("roles", 0) == 0 ? "chaos.roles" : "chaos.kinds"), "[chaos] " + why);
    return;
  }
  if (c.mean_steps_between_faults <= 0) return;
  const Pos at = p.where("chaos.mean_steps_between_faults");
  if (s.topology.device_kind == DeviceKind::sim) {
    p.error(at, "[chaos] needs real devices: sim devices ([topology] device_kind = \"sim\") run no supervised actors");
    return;
  }
  if (s.run.mode == RunMode::rl) {
    check_rl_chaos(s, p, at);
    return;
  }
  if (!uses_runtime(s)) {
    p.error(at, "[chaos] needs the actor runtime (supervised actors); this single-device sequential spec runs in the "
                "single-process trainer (use e.g. [topology] schedule = \"1f1b\")");
    return;
  }
  if (s.topology.processes > 1) {
    p.error(at, "[chaos] runs in one process only for now, like [[faults]] ([topology] processes = " +
                    std::to_string(s.topology.processes) + ")");
    return;
  }
  std::optional<runtime::Plan> plan;
  try {
    plan = resolve_topology(s);
  } catch (const std::exception&) {
    return;  // the topology itself is reported on its keys
  }
  for (runtime::Role r : chaos_options(s).roles) {
    if (r == runtime::Role::Expert && !s.elastic.empty()) {
      p.error(p.where("chaos.roles"), "[chaos] roles names \"expert\", but [[elastic]] scale events change the expert "
                                      "shards during the run; the nemesis cannot aim at them yet (leave \"expert\" out)");
      continue;
    }
    bool any = false;
    for (const auto& a : plan->actors) any = any || a.role == r;
    if (!any)
      p.error(p.where("chaos.roles"), std::string("[chaos] roles names \"") + runtime::role_name(r) +
                                          "\", which this topology has no actors of" +
                                          (r == runtime::Role::Expert ? " (expert-shard actors need [model] ffn = \"moe\" and [topology] expert_shards > 1)" : ""));
  }
}

// rl.steps, rl.eval_every, rl.lr, rl.warmup_steps are phase 2's values in a
// two-phase spec; a one-phase RL run reads [run] and [optim] for them.
void check_phase_keys(const Spec& s, Parser& p) {
  if (s.run.mode == RunMode::pretrain) return;  // every [rl] key is reported there
  // A two-phase file run as one RL run (--set run.mode="rl") reads [run] and
  // [optim] like any RL run; its phase-2 values are left unused.
  if (p.file_mode == RunMode::sft_rl) return;
  for (const char* key : {"steps", "eval_every", "lr", "warmup_steps"})
    if (const Pos* at = p.set_at(std::string("rl.") + key))
      p.error(*at, std::string("[rl] ") + key + " is phase 2's value in run.mode = \"sft_rl\"; this run has mode = \"" +
                       run_mode_name(s.run.mode) + "\" and reads " + (key[0] == 's' || key[0] == 'e' ? "[run] " : "[optim] ") +
                       key + " instead");
}

// run.mode = "sft_rl": each phase's derived spec (launch/phases.hpp) passes
// the checks its own mode would get, and what the pair cannot do yet is said.
void check_sft_rl(Spec& s, Parser& p) {
  const std::string why = " in run.mode = \"sft_rl\"";
  if (s.topology.device_kind == DeviceKind::sim)
    p.error(p.where("topology.device_kind"), "[topology] device_kind = \"sim\"" + why + ": the two-phase job trains a real "
                                             "model (use \"host\" or \"opencl\")");
  if (s.topology.processes > 1)
    p.error(p.where("topology.processes"), "[topology] processes = " + std::to_string(s.topology.processes) + why +
                                               ": the two-phase job runs in one process (run the phases as separate runs)");
  if (!s.faults.empty())
    p.error(p.fault_where(0, ""), "[[faults]]" + why + ": not built for the two-phase job yet (run phase 1 with --set "
                                  "run.mode='\"pretrain\"', or phase 2 as its own run.mode = \"rl\" spec)");
  if (s.chaos.mean_steps_between_faults > 0)
    p.error(p.where("chaos.mean_steps_between_faults"), "[chaos]" + why + ": not built for the two-phase job yet");
  if (!s.elastic.empty())
    p.error(p.elastic_where(0, ""), "[[elastic]]" + why + ": not built for the two-phase job yet");
  if (!s.rl_section.init.empty())
    p.error(p.where("rl.init"), "[rl] init" + why + ": phase 2 starts from phase 1's checkpoint (" + sft_checkpoint_dir(s) +
                                    "); leave init out");
  if (s.rl_section.reward == rl::RewardSource::model)
    p.error(p.where("rl.reward"), "[rl] reward = \"model\"" + why + ": not built for the two-phase job yet (phase 2 uses "
                                  "the rule verifier)");
  const size_t before = p.diagnostics().size();
  Spec sft = sft_phase_spec(s);
  check_cross_fields(sft, p);
  check_supported(sft, p);
  check_checkpoint_dir(sft, p);
  Spec rl_spec = rl_phase_spec(s, "");  // phase 1's checkpoint does not exist yet
  check_cross_fields(rl_spec, p);
  check_supported(rl_spec, p);
  convert_rl(rl_spec, p);
  check_checkpoint_dir(rl_spec, p);
  s.rl = rl_spec.rl;
  if (p.diagnostics().size() == before) {
    check_data(sft, p);
    if (p.diagnostics().size() == before) check_rl_inputs(rl_spec, p);
  }
}

Spec load(const std::string* text, const std::string& source, const std::vector<Override>& overrides,
          const std::filesystem::path& base_dir) {
  Spec spec;
  spec.source = source;
  Parser parser(spec);
  if (text) parser.parse_document(*text, source);
  parser.file_mode = spec.run.mode;
  for (const auto& o : overrides) parser.apply_override(o);
  // A relative data path is relative to the spec file, so specs can be run from anywhere.
  if (!spec.data.path.empty() && std::filesystem::path(spec.data.path).is_relative() && !base_dir.empty())
    spec.data.path = (base_dir / spec.data.path).lexically_normal().string();
  if (spec.run.mode == RunMode::sft_rl) {
    check_sft_rl(spec, parser);
  } else {
    const size_t problems_before_data = parser.diagnostics().size();
    check_cross_fields(spec, parser);
    check_faults(spec, parser);
    check_chaos(spec, parser);
    check_elastic(spec, parser);
    check_supported(spec, parser);
    convert_rl(spec, parser);
    check_phase_keys(spec, parser);
    check_checkpoint_dir(spec, parser);
    if (parser.diagnostics().size() == problems_before_data) {
      check_data(spec, parser);
      if (parser.diagnostics().size() == problems_before_data) check_rl_inputs(spec, parser);
    }
  }
  auto& ds = parser.diagnostics();
  // The two phases of an sft_rl spec are checked alike: report a problem once.
  std::set<std::tuple<std::string, int, int, std::string>> seen;
  ds.erase(std::remove_if(ds.begin(), ds.end(),
                          [&](const Diagnostic& d) { return !seen.insert({d.file, d.line, d.column, d.message}).second; }),
           ds.end());
  // toml++ iterates keys alphabetically; report in file order, overrides last.
  auto order = [&](const Diagnostic& d) { return std::make_tuple(d.file != source, d.line, d.column); };
  std::stable_sort(ds.begin(), ds.end(), [&](const Diagnostic& a, const Diagnostic& b) { return order(a) < order(b); });
  if (!ds.empty()) throw SpecError(ds);
  return spec;
}

}  // namespace

Spec load_spec_text(const std::string& text, const std::string& source_name,
                    const std::vector<Override>& overrides) {
  return load(&text, source_name, overrides, {});
}

// A spec is a small regular file: a directory would read as empty (and train
// on the defaults), a FIFO would block the open, a huge file is a mistake.
constexpr std::uintmax_t kMaxSpecBytes = 1 << 20;

Spec load_spec_file(const std::string& path, const std::vector<Override>& overrides) {
  std::error_code ec;
  const auto st = std::filesystem::status(path, ec);
  if (!ec && std::filesystem::exists(st)) {
    if (std::filesystem::is_directory(st))
      throw SpecError({{path, 0, 0, "is a directory, not a spec file (give the path of a .toml file)"}});
    if (!std::filesystem::is_regular_file(st))
      throw SpecError({{path, 0, 0, "is not a regular file (a FIFO, device or socket); give the path of a .toml file"}});
    const auto bytes = std::filesystem::file_size(path, ec);
    if (!ec && bytes > kMaxSpecBytes)
      throw SpecError({{path, 0, 0, "is " + std::to_string(bytes) + " bytes; a spec file is at most " +
                                        std::to_string(kMaxSpecBytes) + " bytes"}});
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw SpecError({{path, 0, 0, "cannot open spec file: " + std::string(std::strerror(errno))}});
  std::ostringstream ss;
  ss << in.rdbuf();
  const auto base = std::filesystem::path(path).parent_path();
  const std::string text = ss.str();
  return load(&text, path, overrides, base.empty() ? std::filesystem::path(".") : base);
}

const std::string& default_spec_text() {
  static const std::string text = kDefaultSpecText;
  return text;
}

Spec load_default_spec(const std::vector<Override>& overrides) {
  return load_spec_text(default_spec_text(), "<built-in default>", overrides);
}

std::vector<int> device_process_list(const Spec& spec) {
  const auto& t = spec.topology;
  std::vector<int> out;
  if (t.device_processes.empty()) return out;
  std::string item;
  std::istringstream in(t.device_processes);
  while (std::getline(in, item, ',')) {
    const auto b = item.find_first_not_of(' '), e = item.find_last_not_of(' ');
    const std::string x = b == std::string::npos ? "" : item.substr(b, e - b + 1);
    if (x.empty() || x.size() > 9 || x.find_first_not_of("0123456789") != std::string::npos)
      throw std::invalid_argument("expected comma-separated process numbers, one per device, got '" + x + "'");
    const int p = std::stoi(x);
    if (p >= t.processes)
      throw std::invalid_argument("process " + x + " is out of range for processes = " + std::to_string(t.processes));
    out.push_back(p);
  }
  if (static_cast<int64_t>(out.size()) != t.devices)
    throw std::invalid_argument("lists " + std::to_string(out.size()) + " device(s), devices = " + std::to_string(t.devices));
  for (int64_t p = 0; p < t.processes; ++p)
    if (std::find(out.begin(), out.end(), static_cast<int>(p)) == out.end())
      throw std::invalid_argument("process " + std::to_string(p) + " gets no device");
  return out;
}

bool is_ep_sim(const Spec& spec) {
  return spec.topology.device_kind == DeviceKind::sim && spec.topology.expert_shards > 1;
}

bool uses_runtime(const Spec& spec) {
  const auto& t = spec.topology;
  return t.devices > 1 || t.stages > 1 || t.schedule != sched::Kind::sequential || t.optimizer_shards > 1 || t.data_parallel > 1 ||
         t.expert_shards > 1;
}

std::vector<std::string> spec_key_paths() {
  std::vector<std::string> out;
  for (const auto& d : spec_keys()) out.push_back(d.path());
  return out;
}

std::string spec_keys_markdown() {
  Spec defaults;
  std::ostringstream os;
  os << "| key | type | default | meaning |\n|---|---|---|---|\n";
  for (const auto& d : spec_keys()) {
    std::string meaning = d.doc;
    if ((d.type == KeyType::Int || d.type == KeyType::Float || d.type == KeyType::FloatList) &&
        (std::isfinite(d.min) || std::isfinite(d.max)))
      meaning += " Range " + num_text(d.min) + " .. " + num_text(d.max) + ".";
    if (d.unsupported) meaning += " Some values are not supported yet; the validator says which.";
    std::string value = key_value_text(d, defaults);
    os << "| `" << d.path() << "` | " << key_type_name(d.type) << " | `" << value << "` | " << meaning << " |\n";
  }
  return os.str();
}

}  // namespace troupe::launch
