// `troupe run`: training as the spec says, with progress on the terminal, a
// log file and metrics.jsonl in the output directory. One device running the
// whole model trains on model::Trainer; any other topology (devices, stages,
// schedule, optimizer shards, data-parallel replicas) on the actor runtime,
// in this process or, with [topology] processes > 1, across the processes
// mpirun started (process 0 drives and writes the outputs; the others serve
// their actors). Both end with a checkpoint and an evaluation.
#include <unistd.h>

#include <csignal>

#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <mutex>
#include <spdlog/sinks/basic_file_sink.h>
#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include "kernels/blas_core.hpp"
#include "actors/runtime.hpp"
#include "actors/cluster/runtime_cluster.hpp"
#include "launch/mpi_bootstrap.hpp"
#include "launch/cli.hpp"
#include "launch/commands/rl.hpp"
#include "launch/observe/progress.hpp"
#include "launch/phases.hpp"
#include "launch/signals.hpp"
#include "launch/sim_plan.hpp"
#include "launch/run_plan.hpp"
#include "launch/train_options.hpp"
#include "model/checkpoint.hpp"

namespace troupe::launch {

namespace {

// {"type":"plan",...}: every actor of the plan (name, role, device, process,
// what it owns), the [[faults]] to inject and the trace file, for the dashboard.
std::string plan_line(const Spec& spec, const runtime::Plan& plan) {
  std::string actors = "[", faults = "[";
  for (const auto& a : plan.actors)
    actors += std::string(actors.size() > 1 ? "," : "") + JsonObject()
                                                            .add("name", a.name)
                                                            .add("role", std::string(runtime::role_name(a.role)))
                                                            .add("device", static_cast<int64_t>(a.device))
                                                            .add("process", static_cast<int64_t>(a.process))
                                                            .add("detail", a.detail)
                                                            .str();
  for (const auto& f : spec.faults) {
    // A target as written may use an alias (rank:K): name it as the plan does.
    const runtime::ActorPlan* a = plan.find(f.target);
    faults += std::string(faults.size() > 1 ? "," : "") + JsonObject()
                                                            .add("at_step", f.at_step)
                                                            .add("target", a ? a->name : f.target)
                                                            .add("kind", std::string(runtime::fault_kind_name(f.kind)))
                                                            .str();
  }
  return JsonObject()
      .add("type", std::string("plan"))
      .add_raw("actors", actors + "]")
      .add_raw("faults", faults + "]")
      .add("trace", spec.log.trace)
      .str();
}

// Restarts reported by the runtime's supervisor (on its own thread) are
// logged at once and written to metrics.jsonl, as {"type":"restart",...}
// lines, on the training thread before the next step's line.
class RestartMetrics : public model::TrainObserver {
 public:
  RestartMetrics(model::TrainObserver& inner, MetricsWriter& metrics) : inner_(inner), metrics_(metrics) {}
  void record(const runtime::RestartEvent& ev) {
    spdlog::warn("{}", ev.str());
    std::lock_guard<std::mutex> lock(mu_);
    pending_.push_back(ev);
  }
  void on_step(const model::StepMetrics& m) override {
    std::vector<runtime::RestartEvent> events;
    {
      std::lock_guard<std::mutex> lock(mu_);
      events.swap(pending_);
    }
    std::vector<std::string> rescales;
    {
      std::lock_guard<std::mutex> lock(mu_);
      rescales.swap(rescale_lines_);
    }
    for (const std::string& line : rescales) metrics_.write_line(line);
    for (const auto& ev : events)
      metrics_.write_line(restart_json(ev));
    inner_.on_step(m);
  }
  // A scale event ([[elastic]]): {"type":"rescale",...}, or an eplb move:
  // {"type":"rebalance",...}, before its step's line.
  void record(const runtime::RescaleReport& r) {
    spdlog::info("{}: {}", r.policy ? "rebalance" : "rescale", r.str());
    auto list = [](const std::vector<double>& v) {
      std::string out = "[";
      for (size_t i = 0; i < v.size(); ++i) {
        char b[32];
        std::snprintf(b, sizeof b, "%s%.6g", i ? "," : "", v[i]);
        out += b;
      }
      return out + "]";
    };
    JsonObject j;
    j.add("type", std::string(r.policy ? "rebalance" : "rescale"))
        .add("step", r.step)
        .add("old_shards", static_cast<int64_t>(r.old_shards))
        .add("new_shards", static_cast<int64_t>(r.new_shards))
        .add("spawned", static_cast<int64_t>(r.spawned))
        .add("retired", static_cast<int64_t>(r.retired))
        .add("moved_experts", static_cast<int64_t>(r.moved_experts))
        .add("bytes", r.bytes)
        .add("migration_seconds", r.migration_seconds)
        .add("step_seconds", r.step_seconds)
        .add_raw("max_mean_load_before", list(r.imbalance_before))
        .add_raw("max_mean_load_after", list(r.imbalance_after))
        .add("neighbour_step_seconds", r.neighbour_seconds);
    if (r.policy) j.add("trigger", std::string(r.threshold ? "imbalance_threshold" : "period"));
    if (!r.replicas.empty()) {  // [moe layer][expert] holders after the change (2: a second copy)
      std::string rep = "[";
      for (size_t l = 0; l < r.replicas.size(); ++l) {
        rep += l ? ",[" : "[";
        for (size_t e = 0; e < r.replicas[l].size(); ++e) rep += (e ? "," : "") + std::to_string(r.replicas[l][e]);
        rep += "]";
      }
      j.add_raw("replicas", rep + "]");
    }
    if (r.policy)  // eplb's migration-cost gate: the decision and what it weighed
      j.add("decision", std::string(r.made ? "made" : "skipped"))
          .add("layers_moved", static_cast<int64_t>(r.layers_moved))
          .add("layers_skipped", static_cast<int64_t>(r.layers_skipped))
          .add("predicted_gain_seconds", r.predicted_gain_seconds)
          .add("predicted_cost_seconds", r.predicted_cost_seconds)
          .add("cost_measured", static_cast<int64_t>(r.cost_measured));
    const std::string line = j.str();
    std::lock_guard<std::mutex> lock(mu_);
    rescale_lines_.push_back(line);
  }
  void on_eval(const model::EvalMetrics& m) override { inner_.on_eval(m); }
  void on_checkpoint(int64_t step, const std::string& dir) override { inner_.on_checkpoint(step, dir); }

