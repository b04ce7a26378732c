// The spec's TOML reader: toml++ document -> Spec, key by key through the
// key table (keys.hpp), with a Diagnostic for every problem and the
// position of every key kept for the checks (check_*.cpp); load() runs them.
#include "launch/spec/parser.hpp"

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

namespace {

const std::vector<std::string> kSections = {"run", "model", "data", "tokenizer", "optim", "topology", "experts", "checkpoint", "log", "sim", "rl", "chaos"};

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


class Parser : public SpecSites {
 public:
  using SpecSites::SpecSites;


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
      case KeyType::StringList: {
        const toml::array* arr = value.as_array();
        if (!arr) return type_error(*def, value, p);
        std::vector<std::string> xs;
        for (const toml::node& e : *arr) {
          auto str = e.as_string();
          if (!str) return error(p, name + ": expected an array of strings, got " + node_text(value));
          xs.push_back(str->get());
        }
        *static_cast<std::vector<std::string>*>(field) = std::move(xs);
        break;
      }
    }
    set_[def->path()] = p;
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
                      (def.type == KeyType::Int || def.type == KeyType::FloatList || def.type == KeyType::StringList ? "an " : "a ") + key_type_name(def.type) +
                      ", got " + node_type_name(value) + " " + node_text(value);
    if (def.type == KeyType::Int && value.is_floating_point()) msg += " (write it without a fraction)";
    if (value.is_string() && def.type != KeyType::String && def.type != KeyType::Choice) msg += " (remove the quotes)";
    error(p, msg);
  }
  void range_error(const KeyDef& def, const toml::node& value, const Pos& p) {
    error(p, def.label() + " = " + node_text(value) +
                 " is out of range (allowed " + num_text(def.min) + " .. " + num_text(def.max) + ")");
  }
};

}  // namespace

Spec load(const std::string* text, const std::string& source, const std::vector<Override>& overrides,
          const std::filesystem::path& base_dir) {
  Spec spec;
  spec.source = source;
  Parser parser(spec);
  if (text) parser.parse_document(*text, source);
  parser.file_mode = spec.run.mode;
  for (const auto& o : overrides) parser.apply_override(o);
  // A relative data path is relative to the spec file, so specs can be run
  // from anywhere; so are a user's task's files, and its reward program runs there.
  for (std::string* path : {&spec.data.path, &spec.data.eval_path, &spec.data.tokenizer.model, &spec.rl_section.prompts,
                            &spec.rl_section.eval_prompts})
    if (!path->empty() && std::filesystem::path(*path).is_relative() && !base_dir.empty())
      *path = (base_dir / *path).lexically_normal().string();
  {
    std::error_code ec;
    const auto dir = std::filesystem::absolute(base_dir.empty() ? std::filesystem::path(".") : base_dir, ec);
    spec.rl_section.reward_dir = ec ? base_dir.string() : dir.lexically_normal().string();
  }
  check_tokenizer(spec, parser);  // before the checks that read model.vocab_size
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
  if (parser.diagnostics().empty()) check_memory(spec, parser);
  check_warnings(spec, parser, text != nullptr);
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

}  // namespace troupe::launch::spec_detail
