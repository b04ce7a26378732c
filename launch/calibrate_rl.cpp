// RL sim calibration on the real synchronous loop (see calibrate_rl.hpp).
#include "launch/calibrate_rl.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <filesystem>
#include <cstdlib>
#include <cerrno>
#include <cstring>
#include <spdlog/spdlog.h>

#include "kernels/backend.hpp"
#include "launch/calibrate.hpp"
#include "launch/cli.hpp"
#include "launch/commands/rl.hpp"
#include "launch/observe/progress.hpp"
#include "launch/run_plan.hpp"
#include "model/clock.hpp"
#include "rl/rollout_step.hpp"
#include "rl/trainer.hpp"

namespace troupe::launch {
namespace {

using Clock = std::chrono::steady_clock;
using model::seconds_since;

// warmup + repeat synchronous steps on `devices` devices from the spec's
// init; the timed steps' sums (and their completion lengths, when asked).
RlPhaseTimes run_phase(const Spec& spec, int devices, const RlCalibrateOptions& o, std::vector<int64_t>* lengths,
                       bool& interrupted) {
  rl::RlTrainOptions opt = rl_train_options(spec);
  opt.devices = devices;
  opt.steps = o.warmup + o.repeat;
  opt.checkpoint_dir.clear();
  opt.resume_from.clear();
  int64_t done = 0;
  if (lengths) {
    opt.rollouts_every = 1;
    opt.on_rollouts = [&](const rl::StepRollouts& r, const rl::ScoredBatch&) {
      if (done < o.warmup) return;
      for (const auto& c : r.completions) lengths->push_back(static_cast<int64_t>(c.tokens.size()));
    };
  }
  rl::RlTrainer trainer(opt);
  RlPhaseTimes p;
  p.devices = devices;
  std::vector<double> idle(static_cast<size_t>(devices), 0.0);
  double wall = 0;
  for (; done < opt.steps; ++done) {
    if (o.stop && o.stop->load()) {
      interrupted = true;
      return p;
    }
    const rl::RlStepMetrics m = trainer.step();
    spdlog::info("calibrate rl: {} device(s), step {}/{}{}: generation {:.3f} s, training {:.3f} s", devices, done + 1,
                 opt.steps, done < o.warmup ? " (warm-up)" : "", m.gen_seconds, m.train_seconds);
    if (done < o.warmup) continue;
    ++p.steps;
    p.tokens += m.gen_tokens;
    p.completions += m.groups * spec.rl.group_size;
    p.gen_s += m.gen_seconds;
    p.reward_s += m.reward_seconds;
    p.train_s += m.train_seconds;
    p.train_serial_s += m.train_serial_seconds;
    if (devices == 1) {
      p.gen_busy_s += m.gen_seconds;
    } else {
      for (int d = 0; d < devices; ++d) {
        const double gi = static_cast<size_t>(d) < m.gen_idle_seconds.size() ? m.gen_idle_seconds[static_cast<size_t>(d)] : 0.0;
        p.gen_busy_s += m.gen_seconds - gi;
      }
      const std::vector<double> shares = m.device_idle_shares();
      const double step_wall = m.gen_seconds + m.reward_seconds + m.train_seconds;
      for (size_t d = 0; d < shares.size() && d < idle.size(); ++d) idle[d] += shares[d] * step_wall;
      wall += step_wall;
    }
  }
  if (devices > 1 && wall > 0)
    for (double x : idle) p.idle_share.push_back(x / wall);
  return p;
}

// The number after "key": in one flat JSON line (0 when absent).
double json_number(const std::string& line, const std::string& key) {
  const std::string k = "\"" + key + "\":";
  const size_t at = line.find(k);
  return at == std::string::npos ? 0.0 : std::strtod(line.c_str() + at + k.size(), nullptr);
}

// The decoupled loop (fixed_lag 1: the trainer on device 0, one generator on
// device 1) for warmup + repeat steps in a temporary directory: its
// trainer's timed steps, read back from the run's metrics.
RlPhaseTimes run_decoupled_phase(const Spec& spec, const RlCalibrateOptions& o, bool& interrupted) {
  Spec s = spec;
  s.rl.sync = rl::SyncMode::fixed_lag;
  s.rl_section.sync = rl::SyncMode::fixed_lag;
  s.rl.max_staleness = s.rl_section.max_staleness = 1;
  s.rl.generators = s.rl_section.generators = 1;
  s.topology.data_parallel = 1;
  s.run.steps = o.warmup + o.repeat;
  s.run.eval_every = 0;
  s.log.progress = ProgressStyle::off;
  s.log.rollouts = 0;
  std::string tmpl = (std::filesystem::temp_directory_path() / "troupe-calibrate-XXXXXX").string();
  if (!mkdtemp(tmpl.data())) throw std::runtime_error("calibrate: cannot make a temporary directory: " + std::string(std::strerror(errno)));
  struct Cleanup {
    std::string dir;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(dir, ec);
    }
  } cleanup{tmpl};
  s.run.out_dir = tmpl + "/run";
  std::filesystem::create_directories(s.run.out_dir);
  spdlog::info("calibrate rl: the decoupled loop (fixed_lag 1, trainer on device 0, a generator on device 1), {} step(s)",
               s.run.steps);
  RlPhaseTimes p;
  p.devices = 1;
  {
    MetricsWriter metrics;
    metrics.open(tmpl + "/metrics.jsonl");
    const int rc = run_rl(s, make_run_plan(s), metrics, ProgressStyle::off, *o.signals);
    if (rc == kExitInterrupted || o.signals->requested()) {
      interrupted = true;
      return p;
    }
    if (rc != kExitOk) throw std::runtime_error("calibrate: the decoupled run failed (exit " + std::to_string(rc) + ")");
  }
  std::ifstream in(tmpl + "/metrics.jsonl");
  std::string line;
  while (std::getline(in, line)) {
    if (line.find("\"type\":\"rl_step\"") == std::string::npos) continue;
    const int64_t step = static_cast<int64_t>(json_number(line, "step"));
    if (step <= o.warmup) continue;
    ++p.steps;
    p.tokens += static_cast<int64_t>(json_number(line, "gen_tokens"));
    p.train_s += json_number(line, "train_seconds");
    p.train_serial_s += json_number(line, "train_serial_seconds");
  }
  if (p.steps == 0) throw std::runtime_error("calibrate: the decoupled run wrote no timed rl_step lines");
  return p;
}

// A parameter download and an upload to a second backend: what publishing
// a policy version to a generator copies (median of 5).
double sync_ms(const Spec& spec) {
  rl::RlTrainOptions opt = rl_train_options(spec);
  opt.steps = 0;
  rl::RlTrainer trainer(opt);
  std::unique_ptr<kernels::Backend> be = kernels::make_backend(opt.backend);
  std::vector<double> t;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = Clock::now();
    const std::vector<float> host = trainer.parameters();
    const kernels::Tensor copy = be->from_f32({static_cast<int64_t>(host.size())}, host);
    be->synchronize();
    t.push_back(1e3 * seconds_since(t0));
  }
  std::sort(t.begin(), t.end());
  return t[2];
}

