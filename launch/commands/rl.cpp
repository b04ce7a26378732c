// `troupe run` for run.mode = "rl": the synchronous RL loop (rl/trainer.hpp)
// or, with rl.sync = "fixed_lag" / "latest", the decoupled actors (actors/rl/), with
// progress on the terminal and one JSON line per RL step, evaluation and
// checkpoint in metrics.jsonl (decoupled runs add "rl_actors" lines per step,
// "restart" lines and an "rl_actors_end" summary).
#include <chrono>
#include <cmath>
#include <map>
#include <string>
#include <vector>
#include <spdlog/spdlog.h>

#include "actors/cluster/runtime_cluster.hpp"
#include "actors/rl/rl_actors.hpp"
#include "actors/rl/runtime_policy.hpp"
#include "launch/cli.hpp"
#include "launch/commands/rl.hpp"
#include "model/tokenizer.hpp"
#include "launch/observe/rollouts_log.hpp"
#include "launch/run_plan.hpp"
#include "launch/train_options.hpp"
#include "model/data.hpp"
#include "rl/trainer.hpp"

namespace troupe::launch {

rl::RlTrainOptions rl_train_options(const Spec& spec) {
  // The keys RL shares with pretraining map as train_options maps them.
  const model::TrainOptions t = train_options(spec);
  rl::RlTrainOptions o;
  o.model = t.model;
  o.optim = t.optim;
  o.data = t.data;
  o.seed = t.seed;
  o.steps = t.steps;
  o.checkpoint_every = t.checkpoint_every;
  o.checkpoint_dir = t.checkpoint_dir;
  o.resume_from = t.resume_from;
  o.backend = t.backend;
  o.rl = spec.rl;
  o.eval_every = spec.run.eval_every;  // 0: only after the last step (rl::train)
  return o;
}

namespace {

// A version-lag histogram as a JSON object {"lag": tokens, ...}.
std::string histogram_json(const std::map<int64_t, int64_t>& h) {
  std::string out = "{";
  for (const auto& [lag, n] : h) out += (out.size() > 1 ? "," : "") + ("\"" + std::to_string(lag) + "\":" + std::to_string(n));
  return out + "}";
}

std::string number_list_json(const std::vector<double>& xs) {
  std::string out = "[";
  for (size_t i = 0; i < xs.size(); ++i) {
    char b[32];
    std::snprintf(b, sizeof b, "%s%.4f", i ? "," : "", std::isfinite(xs[i]) ? xs[i] : 0.0);
    out += b;
  }
  return out + "]";
}

class RlProgress final : public runtime::RlActorObserver {
 public:
  RlProgress(ProgressStyle style, int64_t total, int64_t every, MetricsWriter& metrics)
      : style_(style), total_(total), every_(every), metrics_(metrics),
        t0_(std::chrono::steady_clock::now()) {}

