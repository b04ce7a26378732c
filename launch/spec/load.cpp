// The spec module's public face (spec.hpp): loading a spec from a file, a
// string or the built-in default, diagnostics, and the derived facts every
// command asks of a spec. Parsing is parse.cpp's, the checks check_*.cpp's.
#include "launch/spec/spec.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "launch/spec/keys.hpp"
#include "launch/spec/parser.hpp"

namespace troupe::launch {

extern const char* const kDefaultSpecText;  // launch/specs/default.toml, embedded

std::string Diagnostic::str() const {
  std::ostringstream os;
  os << file;
  if (line > 0) os << ':' << line << ':' << column;
  os << (warning ? ": warning: " : ": error: ") << message;
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

Spec load_spec_text(const std::string& text, const std::string& source_name,
                    const std::vector<Override>& overrides) {
  return spec_detail::load(&text, source_name, overrides, {});
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
  return spec_detail::load(&text, path, overrides, base.empty() ? std::filesystem::path(".") : base);
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

bool sync_data_parallel(const Spec& spec) {
  const auto& t = spec.topology;
  return !rl::decoupled(spec.rl.sync) && t.data_parallel > 1 && t.devices == t.data_parallel && t.stages == 1 &&
         t.schedule == sched::Kind::sequential && t.optimizer_shards == 1 && t.expert_shards == 1 && t.processes == 1 &&
         t.device_kind != DeviceKind::sim;
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
      meaning += " Range " + spec_detail::num_text(d.min) + " .. " + spec_detail::num_text(d.max) + ".";
    if (d.unsupported) meaning += " Some values are not supported yet; the validator says which.";
    std::string value = key_value_text(d, defaults);
    os << "| `" << d.path() << "` | " << key_type_name(d.type) << " | `" << value << "` | " << meaning << " |\n";
  }
  return os.str();
}

}  // namespace troupe::launch
