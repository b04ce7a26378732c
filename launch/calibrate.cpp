// Sim calibration from the real runtime's device trace (see calibrate.hpp).
#include "launch/calibrate.hpp"
#include "launch/calibrate_rl.hpp"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <exception>
#include <memory>
#include <spdlog/spdlog.h>
#include <thread>
#include <tuple>

#include "launch/spec/keys.hpp"
#include "launch/run_plan.hpp"

namespace troupe::launch {
namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0.0 : s / static_cast<double>(v.size());
}

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Bytes per second of a large copy (read + write), the median of 5: the
// device memory bandwidth the flops roofline divides bytes by.
double copy_bandwidth() {
  const size_t n = size_t{16} << 20;  // floats: 64 MiB each way
  std::vector<float> a(n, 1.0f), b(n, 0.0f);
  std::vector<double> t;
  for (int i = 0; i < 5; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    std::memcpy(b.data(), a.data(), n * sizeof(float));
    t.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    a[static_cast<size_t>(i)] = b[n - 1 - static_cast<size_t>(i)];  // keep the copies observable
  }
  return 2.0 * static_cast<double>(n * sizeof(float)) / median(t);
}

// The phase (see OpTimes::post) of a post-pipeline closure; -1 for the others.
int post_phase(runtime::TraceLabel::Kind k) {
  using K = runtime::TraceLabel;
  switch (k) {
    case K::GradSend: return 0;
    case K::Reduce: return 1;
    case K::Update:
    case K::ParamRead: return 2;
    case K::Snapshot:
    case K::ParamLoad: return 3;
    default: return -1;
  }
}

// post_by_device and optimizer from post.
void summarize_post(OpTimes& m) {
  m.post_by_device.clear();
  std::map<int, double> phase_max;
  for (const auto& [key, ms] : m.post) {
    m.post_by_device[key.second] += ms;
    phase_max[key.first] = std::max(phase_max[key.first], ms);
  }
  m.optimizer = 0;
  for (const auto& [phase, ms] : phase_max) m.optimizer += ms;
}

// The runtime options of one calibration copy: every actor of the spec's
// pipeline on one device, one replica with the spec's micro-batch size.
runtime::RuntimeOptions copy_options(const Spec& spec, const RunPlan& plan) {
  runtime::RuntimeOptions o = plan.runtime;
  o.devices = 1;
  o.data_parallel = 1;
  o.train.microbatches = spec.topology.microbatches;
  o.train.data.batch_size = spec.data.batch_size / spec.topology.data_parallel;
  o.expert_shards = 0;
  o.faults.clear();
  o.elastic.clear();
  o.trace.clear();
  o.record_trace = true;
  o.processes = 1;
  o.device_process.clear();
  o.comm.reset();
  o.train.checkpoint_dir.clear();
  o.train.resume_from.clear();
  return o;
}

