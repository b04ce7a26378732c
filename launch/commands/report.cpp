// `troupe report RUN_DIR... --output FILE.html` (the dashboard page as one
// self-contained file) and `troupe plot RUN_DIR... --output FILE.png|.svg`
// (the charts drawn by gnuplot, from Debian's gnuplot-nox). Both only read
// the run directories.
#include <fcntl.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "model/atomic_file.hpp"
#include "launch/cli.hpp"
#include "launch/observe/run_dir.hpp"
#include "launch/observe/web_page.hpp"

extern char** environ;

namespace troupe::launch {

namespace fs = std::filesystem;

namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// Writes `text` to `path` whole or not at all (model/atomic_file.hpp).
bool write_file(const std::string& path, const std::string& text) {
  try {
    model::write_file_atomically(path, text);
    return true;
  } catch (const std::exception&) {
    return false;
  }
}

// Run directories and --output, or an exit code.
int open_inputs(const CliOptions& opt, const char* what, std::vector<RunDir>& runs) {
  if (opt.positional.empty()) {
    std::fprintf(stderr, "troupe: %s needs at least one RUN_DIR\nRun 'troupe --help' for usage.\n", what);
    return kExitUsage;
  }
  if (opt.file.empty()) {
    std::fprintf(stderr, "troupe: %s needs --output FILE\nRun 'troupe --help' for usage.\n", what);
    return kExitUsage;
  }
  try {
    runs = open_run_dirs(opt.positional);
  } catch (const RunDirError& e) {
    std::fprintf(stderr, "troupe: %s: %s\n", what, e.what());
    return kExitBadInput;
  }
  return kExitOk;
}

std::string gp_quote(const std::string& s) {  // a gnuplot single-quoted string
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("''") : std::string(1, c);
  return out + "'";
}

std::string num(double v) {
  if (!std::isfinite(v)) return "NaN";
  std::ostringstream os;
  os.precision(10);
  os << v;
  return os.str();
}

// One multiplot panel: a title, axis labels and the plot command.
struct Panel {
  std::string title, xlabel, ylabel, plot;
  bool image = false;
};

// One column of a data file drawn for every run that has it; a second
// column of the same file (the SFT task beside the RL target) is dashed.
struct Column {
  int column;
  std::string suffix;  // after the run's name in the key
  std::function<bool(const RunSeries&)> has;
};
std::string overlay(const std::vector<RunSeries>& series, const std::string& dir, const char* file,
                    const std::vector<Column>& columns) {
  std::string cmd;
  for (size_t i = 0; i < series.size(); ++i)
    for (size_t k = 0; k < columns.size(); ++k) {
      if (!columns[k].has(series[i])) continue;
      cmd += std::string(cmd.empty() ? "plot " : ", ") + gp_quote(dir + "/run" + std::to_string(i) + "." + file) +
             " using 1:" + std::to_string(columns[k].column) + " with linespoints pt 7 ps 0.4 lc " +
             std::to_string(i + 1) + (k > 0 ? " dt 2" : "") + " title " + gp_quote(series[i].name + columns[k].suffix);
    }
  return cmd;
}
std::string overlay(const std::vector<RunSeries>& series, const std::string& dir, const char* file, int column,
                    const std::function<bool(const RunSeries&)>& has) {
  return overlay(series, dir, file, {Column{column, "", has}});
}

// Runs gnuplot on `script`; its messages (warnings about flat ranges, ...) go
// to `messages`, shown only when it fails. -1: gnuplot is not installed.
int run_gnuplot(const std::string& script, const std::string& messages) {
  const char* argv[] = {"gnuplot", script.c_str(), nullptr};
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, 2, messages.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0600);
  pid_t pid = 0;
  const int spawned = posix_spawnp(&pid, "gnuplot", &actions, nullptr, const_cast<char* const*>(argv), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (spawned != 0) return -1;
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128;
}

}  // namespace

int command_report(const CliOptions& opt) {
  std::vector<RunDir> runs;
  if (int rc = open_inputs(opt, "report", runs)) return rc;
  std::string page;
  try {
    page = static_page(runs);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "troupe: report: %s\n", e.what());
    return kExitRuntime;
  }
  if (!write_file(opt.file, page)) {
    std::fprintf(stderr, "troupe: report: cannot write %s\n", opt.file.c_str());
    return kExitRuntime;
  }
  std::printf("troupe report: %zu run(s) -> %s (%zu bytes, self-contained)\n", runs.size(), opt.file.c_str(), page.size());
  return kExitOk;
}

