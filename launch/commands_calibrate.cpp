// `troupe calibrate SPEC [--out FILE] [--repeat N]`: measures the spec's
// per-stage op times on this machine and writes the [sim] table that makes a
// sim spec ([topology] device_kind = "sim") predict the real runtime.
//
// How: the spec's pipeline (its model, stages, schedule, micro-batch size,
// optimizer shards, backend and threads per device) runs on the real actor
// runtime with every actor on ONE device, so its closures run one at a time
// with no second device competing for the cores; the device trace gives each
// closure's time. After warm-up steps, per stage: the median forward and
// full backward of a micro-batch (the runtime runs B and W as one backward,
// so there is no weight part to measure: stage_weight_ms stays empty). The
// optimizer step is what runs after the pipeline: gradient download, reduce,
// AdamW, the parameter and snapshot copies and the parameter load, summed
// per device of the SPEC's placement (the plan), the busiest device taken.
// link_latency_us is the median idle gap between two closures (a completion
// message to an actor and its next submission: the in-process cost of a hop).
//
// The flops model is fitted too (memory bandwidth measured by a copy, the
// compute rate chosen so that the stages' total time is matched) and its
// per-op error printed; cost_model = "measured" is written unless the fit is
// within 5% on every op (or --model says otherwise).
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <csignal>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <atomic>
#include <map>
#include <thread>
#include <spdlog/spdlog.h>

#include "actors/sim/sim_costs.hpp"
#include "launch/cli.hpp"
#include "launch/signals.hpp"
#include "launch/spec_keys.hpp"
#include "launch/topology.hpp"

namespace troupe::launch {
namespace {

double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// A number as the table writes it: 6 significant digits, as %g (and so
// `troupe validate`) prints it back.
std::string round_sig(double x) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.6g", x);
  return buf;
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
    a[i] = b[n - 1 - static_cast<size_t>(i)];  // keep the copies observable
  }
  return 2.0 * static_cast<double>(n * sizeof(float)) / median(t);
}

// What one calibration measured, in ms (per micro-batch for F and B).
struct Measured {
  std::vector<double> f, b;          // per stage
  double optimizer = 0.0;            // post-pipeline work of the busiest device of SPEC's placement
  std::map<int, double> post_by_device;
  double gap_us = 0.0;               // median idle gap between closures
  double step = 0.0, busy = 0.0;     // per step on the one device
  int64_t samples = 0;               // F and B closures timed
  int64_t steps = 0;                 // steps they came from (all copies)
};