// `copies` calibration copies stepping in lockstep rounds (every copy's step
// of a round runs at once, on its own device thread), then `between`.
// Returns the op times of the rounds after the warm-up.
OpTimes measure(const Spec& spec, const RunPlan& plan, int copies, const CalibrateOptions& opt, bool& interrupted) {
  const runtime::Plan& placement = plan.plan;
  const runtime::RuntimeOptions o = copy_options(spec, plan);
  std::vector<std::unique_ptr<runtime::Runtime>> runs;
  for (int k = 0; k < copies; ++k) runs.push_back(std::make_unique<runtime::Runtime>(o));
  std::vector<std::vector<std::pair<int64_t, int64_t>>> timed(static_cast<size_t>(copies));
  for (int64_t i = 0; i < opt.warmup + opt.repeat; ++i) {
    if (opt.stop && opt.stop->load()) {
      interrupted = true;
      return {};
    }
    std::vector<std::pair<int64_t, int64_t>> round(static_cast<size_t>(copies));
    std::vector<std::exception_ptr> errors(static_cast<size_t>(copies));
    std::vector<std::thread> threads;
    for (size_t k = 0; k < runs.size(); ++k)
      threads.emplace_back([&, k] {
        try {
          round[k].first = now_ns();
          runs[k]->step();
          round[k].second = now_ns();
        } catch (...) {
          errors[k] = std::current_exception();
        }
      });
    for (std::thread& t : threads) t.join();
    for (const auto& e : errors)
      if (e) std::rethrow_exception(e);
    spdlog::info("calibrate ({} device(s) busy): round {}/{} ({}) {:.1f} ms", copies, i + 1, opt.warmup + opt.repeat,
                 i < opt.warmup ? "warm-up" : "timed", static_cast<double>(round[0].second - round[0].first) / 1e6);
    if (i >= opt.warmup)
      for (size_t k = 0; k < runs.size(); ++k) timed[k].push_back(round[k]);
    if (opt.between) opt.between();
  }
  // Steps of different copies overlap in time: each copy's trace is read with its own steps.
  std::vector<OpTimes> per;
  for (size_t k = 0; k < runs.size(); ++k) per.push_back(read_op_times(runs[k]->device_traces(), timed[k], spec, placement));
  if (per.size() == 1) return per[0];
  // Pooled: per figure, the median over the copies (each copy ran the same pipeline).
  OpTimes out = per[0];
  for (size_t s = 0; s < out.f.size(); ++s) {
    std::vector<double> f, b, w;
    for (const OpTimes& p : per) {
      f.push_back(p.f[s]), b.push_back(p.b[s]);
      if (!p.w.empty()) w.push_back(p.w[s]);
    }
    out.f[s] = median(f);
    out.b[s] = median(b);
    if (!out.w.empty()) out.w[s] = median(w);
  }
  for (auto& [key, ms] : out.post) {
    std::vector<double> v;
    for (const OpTimes& p : per) v.push_back(p.post.count(key) ? p.post.at(key) : 0.0);
    ms = median(v);
  }
  summarize_post(out);
  std::vector<double> gaps, walls;
  for (const OpTimes& p : per) gaps.push_back(p.gap_us), walls.push_back(p.step);
  out.gap_us = median(gaps);
  out.step = median(walls);
  out.samples = out.steps = 0;
  for (const OpTimes& p : per) out.samples += p.samples, out.steps += p.steps;
  return out;
}

FlopsFit fit_flops(const Spec& spec, const OpTimes& m, int64_t mb_sequences, double gbps) {
  sim::CostConfig c;
  c.model = sim::CostModel::flops;
  c.gbps = gbps;
  double target = 0;
  for (size_t s = 0; s < m.f.size(); ++s) target += m.f[s] + m.b[s];
  auto total = [&](double g, std::vector<double>* f, std::vector<double>* b) {
    c.gflops = g;
    double t = 0;
    for (const sim::StageCost& x : sim::stage_costs(c, spec.model, mb_sequences, static_cast<int>(m.f.size()))) {
      t += static_cast<double>(x.f + x.b) / 1e6;
      if (f) f->push_back(static_cast<double>(x.f) / 1e6);
      if (b) b->push_back(static_cast<double>(x.b) / 1e6);
    }
    return t;
  };
  // Bisection on a log scale: the total falls as the rate rises.
  double lo = 1e-3, hi = 1e9;
  for (int i = 0; i < 200 && hi / lo > 1.0 + 1e-9; ++i) {
    const double mid = std::sqrt(lo * hi);
    (total(mid, nullptr, nullptr) > target ? lo : hi) = mid;
  }
  FlopsFit fit;
  fit.gflops = hi;
  fit.gbps = gbps;
  total(hi, &fit.f, &fit.b);
  for (size_t s = 0; s < m.f.size(); ++s)
    fit.worst = std::max({fit.worst, std::fabs(fit.f[s] / m.f[s] - 1.0), std::fabs(fit.b[s] / m.b[s] - 1.0)});
  return fit;
}

}  // namespace

