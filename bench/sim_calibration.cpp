// bench_sim_calibration (issue 16, "Sim calibration"): does a sim calibrated
// by `troupe calibrate` (launch/calibrate.hpp) predict the real 2-device step
// time of 1F1B and DualPipe?
//
// For each config — "quickstart" (launch/specs/pipeline_1f1b.toml and
// pipeline_dualpipe.toml as written: the model and topology
// bench_pipeline_real runs) and "d256" (the same with d_model 256, 8 heads,
// expert hidden 512) — and schedule, in one process:
//   1. the real runtime for the spec (2 host devices) is built and warmed up;
//   2. the calibration runs (one copy alone, then 2 copies at once) and after
//      EVERY calibration round the real runtime runs one step, so load drift
//      on a shared machine hits the calibration and the real steps alike;
//   3. the sim (actors/sim, the code `troupe run` uses on a sim spec) runs
//      one step of the spec on sim devices with the calibrated costs:
//      measured per-stage times with 2 devices busy (what `troupe calibrate`
//      writes), the same with the one-device-alone times, and the flops fit;
//   4. predicted vs measured (median real step) with the relative error.
// A breakdown from the real runtime's own trace follows: its per-op medians
// against the calibrated ones, its post-pipeline work per device against
// optimizer_ms, and its busy time per device.
//
//   bench_sim_calibration SPEC_DIR [--rounds N] [--repeat N] [--configs quickstart,d256] [--json PATH]
// SPEC_DIR: launch/specs. --repeat: timed calibration rounds per phase
// (the real step count is 2 x repeat). --rounds: the whole thing N times.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include <spdlog/spdlog.h>

#include "bench/bench_stats.hpp"
#include "actors/sim/sim_runtime.hpp"
#include "kernels/blas_core.hpp"
#include "launch/calibrate.hpp"
#include "launch/sim_plan.hpp"
#include "launch/run_plan.hpp"

using namespace troupe;
using namespace troupe::launch;

namespace {

using troupe::bench::median;

int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  return f >> a >> b >> c ? a + " " + b + " " + c : "unknown";
}

// One simulated step of `spec` on sim devices with `costs`: its step time in ms.
double predict(Spec spec, const sim::CostConfig& costs) {
  spec.topology.device_kind = DeviceKind::sim;
  spec.topology.optimizer_shards = 1;  // the calibrated optimizer_ms covers the real shards
  spec.sim = costs;
  spec.run.steps = 1;
  spec.log.trace.clear();
  const sim::SimResult r = sim::simulate(sim_options(spec));
  if (!r.completed) throw std::runtime_error("sim failed: " + r.error);
  return static_cast<double>(r.step_ns()) / 1e6;
}

std::string list(const std::vector<double>& v) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << v[i];
  return os.str() + "]";
}

std::string map_text(const std::map<int, double>& m) {
  std::ostringstream os;
  os << '{';
  bool first = true;
  for (const auto& [k, v] : m) os << (first ? "" : ", ") << '"' << k << "\": " << v, first = false;
  return os.str() + "}";
}

struct Row {
  std::string config, schedule;
  int round = 0;
  double predicted = 0, predicted_alone = 0, predicted_flops = 0, measured = 0, measured_mean = 0, best = 0;
  std::vector<double> real_steps;
  Calibration cal;
  OpTimes real;  // the real runtime's own trace
  std::string load;
};

}  // namespace

