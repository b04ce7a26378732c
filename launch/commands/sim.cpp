// Sim devices in the CLI (see sim_plan.hpp): `troupe validate` shows the
// simulated devices and their costs, `troupe run` runs steps through the sim
// actors on a virtual clock. No math runs: the output is timings only.
#include "launch/sim_plan.hpp"

#include <algorithm>
#include <cstdio>
#include <set>
#include <sstream>
#include <stdexcept>
#include <spdlog/spdlog.h>

#include "actors/sim/sim_faults.hpp"
#include "launch/observe/progress.hpp"
#include "launch/spec/keys.hpp"
#include "launch/run_plan.hpp"

namespace troupe::launch {
namespace {

double ms(int64_t ns) { return static_cast<double>(ns) / 1e6; }

std::string fmt(const char* f, double x) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, x);
  return buf;
}

int64_t mb_sequences(const Spec& s) {
  return s.data.batch_size / (s.topology.microbatches * s.topology.data_parallel);
}

// The stages rank `rank` holds, e.g. "s0", "s0 s7" (dualpipev), "s0/d0 s3/d1" (dualpipe).
std::string stages_held(const sched::Layout& l, int rank) {
  std::set<std::pair<int, int>> held;
  for (const sched::Op& op : sched::make_schedule(l.kind, rank, l.num_ranks, l.num_chunks))
    if (op.type == sched::OpType::F || op.type == sched::OpType::FB) held.insert({op.f.dir, op.f.stage});
  std::string out;
  for (const auto& [dir, stage] : held) {
    if (!out.empty()) out += ' ';
    out += 's';
    out += std::to_string(stage);
    if (l.num_dirs > 1) {
      out += "/d";
      out += std::to_string(dir);
    }
  }
  return out;
}

std::string cost_model_text(const Spec& s) {
  const auto& c = s.sim;
  std::string out = std::string("cost model ") + sim::cost_model_name(c.model) + ": ";
  if (c.model == sim::CostModel::fixed)
    out += "F " + fmt("%g", c.forward_ms) + " ms, B " + fmt("%g", c.backward_ms) + " ms (full backward, W " +
           fmt("%g", c.weight_ms) + " ms of it) per micro-batch and stage";
  else if (c.model == sim::CostModel::flops)
    out += fmt("%g", c.gflops) + " GFLOP/s and " + fmt("%g", c.gbps) + " GB/s per device (op time = max(FLOPs/rate, bytes/bandwidth))";
  else
    out += "per stage F " + float_list_text(c.stage_forward_ms) + " ms, B " + float_list_text(c.stage_backward_ms) +
           " ms (full backward, W " + (c.stage_weight_ms.empty() ? std::string("none") : float_list_text(c.stage_weight_ms) + " ms") +
           " of it) per micro-batch (troupe calibrate)";
  const int64_t bytes = sim::message_bytes(s.model, mb_sequences(s));
  out += "; link " + fmt("%g", c.link_latency_us) + " us latency, " +
         (c.link_gbps > 0 ? fmt("%g", c.link_gbps) + " GB/s" : std::string("unlimited bandwidth")) + " (a message is " +
         fmt("%.3g", static_cast<double>(bytes) / (1 << 20)) + " MiB)";
  out += "; optimizer step: " + (c.optimizer_ms > 0 ? fmt("%g", c.optimizer_ms) + " ms (fixed)" : std::string("not modelled"));
  return out;
}

std::string fault_model_text(const Spec& s, int64_t devices) {
  const auto& c = s.sim;
  if (c.mtbf_hours <= 0) return "device failures: not modelled ([sim] mtbf_hours = 0)";
  return "device failures: MTBF " + fmt("%g", c.mtbf_hours) + " h per device, so one every " +
         fmt("%.3g", c.mtbf_hours / static_cast<double>(devices)) + " h for the job; goodput over " +
         fmt("%g", c.fault_horizon_hours) + " h: troupe (detect " + fmt("%g", c.detect_s) + " s, recover " +
         fmt("%g", c.recover_s) + " s, replay the step, snapshots " + fmt("%g", 100.0 * c.snapshot_overhead) +
         "% of a step) vs checkpoint-restart every " + fmt("%g", c.checkpoint_every_min) + " min (write " +
         fmt("%g", c.checkpoint_write_s) + " s, restart " + fmt("%g", c.checkpoint_restart_s) + " s)";
}

