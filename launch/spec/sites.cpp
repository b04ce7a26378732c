// SpecSites (parser.hpp): where each key was set, read by every check.
#include <cmath>
#include <sstream>

#include "launch/spec/parser.hpp"
#include "launch/run_plan.hpp"

namespace troupe::launch::spec_detail {

void SpecSites::error(const Pos& p, std::string message) {
  diags_.push_back({p.file, p.line, p.column, std::move(message)});
}

void SpecSites::warn(const Pos& p, std::string message) {
  for (const Diagnostic& d : spec_.warnings)
    if (d.message == message && d.line == p.line && d.file == p.file) return;
  spec_.warnings.push_back({p.file, p.line, p.column, std::move(message), true});
}

Pos SpecSites::elastic_where(size_t index, const std::string& key) const {
  if (auto it = elastic_pos_.find({index, key}); it != elastic_pos_.end()) return it->second;
  if (auto it = elastic_pos_.find({index, ""}); it != elastic_pos_.end()) return it->second;
  return Pos{spec_.source, 0, 0};
}

Pos SpecSites::fault_where(size_t index, const std::string& key) const {
  if (auto it = fault_pos_.find({index, key}); it != fault_pos_.end()) return it->second;
  if (auto it = fault_pos_.find({index, ""}); it != fault_pos_.end()) return it->second;
  return Pos{spec_.source, 0, 0};
}

const Pos* SpecSites::first_set_in(const std::string& section) const {
  for (const auto& [path, pos] : set_)
    if (path.rfind(section + ".", 0) == 0) return &pos;
  return nullptr;
}

const Pos* SpecSites::first_set_with_prefix(const std::string& prefix) const {
  for (const auto& [path, pos] : set_)
    if (path.rfind(prefix, 0) == 0) return &pos;
  return nullptr;
}

const Pos* SpecSites::set_at(const std::string& path) const {
  auto it = set_.find(path);
  return it == set_.end() ? nullptr : &it->second;
}

size_t SpecSites::keys_set_in_file(const std::string& file) const {
  size_t n = 0;
  for (const auto& [path, pos] : set_) n += pos.file == file ? 1 : 0;
  return n + fault_pos_.size() + elastic_pos_.size();
}

Pos SpecSites::where(const std::string& path) const {
  if (auto it = set_.find(path); it != set_.end()) return it->second;
  const std::string section = path.substr(0, path.find('.'));
  if (auto it = section_pos_.find(section); it != section_pos_.end()) return it->second;
  return Pos{spec_.source, 0, 0};
}

std::string num_text(double v) {
  std::ostringstream os;
  if (std::isinf(v)) return v > 0 ? "inf" : "-inf";
  if (std::fabs(v) >= 1e9) os << v;
  else if (v == std::floor(v)) os << static_cast<long long>(v);
  else os << v;
  return os.str();
}

const runtime::Plan* SpecSites::topology_plan(const Spec& s) {
  if (plan_of_ != &s) {
    plan_of_ = &s;
    plan_.reset();
    try {
      plan_ = resolve_topology(s);
    } catch (const std::exception&) {
    }
  }
  return plan_ ? &*plan_ : nullptr;
}

}  // namespace troupe::launch::spec_detail