  void on_step(const rl::RlStepMetrics& m) override {
    if (metrics_.is_open()) {
      JsonObject line = JsonObject()
                              .add("type", std::string("rl_step"))
                              .add("step", m.step)
                              .add("loss", m.loss)
                              .add("pg_loss", m.pg_loss)
                              .add("reward_mean", m.reward_mean)
                              .add("reward_std", m.reward_std)
                              .add("correct", m.correct)
                              .add("groups", m.groups)
                              .add("zero_variance_groups", m.zero_variance_groups)
                              .add("zero_variance_share", m.zero_variance_share)
                              .add("kl_ref", m.kl_ref)
                              .add("kl_ref_max", m.kl_ref_max)
                              .add("kl_ref_k1", m.kl_ref_k1)
                              .add("kl_ref_weighted", m.kl_ref_weighted)
                              .add("entropy", m.entropy)
                              .add("clip_low", m.clip_low)
                              .add("clip_high", m.clip_high)
                              .add("ratio_min", m.ratio_min)
                              .add("ratio_mean", m.ratio_mean)
                              .add("ratio_max", m.ratio_max)
                              .add("importance_weight_min", m.weight_min)
                              .add("importance_weight_mean", m.weight_mean)
                              .add("importance_weight_max", m.weight_max)
                              .add("approx_kl", m.approx_kl)
                              .add("response_length", m.response_length)
                              .add("finished", m.finished)
                              .add("grad_norm", m.grad_norm)
                              .add("lr", m.lr)
                              .add("aux_loss", m.aux_loss)
                              .add("gen_tokens", m.gen_tokens)
                              .add("train_tokens", m.train_tokens)
                              .add("gen_tokens_per_s", m.gen_tokens_per_s)
                              .add("train_tokens_per_s", m.train_tokens_per_s)
                              .add("gen_seconds", m.gen_seconds)
                              .add("reward_seconds", m.reward_seconds)
                              .add("train_seconds", m.train_seconds)
                              .add("step_seconds", m.step_seconds)
                              .add("train_serial_seconds", m.train_serial_seconds)
                              .add("wall_seconds", wall());
      // The data-parallel loop: each device's idle share of the step.
      if (!m.train_idle_seconds.empty())
        line.add_raw("device_idle", number_list_json(m.device_idle_shares()))
            .add_raw("gen_idle_seconds", number_list_json(m.gen_idle_seconds))
            .add_raw("train_idle_seconds", number_list_json(m.train_idle_seconds));
      metrics_.write_line(line.str());
    }
    if (style_ == ProgressStyle::off) return;
    if (m.step % every_ == 0 || m.step == total_ || m.step == 1 || style_ == ProgressStyle::bar)
      std::fprintf(stderr,
                   "rl step %lld/%lld reward %.3f (std %.3f, exact %.1f%%, zero-var groups %.0f%%) kl %.4f "
                   "entropy %.3f clip %.3f/%.3f len %.1f gen %.0f tok/s train %.0f tok/s\n",
                   static_cast<long long>(m.step), static_cast<long long>(total_), m.reward_mean, m.reward_std,
                   100.0 * m.correct, 100.0 * m.zero_variance_share, m.kl_ref, m.entropy, m.clip_low, m.clip_high,
                   m.response_length, m.gen_tokens_per_s, m.train_tokens_per_s);
  }

  void on_actor_step(const runtime::RlActorStepMetrics& m) override {
    if (!metrics_.is_open()) return;
    metrics_.write_line(JsonObject()
                            .add("type", std::string("rl_actors"))
                            .add("step", m.step)
                            .add("sampled_version", m.sampled_version)
                            .add_raw("staleness", histogram_json(m.staleness))
                            .add("buffer_depth", m.buffer_depth)
                            .add("trainer_wait_seconds", m.trainer_wait_seconds)
                            .add("weight_sync_seconds", m.weight_sync_seconds)
                            .add("weight_sync_bytes", m.weight_sync_bytes)
                            .add("paused_seconds", m.paused_seconds)
                            .add("mixed_completions", m.mixed_completions)
                            .add("generator_idle", m.generator_idle)
                            .add("trainer_idle", m.trainer_idle)
                            .add("discarded", m.discarded)
                            .add("duplicates", m.duplicates)
                            .str());
  }

  void on_restart(const runtime::RestartEvent& ev) override {
    spdlog::warn("{}", ev.str());
    if (metrics_.is_open())
      metrics_.write_line(restart_json(ev));
  }

  void on_eval(const rl::RlEvalMetrics& e) override {
    if (metrics_.is_open()) {
      JsonObject j;
      j.add("type", std::string("rl_eval"))
          .add("step", e.step)
          .add("problems", e.problems)
          .add("exact_match", e.exact_match)
          .add("mean_reward", e.mean_reward)
          .add("k", e.k)
          .add("pass_at_k", e.pass_at_k);
      if (e.sft_problems > 0)
        j.add("sft_problems", e.sft_problems)
            .add("sft_exact_match", e.sft_exact_match)
            .add("sft_mean_reward", e.sft_mean_reward)
            .add("sft_pass_at_k", e.sft_pass_at_k);
      metrics_.write_line(j.add("seconds", e.seconds).add("wall_seconds", wall()).str());
    }
    spdlog::info("rl eval step {}: held-out exact match {:.1f}% (greedy), pass@{} {:.1f}%, mean reward {:.3f} "
                 "({} problems){}",
                 e.step, 100.0 * e.exact_match, e.k, 100.0 * e.pass_at_k, e.mean_reward, e.problems,
                 e.sft_problems > 0 ? fmt::format("; SFT side {:.1f}% (pass@{} {:.1f}%, {} problems)",
                                                  100.0 * e.sft_exact_match, e.k, 100.0 * e.sft_pass_at_k,
                                                  e.sft_problems)
                                    : std::string());
  }

