// Progress display and metrics lines for `troupe run` (see progress.hpp).
#include "launch/observe/progress.hpp"

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <sstream>
#include <stdexcept>

#include <unistd.h>

namespace troupe::launch {

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

void MetricsWriter::open(const std::string& path) {
  file_ = std::fopen(path.c_str(), "a");
  if (!file_) throw std::runtime_error("cannot open metrics file " + path + ": " + std::strerror(errno));
}

void MetricsWriter::write_line(const std::string& json) {
  if (!file_) return;
  std::fputs(json.c_str(), file_);
  std::fputc('\n', file_);
  std::fflush(file_);
}

std::string restart_json(const runtime::RestartEvent& ev) {
  JsonObject j;
  j
      .add("type", std::string("restart"))
      .add("step", ev.step)
      .add("attempt", static_cast<int64_t>(ev.attempt))
      .add("actor", ev.actor)
      .add("cause", ev.cause)
      .add("phase", ev.phase)
      .add("replayed", static_cast<int64_t>(ev.replayed));
  if (ev.shrink)  // [experts] on_failure = "shrink": the shard's slot was removed
    j.add("shrink", static_cast<int64_t>(1))
        .add("shards_before", static_cast<int64_t>(ev.shards_before))
        .add("shards_after", static_cast<int64_t>(ev.shards_after));
  return j.str();
}

std::string json_escape(const std::string& s) {
  std::string out = "\"";
  for (char c : s) {
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\t': out += "\\t"; break;
      default:
        if (static_cast<unsigned char>(c) < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += c;
        }
    }
  }
  return out + "\"";
}

void JsonObject::key(const char* k) {
  if (!body_.empty()) body_ += ',';
  body_ += json_escape(k) + ':';
}
JsonObject& JsonObject::add(const char* k, double v) {
  key(k);
  if (!std::isfinite(v)) {
    body_ += "null";
  } else {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.9g", v);
    body_ += buf;
  }
  return *this;
}
JsonObject& JsonObject::add(const char* k, int64_t v) {
  key(k);
  body_ += std::to_string(v);
  return *this;
}
JsonObject& JsonObject::add(const char* k, const std::string& v) {
  key(k);
  body_ += json_escape(v);
  return *this;
}
JsonObject& JsonObject::add_raw(const char* k, const std::string& json) {
  key(k);
  body_ += json;
  return *this;
}

ProgressStyle resolve_progress(ProgressStyle style) {
  if (style != ProgressStyle::automatic) return style;
  return isatty(fileno(stderr)) ? ProgressStyle::bar : ProgressStyle::plain;
}

ProgressObserver::ProgressObserver(ProgressStyle style, int64_t total_steps, int64_t plain_every,
                                   MetricsWriter* metrics)
    : style_(style), total_(total_steps), start_(0), every_(plain_every),
      metrics_(metrics), t0_(std::chrono::steady_clock::now()) {}

std::string ProgressObserver::eta_text(int64_t step) const {
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  const int64_t done = step - start_;
  if (done <= 0) return "?";
  const auto left = static_cast<int64_t>(elapsed / static_cast<double>(done) * static_cast<double>(total_ - step));
  char buf[32];
  std::snprintf(buf, sizeof buf, "%lld:%02lld", static_cast<long long>(left / 60), static_cast<long long>(left % 60));
  return buf;
}

namespace {

// [[a,b],[c]] of per-layer counts.
std::string nested_json(const std::vector<std::vector<int64_t>>& v) {
  std::string out = "[";
  for (size_t l = 0; l < v.size(); ++l) {
    out += l ? ",[" : "[";
    for (size_t e = 0; e < v[l].size(); ++e) {
      if (e) out += ',';
      out += std::to_string(v[l][e]);
    }
    out += "]";
  }
  return out + "]";
}

// Load imbalance: max / mean of the counts of a layer, the worst layer (1 =
// perfectly balanced; 0 when there is nothing to measure).
double imbalance(const std::vector<std::vector<int64_t>>& v) {
  double worst = 0.0;
  for (const auto& layer : v) {
    if (layer.empty()) continue;
    int64_t sum = 0, mx = 0;
    for (int64_t x : layer) {
      sum += x;
      mx = std::max(mx, x);
    }
    if (sum > 0) worst = std::max(worst, static_cast<double>(mx) * static_cast<double>(layer.size()) / static_cast<double>(sum));
  }
  return worst;
}

// [0.5,1,null] of shares (NaN -> null).
std::string list_json(const std::vector<double>& v) {
  std::string out = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) out += ',';
    if (std::isfinite(v[i])) {
      char buf[32];
      std::snprintf(buf, sizeof buf, "%.6g", v[i]);
      out += buf;
    } else {
      out += "null";
    }
  }
  return out + "]";
}

}  // namespace

