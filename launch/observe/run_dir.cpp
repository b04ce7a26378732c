// Reading run directories for the dashboard, report and plot commands
// (launch/observe/run_dir.hpp). Read-only; JSON lines are parsed with nlohmann-json
// (Debian's nlohmann-json3-dev), and only here.
#include "launch/observe/run_dir.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>

namespace fs = std::filesystem;
using nlohmann::json;

namespace troupe::launch {

namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();

std::string metrics_file(const RunDir& r) { return r.path + "/metrics.jsonl"; }

// Only regular files are opened: a FIFO (or a device) in a run directory
// would block open() or read() forever.
bool regular_file(const std::string& path) {
  std::error_code ec;
  return fs::is_regular_file(path, ec);
}

// The first line of metrics.jsonl whose "type" is `type`, parsed; null when none.
json first_line_of_type(const RunDir& r, const std::string& type, int max_lines = 8) {
  if (!regular_file(metrics_file(r))) return nullptr;
  std::ifstream in(metrics_file(r));
  std::string line;
  for (int i = 0; i < max_lines && std::getline(in, line); ++i) {
    json j = json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.value("type", "") == type) return j;
  }
  return nullptr;
}

double number(const json& j, const char* key) {
  auto it = j.find(key);
  return it != j.end() && it->is_number() ? it->get<double>() : kNaN;
}

}  // namespace

RunDir open_run_dir(const std::string& given) {
  std::string path = given;
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  std::error_code ec;
  const auto st = fs::status(path, ec);
  if (!fs::exists(st)) throw RunDirError(given + ": no such directory");
  if (!fs::is_directory(st)) throw RunDirError(given + ": is not a directory (expected a run directory, e.g. runs/<name>)");
  if (!fs::exists(path + "/metrics.jsonl", ec) && !fs::exists(path + "/troupe.log", ec))
    throw RunDirError(given + ": not a run directory (it holds neither metrics.jsonl nor troupe.log)");
  for (const char* name : {"/metrics.jsonl", "/troupe.log"})
    if (fs::exists(fs::symlink_status(path + name, ec)) && !regular_file(path + name))
      throw RunDirError(given + name + ": is not a regular file (a FIFO, a device or a directory cannot be read as "
                                       "a run's output)");
  RunDir r{path, fs::path(path).filename().string()};
  if (r.name.empty() || r.name == ".") r.name = fs::absolute(path, ec).filename().string();
  const json start = first_line_of_type(r, "start", 1);
  if (start.is_object() && start.contains("name") && start["name"].is_string() && !start["name"].get<std::string>().empty())
    r.name = start["name"].get<std::string>();
  return r;
}

std::vector<RunDir> open_run_dirs(const std::vector<std::string>& paths) {
  std::vector<RunDir> runs;
  std::map<std::string, int> seen;
  for (const auto& p : paths) {
    RunDir r = open_run_dir(p);
    const int n = ++seen[r.name];
    if (n > 1) r.name += " (" + std::to_string(n) + ")";
    runs.push_back(std::move(r));
  }
  return runs;
}

MetricsChunk read_metrics(const RunDir& run, uint64_t from, uint64_t max_bytes) {
  MetricsChunk c;
  std::error_code ec;
  const auto size = fs::file_size(metrics_file(run), ec);
  if (ec || !regular_file(metrics_file(run))) {
    // No metrics yet is not "gone" while the directory is there (the run may start writing).
    c.gone = !fs::is_directory(run.path, ec);
    c.next = from;
    return c;
  }
  if (from > size) c.reset = true, from = 0;
  std::ifstream in(metrics_file(run), std::ios::binary);
  in.seekg(static_cast<std::streamoff>(from));
  const uint64_t want = std::min<uint64_t>(size - from, max_bytes);
  c.text.resize(want);
  in.read(c.text.data(), static_cast<std::streamsize>(want));
  c.text.resize(static_cast<size_t>(in.gcount()));
  const auto nl = c.text.rfind('\n');
  c.text.resize(nl == std::string::npos ? 0 : nl + 1);
  c.next = from + c.text.size();
  return c;
}

namespace {

// The last `max_bytes` of the run's file `name`, from a line start.
std::optional<std::string> read_tail(const RunDir& run, const char* name, uint64_t max_bytes) {
  const std::string path = run.path + "/" + name;
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec || !regular_file(path)) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  const uint64_t from = size > max_bytes ? size - max_bytes : 0;
  in.seekg(static_cast<std::streamoff>(from));
  std::string text(size - from, '\0');
  in.read(text.data(), static_cast<std::streamsize>(text.size()));
  text.resize(static_cast<size_t>(in.gcount()));
  if (from > 0) {
    const auto nl = text.find('\n');
    text.erase(0, nl == std::string::npos ? text.size() : nl + 1);
  }
  return text;
}

}  // namespace

