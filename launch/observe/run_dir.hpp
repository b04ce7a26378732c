// A run directory as `troupe dashboard`, `report` and `plot` read it (never
// write): checks that a path is one, reads metrics.jsonl from a byte offset
// (complete lines only, so a run that is still writing is safe), the tail of
// troupe.log, the Chrome trace the run names, and the series the plots draw.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe::launch {

// Bad input: a missing path, a file, a directory that is not a run.
class RunDirError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct RunDir {
  std::string path;  // as given, without a trailing '/'
  std::string name;  // the run's name ([run] name from the start line), else the directory's name
};

// Throws RunDirError unless `path` is a directory holding metrics.jsonl or troupe.log.
RunDir open_run_dir(const std::string& path);
// open_run_dir for each path; equal names get " (2)", " (3)", ... appended.
std::vector<RunDir> open_run_dirs(const std::vector<std::string>& paths);

struct MetricsChunk {
  std::string text;    // complete lines from `from` (the partial last line waits for its '\n')
  uint64_t next = 0;   // offset to ask for next
  bool reset = false;  // the file is shorter than `from` (replaced or truncated): text starts at 0
  bool gone = false;   // the run directory or its metrics.jsonl no longer exists
};
MetricsChunk read_metrics(const RunDir& run, uint64_t from, uint64_t max_bytes = 16u << 20);

// The last `max_bytes` of troupe.log, from a line start; nullopt when there is none.
std::optional<std::string> read_log_tail(const RunDir& run, uint64_t max_bytes);
// The same of rollouts.jsonl (log.rollouts), complete lines only.
std::optional<std::string> read_rollouts_tail(const RunDir& run, uint64_t max_bytes);

// True when `path` is a regular file inside the run's directory once every
// symlink is resolved: all the dashboard serves from disk, whatever a
// run's metrics.jsonl names.
bool inside_run_dir(const RunDir& run, const std::string& path);

// The trace file of the run: the "trace" of its plan line, else <dir>/trace.json
// when that exists; "" when there is none, or when it is not a regular file
// inside the run directory (inside_run_dir).
std::string trace_path(const RunDir& run);

// A whole file; nullopt when it cannot be read.
std::optional<std::string> read_whole_file(const std::string& path, uint64_t max_bytes = 256u << 20);

// What `troupe plot` draws, parsed from metrics.jsonl (NaN: no value).
struct RunSeries {
  std::string name;
  struct Step { int64_t step; double wall, loss, shard_imbalance; };
  struct Eval { int64_t step; double wall, val_loss, exact_match; };
  struct Rl { int64_t step; double wall, reward, kl, entropy; };
  // An RL evaluation: exact match (%) on the RL target and on the SFT side of
  // the split (NaN without one).
  struct RlEval { int64_t step; double wall, target, sft_task; };
  std::vector<Step> steps;
  std::vector<Eval> evals;  // pretraining (SFT) evaluations
  std::vector<Rl> rl;
  std::vector<RlEval> rl_evals;
  // [step][layer][expert] token counts (steps with an expert_load only), and their step numbers.
  std::vector<std::vector<std::vector<double>>> expert_load;
  std::vector<int64_t> expert_load_steps;
};
RunSeries load_series(const RunDir& run);

}  // namespace troupe::launch
