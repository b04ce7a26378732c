// The table of every launch-spec key: type, range or choices, documentation,
// and whether the feature behind a value is built yet. Internal to launch/.
#pragma once

#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "launch/spec/spec.hpp"

namespace troupe::launch {

// Choice: a string from `choices`, stored as the enum the row names.
// FloatList: a TOML array of numbers (std::vector<double>), each in [min, max].
// StringList: a TOML array of strings (std::vector<std::string>).
enum class KeyType { Int, Float, Bool, String, Choice, FloatList, StringList };
const char* key_type_name(KeyType t);

struct KeyDef {
  std::string section;
  std::string key;
  KeyType type;
  // Address of the typed field (int64_t, double, bool, std::string or an enum) in a Spec.
  std::function<void*(Spec&)> field;
  std::string doc;
  double min = -std::numeric_limits<double>::infinity();  // Int/Float/FloatList: inclusive range
  double max = std::numeric_limits<double>::infinity();
  std::vector<std::string> choices;  // String: allowed values (empty = any); Choice: the enum's names
  // Non-empty result: why this value cannot run yet ("not supported yet: ...").
  std::function<std::string(const Spec&)> unsupported;
  // Choice: stores the enum value of choices[i] into the field / finds the
  // index of the field's value (set by the table's bind_choices).
  std::function<void(void*, size_t)> set_choice;
  std::function<size_t(const void*)> choice_index;

  // section "" is the top level (spec_version).
  std::string path() const { return section.empty() ? key : section + "." + key; }
  // How messages name the key: "[run] steps", or "spec_version" at the top level.
  std::string label() const { return section.empty() ? key : "[" + section + "] " + key; }
};

const std::vector<KeyDef>& spec_keys();
// A float list in the spec's syntax: "[1.5, 2]" (each value as %g prints it).
std::string float_list_text(const std::vector<double>& values);
// The current value of `def` in `spec`, rendered as TOML ("128", "\"host\"", "true").
std::string key_value_text(const KeyDef& def, Spec& spec);

}  // namespace troupe::launch
