// Expert parallelism on sim devices ([topology] device_kind = "sim" with
// expert_shards > 1): static, eplb and perfectly balanced expert placements
// on the virtual clock of actors/sim/ep_sim.hpp (`troupe validate` prints the
// model, `troupe run` the comparison table and metrics lines). No math runs.
#include <algorithm>
#include <cstdio>
#include <spdlog/spdlog.h>

#include "actors/sim/ep_sim.hpp"
#include "launch/observe/progress.hpp"
#include "launch/sim_plan.hpp"

namespace troupe::launch {
namespace {

double ms(int64_t ns) { return static_cast<double>(ns) / 1e6; }

// Mean step time from step 1 on (eplb's first rebalance; step 0 runs on the
// placement for uniform loads), or over all steps when there is only one.
double steady_ms(const sim::EpSimResult& r) {
  if (r.step_ns.size() < 2) return ms(r.total_ns);
  return ms(r.total_ns - r.step_ns.front()) / static_cast<double>(r.step_ns.size() - 1);
}

}  // namespace

sim::EpSimOptions ep_sim_options(const Spec& s) {
  sim::EpSimOptions o;
  o.devices = static_cast<int>(s.topology.devices);
  o.experts = s.model.n_experts;
  const int64_t fit = (o.experts + o.devices - 1) / o.devices;
  o.slots_per_device = static_cast<int>(s.sim.ep_slots_per_device > 0 ? s.sim.ep_slots_per_device : fit);
  o.layers = static_cast<int>(s.model.n_layers);
  o.steps = static_cast<int>(s.run.steps);
  o.tokens = s.data.batch_size * s.model.seq_len;
  o.top_k = s.model.top_k;
  o.d_model = s.model.d_model;
  o.expert_hidden = s.model.expert_hidden;
  o.flops_per_ns = s.sim.gflops;  // GFLOP/s = FLOPs per ns
  o.link_bytes_per_ns = s.sim.link_gbps;
  o.link_latency_ns = static_cast<int64_t>(s.sim.link_latency_us * 1000.0 + 0.5);
  o.zipf = s.sim.ep_zipf;
  o.drift_every = static_cast<int>(s.sim.ep_drift_every);
  o.drift = s.sim.ep_drift;
  o.ema = s.sim.ep_ema;
  o.rebalance_every = static_cast<int>(s.sim.ep_rebalance_every);
  o.tolerance = s.sim.ep_tolerance;
  o.imbalance_threshold = s.sim.ep_imbalance_threshold;
  o.bytes_per_param = s.sim.ep_bytes_per_param;
  o.seed = static_cast<uint64_t>(s.run.seed);
  return o;
}

std::string format_ep_sim_plan(const Spec& s) {
  const sim::EpSimOptions o = ep_sim_options(s);
  const int64_t slots = static_cast<int64_t>(o.devices) * o.slots_per_device;
  char buf[1600];
  std::snprintf(buf, sizeof buf,
                "sim expert parallelism (timings only, no math): %d devices, one EP rank each; %lld experts x %d MoE "
                "layer(s), top-%lld, %lld tokens per step (batch_size x seq_len), %d step(s)\n"
                "  expert: SwiGLU d_model %lld x hidden %lld, %.4g GFLOP per token copy (forward + backward) at %g GFLOP/s; "
                "link %g GB/s, %g us latency; 4 all-to-alls per layer and step (dispatch, combine, and their backward)\n"
                "  loads: Zipf exponent %g over a per-layer ranking; %s\n"
                "  placements: static (even contiguous ranges, %lld..%lld experts per device), eplb (%d slots per device: "
                "%lld redundant for replicas of hot experts; incremental every %d step(s)%s from a moving average of weight %g, "
                "tolerance %g, moved only when the gain over %d steps beats the migration of %lld bytes per parameter), "
                "balanced (the lower bound)\n",
                o.devices, static_cast<long long>(o.experts), o.layers, static_cast<long long>(o.top_k),
                static_cast<long long>(o.tokens), o.steps, static_cast<long long>(o.d_model),
                static_cast<long long>(o.expert_hidden), sim::ep_flops_per_copy(o) / 1e9, o.flops_per_ns, o.link_bytes_per_ns,
                static_cast<double>(o.link_latency_ns) / 1e3, o.zipf,
                o.drift_every > 0 ? ("every " + std::to_string(o.drift_every) + " steps " + std::to_string(static_cast<int>(o.drift * 100 + 0.5)) +
                                     "% of the experts change rank").c_str()
                                  : "no drift",
                static_cast<long long>(o.experts / o.devices), static_cast<long long>((o.experts + o.devices - 1) / o.devices),
                o.slots_per_device, static_cast<long long>(slots - o.experts), o.rebalance_every,
                o.imbalance_threshold > 0 ? (" and when a layer's max/mean exceeds " + std::to_string(o.imbalance_threshold).substr(0, 5)).c_str() : "",
                o.ema, o.tolerance,
                o.rebalance_every, static_cast<long long>(o.bytes_per_param));
  return buf;
}

int run_ep_sim(const Spec& s, MetricsWriter& metrics) {
  const sim::EpSimOptions o = ep_sim_options(s);
  spdlog::info("sim expert parallelism on {} devices: static, eplb and balanced placements; no math runs, timings only", o.devices);
  const sim::EpSimResult rows[] = {sim::simulate_ep_static(o), sim::simulate_ep_eplb(o), sim::simulate_ep_balanced(o)};
  const double balanced = static_cast<double>(rows[2].total_ns), balanced_steady = steady_ms(rows[2]);
  std::printf("\nsim expert-parallel summary (virtual time; no math ran): %d devices, %lld experts x %d layers, %d steps\n",
              o.devices, static_cast<long long>(o.experts), o.layers, o.steps);
  std::printf("  %-9s %10s %12s %14s %12s %14s %16s %11s %12s %16s\n", "placement", "step ms", "vs balanced", "from step 1",
              "vs balanced", "max/mean mean", "after rebalance", "rebalances", "copies moved", "stall ms tot/max");
  for (const auto& r : rows) {
    double imb = 0;
    for (double x : r.imbalance) imb += x;
    imb /= static_cast<double>(r.imbalance.size());
    const double step = ms(r.total_ns) / o.steps, vs = static_cast<double>(r.total_ns) / balanced;
    const bool eplb = r.placement == "eplb";
    char after[32] = "-", reb[32] = "-", moved[32] = "-", stall[48] = "-";
    if (eplb) {
      std::snprintf(after, sizeof after, "%.3f", r.after_rebalance);
      std::snprintf(reb, sizeof reb, "%d/%d", r.rebalances, r.rebalances + r.skipped);
      std::snprintf(moved, sizeof moved, "%lld", static_cast<long long>(r.copies_moved));
      std::snprintf(stall, sizeof stall, "%.2f/%.2f", ms(r.stall_ns), ms(r.max_stall_ns));
    }
    const double steady = steady_ms(r);
    std::printf("  %-9s %10.3f %11.4fx %14.3f %11.4fx %14.3f %16s %11s %12s %16s\n", r.placement.c_str(), step, vs, steady,
                steady / balanced_steady, imb, after, reb, moved, stall);
    JsonObject j;
    j.add("type", std::string("sim_ep")).add("placement", r.placement).add("step_ms", step).add("vs_balanced", vs)
        .add("step_ms_from_step_1", steady)
        .add("max_mean_load", imb);
    if (eplb)
      j.add("max_mean_after_rebalance", r.after_rebalance).add("max_mean_planned", r.planned)
          .add("rebalances", static_cast<int64_t>(r.rebalances)).add("rebalances_skipped", static_cast<int64_t>(r.skipped))
          .add("copies_moved", r.copies_moved).add("stall_ms", ms(r.stall_ns)).add("max_stall_ms", ms(r.max_stall_ns));
    metrics.write_line(j.str());
  }
  const auto& e = rows[1];
  // The goals, said plainly: a rebalanced layer's max/mean on the
  // step it is first used (the loads it was placed for are a moving
  // average, so drift since then counts against it), and the step time.
  const double within = steady_ms(e) / balanced_steady - 1.0;
  std::printf("  eplb: max/mean %.3f under the moving-average loads it placed for, %.3f on the rebalanced steps' real loads "
              "(goal <= 1.05: %s); step time from step 1 on %.2f%% above balanced, stalls included (goal <= 5%%: %s); "
              "largest stall %.1f ms = %.2f balanced steps\n",
              e.planned, e.after_rebalance, e.rebalances == 0 ? "no rebalance made" : e.after_rebalance <= 1.05 ? "met" : "not met",
              100 * within, within <= 0.05 ? "met" : "not met", ms(e.max_stall_ns), ms(e.max_stall_ns) / balanced_steady);
  std::fflush(stdout);
  metrics.write_line(JsonObject().add("type", std::string("end")).add("sim", std::string("timings only")).add("steps", static_cast<int64_t>(o.steps)).str());
  spdlog::info("done: sim expert parallelism on {} devices; no parameters were computed, so no checkpoint", o.devices);
  return 0;
}

}  // namespace troupe::launch