OpTimes read_op_times(const std::vector<runtime::DeviceTrace>& traces,
                      const std::vector<std::pair<int64_t, int64_t>>& steps, const Spec& spec,
                      const runtime::Plan& placement) {
  const auto& t = spec.topology;
  const int num_stages =
      sched::make_layout(t.schedule, static_cast<int>(t.stages), static_cast<int>(t.microbatches)).num_stages;
  OpTimes m;
  std::vector<std::vector<double>> fs(static_cast<size_t>(num_stages)), bs(fs.size()), ws(fs.size());
  std::map<std::tuple<int, int, int>, std::vector<double>> post;  // (0 rank / 1 shard, index, phase) -> ms per step
  std::map<int, std::vector<double>> busy;
  std::vector<double> gaps, wall;
  for (const auto& [s0, s1] : steps) {
    std::map<std::tuple<int, int, int>, double> this_step;  // (0 rank / 1 shard, index, phase)
    // A chunk's backward: its B, plus its W when split. (stage, dir, mb) -> ms.
    std::map<std::tuple<int, int, int>, double> chunk_b, chunk_w;
    for (const runtime::DeviceTrace& dt : traces) {
      double b = 0;
      int64_t prev_end = -1;
      for (const runtime::TraceEvent& e : dt.events) {
        if (e.start_ns < s0 || e.end_ns > s1) continue;
        const double ms = static_cast<double>(e.end_ns - e.start_ns) / 1e6;
        b += ms;
        if (prev_end >= 0) gaps.push_back(static_cast<double>(e.start_ns - prev_end) / 1e3);
        prev_end = e.end_ns;
        const auto& l = e.label;
        using K = runtime::TraceLabel;
        if (l.kind == K::Forward || l.kind == K::Backward || l.kind == K::Weight) {
          if (l.stage < 0 || l.stage >= num_stages) throw std::logic_error("calibrate: the trace names an unknown stage");
          if (l.kind == K::Forward) fs[static_cast<size_t>(l.stage)].push_back(ms);
          else (l.kind == K::Backward ? chunk_b : chunk_w)[{l.stage, l.chunk, l.mb}] += ms;
          ++m.samples;
        } else if (const int phase = post_phase(l.kind); phase >= 0) {
          const int actor = l.kind == K::GradSend || l.kind == K::ParamLoad ? 0 : 1;  // rank or shard
          this_step[{actor, l.owner, phase}] += ms;
        }
      }
      busy[dt.device].push_back(b);
    }
    for (const auto& [c, ms] : chunk_b) {
      auto wi = chunk_w.find(c);
      bs[static_cast<size_t>(std::get<0>(c))].push_back(ms + (wi == chunk_w.end() ? 0.0 : wi->second));
    }
    for (const auto& [c, ms] : chunk_w) ws[static_cast<size_t>(std::get<0>(c))].push_back(ms);
    for (const auto& [k, v] : this_step) post[k].push_back(v);
    wall.push_back(static_cast<double>(s1 - s0) / 1e6);
    ++m.steps;
  }
  for (size_t s = 0; s < fs.size(); ++s) {
    if (fs[s].empty() || bs[s].empty())
      throw std::runtime_error("calibrate: stage " + std::to_string(s) + " ran no forward or backward in the timed steps");
    m.f.push_back(mean(fs[s]));
    m.b.push_back(mean(bs[s]));
  }
  // The weight part, when the schedule split backwards: a stage with no W
  // in these steps gets 0 (its B's were all full backwards).
  bool split = false;
  for (const auto& v : ws) split |= !v.empty();
  if (split)
    for (size_t s = 0; s < ws.size(); ++s) m.w.push_back(ws[s].empty() ? 0.0 : std::min(mean(ws[s]), m.b[s]));
  for (const runtime::ActorPlan& a : placement.actors) {
    if (a.device < 0 || a.replica > 0) continue;
    const int kind = a.role == runtime::Role::Rank ? 0 : a.role == runtime::Role::Optimizer ? 1 : -1;
    for (int phase = 0; phase < 4; ++phase)
      if (auto it = post.find({kind, a.index, phase}); it != post.end())
        m.post[{phase, a.device}] += mean(it->second);
  }
  summarize_post(m);
  for (const auto& [d, v] : busy) m.busy_by_device[d] = median(v);
  m.gap_us = median(gaps);
  m.step = median(wall);
  return m;
}

std::string round_sig(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
}

std::string host_name() {
  std::string host(256, '\0');
  if (gethostname(host.data(), host.size()) != 0) return "?";
  host.resize(std::strlen(host.c_str()));
  return host;
}

std::string calibrate_refusal(const Spec& spec) {
  const auto& t = spec.topology;
  if (t.device_kind == DeviceKind::sim)
    return "[topology] device_kind = \"sim\": calibrate measures real devices; give it the spec with device_kind = "
           "\"host\" or \"opencl\" (the [sim] table it writes goes into the sim spec)";
  if (spec.run.mode == RunMode::rl) return calibrate_rl_refusal(spec);
  if (spec.run.mode != RunMode::pretrain)
    return std::string("[run] mode = \"") + run_mode_name(spec.run.mode) +
           "\": calibrate measures pipeline training steps (mode = \"pretrain\") or RL steps (mode = \"rl\")";
  if (t.expert_shards > 1)
    return "[topology] expert_shards = " + std::to_string(t.expert_shards) +
           ": expert-parallel sims use the flops model (docs/sim.md); calibrate the spec with expert_shards = 1";
  if (t.processes > 1) return "[topology] processes > 1: calibrate runs in one process";
  return "";
}