int main(int argc, char** argv) {
  troupe::kernels::configure_openblas(argv);  // the kernels `troupe` runs
  spdlog::set_level(spdlog::level::warn);           // the calibration's per-round lines
  std::string spec_dir, json = "bench_sim_calibration.json", configs = "quickstart,d256";
  int rounds = 1;
  int64_t repeat = 8;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--rounds") rounds = std::atoi(next().c_str());
    else if (a == "--repeat") repeat = std::atoll(next().c_str());
    else if (a == "--configs") configs = next();
    else if (a == "--json") json = next();
    else if (spec_dir.empty() && a[0] != '-') spec_dir = a;
    else {
      std::fprintf(stderr, "usage: bench_sim_calibration SPEC_DIR [--rounds N] [--repeat N] [--configs quickstart,d256] [--json PATH]\n");
      return 2;
    }
  }
  if (spec_dir.empty() || rounds < 1 || repeat < 1) {
    std::fprintf(stderr, "usage: bench_sim_calibration SPEC_DIR [--rounds N >= 1] [--repeat N >= 1] ...\n");
    return 2;
  }
  const std::map<std::string, std::vector<Override>> overrides = {
      {"quickstart", {}},
      {"d256", {{"model.d_model", "256"}, {"model.n_heads", "8"}, {"model.expert_hidden", "512"}}}};
  const std::vector<std::pair<std::string, std::string>> schedules = {{"1f1b", "pipeline_1f1b.toml"},
                                                                      {"dualpipe", "pipeline_dualpipe.toml"}};
  try {
    std::vector<Row> rows;
    const std::string load_before = load_average();
    std::stringstream cs(configs);
    for (std::string cfg; std::getline(cs, cfg, ',');) {
      if (!overrides.count(cfg)) throw std::runtime_error("unknown config " + cfg + " (quickstart, d256)");
      for (int rnd = 0; rnd < rounds; ++rnd)
        for (const auto& [sched_name, file] : schedules) {
          const Spec spec = load_spec_file(spec_dir + "/" + file, overrides.at(cfg));
          Row row;
          row.config = cfg;
          row.schedule = sched_name;
          row.round = rnd;
          const RunPlan rp = make_run_plan(spec);  // the spec, translated once
          runtime::RuntimeOptions ro = rp.runtime;
          ro.trace.clear();
          ro.record_trace = true;
          runtime::Runtime real(ro);
          for (int w = 0; w < 2; ++w) real.step();
          std::vector<std::pair<int64_t, int64_t>> real_windows;
          CalibrateOptions co;
          co.repeat = repeat;
          co.between = [&] {
            const int64_t t0 = now_ns();
            real.step();
            real_windows.emplace_back(t0, now_ns());
            row.real_steps.push_back(static_cast<double>(real_windows.back().second - t0) / 1e6);
          };
          row.cal = calibrate(spec, rp, co);
          row.real = read_op_times(real.device_traces(), real_windows, spec, rp.plan);
          row.predicted = predict(spec, calibrated_costs(row.cal, true));
          row.predicted_alone = predict(spec, calibrated_costs(row.cal, true, true));
          row.predicted_flops = predict(spec, calibrated_costs(row.cal, false));
          row.measured = median(row.real_steps);
          row.measured_mean = 0;
          for (double x : row.real_steps) row.measured_mean += x / static_cast<double>(row.real_steps.size());
          row.best = *std::min_element(row.real_steps.begin(), row.real_steps.end());
          row.load = load_average();
          std::printf("%-10s %-8s round %d: predicted %7.1f ms (alone %7.1f, flops %7.1f), measured %7.1f ms (mean %7.1f, "
                      "best %7.1f): error %+5.1f%% (alone %+5.1f%%, flops %+5.1f%%); load %s\n",
                      cfg.c_str(), sched_name.c_str(), rnd, row.predicted, row.predicted_alone, row.predicted_flops,
                      row.measured, row.measured_mean, row.best, 100 * (row.predicted / row.measured - 1), 100 * (row.predicted_alone / row.measured - 1),
                      100 * (row.predicted_flops / row.measured - 1), row.load.c_str());
          std::fflush(stdout);
          rows.push_back(std::move(row));
        }
    }
    const std::string load_after = load_average();

    std::printf("\nbench_sim_calibration: sim step time (troupe calibrate's costs) vs the real runtime, 2 host devices, "
                "1 BLAS thread each;\n%d round(s), %lld timed calibration rounds per phase, a real step after each; "
                "load average before %s, after %s\n\n", rounds, static_cast<long long>(repeat), load_before.c_str(),
                load_after.c_str());
    std::printf("%-10s %-8s %5s %10s %10s %8s %12s %8s %12s %8s\n", "config", "schedule", "round", "predicted", "measured",
                "error", "alone pred", "error", "flops pred", "error");
    for (const Row& r : rows)
      std::printf("%-10s %-8s %5d %10.1f %10.1f %+7.1f%% %12.1f %+7.1f%% %12.1f %+7.1f%%\n", r.config.c_str(),
                  r.schedule.c_str(), r.round, r.predicted, r.measured, 100 * (r.predicted / r.measured - 1),
                  r.predicted_alone, 100 * (r.predicted_alone / r.measured - 1), r.predicted_flops,
                  100 * (r.predicted_flops / r.measured - 1));
    std::printf("\nbreakdown, ms: calibrated (2 busy) / inside the real run, per stage F and B; optimizer_ms / the real "
                "post-pipeline work per device; real busy per device and step\n");
    for (const Row& r : rows) {
      std::printf("%-10s %-8s %d:", r.config.c_str(), r.schedule.c_str(), r.round);
      for (size_t s = 0; s < r.real.f.size(); ++s)
        std::printf(" F%zu %.1f/%.1f B%zu %.1f/%.1f", s, r.cal.busy.f[s], r.real.f[s], s, r.cal.busy.b[s], r.real.b[s]);
      std::printf("; post %.1f /", r.cal.busy.optimizer);
      for (const auto& [d, ms] : r.real.post_by_device) std::printf(" %.1f", ms);
      std::printf("; busy");
      for (const auto& [d, ms] : r.real.busy_by_device) std::printf(" %.1f", ms);
      std::printf(" of %.1f\n", r.measured);
    }

    std::ostringstream js;
    js << "{\n  \"bench\": \"sim_calibration\",\n  \"rounds\": " << rounds << ",\n  \"repeat\": " << repeat
       << ",\n  \"load_before\": \"" << load_before << "\",\n  \"load_after\": \"" << load_after << "\",\n  \"rows\": [\n";
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      js << "    {\"config\": \"" << r.config << "\", \"schedule\": \"" << r.schedule << "\", \"round\": " << r.round
         << ", \"predicted_ms\": " << r.predicted << ", \"predicted_alone_ms\": " << r.predicted_alone
         << ", \"predicted_flops_ms\": " << r.predicted_flops << ", \"measured_ms\": " << r.measured
         << ", \"mean_ms\": " << r.measured_mean << ", \"best_ms\": " << r.best << ", \"error\": " << r.predicted / r.measured - 1
         << ", \"real_steps_ms\": " << list(r.real_steps) << ", \"load\": \"" << r.load << "\""
         << ", \"calibrated\": {\"forward_ms\": " << list(r.cal.busy.f) << ", \"backward_ms\": " << list(r.cal.busy.b)
         << ", \"optimizer_ms\": " << r.cal.busy.optimizer << ", \"link_latency_us\": " << r.cal.busy.gap_us
         << ", \"alone_forward_ms\": " << list(r.cal.alone.f) << ", \"alone_backward_ms\": " << list(r.cal.alone.b)
         << ", \"alone_optimizer_ms\": " << r.cal.alone.optimizer << ", \"flops_gflops\": " << r.cal.fit.gflops
         << ", \"flops_gbps\": " << r.cal.fit.gbps << ", \"flops_worst_op_error\": " << r.cal.fit.worst << "}"
         << ", \"real\": {\"forward_ms\": " << list(r.real.f) << ", \"backward_ms\": " << list(r.real.b)
         << ", \"post_by_device_ms\": " << map_text(r.real.post_by_device) << ", \"busy_by_device_ms\": "
         << map_text(r.real.busy_by_device) << "}}" << (i + 1 < rows.size() ? "," : "") << "\n";
    }
    js << "  ]\n}\n";
    std::ofstream f(json);
    if (!(f << js.str())) throw std::runtime_error("cannot write " + json);
    std::printf("wrote %s\n", json.c_str());
  } catch (const std::exception& e) {
    std::fprintf(stderr, "bench_sim_calibration: %s\n", e.what());
    return 1;
  }
  return 0;
}