 private:
  model::TrainObserver& inner_;
  MetricsWriter& metrics_;
  std::mutex mu_;
  std::vector<runtime::RestartEvent> pending_;
  std::vector<std::string> rescale_lines_;
};

// The runtime's view of MPI: endpoint exchange and agreement (mpi_bootstrap).
class MpiComm final : public runtime::ClusterComm {
 public:
  explicit MpiComm(const mpi::Session& s) : rank_(s.rank()), size_(s.size()) {}
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::vector<std::pair<std::string, uint16_t>> exchange(const std::string& host, uint16_t port, bool ok) override {
    auto all = mpi::exchange_endpoints(mpi::Endpoint{host, port}, ok);
    if (!all) throw std::runtime_error("exchange of CAF ports through MPI failed: " + caf::to_string(all.error()));
    std::vector<std::pair<std::string, uint16_t>> out;
    for (const auto& e : *all) out.emplace_back(e.host, e.port);
    return out;
  }
  bool all_ok(bool mine) override { return mpi::all_ok(mine); }
  std::string broadcast(const std::string& text) override {
    auto all = mpi::broadcast(text);
    if (!all) throw std::runtime_error("broadcast through MPI failed: " + caf::to_string(all.error()));
    return *all;
  }

 private:
  int rank_, size_;
};

// A process other than 0 has no outputs: its logs go to stderr tagged with the process.
void tag_process_logs(const Spec& spec, int rank) {
  auto console = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  auto logger = std::make_shared<spdlog::logger>("troupe", console);
  logger->set_level(spdlog::level::from_str(spec.log.level));
  logger->set_pattern("[%H:%M:%S.%e] [process " + std::to_string(rank) + "] [%l] %v");
  spdlog::set_default_logger(logger);
}

int serve_process(const Spec& spec, runtime::RuntimeOptions ro, const runtime::Plan& plan) {
  tag_process_logs(spec, ro.comm->rank());
  model::TrainObserver quiet;  // process 0 reports progress
  // mpirun forwards SIGINT/SIGTERM to every process: this one keeps serving
  // until process 0 has finished its step and ended the run.
  StopOnSignal signals;
  try {
    runtime::train(ro, quiet, &plan);
    spdlog::debug("run ended by process 0");
    return kExitOk;
  } catch (const std::exception& e) {
    spdlog::error("run failed: {}", e.what());
    return kExitRuntime;
  }
}

}  // namespace

// Logs go to stderr and to <out_dir>/troupe.log.
static void setup_logging(const Spec& spec, const std::string& out_dir) {
  auto console = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
  auto file = std::make_shared<spdlog::sinks::basic_file_sink_mt>(out_dir + "/troupe.log");
  auto logger = std::make_shared<spdlog::logger>("troupe", spdlog::sinks_init_list{console, file});
  logger->set_level(spdlog::level::from_str(spec.log.level));
  logger->flush_on(spdlog::level::info);
  spdlog::set_default_logger(logger);
}

static int run_process(const Spec& spec, const std::shared_ptr<runtime::ClusterComm>& comm);

int report_interrupted(const Spec& spec, const StopOnSignal& signals, int64_t steps_done) {
  const char* name = signal_name(signals.signal());
  spdlog::warn("stopped by {} after {} step(s) of this run; checkpoint saved to {} (continue with --set "
               "checkpoint.resume='\"{}\"')",
               name, steps_done, spec.checkpoint_dir(), spec.checkpoint_dir());
  return kExitInterrupted;
}

int command_run(const CliOptions&, const Spec& spec) {
  // Under mpirun MPI says which process this is; the spec must ask for as
  // many processes as were started (every process checks, none waits).
  std::unique_ptr<mpi::Session> session;
  if (mpi::launched_by_mpirun()) {
    int argc = 0;
    char** argv = nullptr;
    session = std::make_unique<mpi::Session>(argc, argv);
  }
  const int world = session ? session->size() : 1;
  if (world != spec.topology.processes) {
    if (!session || session->rank() == 0)
      std::fprintf(stderr,
                   "troupe: %s: [topology] processes = %lld, but %d process(es) were started; launch it with "
                   "`mpirun -np %lld troupe run ...`\n",
                   spec.source.c_str(), static_cast<long long>(spec.topology.processes), world,
                   static_cast<long long>(spec.topology.processes));
    return kExitBadSpec;
  }
  // process_loss = recover needs mpirun to let the job outlive a process:
  // without --enable-recovery Open MPI kills process 0 about a second after
  // process 1 dies. mpirun exports the setting to every rank.
  if (world == 2 && spec.topology.process_loss == runtime::ProcessLoss::recover) {
    const char* rec = std::getenv("OMPI_MCA_orte_enable_recovery");
    const bool on = rec && (std::string(rec) == "1" || std::string(rec) == "true");
    bool process_faults = false;
    for (const auto& f : spec.faults) {
      int p = 0;
      process_faults = process_faults || runtime::parse_process_target(f.target, p);
    }
    if (!on && process_faults) {
      if (session->rank() == 0)
        std::fprintf(stderr, "troupe: %s: [[faults]] on a process need `mpirun --enable-recovery` (else Open MPI ends "
                             "the whole job when the process dies, before process 0 can recover)\n", spec.source.c_str());
      return kExitBadSpec;
    }
    if (!on && session->rank() == 0)
      std::fprintf(stderr, "troupe: note: mpirun was started without --enable-recovery, so losing process 1 ends the job "
                           "(Open MPI kills it) although [topology] process_loss = \"recover\"\n");
  }
  std::shared_ptr<runtime::ClusterComm> comm;
  if (world > 1) comm = std::make_shared<MpiComm>(*session);
  const int rc = run_process(spec, comm);
  launch_report_exit(rc);  // `troupe launch` returns process 0's own status
  // A peer process was lost and survived: no MPI call any more, not even
  // MPI_Finalize (it can wait forever on the dead peer), so end here.
  if (world > 1 && runtime::survived_process_loss()) {
    spdlog::default_logger()->flush();
    std::fflush(stdout);
    std::fflush(stderr);
    std::_Exit(rc);
  }
  // A failed multi-process run ends the whole job: MPI_Finalize could wait
  // forever on a lost or hung peer.
  if (rc != kExitOk && world > 1) {
    spdlog::default_logger()->flush();
    std::fflush(stderr);
    session->abort(rc);
  }
  return rc;
}

// Pretraining (run.mode = "pretrain", and phase 1 of "sft_rl"): the actor
// runtime or the single-process trainer, with progress and metrics lines.
// Returns an ExitCode; throws on failure (run_process maps the exception).
int run_pretrain(const Spec& spec, const RunPlan& plan, const std::shared_ptr<runtime::ClusterComm>& comm, MetricsWriter& metrics,
                 ProgressStyle style, const StopOnSignal& signals, model::TrainSummary* out) {
  ProgressObserver progress(style, spec.run.steps, spec.log.progress_every, &metrics);
  model::TrainSummary summary;
  if (uses_runtime(spec)) {
    const auto& t = spec.topology;
    spdlog::info("actor runtime: schedule {}, {} stage(s) x {} replica(s), {} microbatch(es) per replica, "
                 "{} expert shard(s) per MoE layer, {} optimizer shard(s) on {} device(s), {} process(es)",
                 sched::to_string(t.schedule), t.stages, t.data_parallel, t.microbatches, t.expert_shards, t.optimizer_shards,
                 t.devices, t.processes);
    RestartMetrics observer(progress, metrics);
    runtime::RuntimeOptions ro = plan.runtime;
    ro.comm = comm;
    ro.train.stop = signals.flag();
    ro.on_restart = [&observer](const runtime::RestartEvent& ev) { observer.record(ev); };
    ro.on_rescale = [&observer](const runtime::RescaleReport& r) { observer.record(r); };
    if (!spec.elastic.empty())
      spdlog::info("elastic experts: {} scale event(s) ([[elastic]])", spec.elastic.size());
    if (!ro.faults.empty())
      spdlog::info("failure injection: {} fault(s) ({} from [chaos]); supervisor restarts at most {} time(s) per {} step(s){}",
                   ro.faults.size(), ro.faults.size() - spec.faults.size(), spec.run.max_restarts, spec.run.restart_window,
                   spec.run.restart_period > 0 ? fmt::format(" and per {} s", spec.run.restart_period) : std::string());
    // The fault summary: on stdout, and as a {"type":"faults",...} line.
    if (!ro.faults.empty())
      ro.on_fault_summary = [&metrics](const runtime::FaultSummary& f) {
        std::printf("%s\n", f.str().c_str());
        std::fflush(stdout);
        JsonObject injected;
        for (const auto& [kind, n] : f.injected) injected.add(kind.c_str(), n);
        JsonObject mttr;
        for (const auto& [role, r] : f.repairs)
          mttr.add_raw(role.c_str(), JsonObject().add("count", r.count).add("mean_ms", 1e3 * r.mean()).add("max_ms", 1e3 * r.max_seconds).str());
        metrics.write_line(JsonObject()
                               .add("type", std::string("faults"))
                               .add_raw("injected", injected.str())
                               .add("total", f.total_injected())
                               .add("recovered", f.recovered)
                               .add("restarts", f.restarts)
                               .add("replays", f.replays)
                               .add("suspicions", f.suspicions)
                               .add("gaps", f.gaps)
                               .add("damaged", f.damaged)
                               .add("partitioned", f.partitioned)
                               .add("processes_lost", f.processes_lost)
                               .add("detect_s", f.processes_lost > 0 ? f.detect_seconds / static_cast<double>(f.processes_lost) : 0.0)
                               .add("steps", f.steps)
                               .add("wall_s", f.wall_seconds)
                               .add("useful_s", f.useful_seconds)
                               .add("lost_s", f.lost_seconds())
                               .add("goodput", f.goodput())
                               .add_raw("mttr", mttr.str())
                               .str());
      };
    summary = runtime::train(ro, observer, &plan.plan);  // the plan made once, from these options
  } else {
    model::TrainOptions to = train_options(spec);
    to.stop = signals.flag();
    summary = model::train(to, progress);
  }
  progress.finish();
  if (out) *out = summary;
  metrics.write_line(JsonObject()
                         .add("type", std::string("end"))
                         .add("steps", summary.steps_done)
                         .add("final_loss", summary.final_loss)
                         .add("final_val_loss", summary.final_val_loss)
                         .add("accuracy", summary.accuracy)
                         .add_raw("interrupted", summary.interrupted ? "true" : "false")
                         .str());
  if (summary.interrupted) return report_interrupted(spec, signals, summary.steps_done);
  if (std::isnan(summary.accuracy))
    spdlog::info("done: {} steps, final loss {:.4f}, val loss {:.4f}", summary.steps_done, summary.final_loss,
                 summary.final_val_loss);
  else
    spdlog::info("done: {} steps, final loss {:.4f}, val loss {:.4f}, held-out exact match {:.1f}%",
                 summary.steps_done, summary.final_loss, summary.final_val_loss, 100.0 * summary.accuracy);
  if (!std::isfinite(summary.final_loss)) {
    spdlog::error("training diverged (loss is not finite)");
    return kExitRuntime;
  }
  return kExitOk;
}

// What the pretraining (SFT) evaluator's exact match scores, for the start
// line (the dashboard prints it beside that chart): with a target split it is
// the RL target, problems SFT rows never show, not the SFT task.
static std::string eval_scores(const Spec& spec) {
  if (spec.data.target_pairs.empty()) return "Exact match over data.eval_problems held-out problems of the task SFT trains on.";
  return "Exact match over the held-out TARGET problems (data.target_pairs \"" + spec.data.target_pairs +
         "\"): the RL target, which SFT rows never show, so it stays low after SFT by design.";
}

static int run_process(const Spec& spec, const std::shared_ptr<runtime::ClusterComm>& comm) {
  const RunPlan plan = make_run_plan(spec);  // the spec, translated once for everything below
  if (comm && comm->rank() != 0) {
    if (spec.run.mode == RunMode::rl) {
      tag_process_logs(spec, comm->rank());
      return serve_rl_generators(spec, plan, comm);
    }
    runtime::RuntimeOptions ro = plan.runtime;
    ro.comm = comm;
    return serve_process(spec, std::move(ro), plan.plan);
  }
  if (const int rc = check_input_checkpoints(spec); rc != kExitOk) return rc;
  const std::string out_dir = spec.out_dir();
  std::error_code ec;
  std::filesystem::create_directories(out_dir, ec);
  if (ec) {
    std::fprintf(stderr, "troupe: cannot create output directory %s: %s\n", out_dir.c_str(), ec.message().c_str());
    return kExitRuntime;
  }
  setup_logging(spec, out_dir);
  // A process killed during a checkpoint save leaves <dir>.tmp-<pid>-<n>
  // behind: removed here, beside every checkpoint this job writes or resumes
  // from, as the rings' stale segments are (never a live process's).
  std::vector<std::string> checkpoints{spec.checkpoint_dir(), spec.checkpoint.resume};
  if (spec.run.mode == RunMode::sft_rl) checkpoints.push_back(sft_phase_spec(spec).checkpoint_dir());
  for (const std::string& dir : checkpoints)
    if (!dir.empty())
      if (const int n = model::clean_checkpoint_leftovers(dir); n > 0)
        spdlog::info("removed {} leftover(s) of an interrupted checkpoint save beside {}", n, dir);
  const runtime::Plan& topo = plan.plan;
  // The kernels OpenBLAS uses (kernels/blas_core.hpp: troupe's portable family unless the spec or the user chose).
  const std::string blas_core = kernels::blas_core();
  bool off_portable = false;
  const std::string blas_family = kernels::describe_host_kernels(spec.topology.host_kernels, &off_portable);
  // What configure_openblas set (or the user did): how long idle OpenBLAS threads spin.
  const char* timeout_env = std::getenv("OPENBLAS_THREAD_TIMEOUT");
  const std::string blas_thread_timeout = timeout_env ? timeout_env : "";
  spdlog::info("run '{}' from {}: {} parameters, {} steps, {} device(s) ({}), output in {}; OpenBLAS kernels {}",
               spec.run.name, spec.source, topo.parameters, spec.run.steps, spec.topology.devices,
               device_kind_name(spec.topology.device_kind), out_dir, blas_family);
  if (off_portable && spec.topology.device_kind == DeviceKind::host)
    spdlog::warn("[topology] host_kernels = \"portable\", but OpenBLAS runs {}", blas_family);

  MetricsWriter metrics;
  const ProgressStyle style = resolve_progress(spec.log.progress);
  try {
    if (spec.log.metrics) {
      metrics.open(out_dir + "/metrics.jsonl");
      metrics.write_line(JsonObject()
                             .add("type", std::string("start"))
                             .add("name", spec.run.name)
                             .add("spec", spec.source)
                             .add("seed", spec.run.seed)
                             .add("steps", spec.run.steps)
                             .add("parameters", topo.parameters)
                             .add("openblas_core", blas_core)
                             .add("host_kernels", std::string(kernels::host_kernels_name(spec.topology.host_kernels)))
                             .add("openblas_thread_timeout", blas_thread_timeout)
                             .add("eval_scores", eval_scores(spec))
                             .str());
      // The actor tree for `troupe dashboard` (sim runs have no actors).
      if (spec.topology.device_kind != DeviceKind::sim) metrics.write_line(plan_line(spec, topo));
    }
    // Sim devices: timings on a virtual clock, no math (launch/commands/sim.cpp).
    if (spec.topology.device_kind == DeviceKind::sim) return run_sim(spec, plan, metrics);
    StopOnSignal signals;  // stop after the running step, save, exit 130
    // Online RL: the synchronous generate -> reward -> train loop (rl/trainer.hpp).
    if (spec.run.mode == RunMode::rl) return run_rl(spec, plan, metrics, style, signals, nullptr, comm);
    if (spec.run.mode == RunMode::reward_model) return run_reward_model(spec, metrics, style, signals);
    if (spec.run.mode == RunMode::sft_rl) return run_sft_rl(spec, metrics, style, signals);
    return run_pretrain(spec, plan, comm, metrics, style, signals);
  } catch (const model::CheckpointError& e) {
    spdlog::error("{}", e.what());
    return kExitBadInput;
  } catch (const std::exception& e) {
    spdlog::error("run failed: {}", e.what());
    return kExitRuntime;
  }
  return kExitOk;
}

}  // namespace troupe::launch