int command_plot(const CliOptions& opt) {
  std::vector<RunDir> runs;
  if (int rc = open_inputs(opt, "plot", runs)) return rc;
  const bool png = ends_with(opt.file, ".png"), svg = ends_with(opt.file, ".svg");
  if (!png && !svg) {
    std::fprintf(stderr, "troupe: plot --output %s: expected a .png or .svg file\n", opt.file.c_str());
    return kExitUsage;
  }
  std::vector<RunSeries> series;
  for (const auto& r : runs) series.push_back(load_series(r));

  char tmpl[] = "/tmp/troupe-plot-XXXXXX";
  if (!mkdtemp(tmpl)) {
    std::fprintf(stderr, "troupe: plot: cannot make a temporary directory\n");
    return kExitRuntime;
  }
  const std::string dir = tmpl;
  struct Cleanup {
    std::string d;
    ~Cleanup() { std::error_code ec; fs::remove_all(d, ec); }
  } cleanup{dir};

  // Data files: one table per run and kind; NaN marks a missing value.
  for (size_t i = 0; i < series.size(); ++i) {
    const RunSeries& s = series[i];
    const std::string base = dir + "/run" + std::to_string(i);
    std::ofstream steps(base + ".steps"), evals(base + ".evals"), rl(base + ".rl"), rl_evals(base + ".rl_evals");
    for (const auto& p : s.rl_evals) rl_evals << p.step << ' ' << num(p.wall) << ' ' << num(p.target) << ' ' << num(p.sft_task) << '\n';
    for (const auto& p : s.steps) steps << p.step << ' ' << num(p.wall) << ' ' << num(p.loss) << ' ' << num(p.shard_imbalance) << '\n';
    for (const auto& p : s.evals) evals << p.step << ' ' << num(p.wall) << ' ' << num(p.val_loss) << ' ' << num(p.exact_match) << '\n';
    for (const auto& p : s.rl) rl << p.step << ' ' << num(p.wall) << ' ' << num(p.reward) << ' ' << num(p.kl) << ' ' << num(p.entropy) << '\n';
  }
  auto any = [&](auto pred) { return std::any_of(series.begin(), series.end(), pred); };
  auto finite_in = [](const auto& v, auto get) { return std::any_of(v.begin(), v.end(), [&](const auto& p) { return std::isfinite(get(p)); }); };
  std::vector<Panel> panels;
  auto has_loss = [&](const RunSeries& s) { return finite_in(s.steps, [](const auto& p) { return p.loss; }); };
  auto has_val = [&](const RunSeries& s) { return finite_in(s.evals, [](const auto& p) { return p.val_loss; }); };
  auto has_em = [&](const RunSeries& s) { return finite_in(s.evals, [](const auto& p) { return p.exact_match; }); };
  auto has_rl = [&](const RunSeries& s) { return !s.rl.empty(); };
  auto has_imb = [&](const RunSeries& s) { return finite_in(s.steps, [](const auto& p) { return p.shard_imbalance; }); };
  if (any(has_loss)) panels.push_back({"Training loss", "step", "loss", overlay(series, dir, "steps", 3, has_loss)});
  if (any(has_val)) panels.push_back({"Validation loss", "step", "loss", overlay(series, dir, "evals", 3, has_val)});
  auto has_rl_em = [&](const RunSeries& s) { return finite_in(s.rl_evals, [](const auto& p) { return p.target; }); };
  auto has_rl_sft = [&](const RunSeries& s) { return finite_in(s.rl_evals, [](const auto& p) { return p.sft_task; }); };
  if (any(has_em))
    panels.push_back({"Pretraining / SFT phase: held-out exact match, pretraining evaluator (with a target split: the RL target, never in SFT rows)",
                      "step", "%", overlay(series, dir, "evals", 4, has_em)});
  if (any(has_rl_em))
    panels.push_back({"RL held-out exact match: target (solid), SFT task (dashed)", "RL step", "%",
                      overlay(series, dir, "rl_evals", {{3, ": RL target", has_rl_em}, {4, ": SFT task", has_rl_sft}})});
  if (any(has_rl)) {
    panels.push_back({"RL reward (mean)", "step", "reward", overlay(series, dir, "rl", 3, has_rl)});
    panels.push_back({"RL KL to the reference", "step", "KL", overlay(series, dir, "rl", 4, has_rl)});
    panels.push_back({"RL policy entropy", "step", "nats", overlay(series, dir, "rl", 5, has_rl)});
  }
  if (any(has_imb)) panels.push_back({"Shard imbalance (max/mean)", "step", "ratio", overlay(series, dir, "steps", 4, has_imb)});
  // Expert load of the first run that has it: one heatmap per layer (at most 4).
  for (size_t i = 0; i < series.size(); ++i) {
    const RunSeries& s = series[i];
    if (s.expert_load.empty()) continue;
    const size_t layers = std::min<size_t>(4, s.expert_load.back().size());
    for (size_t l = 0; l < layers; ++l) {
      const std::string file = dir + "/heat" + std::to_string(l);
      std::ofstream heat(file);
      for (size_t t = 0; t < s.expert_load.size(); ++t) {
        if (l >= s.expert_load[t].size()) continue;
        const auto& load = s.expert_load[t][l];
        double total = 0;
        for (double v : load) total += v;
        for (size_t e = 0; e < load.size(); ++e)
          heat << s.expert_load_steps[t] << ' ' << e << ' ' << num(total > 0 ? 100.0 * load[e] / total : 0.0) << '\n';
      }
      panels.push_back({"Expert load, layer " + std::to_string(l) + " (" + s.name + ", % of tokens)", "step", "expert",
                        "plot " + gp_quote(file) + " using 1:2:3 with image notitle", true});
    }
    break;
  }
  if (panels.empty()) {
    std::fprintf(stderr, "troupe: plot: the run(s) hold no metrics to plot yet (metrics.jsonl has no step lines)\n");
    return kExitBadInput;
  }
  const int cols = panels.size() > 1 ? 2 : 1, rows = static_cast<int>((panels.size() + 1) / 2);
  std::ostringstream gp;
  gp << "set terminal " << (png ? "pngcairo" : "svg") << " noenhanced size " << 700 * cols << "," << 360 * rows
     << (png ? " font 'sans,9'" : " font 'sans,10'") << "\n";
  gp << "set output " << gp_quote(opt.file) << "\nset datafile missing 'NaN'\nset grid\nset key top right\n";
  gp << "set palette defined (0 'white', 1 '#fdae61', 2 '#b2182b')\n";
  gp << "set multiplot layout " << rows << "," << cols << " title " << gp_quote("troupe: " + std::to_string(runs.size()) + " run(s)") << "\n";
  for (const auto& p : panels) {
    gp << "set title " << gp_quote(p.title) << "\nset xlabel " << gp_quote(p.xlabel) << "\nset ylabel " << gp_quote(p.ylabel) << "\n";
    gp << (p.image ? "set autoscale xfix\nset autoscale yfix\n" : "set autoscale\nunset colorbox\n") << (p.image ? "set colorbox\n" : "")
       << p.plot << "\n";
  }
  gp << "unset multiplot\n";
  const std::string script = dir + "/plot.gp";
  if (!write_file(script, gp.str())) {
    std::fprintf(stderr, "troupe: plot: cannot write %s\n", script.c_str());
    return kExitRuntime;
  }
  const int rc = run_gnuplot(script, dir + "/gnuplot.err");
  if (rc == -1) {
    std::fprintf(stderr, "troupe: plot: gnuplot not found: install gnuplot-nox (./setup.sh does)\n");
    return kExitRuntime;
  }
  std::error_code ec;
  if (rc != 0 || fs::file_size(opt.file, ec) == 0 || ec) {
    std::fprintf(stderr, "troupe: plot: gnuplot failed (exit %d) writing %s:\n%s\n", rc, opt.file.c_str(),
                 read_whole_file(dir + "/gnuplot.err").value_or("").c_str());
    return kExitRuntime;
  }
  std::printf("troupe plot: %zu panel(s) for %zu run(s) -> %s\n", panels.size(), runs.size(), opt.file.c_str());
  return kExitOk;
}

}  // namespace troupe::launch