sim::FaultModel fault_model(const Spec& s, int64_t devices, double step_s) {
  const auto& c = s.sim;
  sim::FaultModel m;
  m.devices = devices;
  m.step_s = step_s;
  m.mtbf_hours = c.mtbf_hours;
  m.horizon_hours = c.fault_horizon_hours;
  m.seed = static_cast<uint64_t>(s.run.seed);
  m.detect_s = c.detect_s;
  m.recover_s = c.recover_s;
  m.snapshot_overhead = c.snapshot_overhead;
  m.checkpoint_every_min = c.checkpoint_every_min;
  m.checkpoint_write_s = c.checkpoint_write_s;
  m.checkpoint_restart_s = c.checkpoint_restart_s;
  return m;
}

// The goodput study on the simulated step time: a table on stdout and a
// `sim_faults` line per policy in metrics.jsonl.
void report_fault_study(const Spec& s, int64_t devices, double step_s, MetricsWriter& metrics) {
  const sim::FaultStudy st = sim::study_faults(fault_model(s, devices, step_s));
  std::printf("\nsim faults: %lld failure(s) of %lld device(s) in %g h (job MTBF %.3g h), step %.4g s, seed %lld\n",
              static_cast<long long>(st.failures), static_cast<long long>(devices), s.sim.fault_horizon_hours,
              st.job_mtbf_hours, step_s, static_cast<long long>(s.run.seed));
  std::printf("  %-42s %8s %12s %12s %12s %14s\n", "policy", "goodput", "lost work h", "downtime h", "overhead h",
              "max lost steps");
  for (const sim::PolicyResult* r : {&st.troupe, &st.checkpoint, &st.checkpoint_young_daly}) {
    std::string name = r->name;
    if (r == &st.checkpoint) name += " (" + fmt("%g", s.sim.checkpoint_every_min) + " min)";
    if (r == &st.checkpoint_young_daly) name += " (" + fmt("%.3g", st.young_daly_min) + " min)";
    std::printf("  %-42s %7.2f%% %12.2f %12.2f %12.2f %14.1f\n", name.c_str(), 100.0 * r->goodput, r->lost_work_s / 3600.0,
                r->downtime_s / 3600.0, r->overhead_s / 3600.0, r->max_lost_steps);
    metrics.write_line(JsonObject()
                           .add("type", std::string("sim_faults"))
                           .add("policy", name)
                           .add("failures", st.failures)
                           .add("goodput", r->goodput)
                           .add("steps", r->steps)
                           .add("lost_work_s", r->lost_work_s)
                           .add("downtime_s", r->downtime_s)
                           .add("overhead_s", r->overhead_s)
                           .add("max_lost_steps", r->max_lost_steps)
                           .str());
  }
  std::fflush(stdout);
}

}  // namespace

sim::SimOptions sim_options(const Spec& s) {
  const auto& t = s.topology;
  sim::SimOptions o;
  o.kind = t.schedule;
  o.stages = static_cast<int>(t.stages);
  o.chunks = static_cast<int>(t.microbatches);
  o.replicas = static_cast<int>(t.data_parallel);
  o.steps = s.run.steps;
  const sched::Layout l = sched::make_layout(o.kind, o.stages, o.chunks);
  o.stage_costs = sim::stage_costs(s.sim, s.model, mb_sequences(s), l.num_stages);
  o.link_latency_ns = sim::us_to_ns(s.sim.link_latency_us);
  o.link_bytes_per_ns = s.sim.link_gbps;
  o.message_bytes = sim::message_bytes(s.model, mb_sequences(s));
  o.d_model = s.model.d_model;
  o.optimizer_ns = sim::ms_to_ns(s.sim.optimizer_ms);
  o.record_timeline = !s.log.trace.empty();
  return o;
}