double percentile(std::vector<int64_t> v, double q) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t i = std::min(v.size() - 1, static_cast<size_t>(std::ceil(q * static_cast<double>(v.size()))) - (q > 0 ? 1 : 0));
  return static_cast<double>(v[i]);
}

}  // namespace

std::string calibrate_rl_refusal(const Spec& spec) {
  if (spec.rl_section.trainer == "actors")
    return "[rl] trainer = \"actors\": calibrate times the in-process loop; calibrate the spec with trainer = "
           "\"single\" (the sim's costs are per device either way)";
  if (spec.topology.processes > 1) return "[topology] processes > 1: calibrate runs in one process";
  return "";
}

void fit_log_normal(const std::vector<int64_t>& lengths, double& mean, double& sigma) {
  mean = sigma = 0.0;
  if (lengths.empty()) return;
  double s = 0, s2 = 0;
  for (int64_t l : lengths) {
    const double x = std::log(static_cast<double>(std::max<int64_t>(l, 1)));
    s += x;
    s2 += x * x;
  }
  const double n = static_cast<double>(lengths.size());
  const double mu = s / n;
  sigma = std::sqrt(std::max(0.0, s2 / n - mu * mu));
  mean = std::exp(mu + 0.5 * sigma * sigma);
}

RlCalibration calibrate_rl(const Spec& spec, const RlCalibrateOptions& options) {
  RlCalibration c;
  c.alone = run_phase(spec, 1, options, &c.lengths, c.interrupted);
  const int D = static_cast<int>(std::max<int64_t>(1, spec.topology.devices));
  if (!c.interrupted && D > 1) c.parallel = run_phase(spec, D, options, nullptr, c.interrupted);
  if (!c.interrupted && D > 1 && options.signals) c.decoupled = run_decoupled_phase(spec, options, c.interrupted);
  if (c.interrupted) return c;
  c.sync_ms = sync_ms(spec);
  const RlPhaseTimes& a = c.alone;
  const double tokens = static_cast<double>(std::max<int64_t>(a.tokens, 1));
  c.decode_ms = 1e3 * a.gen_s / tokens;
  c.reward_ms = a.completions ? 1e3 * a.reward_s / static_cast<double>(a.completions) : 0.0;
  c.sync_train_ms = 1e3 * (a.train_s - a.train_serial_s) / tokens;
  c.train_ms = c.sync_train_ms;
  c.train_step_ms = a.steps ? 1e3 * a.train_serial_s / static_cast<double>(a.steps) : 0.0;
  if (c.decoupled.steps > 0) {
    const RlPhaseTimes& d = c.decoupled;
    c.train_ms = 1e3 * (d.train_s - d.train_serial_s) / static_cast<double>(std::max<int64_t>(d.tokens, 1));
    c.train_step_ms = 1e3 * d.train_serial_s / static_cast<double>(d.steps);
  }
  if (c.parallel.steps > 0) {
    const RlPhaseTimes& p = c.parallel;
    const double pt = static_cast<double>(std::max<int64_t>(p.tokens, 1));
    c.parallel_decode_ms = 1e3 * p.gen_busy_s / pt;
    // Whatever the parallel phase took beyond the one-device serial part, as
    // if split perfectly over the devices.
    const double serial = c.train_step_ms / 1e3 * static_cast<double>(p.steps);
    c.parallel_train_ms = std::max(0.0, 1e3 * (p.train_s - serial) * static_cast<double>(p.devices) / pt);
  }
  fit_log_normal(c.lengths, c.mean_tokens, c.sigma);
  return c;
}