void ProgressObserver::on_step(const model::StepMetrics& m) {
  if (first_step_) {
    // A resumed run starts past 0: measure the ETA from where it started
    // (t0_ is when training began, so the first step's time counts).
    start_ = m.step - 1;
    first_step_ = false;
  }
  const double tps = m.step_seconds > 0 ? static_cast<double>(m.tokens) / m.step_seconds : 0.0;
  smoothed_tps_ = smoothed_tps_ == 0.0 ? tps : 0.9 * smoothed_tps_ + 0.1 * tps;
  if (metrics_ && metrics_->is_open()) {
    const std::string load = nested_json(m.expert_load), shard_load = nested_json(m.shard_load);
    metrics_->write_line(JsonObject()
                             .add("type", std::string("step"))
                             .add("step", m.step)
                             .add("loss", m.loss)
                             .add("aux_loss", m.aux_loss)
                             .add("lr", m.lr)
                             .add("grad_norm", m.grad_norm)
                             .add("tokens", m.tokens)
                             .add("step_seconds", m.step_seconds)
                             .add("tokens_per_s", tps)
                             .add_raw("expert_load", load)
                             .add_raw("shard_load", shard_load)
                             .add("expert_imbalance", imbalance(m.expert_load))
                             .add("shard_imbalance", imbalance(m.shard_load))
                             .add("wall_seconds", wall_seconds())
                             .str());
  }
  if (style_ == ProgressStyle::bar) {
    const int width = 30;
    const int filled = total_ > 0 ? static_cast<int>(width * m.step / total_) : width;
    std::fprintf(stderr, "\r\033[Kstep %lld/%lld [%s%s] loss %.4f | %.0f tok/s | ETA %s",
                 static_cast<long long>(m.step), static_cast<long long>(total_),
                 std::string(static_cast<size_t>(filled), '#').c_str(),
                 std::string(static_cast<size_t>(width - filled), '.').c_str(), m.loss, smoothed_tps_,
                 eta_text(m.step).c_str());
    std::fflush(stderr);
    bar_drawn_ = true;
  } else if (style_ == ProgressStyle::plain && (m.step % every_ == 0 || m.step == total_ || m.step == start_ + 1)) {
    std::fprintf(stderr, "step %lld/%lld loss %.4f aux %.4f lr %.3g gnorm %.3f tok/s %.0f eta %s\n",
                 static_cast<long long>(m.step), static_cast<long long>(total_), m.loss, m.aux_loss, m.lr,
                 m.grad_norm, smoothed_tps_, eta_text(m.step).c_str());
  }
}

void ProgressObserver::on_eval(const model::EvalMetrics& m) {
  if (metrics_ && metrics_->is_open())
    metrics_->write_line(JsonObject()
                             .add("type", std::string("eval"))
                             .add("step", m.step)
                             .add("val_loss", m.val_loss)
                             .add("accuracy", m.accuracy)
                             .add("problems", m.problems)
                             .add_raw("digit_accuracy", list_json(m.digit_accuracy))
                             .add_raw("context_accuracy", list_json(m.context_accuracy))
                             .add_raw("size_accuracy", list_json(m.size_accuracy))
                             .add("wall_seconds", wall_seconds())
                             .str());
  if (style_ == ProgressStyle::off) return;
  if (bar_drawn_) std::fputc('\n', stderr), bar_drawn_ = false;
  if (std::isnan(m.accuracy)) {
    std::fprintf(stderr, "eval step %lld: val_loss %.4f\n", static_cast<long long>(m.step), m.val_loss);
    return;
  }
  // Per answer position in the order generated (units first in the default format).
  std::string digits;
  for (double d : m.digit_accuracy) {
    char buf[16];
    std::snprintf(buf, sizeof buf, "%s%.0f", digits.empty() ? "" : " ", 100.0 * d);
    digits += buf;
  }
  std::fprintf(stderr, "eval step %lld: val_loss %.4f exact-match %.1f%% (%lld problems) per-digit %% [%s]\n",
               static_cast<long long>(m.step), m.val_loss, 100.0 * m.accuracy, static_cast<long long>(m.problems),
               digits.c_str());
}

void ProgressObserver::on_checkpoint(int64_t step, const std::string& dir) {
  if (metrics_ && metrics_->is_open())
    metrics_->write_line(JsonObject().add("type", std::string("checkpoint")).add("step", step).add("dir", dir).str());
  if (style_ == ProgressStyle::off) return;
  if (bar_drawn_) std::fputc('\n', stderr), bar_drawn_ = false;
  std::fprintf(stderr, "checkpoint step %lld -> %s\n", static_cast<long long>(step), dir.c_str());
}

void ProgressObserver::finish() {
  if (bar_drawn_) std::fputc('\n', stderr), bar_drawn_ = false;
}

}  // namespace troupe::launch