std::string format_sim_plan(const Spec& s) {
  if (is_ep_sim(s)) return format_ep_sim_plan(s);
  const sim::SimOptions o = sim_options(s);
  const sched::Layout l = sched::make_layout(o.kind, o.stages, o.chunks);
  std::ostringstream os;
  os << "sim devices: " << o.replicas * o.stages << " (" << o.replicas << " replica(s) x " << o.stages
     << " pipeline rank(s)), schedule " << sched::to_string(s.topology.schedule) << ", " << o.chunks << " micro-batch(es) of "
     << mb_sequences(s) << " sequence(s) per replica and step; no math runs: timings only\n";
  os << cost_model_text(s) << "\n";
  os << fault_model_text(s, static_cast<int64_t>(o.replicas) * o.stages) << "\n";
  const auto work = sim::stage_work(s.model, mb_sequences(s), l.num_stages);
  os << "stage  layers     F ms        B ms        W ms        GFLOP (F+B+W)\n";
  for (size_t i = 0; i < o.stage_costs.size(); ++i) {
    const auto& c = o.stage_costs[i];
    const auto& w = work[i];
    char line[160];
    std::snprintf(line, sizeof line, "%-6zu %3lld..%-5lld %-11.4g %-11.4g %-11.4g %.4g\n", i,
                  static_cast<long long>(w.layer_begin), static_cast<long long>(w.layer_end - 1), ms(c.f), ms(c.b),
                  ms(c.w), (w.f_flops + w.bin_flops + w.w_flops) / 1e9);
    os << line;
  }
  os << "device d = replica * " << o.stages << " + rank; every replica's rank k holds the same stages:\n";
  for (int r = 0; r < o.stages; ++r) os << "  rank " << r << ": " << stages_held(l, r) << "\n";
  for (int rep = 0; rep < o.replicas; ++rep)
    os << "  devices " << rep * o.stages << ".." << (rep + 1) * o.stages - 1 << ": replica " << rep << "\n";
  return os.str();
}

namespace {

// The pipeline ranks the run plan places on each device, by the plan's names
// ("stage:3/replica:1"): the trace labels its tracks with them.
std::vector<std::string> device_ranks(const runtime::Plan& plan) {
  std::vector<std::string> out(plan.devices.size());
  for (const runtime::ActorPlan& a : plan.actors)
    if (a.role == runtime::Role::Rank && a.device >= 0) {
      std::string& x = out[static_cast<size_t>(a.device)];
      x += (x.empty() ? "" : ", ") + a.name;
    }
  return out;
}

}  // namespace