  void on_checkpoint(int64_t step, const std::string& dir) override {
    if (metrics_.is_open())
      metrics_.write_line(JsonObject().add("type", std::string("checkpoint")).add("step", step).add("dir", dir).str());
    spdlog::info("checkpoint step {} -> {}", step, dir);
  }

 private:
  // Seconds since the run started (curves of accuracy against wall time).
  double wall() const {
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }
  ProgressStyle style_;
  int64_t total_, every_;
  MetricsWriter& metrics_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace

// What the faults of a decoupled RL run did: the faults whose step was
// reached, by kind; the restarts (a kill whose target died before its
// armed job ran is not restarted twice); the weight syncs retried or
// restarted for a lost one (drops). A log line and a {"type":"faults"} line.
static void write_rl_fault_summary(const std::vector<runtime::FaultSpec>& faults, const runtime::RlActorReport& rep,
                            int64_t steps_done, MetricsWriter& metrics) {
  std::map<std::string, int64_t> injected;
  int64_t total = 0;
  for (const auto& f : faults)
    if (f.at_step <= steps_done) ++injected[runtime::fault_kind_name(f.kind)], ++total;
  JsonObject kinds;
  std::string text;
  for (const auto& [kind, n] : injected) {
    kinds.add(kind.c_str(), n);
    text += (text.empty() ? "" : ", ") + std::to_string(n) + " " + kind;
  }
  spdlog::info("faults: {} injected ({}); {} restart(s), {} weight sync(s) retried, {} generator restart(s) for a "
               "missed sync, {} reward program restart(s); ledger: {} duplicate(s) dropped, {} discarded, {} trained twice",
               total, text.empty() ? "none" : text, rep.restarts.size(), rep.sync_retries, rep.sync_restarts,
               rep.reward_program_restarts, rep.ledger.duplicates, rep.ledger.discarded, rep.ledger.double_trained);
  metrics.write_line(JsonObject()
                         .add("type", std::string("faults"))
                         .add_raw("injected", kinds.str())
                         .add("total", total)
                         .add("restarts", static_cast<int64_t>(rep.restarts.size()))
                         .add("sync_retries", rep.sync_retries)
                         .add("sync_restarts", rep.sync_restarts)
                         .add("reward_program_restarts", rep.reward_program_restarts)
                         .add("duplicates_dropped", rep.ledger.duplicates)
                         .add("discarded", rep.ledger.discarded)
                         .add("double_trained", rep.ledger.double_trained)
                         .str());
}

// Where generators run across processes, and the test hook of a lost one.
runtime::RlProcesses rl_processes(const Spec& spec, const RunPlan& plan, const std::shared_ptr<runtime::ClusterComm>& comm) {
  runtime::RlProcesses p;
  if (!comm || comm->size() <= 1) return p;
  p.comm = comm;
  p.generator_process = plan.generator_process;
  p.auth = spec.topology.auth;
  p.auth_dir = spec.topology.auth_dir;
  p.interface = spec.topology.interface;
  p.peer_timeout = spec.topology.peer_timeout;
  p.heartbeat_pause = spec.topology.heartbeat_pause;
  p.bulk_shm_bytes = spec.topology.bulk_shm_bytes;
  p.recover = spec.topology.process_loss == runtime::ProcessLoss::recover;
  for (const runtime::FaultSpec& f : spec.faults)
    if (int q = 0; runtime::parse_process_target(f.target, q) && q == comm->rank()) p.kill_at_step = f.at_step;
  return p;
}

// The decoupled run's options: the RL actors' faults ([[faults]] on
// generator, reward and buffer targets, and [chaos]), and the trainer on the
// actor runtime with its own faults when rl.trainer = "actors".
runtime::RlActorOptions decoupled_options(const Spec& spec, const RunPlan& plan, rl::RlTrainOptions options,
                                          const std::shared_ptr<runtime::ClusterComm>& comm, size_t* trainer_fault_count) {
  runtime::RlActorOptions ao;
  ao.train = std::move(options);
  std::vector<runtime::FaultSpec> trainer_faults;
  for (const runtime::FaultSpec& f : spec.faults) {
    int q = 0;
    if (runtime::parse_process_target(f.target, q)) continue;  // rl_processes
    (is_trainer_fault_target(f.target) ? trainer_faults : ao.faults).push_back(f);
  }
  if (trainer_fault_count) *trainer_fault_count = trainer_faults.size();
  if (plan.rl_trainer) {
    runtime::RuntimeOptions t = *plan.rl_trainer;
    t.on_restart = [](const runtime::RestartEvent& e) {
      spdlog::warn("trainer: {} went down ({}) in optimizer update {}; restarted{}", e.actor, e.cause, e.step,
                   e.replayed ? ", the update replayed" : "");
    };
    ao.train.make_updater = runtime::runtime_policy_updater(
        std::move(t), spec.rl.policy, spec.rl.temperature > 0 ? spec.rl.temperature : 1.0);
  }
  ao.faults.insert(ao.faults.end(), plan.chaos.begin(), plan.chaos.end());  // [chaos]: generators and reward actors
  ao.max_restarts = static_cast<int>(spec.run.max_restarts);
  ao.processes = rl_processes(spec, plan, comm);
  return ao;
}

int serve_rl_generators(const Spec& spec, const RunPlan& plan, const std::shared_ptr<runtime::ClusterComm>& comm) {
  StopOnSignal signals;  // mpirun forwards SIGINT/SIGTERM: process 0 ends the run, this one follows
  try {
    const runtime::RlActorOptions ao = decoupled_options(spec, plan, rl_train_options(spec), comm, nullptr);
    runtime::serve_generators(ao);
    spdlog::debug("run ended by process 0");
    return kExitOk;
  } catch (const std::exception& e) {
    spdlog::error("run failed: {}", e.what());
    return kExitRuntime;
  }
}

// rl.sync = "fixed_lag" / "latest": the decoupled actors, then their summary.
rl::RlSummary run_decoupled(const Spec& spec, const RunPlan& plan, rl::RlTrainOptions options, RlProgress& progress,
                            MetricsWriter& metrics, const std::shared_ptr<runtime::ClusterComm>& comm) {
  const auto& r = spec.rl;
  const int processes = comm ? comm->size() : 1;
  spdlog::info("decoupled online RL ({}, max_staleness {}): {} generator(s), {} reward actor(s), trainer on device 0{}",
               rl::sync_mode_name(r.sync), r.max_staleness, r.generators, r.reward_actors,
               processes > 1 ? fmt::format("; {} process(es): generators on processes 1..{}", processes, processes - 1) : std::string());
  for (const runtime::ActorPlan& a : plan.plan.rl_actors)
    spdlog::info("  {} ({}{}): {}", a.name, a.device < 0 ? std::string("control") : "device " + std::to_string(a.device),
                 processes > 1 ? ", process " + std::to_string(a.process) : std::string(), a.detail);
  size_t trainer_faults = 0;
  runtime::RlActorOptions ao = decoupled_options(spec, plan, std::move(options), comm, &trainer_faults);
  if (plan.rl_trainer) {
    const runtime::RuntimeOptions& t = *plan.rl_trainer;
    spdlog::info("trainer on the actor runtime: {} stage rank(s) ({}), {} expert shard(s) per MoE layer, {} optimizer "
                 "shard(s) on device(s) 0..{}; {} trainer fault(s)",
                 t.stages, sched::to_string(t.schedule), t.expert_shards, t.optimizer_shards, t.devices - 1,
                 trainer_faults);
  }
  const size_t chaos = plan.chaos.size();
  if (!ao.faults.empty())
    spdlog::info("failure injection: {} fault(s) ({} from [chaos]) on the RL actors; at most {} restart(s) in the run",
                 ao.faults.size(), chaos, spec.run.max_restarts);
  runtime::RlActorReport rep;
  const rl::RlSummary s = runtime::train_decoupled(ao, progress, &rep);
  if (!ao.faults.empty() || rep.reward_program_restarts > 0) write_rl_fault_summary(ao.faults, rep, s.steps_done, metrics);
  metrics.write_line(JsonObject()
                         .add("type", std::string("rl_actors_end"))
                         .add("sync", std::string(rl::sync_mode_name(r.sync)))
                         .add("max_staleness", r.max_staleness)
                         .add("generators", r.generators)
                         .add("reward_actors", r.reward_actors)
                         .add_raw("staleness", histogram_json(rep.staleness))
                         .add("wall_seconds", rep.wall_seconds)
                         .add("generator_idle", rep.generator_idle)
                         .add("trainer_idle", rep.trainer_idle)
                         .add("weight_sync_seconds", rep.weight_sync_seconds)
                         .add("weight_sync_bytes", rep.weight_sync_bytes)
                         .add("weight_syncs", rep.weight_syncs)
                         .add("sync_retries", rep.sync_retries)
                         .add("sync_restarts", rep.sync_restarts)
                         .add("paused_seconds", rep.paused_seconds)
                         .add("mixed_completions", rep.mixed_completions)
                         .add("max_buffer_depth", rep.max_buffer_depth)
                         .add("groups_admitted", static_cast<int64_t>(rep.ledger.admitted.size()))
                         .add("groups_trained", static_cast<int64_t>(rep.ledger.trained.size()))
                         .add("duplicates_dropped", rep.ledger.duplicates)
                         .add("discarded", rep.ledger.discarded)
                         .add("double_trained", rep.ledger.double_trained)
                         .add("restarts", static_cast<int64_t>(rep.restarts.size()))
                         .add("processes", static_cast<int64_t>(comm ? comm->size() : 1))
                         .add("processes_lost", rep.processes_lost)
                         .add("remote_syncs", rep.remote_syncs)
                         .add("remote_sync_bytes", rep.remote_sync_bytes)
                         .add("remote_sync_seconds", rep.remote_sync_seconds)
                         .add("remote_encode_seconds", rep.remote_encode_seconds)
                         .add("remote_decode_seconds", rep.remote_decode_seconds)
                         .add("memcpy_seconds", rep.memcpy_seconds)
                         .str());
  if (rep.remote_syncs > 0) {
    // Per version sent to another process, against a memcpy of the same bytes in this run.
    const double n = static_cast<double>(rep.remote_syncs);
    const double bytes = static_cast<double>(rep.remote_sync_bytes) / n;
    const double per = rep.remote_sync_seconds / n;
    spdlog::info("weight sync across processes: {} version(s) of {:.1f} MB, {:.2f} ms each round trip ({:.2f} GB/s; encode "
                 "{:.2f} ms, decode {:.2f} ms); a memcpy of the same bytes {:.2f} ms ({:.2f} GB/s): {:.2f}x its time",
                 rep.remote_syncs, bytes / 1e6, 1e3 * per, bytes / per / 1e9, 1e3 * rep.remote_encode_seconds / n,
                 1e3 * rep.remote_decode_seconds / n, 1e3 * rep.memcpy_seconds,
                 rep.memcpy_seconds > 0 ? bytes / rep.memcpy_seconds / 1e9 : 0.0, rep.memcpy_seconds > 0 ? per / rep.memcpy_seconds : 0.0);
  }
  if (rep.processes_lost > 0)
    spdlog::warn("{} generator process(es) lost; their generators went on on process 0", rep.processes_lost);
  spdlog::info("actors: generator idle {:.1f}%, trainer idle {:.1f}% of {:.2f} s; {} weight sync(s), {:.1f} MB in {:.3f} s "
               "({} retried, {} generator restart(s) for a missed deadline); "
               "ledger: {} groups admitted, {} trained, {} duplicate(s) dropped, {} discarded; {} restart(s)",
               100.0 * rep.generator_idle, 100.0 * rep.trainer_idle, rep.wall_seconds, rep.weight_syncs,
               static_cast<double>(rep.weight_sync_bytes) / 1e6, rep.weight_sync_seconds, rep.sync_retries,
               rep.sync_restarts, rep.ledger.admitted.size(),
               rep.ledger.trained.size(), rep.ledger.duplicates, rep.ledger.discarded, rep.restarts.size());
  return s;
}

int run_rl(const Spec& spec, const RunPlan& plan, MetricsWriter& metrics, ProgressStyle style, const StopOnSignal& signals,
           rl::RlSummary* out, const std::shared_ptr<runtime::ClusterComm>& comm) {
  const auto& r = spec.rl;
  spdlog::info("online RL ({}): task {}, {} prompts x {} completions per step, "
               "{} new tokens max, temperature {}, loss {}, init {}, reward {}",
               rl::decoupled(r.sync)       ? std::string("decoupled actors")
               : sync_data_parallel(spec) ? "synchronous, one process, data-parallel over " +
                                                std::to_string(spec.topology.data_parallel) + " devices"
                                          : std::string("synchronous, one process"),
               r.prompts.empty() ? r.task : "the prompts of " + r.prompts,
               r.prompts_per_step, r.group_size, r.max_new_tokens, r.temperature,
               rl::loss_kind_name(r.policy.kind), r.init.empty() ? std::string("(fresh initialisation)") : r.init,
               r.reward == rl::RewardSource::model ? "the learned reward model " + r.reward_model
               : r.prompts.empty()                  ? std::string("the rule verifier")
                                                    : std::string("the \"") + rl::reward_source_name(r.reward) + "\" reward");
  RlProgress progress(style, spec.run.steps, spec.log.progress_every, metrics);
  rl::RlTrainOptions options = rl_train_options(spec);
  options.stop = signals.flag();
  if (sync_data_parallel(spec)) options.devices = spec.topology.data_parallel;
  // log.rollouts = N: every N-th step's groups as text to rollouts.jsonl.
  std::unique_ptr<RolloutLog> rollouts;
  if (spec.log.rollouts > 0) {
    // The text of a user's task comes from its tokenizer, the built-in task's from its data source.
    std::function<std::string(const std::vector<int32_t>&)> decode;
    if (!r.prompts.empty()) {
      std::shared_ptr<const model::Tokenizer> tok = model::make_tokenizer(options.data.tokenizer);
      decode = [tok](const std::vector<int32_t>& t) { return tok->decode(t); };
    } else {
      std::shared_ptr<const model::DataSource> data =
          model::make_data_source(options.data, options.seed, options.model.seq_len);
      decode = [data](const std::vector<int32_t>& t) { return data->decode(t); };
    }
    rollouts = std::make_unique<RolloutLog>(spec.out_dir() + "/rollouts.jsonl", decode);
    options.rollouts_every = spec.log.rollouts;
    options.on_rollouts = [log = rollouts.get()](const rl::StepRollouts& r, const rl::ScoredBatch& sb) { log->write(r, sb); };
    spdlog::info("rollouts: every {} step(s)' groups to {}/rollouts.jsonl", spec.log.rollouts, spec.out_dir());
  }
  const rl::RlSummary s = rl::decoupled(r.sync) ? run_decoupled(spec, plan, options, progress, metrics, comm)
                                                             : rl::train(options, progress);
  if (out) *out = s;
  metrics.write_line(JsonObject()
                         .add("type", std::string("end"))
                         .add("steps", s.steps_done)
                         .add("final_reward", s.final_reward)
                         .add("exact_match_before", s.first_eval.exact_match)
                         .add("exact_match_after", s.last_eval.exact_match)
                         .add_raw("interrupted", s.interrupted ? "true" : "false")
                         .str());
  if (s.interrupted) return out ? kExitInterrupted : report_interrupted(spec, signals, s.steps_done);
  spdlog::info("done: {} RL steps; held-out exact match {:.1f}% -> {:.1f}%, pass@{} {:.1f}% -> {:.1f}%",
               s.steps_done, 100.0 * s.first_eval.exact_match, 100.0 * s.last_eval.exact_match, s.last_eval.k,
               100.0 * s.first_eval.pass_at_k, 100.0 * s.last_eval.pass_at_k);
  if (!std::isfinite(s.final_reward)) {
    spdlog::error("RL training diverged (reward is not finite)");
    return kExitRuntime;
  }
  return kExitOk;
}

}  // namespace troupe::launch