std::string rl_sim_table(const Spec& spec, const std::string& path, const RlCalibration& c,
                         const RlCalibrateOptions& options) {
  const std::string host = host_name();
  const rl::RlConfig& r = spec.rl;
  auto fixed = [](double x, int digits) {
    char b[64];
    std::snprintf(b, sizeof b, "%.*f", digits, x);
    return std::string(b);
  };
  double sample_mean = 0;
  for (int64_t l : c.lengths) sample_mean += static_cast<double>(l);
  if (!c.lengths.empty()) sample_mean /= static_cast<double>(c.lengths.size());
  std::string t;
  t += "# troupe calibrate " + path + " on " + host + ": RL, " + std::to_string(r.prompts_per_step) + " prompts x " +
       std::to_string(r.group_size) + " a step, max_new_tokens " + std::to_string(r.max_new_tokens) + ", backend " +
       (spec.topology.device_kind == DeviceKind::opencl ? "opencl" : "host") + ", " +
       std::to_string(spec.topology.threads_per_device) + " thread(s) per device, from " +
       (r.init.empty() ? std::string("a fresh policy") : r.init) + ".\n";
  t += "# The synchronous loop, " + std::to_string(options.warmup) + " warm-up and " + std::to_string(options.repeat) +
       " timed step(s): one device: step " + fixed(c.alone.step_s(), 3) + " s (generation " +
       fixed(c.alone.steps ? c.alone.gen_s / static_cast<double>(c.alone.steps) : 0.0, 3) + ", training " +
       fixed(c.alone.steps ? c.alone.train_s / static_cast<double>(c.alone.steps) : 0.0, 3) + ")";
  if (c.parallel.steps > 0) {
    t += "; data-parallel over " + std::to_string(c.parallel.devices) + " devices: step " + fixed(c.parallel.step_s(), 3) +
         " s (generation " + fixed(c.parallel.gen_s / static_cast<double>(c.parallel.steps), 3) + ", training " +
         fixed(c.parallel.train_s / static_cast<double>(c.parallel.steps), 3) + "), devices idle";
    for (double x : c.parallel.idle_share) t += " " + fixed(100.0 * x, 1) + "%";
  }
  t += ".\n";
  if (c.decoupled.steps > 0)
    t += "# rl_train_ms_per_token and rl_train_step_ms: the trainer of a fixed_lag 1 run (" +
         std::to_string(c.decoupled.steps) + " timed steps, " +
         fixed(c.decoupled.train_s / static_cast<double>(c.decoupled.steps), 3) +
         " s a step); the one-device synchronous loop trains a token in " + round_sig(c.sync_train_ms) + " ms.\n";
  t += "# Completion lengths (" + std::to_string(c.lengths.size()) + ", one-device steps): mean " + fixed(sample_mean, 1) +
       ", p50 " + fixed(percentile(c.lengths, 0.5), 0) + ", p99 " + fixed(percentile(c.lengths, 0.99), 0) + ", max " +
       fixed(percentile(c.lengths, 1.0), 0) + "; log-normal fit (mean and sd of ln L) below.\n";
  t += "# rl_slots = 1: on this backend a decode step costs in proportion to its live rows, so a device's\n"
       "# generation is its tokens at the batched per-token rate, one row at a time. rl_sync_ms: a parameter\n"
       "# download plus an upload. Use: a copy of the spec with [topology] device_kind = \"sim\" and this table.\n";
  t += "[sim]\n";
  t += "rl_mean_tokens = " + round_sig(std::max(1.0, c.mean_tokens)) + "\n";
  t += "rl_sigma = " + round_sig(std::min(4.0, c.sigma)) + "\n";
  t += "rl_max_tokens = " + std::to_string(r.max_new_tokens) + "\n";
  t += "rl_slots = 1\n";
  t += "rl_decode_ms_per_token = " + round_sig(c.decode_ms) + "\n";
  t += "rl_reward_ms = " + round_sig(c.reward_ms) + "\n";
  t += "rl_train_ms_per_token = " + round_sig(c.train_ms) + "\n";
  t += "rl_train_step_ms = " + round_sig(c.train_step_ms) + "\n";
  if (c.parallel.steps > 0) {
    t += "rl_parallel_decode_ms_per_token = " + round_sig(c.parallel_decode_ms) + "\n";
    t += "rl_parallel_train_ms_per_token = " + round_sig(c.parallel_train_ms) + "\n";
  }
  t += "rl_sync_ms = " + round_sig(c.sync_ms) + "\n";
  return t;
}

}  // namespace troupe::launch
