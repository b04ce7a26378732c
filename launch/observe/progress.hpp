// Terminal progress and machine-readable metrics for `troupe run`:
// a redrawn bar on a TTY, plain lines otherwise, and JSON lines in
// <out_dir>/metrics.jsonl (one object per step, evaluation and checkpoint).
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

#include "launch/spec/spec.hpp"
#include "model/trainer.hpp"

namespace troupe::launch {

// Appends one JSON object per line; flushes each line so a crash loses nothing written.
class MetricsWriter {
 public:
  MetricsWriter() = default;
  ~MetricsWriter();
  // Throws std::runtime_error when the file cannot be opened.
  void open(const std::string& path);
  void write_line(const std::string& json);
  bool is_open() const { return file_ != nullptr; }

 private:
  std::FILE* file_ = nullptr;
};

// Small JSON object builder (numbers: NaN/inf become null).
class JsonObject {
 public:
  JsonObject& add(const char* key, double v);
  JsonObject& add(const char* key, int64_t v);
  JsonObject& add(const char* key, const std::string& v);
  JsonObject& add_raw(const char* key, const std::string& json);
  std::string str() const { return "{" + body_ + "}"; }

 private:
  void key(const char* k);
  std::string body_;
};
std::string json_escape(const std::string& s);

// The metrics.jsonl line of a supervised restart or step replay
// ({"type":"restart",...}), for every engine that has one.
std::string restart_json(const runtime::RestartEvent& ev);

// ProgressStyle::automatic as this process sees it: a bar when stderr is a
// terminal, plain lines otherwise; other styles as they are.
ProgressStyle resolve_progress(ProgressStyle style);

class ProgressObserver : public model::TrainObserver {
 public:
  // style: bar, plain or off (automatic resolved by the caller: resolve_progress).
  ProgressObserver(ProgressStyle style, int64_t total_steps, int64_t plain_every,
                   MetricsWriter* metrics);
  void on_step(const model::StepMetrics& m) override;
  void on_eval(const model::EvalMetrics& m) override;
  void on_checkpoint(int64_t step, const std::string& dir) override;
  void finish();

 private:
  std::string eta_text(int64_t step) const;
  // Seconds since the observer was made (when training began): metrics' wall_seconds.
  double wall_seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }
  ProgressStyle style_;
  int64_t total_, start_, every_;
  MetricsWriter* metrics_;
  std::chrono::steady_clock::time_point t0_;
  double smoothed_tps_ = 0.0;
  bool bar_drawn_ = false;
  bool first_step_ = true;
};

}  // namespace troupe::launch