int run_sim(const Spec& s, const RunPlan& plan, MetricsWriter& metrics) {
  if (s.run.mode == RunMode::rl) return run_rl_sim(s, metrics);
  if (is_ep_sim(s)) return run_ep_sim(s, metrics);
  sim::SimOptions o = sim_options(s);
  const int devices = o.replicas * o.stages;
  spdlog::info("sim devices: {} ({} replica(s) x {} rank(s)), schedule {}, {} micro-batch(es) per replica. "
               "No math runs: timings only, on a virtual clock.", devices, o.replicas, o.stages,
               sched::to_string(s.topology.schedule), o.chunks);
  spdlog::info("{}", cost_model_text(s));
  if (s.sim.mtbf_hours > 0) spdlog::info("{}", fault_model_text(s, devices));
  const int64_t every = std::max<int64_t>(1, s.log.progress_every);
  o.on_step = [&](const sim::StepReport& r) {
    if (s.log.progress != ProgressStyle::off && (r.step % every == 0 || r.step == o.steps || r.step == 1))
      spdlog::info("sim step {}/{}: step time {:.4f} ms virtual (pipeline {:.4f} ms), {} messages, simulated in {:.3f} s",
                   r.step, o.steps, ms(r.step_ns), ms(r.pipeline_ns), r.messages, r.wall_seconds);
    metrics.write_line(JsonObject()
                           .add("type", std::string("sim_step"))
                           .add("step", r.step)
                           .add("step_ms", ms(r.step_ns))
                           .add("pipeline_ms", ms(r.pipeline_ns))
                           .add("messages", static_cast<int64_t>(r.messages))
                           .add("wall_seconds", r.wall_seconds)
                           .str());
  };
  const sim::SimResult res = sim::simulate(o);
  if (!res.completed) throw std::runtime_error("simulation failed: " + res.error);

  // Replicas run identical op lists and costs; say so only if it held.
  bool same = true;
  for (int d = o.stages; d < devices; ++d)
    same = same && res.busy[d] == res.busy[d % o.stages] && res.finish[d] == res.finish[d % o.stages];
  const sched::Layout l = sched::make_layout(o.kind, o.stages, o.chunks);
  int64_t busy_sum = 0;
  for (int64_t b : res.busy) busy_sum += b;
  const double span = static_cast<double>(std::max<int64_t>(res.makespan, 1));  // all-zero costs: no division by 0
  const double bubble_fraction = 1.0 - static_cast<double>(busy_sum) / (static_cast<double>(devices) * span);
  std::printf("\nsim summary (virtual time; no math ran): %d device(s), schedule %s, %d micro-batch(es) per replica\n",
              devices, std::string(sched::to_string(s.topology.schedule)).c_str(), o.chunks);
  std::printf("  step time %.4f ms = pipeline %.4f ms + optimizer %s\n", ms(res.step_ns()), ms(res.makespan),
              o.optimizer_ns > 0 ? (fmt("%.4f", ms(o.optimizer_ns)) + " ms").c_str() : "(not modelled)");
  std::printf("  bubble (idle share of device time in the pipeline): %.2f%%\n", 100.0 * bubble_fraction);
  std::printf("  simulated %lld step(s) in %.3f s wall (%llu messages between devices)\n",
              static_cast<long long>(res.steps.size()), res.wall_seconds, static_cast<unsigned long long>(res.messages));
  std::printf("%s\n", same ? (o.replicas > 1 ? "  per device (every replica has the same timeline; replica 0 shown):"
                                             : "  per device:")
                           : "  per device (replica 0; other replicas differ):");
  std::printf("  %-6s %-14s %12s %12s %12s %8s\n", "device", "stages", "busy ms", "idle ms", "finish ms", "busy %");
  for (int r = 0; r < o.stages; ++r)
    std::printf("  %-6d %-14s %12.4f %12.4f %12.4f %7.2f%%\n", r, stages_held(l, r).c_str(), ms(res.busy[r]),
                ms(res.bubble(r)), ms(res.finish[r]), 100.0 * static_cast<double>(res.busy[r]) / span);
  std::fflush(stdout);
  metrics.write_line(JsonObject()
                         .add("type", std::string("end"))
                         .add("steps", static_cast<int64_t>(res.steps.size()))
                         .add("sim", std::string("timings only"))
                         .add("step_ms", ms(res.step_ns()))
                         .add("pipeline_ms", ms(res.makespan))
                         .add("bubble_fraction", bubble_fraction)
                         .add("wall_seconds", res.wall_seconds)
                         .str());
  if (s.sim.mtbf_hours > 0) report_fault_study(s, devices, static_cast<double>(res.step_ns()) / 1e9, metrics);
  if (!s.log.trace.empty()) {
    sim::write_sim_trace(s.log.trace, o, res, device_ranks(plan.plan));
    spdlog::info("trace (virtual time, one track per device) written to {}", s.log.trace);
  }
  spdlog::info("done: {} simulated step(s), step time {:.4f} ms (virtual); no parameters were computed, so no checkpoint",
               res.steps.size(), ms(res.step_ns()));
  return 0;
}

}  // namespace troupe::launch