// The runtime options of one calibration copy: every actor of the spec's
// pipeline on one device, one replica with the spec's micro-batch size.
runtime::RuntimeOptions copy_options(const Spec& spec) {
  runtime::RuntimeOptions o = runtime_options(spec);
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

// Runs `copies` calibration copies at once, each on its own device thread
// (copies = 1: every op alone on the machine; copies = the spec's devices:
// as many devices busy as in the real run, so the ops share the cores, caches
// and memory bandwidth as they will there), and reads the op times of the
// steps in which every copy was past its warm-up and still stepping.
Measured measure(const Spec& spec, int copies, int64_t warmup, int64_t repeat, const StopOnSignal& stop, bool& interrupted) {
  const runtime::RuntimeOptions o = copy_options(spec);
  const sched::Layout layout = sched::make_layout(o.schedule, o.stages, static_cast<int>(o.train.microbatches));
  struct Copy {
    std::unique_ptr<runtime::Runtime> rt;
    std::vector<std::pair<int64_t, int64_t>> steps;  // [start, end] ns of every step
    std::exception_ptr error;
  };
  std::vector<Copy> runs(static_cast<size_t>(copies));
  for (Copy& c : runs) c.rt = std::make_unique<runtime::Runtime>(o);
  auto now_ns = [] {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
  };
  // The timed window opens when the last copy has finished its warm-up and
  // closes when every copy has run `repeat` steps inside it; copies keep
  // stepping until then, so every timed step had all copies busy.
  std::atomic<bool> stopped{false};
  std::atomic<int> warmed{0}, ready{0};
  std::atomic<int64_t> from{0}, to{0};
  std::vector<std::thread> threads;
  for (size_t k = 0; k < runs.size(); ++k)
    threads.emplace_back([&, k] {
      Copy& c = runs[k];
      int64_t counted = 0;
      try {
        for (int64_t i = 0; i < warmup + 100 * repeat && to == 0 && !stop.requested() && !stopped; ++i) {
          const int64_t t0 = now_ns();
          c.rt->step();
          const int64_t t1 = now_ns();
          c.steps.emplace_back(t0, t1);
          if (k == 0)
            spdlog::info("calibrate ({} device(s) busy): step {} ({}) {:.1f} ms", copies, i + 1,
                         i < warmup ? "warm-up" : "timed", static_cast<double>(t1 - t0) / 1e6);
          if (i + 1 == warmup && ++warmed == copies) from = now_ns();
          if (from != 0 && t0 >= from && ++counted == repeat && ++ready == copies) to = now_ns();
        }
      } catch (...) {
        c.error = std::current_exception();
        stopped = true;
      }
    });
  for (std::thread& t : threads) t.join();
  for (const Copy& c : runs)
    if (c.error) std::rethrow_exception(c.error);
  if (stop.requested()) {
    interrupted = true;
    return {};
  }
  if (to == 0) throw std::runtime_error("calibrate: the copies never had " + std::to_string(repeat) + " timed steps at once");

  Measured m;
  std::vector<std::vector<double>> fs(static_cast<size_t>(layout.num_stages)), bs(fs.size());
  // Post-pipeline closures per step, by the actor that ran them.
  std::map<std::pair<int, int>, std::vector<double>> post;  // (0 rank / 1 shard, index) -> ms per step
  std::vector<double> gaps, busy, wall;
  for (Copy& c : runs) {
    const std::vector<runtime::DeviceTrace> traces = c.rt->device_traces();
    if (traces.size() != 1) throw std::logic_error("calibrate: expected one device, got " + std::to_string(traces.size()));
    for (const auto& [s0, s1] : c.steps) {
      if (s0 < from || s1 > to) continue;  // outside the window: not every copy was busy
      std::map<std::pair<int, int>, double> this_step;
      double b = 0;
      int64_t prev_end = -1;
      for (const runtime::TraceEvent& e : traces[0].events) {
        if (e.start_ns < s0 || e.end_ns > s1) continue;
        const double ms = static_cast<double>(e.end_ns - e.start_ns) / 1e6;
        b += ms;
        if (prev_end >= 0) gaps.push_back(static_cast<double>(e.start_ns - prev_end) / 1e3);
        prev_end = e.end_ns;
        const auto& l = e.label;
        using K = runtime::TraceLabel;
        if (l.kind == K::Forward || l.kind == K::Backward) {
          if (l.stage < 0 || l.stage >= layout.num_stages) throw std::logic_error("calibrate: trace names an unknown stage");
          (l.kind == K::Forward ? fs : bs)[static_cast<size_t>(l.stage)].push_back(ms);
          ++m.samples;
        } else if (l.kind == K::GradSend || l.kind == K::ParamLoad) {
          this_step[{0, l.owner}] += ms;
        } else if (l.kind == K::Reduce || l.kind == K::Update || l.kind == K::Snapshot || l.kind == K::ParamRead) {
          this_step[{1, l.owner}] += ms;
        }
      }
      for (const auto& [k, v] : this_step) post[k].push_back(v);
      busy.push_back(b);
      wall.push_back(static_cast<double>(s1 - s0) / 1e6);
      ++m.steps;
    }
  }
  for (size_t s = 0; s < fs.size(); ++s) {
    if (fs[s].empty() || bs[s].empty())
      throw std::runtime_error("calibrate: stage " + std::to_string(s) + " ran no forward or backward in the timed steps");
    m.f.push_back(median(fs[s]));
    m.b.push_back(median(bs[s]));
  }
  // The SPEC's placement: which device each rank and shard runs on.
  const runtime::Plan plan = resolve_topology(spec);
  for (const runtime::ActorPlan& a : plan.actors) {
    if (a.device < 0 || a.replica > 0) continue;
    int kind = -1;
    if (a.role == runtime::Role::Rank) kind = 0;
    else if (a.role == runtime::Role::Optimizer) kind = 1;
    auto it = post.find({kind, a.index});
    if (it != post.end()) m.post_by_device[a.device] += median(it->second);
  }
  for (const auto& [d, ms] : m.post_by_device) m.optimizer = std::max(m.optimizer, ms);
  m.gap_us = median(gaps);
  m.step = median(wall);
  m.busy = median(busy);
  return m;
}

// The flops roofline fitted to the measured stage times: gbps as measured,
// gflops so that the predicted total of every F and B equals the measured
// total (bisection: the total falls as the rate rises).
struct FlopsFit {
  double gflops = 0, gbps = 0, worst = 0;  // worst: largest relative error of one op
  std::vector<double> f, b;                // predicted ms
};

FlopsFit fit_flops(const Spec& spec, const Measured& m, int64_t mb_sequences, double gbps) {
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

// The [sim] table (comments first), in the spec's syntax. `m` is what is
// written; `alone` (the ops with one device busy) goes into the comments.
std::string sim_table(const Spec& spec, const std::string& path, const Measured& m, const Measured& alone, int copies,
                      const FlopsFit& fit, bool measured, int64_t mb, int64_t warmup, int64_t repeat) {
  std::string host(256, '\0');
  if (gethostname(host.data(), host.size()) != 0) host = "?";
  host.resize(std::strlen(host.c_str()));
  std::string t;
  t += "# troupe calibrate " + path + " on " + host + ": " + std::to_string(spec.topology.stages) + " stage(s), schedule " +
       std::string(sched::to_string(spec.topology.schedule)) + ", micro-batch " + std::to_string(mb) + " x " +
       std::to_string(spec.model.seq_len) + " tokens, backend " +
       (spec.topology.device_kind == DeviceKind::opencl ? "opencl" : "host") + ", " +
       std::to_string(spec.topology.threads_per_device) + " thread(s) per device.\n";
  t += "# Medians of " + std::to_string(repeat) + " step(s) after " + std::to_string(warmup) + " warm-up step(s) of " +
       std::to_string(copies) + " copy(ies) of the pipeline on one device each, stepping at once (as many devices busy\n" +
       "# as the spec has), on the real runtime.\n";
  t += "# alone (one device busy): stage_forward_ms = " + float_list_text(alone.f) + ", stage_backward_ms = " +
       float_list_text(alone.b) + ", optimizer_ms = " + round_sig(alone.optimizer) + "\n";
  t += "# flops fit (gbps: a measured copy; gflops: the stages' total time matched): gflops = " + round_sig(fit.gflops) +
       ", gbps = " + round_sig(fit.gbps) + "; worst op off by " + round_sig(std::round(1000.0 * fit.worst) / 10.0) + "%" +
       (measured ? "" : ", so the flops model is written") + ".\n";
  t += "# optimizer_ms: gradient download, reduce, AdamW, copies and parameter load of the busiest device;\n";
  t += "# link_latency_us: median idle gap between two closures (one actor hop in one process).\n";
  t += "# Use: a copy of the spec with [topology] device_kind = \"sim\", optimizer_shards = 1 and this table.\n";
  t += "[sim]\n";
  if (measured) {
    t += "cost_model = \"measured\"\n";
    t += "stage_forward_ms = " + float_list_text(m.f) + "\n";
    t += "stage_backward_ms = " + float_list_text(m.b) + "\n";
  } else {
    t += "cost_model = \"flops\"\n";
    t += "gflops = " + round_sig(fit.gflops) + "\n";
    t += "gbps = " + round_sig(fit.gbps) + "\n";
  }
  t += "link_latency_us = " + round_sig(m.gap_us) + "\n";
  t += "optimizer_ms = " + round_sig(m.optimizer) + "\n";
  return t;
}

// Writes `text` to `path` through a temporary file in the same directory and
// a rename, so a reader never sees half a table. Throws on failure.
void write_atomically(const std::string& path, const std::string& text) {
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) throw std::runtime_error("cannot write " + path + " (cannot create " + tmp + ": " + std::strerror(errno) + ")");
    out << text;
    out.flush();
    if (!out) {
      std::filesystem::remove(tmp);
      throw std::runtime_error("cannot write " + tmp);
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  if (ec) {
    std::filesystem::remove(tmp);
    throw std::runtime_error("cannot write " + path + ": " + ec.message());
  }
}

// Checks, before minutes of measuring, that `path` can be written.
void check_writable(const std::string& path) {
  const std::filesystem::path p(path);
  if (std::filesystem::is_directory(p)) throw std::runtime_error(path + " is a directory");
  write_atomically(path + ".probe", "");
  std::filesystem::remove(path + ".probe");
}

}  // namespace

int command_calibrate(const CliOptions& opt, const Spec& spec) {
  const auto& t = spec.topology;
  auto refuse = [&](const std::string& why) {
    std::fprintf(stderr, "troupe calibrate: %s: %s\n", spec.source.c_str(), why.c_str());
    return kExitBadSpec;
  };
  if (t.device_kind == DeviceKind::sim)
    return refuse("[topology] device_kind = \"sim\": calibrate measures real devices; give it the spec with device_kind = "
                  "\"host\" or \"opencl\" (the [sim] table it writes goes into the sim spec)");
  if (spec.run.mode != RunMode::pretrain)
    return refuse(std::string("[run] mode = \"") + run_mode_name(spec.run.mode) +
                  "\": calibrate measures pipeline training steps (mode = \"pretrain\")");
  if (t.expert_shards > 1)
    return refuse("[topology] expert_shards = " + std::to_string(t.expert_shards) +
                  ": expert-parallel sims use the flops model (README \"Sim devices\"); calibrate the spec with expert_shards = 1");
  if (t.processes > 1) return refuse("[topology] processes > 1: calibrate runs in one process");
  const int64_t warmup = 2, repeat = opt.repeat > 0 ? opt.repeat : 8;
  const std::string& out = opt.file;
  try {
    if (!out.empty()) check_writable(out);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "troupe calibrate: --out %s: %s\n", out.c_str(), e.what());
    return kExitBadInput;
  }
  const int64_t mb = spec.data.batch_size / (t.microbatches * t.data_parallel);
  const int copies = static_cast<int>(std::max<int64_t>(1, t.devices));
  spdlog::info("calibrate {}: {} warm-up + {} timed step(s) with every op alone on one device, then with {} device(s) "
               "busy at once, then a copy-bandwidth test", spec.source, warmup, repeat, copies);
  StopOnSignal stop;
  Measured alone, m;
  double gbps = 0;
  try {
    bool interrupted = false;
    alone = measure(spec, 1, warmup, repeat, stop, interrupted);
    if (!interrupted) m = copies > 1 ? measure(spec, copies, warmup, repeat, stop, interrupted) : alone;
    if (interrupted || stop.requested()) {
      std::fprintf(stderr, "troupe calibrate: interrupted (%s); nothing was written\n",
                   stop.signal() == SIGTERM ? "SIGTERM" : "SIGINT");
      return kExitInterrupted;
    }
    gbps = copy_bandwidth() / 1e9;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "troupe calibrate: %s\n", e.what());
    return kExitRuntime;
  }
  const FlopsFit fit = fit_flops(spec, m, mb, gbps);
  const bool measured = opt.cost_model == "measured" || (opt.cost_model.empty() && fit.worst > 0.05);

  std::printf("calibrate %s: %lld step(s) timed; one device alone: step %.1f ms (busy %.1f ms)\n", spec.source.c_str(),
              static_cast<long long>(m.steps), alone.step, alone.busy);
  std::printf("  %-6s %9s %9s %11s %11s %15s %15s\n", "stage", "F alone", "B alone", ("F " + std::to_string(copies) + " busy").c_str(),
              ("B " + std::to_string(copies) + " busy").c_str(), "flops F (err)", "flops B (err)");
  for (size_t s = 0; s < m.f.size(); ++s)
    std::printf("  %-6zu %9.3f %9.3f %11.3f %11.3f %8.3f (%+4.0f%%) %8.3f (%+4.0f%%)\n", s, alone.f[s], alone.b[s], m.f[s],
                m.b[s], fit.f[s], 100.0 * (fit.f[s] / m.f[s] - 1.0), fit.b[s], 100.0 * (fit.b[s] / m.b[s] - 1.0));
  std::printf("  after the pipeline (ms), per device of the spec's placement, alone / %d busy:", copies);
  for (const auto& [d, ms] : m.post_by_device) std::printf(" device %d %.2f / %.2f", d, alone.post_by_device[d], ms);
  std::printf("\n  idle gap between closures (median): %.1f us\n\n", m.gap_us);
  const std::string table = sim_table(spec, opt.positional.empty() ? spec.source : opt.positional[0], m, alone, copies,
                                      fit, measured, mb, warmup, repeat);
  std::fputs(table.c_str(), stdout);
  std::fflush(stdout);
  if (!out.empty()) {
    try {
      write_atomically(out, table);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "troupe calibrate: %s\n", e.what());
      return kExitRuntime;
    }
    std::fprintf(stderr, "troupe calibrate: wrote %s\n", out.c_str());
  }
  return kExitOk;
}

}  // namespace troupe::launch