Calibration calibrate(const Spec& spec, const RunPlan& plan, const CalibrateOptions& options) {
  Calibration c;
  c.copies = static_cast<int>(std::max<int64_t>(1, spec.topology.devices));
  c.mb_sequences = spec.data.batch_size / (spec.topology.microbatches * spec.topology.data_parallel);
  c.alone = measure(spec, plan, 1, options, c.interrupted);
  if (!c.interrupted) c.busy = c.copies > 1 ? measure(spec, plan, c.copies, options, c.interrupted) : c.alone;
  if (c.interrupted) return c;
  c.fit = fit_flops(spec, c.busy, c.mb_sequences, copy_bandwidth() / 1e9);
  return c;
}

sim::CostConfig calibrated_costs(const Calibration& c, bool measured, bool alone) {
  const OpTimes& m = alone ? c.alone : c.busy;
  sim::CostConfig s;
  if (measured) {
    s.model = sim::CostModel::measured;
    s.stage_forward_ms = m.f;
    s.stage_backward_ms = m.b;
    s.stage_weight_ms = m.w;
  } else {
    s.model = sim::CostModel::flops;
    s.gflops = c.fit.gflops;
    s.gbps = c.fit.gbps;
  }
  s.link_latency_us = m.gap_us;
  s.optimizer_ms = m.optimizer;
  return s;
}

std::string sim_table(const Spec& spec, const std::string& path, const Calibration& c, bool measured,
                      const CalibrateOptions& options) {
  const std::string host = host_name();
  const sim::CostConfig s = calibrated_costs(c, measured);
  std::string t;
  t += "# troupe calibrate " + path + " on " + host + ": " + std::to_string(spec.topology.stages) + " stage(s), schedule " +
       std::string(sched::to_string(spec.topology.schedule)) + ", micro-batch " + std::to_string(c.mb_sequences) + " x " +
       std::to_string(spec.model.seq_len) + " tokens, backend " +
       (spec.topology.device_kind == DeviceKind::opencl ? "opencl" : "host") + ", " +
       std::to_string(spec.topology.threads_per_device) + " thread(s) per device.\n";
  t += "# Means (gaps: medians) of " + std::to_string(options.repeat) + " round(s) after " + std::to_string(options.warmup) +
       " warm-up round(s) of " + std::to_string(c.copies) +
       " copy(ies) of the pipeline, one device each, stepping at once (as many devices busy\n"
       "# as the spec has), on the real runtime.\n";
  t += "# alone (one device busy): stage_forward_ms = " + float_list_text(c.alone.f) + ", stage_backward_ms = " +
       float_list_text(c.alone.b) + ", optimizer_ms = " + round_sig(c.alone.optimizer) + "\n";
  t += "# flops fit (gbps: a measured copy; gflops: the stages' total time matched): gflops = " + round_sig(c.fit.gflops) +
       ", gbps = " + round_sig(c.fit.gbps) + "; worst op off by " + round_sig(std::round(1000.0 * c.fit.worst) / 10.0) +
       "%" + (measured ? "" : ", so the flops model is written") + ".\n";
  t += "# optimizer_ms: after the pipeline, per phase (gradient download, reduce, AdamW, snapshot and parameter\n"
       "# load) the busiest device of the spec's placement, summed (the phases wait for each other across devices);\n";
  t += "# link_latency_us: median idle gap between two closures (one actor hop in one process).\n";
  t += "# Use: a copy of the spec with [topology] device_kind = \"sim\", optimizer_shards = 1 and this table.\n";
  t += "[sim]\n";
  t += std::string("cost_model = \"") + sim::cost_model_name(s.model) + "\"\n";
  if (measured) {
    t += "stage_forward_ms = " + float_list_text(s.stage_forward_ms) + "\n";
    t += "stage_backward_ms = " + float_list_text(s.stage_backward_ms) + "\n";
    if (!s.stage_weight_ms.empty()) t += "stage_weight_ms = " + float_list_text(s.stage_weight_ms) + "\n";
  } else {
    t += "gflops = " + round_sig(s.gflops) + "\n";
    t += "gbps = " + round_sig(s.gbps) + "\n";
  }
  t += "link_latency_us = " + round_sig(s.link_latency_us) + "\n";
  t += "optimizer_ms = " + round_sig(s.optimizer_ms) + "\n";
  return t;
}

}  // namespace troupe::launch