std::optional<std::string> read_log_tail(const RunDir& run, uint64_t max_bytes) {
  return read_tail(run, "troupe.log", max_bytes);
}

std::optional<std::string> read_rollouts_tail(const RunDir& run, uint64_t max_bytes) {
  auto text = read_tail(run, "rollouts.jsonl", max_bytes);
  if (text) {  // a line being written waits
    const size_t end = text->rfind('\n');
    text->erase(end == std::string::npos ? 0 : end + 1);
  }
  return text;
}

bool inside_run_dir(const RunDir& run, const std::string& path) {
  std::error_code ec;
  const fs::path dir = fs::canonical(run.path, ec);
  if (ec) return false;
  const fs::path file = fs::canonical(path, ec);  // symlinks resolved
  if (ec || !fs::is_regular_file(file, ec)) return false;
  const auto [d, f] = std::mismatch(dir.begin(), dir.end(), file.begin(), file.end());
  return d == dir.end() && f != file.end();
}

std::string trace_path(const RunDir& run) {
  std::error_code ec;
  const json plan = first_line_of_type(run, "plan");
  std::string found;
  if (plan.is_object() && plan.contains("trace") && plan["trace"].is_string()) {
    const std::string t = plan["trace"].get<std::string>();
    // A relative path is relative to where the run started; the dashboard may
    // run elsewhere, so look next to metrics.jsonl too.
    if (!t.empty() && (fs::exists(t, ec) || fs::path(t).is_absolute())) found = t;
    if (!t.empty() && found.empty()) {
      const std::string beside = run.path + "/" + fs::path(t).filename().string();
      if (fs::exists(beside, ec)) found = beside;
    }
  }
  if (found.empty()) found = run.path + "/trace.json";
  // Whatever metrics.jsonl names, only a regular file inside the run
  // directory is read (and served by the dashboard).
  return inside_run_dir(run, found) ? found : "";
}

std::optional<std::string> read_whole_file(const std::string& path, uint64_t max_bytes) {
  std::error_code ec;
  const auto size = fs::file_size(path, ec);
  if (ec || size > max_bytes || !regular_file(path)) return std::nullopt;
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::string text(size, '\0');
  in.read(text.data(), static_cast<std::streamsize>(size));
  text.resize(static_cast<size_t>(in.gcount()));
  return text;
}

RunSeries load_series(const RunDir& run) {
  RunSeries s;
  s.name = run.name;
  std::ifstream in(metrics_file(run));
  std::string line;
  double wall = 0;  // wall_seconds when the line has it, else the sum of step times
  while (std::getline(in, line)) {
    if (in.eof()) break;  // a partial last line (no '\n' yet)
    const json j = json::parse(line, nullptr, false);
    if (!j.is_object()) continue;
    const std::string type = j.value("type", "");
    const int64_t step = j.value("step", int64_t{0});
    auto advance = [&] {
      const double w = number(j, "wall_seconds");
      wall = std::isfinite(w) ? w : wall + (std::isfinite(number(j, "step_seconds")) ? number(j, "step_seconds") : 0);
    };
    auto wall_of = [&] { const double w = number(j, "wall_seconds"); return std::isfinite(w) ? w : wall; };
    if (type == "step") {
      advance();
      bool sharded = false;
      if (auto it = j.find("shard_load"); it != j.end() && it->is_array())
        for (const auto& l : *it) sharded = sharded || (l.is_array() && l.size() > 1);
      s.steps.push_back({step, wall, number(j, "loss"), sharded ? number(j, "shard_imbalance") : kNaN});
      if (auto it = j.find("expert_load"); it != j.end() && it->is_array() && !it->empty()) {
        std::vector<std::vector<double>> layers;
        for (const auto& l : *it) {
          std::vector<double> row;
          if (l.is_array())
            for (const auto& v : l) row.push_back(v.is_number() ? v.get<double>() : 0.0);
          layers.push_back(std::move(row));
        }
        s.expert_load.push_back(std::move(layers));
        s.expert_load_steps.push_back(step);
      }
    } else if (type == "eval") {
      s.evals.push_back({step, wall_of(), number(j, "val_loss"), 100.0 * number(j, "accuracy")});
    } else if (type == "rl_step") {
      advance();
      s.rl.push_back({step, wall, number(j, "reward_mean"), number(j, "kl_ref"), number(j, "entropy")});
    } else if (type == "rl_eval") {
      s.rl_evals.push_back({step, wall_of(), 100.0 * number(j, "exact_match"), 100.0 * number(j, "sft_exact_match")});
    }
  }
  return s;
}

}  // namespace troupe::launch
