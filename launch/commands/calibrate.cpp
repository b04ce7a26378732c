// `troupe calibrate SPEC [--out FILE] [--repeat N] [--model flops|measured]`:
// measures the spec's per-stage op times on this machine (launch/
// calibrate.hpp says how) and prints the [sim] table that makes a sim spec
// ([topology] device_kind = "sim") predict the real runtime; --out also
// writes it, through a temporary file and a rename. The flops model is
// fitted too and its per-op error printed; cost_model = "measured" is written
// unless the fit is within 5% on every op (or --model says otherwise).
#include <unistd.h>

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <spdlog/spdlog.h>

#include "model/atomic_file.hpp"
#include "launch/calibrate.hpp"
#include "launch/calibrate_rl.hpp"
#include "launch/cli.hpp"
#include "launch/signals.hpp"

namespace troupe::launch {
namespace {

// Checks, before any measuring, that `path` can be written (a probe file
// next to it, removed again).
void check_writable(const std::string& path) {
  if (std::filesystem::is_directory(path)) throw std::runtime_error(path + " is a directory");
  model::write_file_atomically(path + ".probe", "");
  std::filesystem::remove(path + ".probe");
}

double pct(double predicted, double measured) { return 100.0 * (predicted / measured - 1.0); }

// Writes `table` to stdout and, with --out, to the file. Returns an ExitCode.
int emit_table(const std::string& table, const std::string& out) {
  std::fputs(table.c_str(), stdout);
  std::fflush(stdout);
  if (!out.empty()) {
    try {
      model::write_file_atomically(out, table);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "troupe calibrate: %s\n", e.what());
      return kExitRuntime;
    }
    std::fprintf(stderr, "troupe calibrate: wrote %s\n", out.c_str());
  }
  return kExitOk;
}

// run.mode = "rl": the synchronous loop on one device, then data-parallel
// over the spec's devices (launch/calibrate_rl.hpp).
int calibrate_rl_command(const CliOptions& opt, const Spec& spec, const StopOnSignal& stop) {
  if (!opt.cost_model.empty()) {
    std::fprintf(stderr, "troupe calibrate: --model applies to pipeline specs; an RL spec's table has one model\n");
    return kExitUsage;
  }
  RlCalibrateOptions co;
  if (opt.repeat > 0) co.repeat = opt.repeat;
  co.stop = stop.flag();
  co.signals = &stop;
  spdlog::info("calibrate {}: the synchronous RL loop, {} warm-up + {} timed step(s) on one device, then data-parallel "
               "over {} device(s), then the decoupled loop's trainer", spec.source, co.warmup, co.repeat, spec.topology.devices);
  RlCalibration c;
  try {
    c = calibrate_rl(spec, co);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "troupe calibrate: %s\n", e.what());
    return kExitRuntime;
  }
  if (c.interrupted || stop.requested()) {
    std::fprintf(stderr, "troupe calibrate: interrupted (%s); nothing was written\n", signal_name(stop.signal()));
    return kExitInterrupted;
  }
  return emit_table(rl_sim_table(spec, opt.positional.empty() ? spec.source : opt.positional[0], c, co), opt.file);
}

}  // namespace

int command_calibrate(const CliOptions& opt, const Spec& spec) {
  if (const std::string why = calibrate_refusal(spec); !why.empty()) {
    std::fprintf(stderr, "troupe calibrate: %s: %s\n", spec.source.c_str(), why.c_str());
    return kExitBadSpec;
  }
  const std::string& out = opt.file;
  try {
    if (!out.empty()) check_writable(out);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "troupe calibrate: --out %s: %s\n", out.c_str(), e.what());
    return kExitBadInput;
  }
  StopOnSignal stop;
  if (spec.run.mode == RunMode::rl) return calibrate_rl_command(opt, spec, stop);
  CalibrateOptions co;
  if (opt.repeat > 0) co.repeat = opt.repeat;
  co.stop = stop.flag();
  spdlog::info("calibrate {}: {} warm-up + {} timed round(s) with every op alone on one device, then with {} device(s) "
               "busy at once, then a copy-bandwidth test", spec.source, co.warmup, co.repeat, spec.topology.devices);
  Calibration c;
  try {
    c = calibrate(spec, make_run_plan(spec), co);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "troupe calibrate: %s\n", e.what());
    return kExitRuntime;
  }
  if (c.interrupted || stop.requested()) {
    std::fprintf(stderr, "troupe calibrate: interrupted (%s); nothing was written\n",
                 signal_name(stop.signal()));
    return kExitInterrupted;
  }
  const bool measured = opt.cost_model == "measured" || (opt.cost_model.empty() && c.fit.worst > 0.05);

  const OpTimes& a = c.alone;
  const OpTimes& m = c.busy;
  std::printf("calibrate %s: %lld copy step(s) timed with all devices busy; one device alone: step %.1f ms (busy %.1f ms)\n", spec.source.c_str(),
              static_cast<long long>(m.steps), a.step, a.busy_by_device.empty() ? 0.0 : a.busy_by_device.begin()->second);
  const std::string fb = "F " + std::to_string(c.copies) + " busy", bb = "B " + std::to_string(c.copies) + " busy";
  std::printf("  %-6s %9s %9s %11s %11s %15s %15s\n", "stage", "F alone", "B alone", fb.c_str(), bb.c_str(),
              "flops F (err)", "flops B (err)");
  for (size_t s = 0; s < m.f.size(); ++s)
    std::printf("  %-6zu %9.3f %9.3f %11.3f %11.3f %8.3f (%+4.0f%%) %8.3f (%+4.0f%%)\n", s, a.f[s], a.b[s], m.f[s], m.b[s],
                c.fit.f[s], pct(c.fit.f[s], m.f[s]), c.fit.b[s], pct(c.fit.b[s], m.b[s]));
  std::printf("  after the pipeline (ms), per device of the spec's placement, alone / %d busy:", c.copies);
  for (const auto& [d, ms] : m.post_by_device)
    std::printf(" device %d %.2f / %.2f", d, a.post_by_device.count(d) ? a.post_by_device.at(d) : 0.0, ms);
  std::printf("\n  idle gap between closures (median): %.1f us\n\n", m.gap_us);
  return emit_table(sim_table(spec, opt.positional.empty() ? spec.source : opt.positional[0], c, measured, co), out);
}

}  // namespace troupe::launch
