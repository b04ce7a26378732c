// `troupe run` for run.mode = "sft_rl", the built-in default: phase 1 trains
// the spec's pretraining run (SFT on the actor runtime) and saves to
// <checkpoint>_sft; phase 2 runs RL ([rl], decoupled actors with fixed_lag)
// from that checkpoint and saves to the spec's checkpoint directory. Each phase
// is the ordinary run of its derived spec (launch/phases.hpp) through the
// ordinary drivers (run_pretrain, run_rl): nothing here trains. What this file
// adds is the sequencing, the resume rule and the before/after table of both
// tasks (stdout, troupe.log and a {"type":"summary"} line in metrics.jsonl).
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstdio>
#include <spdlog/spdlog.h>

#include "launch/cli.hpp"
#include "launch/commands/rl.hpp"
#include "launch/phases.hpp"
#include "model/checkpoint.hpp"
#include "rl/task.hpp"
#include "rl/trainer.hpp"
#include "model/clock.hpp"

namespace troupe::launch {

namespace {

using model::Clock;
using model::seconds_since;


std::string pct(double x) {
  if (!std::isfinite(x)) return "-";
  char b[32];
  std::snprintf(b, sizeof b, "%.1f%%", 100.0 * x);
  return b;
}

// Phase 2 stopped after some steps: its checkpoint continues it (bit for
// bit for synchronous and fixed_lag runs; a latest run goes on under its
// staleness bound). Before its first step the way on is phase 1's checkpoint.
int report_rl_interrupted(const Spec& spec, const StopOnSignal& signals, const std::string& sft_dir, int64_t steps) {
  const char* name = signal_name(signals.signal());
  if (steps > 0)
    spdlog::warn("stopped by {} in phase 2 after {} RL step(s) of this run; checkpoint saved to {} (continue the job "
                 "with --set checkpoint.resume='\"{}\"')",
                 name, steps, spec.checkpoint_dir(), spec.checkpoint_dir());
  else
    spdlog::warn("stopped by {} in phase 2 after {} RL step(s); phase 1's checkpoint is {}. `troupe run` with --set "
                 "checkpoint.resume='\"{}\"' skips phase 1 and runs phase 2 {}",
                 name, steps, sft_dir, sft_dir, "from its start");
  return kExitInterrupted;
}

// Phase 1's checkpoint scored as phase 2's first evaluation scores it (the
// RL target and the SFT side of the split): needed when phase 2 is resumed,
// whose run starts past step 0 and so does not evaluate its init.
rl::RlEvalMetrics init_eval(const Spec& spec, const std::string& dir) {
  rl::RlTrainOptions o = rl_train_options(rl_phase_spec(spec, dir));
  o.checkpoint_dir.clear();
  o.resume_from.clear();
  rl::RlTrainer trainer(o);
  return trainer.evaluate();
}

}  // namespace

int run_sft_rl(const Spec& spec, MetricsWriter& metrics, ProgressStyle style, const StopOnSignal& signals) {
  const Spec sft = sft_phase_spec(spec);
  const std::string sft_dir = sft.checkpoint_dir();
  // Resume: a checkpoint before the end of phase 1 continues phase 1; one at
  // its last step (phase 1 done) skips to phase 2 (check_input_checkpoints
  // refuses anything later).
  // Phase 2's own checkpoint (the spec's checkpoint directory) resumes phase
  // 2, from phase 1's finished checkpoint (check_input_checkpoints checked both).
  const bool resume_rl = resumes_phase2(spec);
  int64_t resumed_at = -1;
  if (!spec.checkpoint.resume.empty() && !resume_rl) resumed_at = model::load_checkpoint(spec.checkpoint.resume).step;
  const bool skip_sft = resume_rl || resumed_at >= spec.run.steps;
  const std::string init = skip_sft && !resume_rl ? spec.checkpoint.resume : sft_dir;
  const Spec rl_spec = rl_phase_spec(spec, init);
  const std::string split = spec.data.target_pairs.empty()
                                ? std::string("no split: both tasks are every held-out problem")
                                : "data.target_pairs \"" + spec.data.target_pairs + "\" at column " +
                                      std::to_string(spec.data.target_column);

  // Phase 1: SFT.
  const auto t1 = Clock::now();
  metrics.write_line(JsonObject()
                         .add("type", std::string("phase"))
                         .add("phase", std::string("sft"))
                         .add("index", int64_t{1})
                         .add("steps", spec.run.steps)
                         .add("checkpoint", sft_dir)
                         .str());
  if (resume_rl) {
    spdlog::info("phase 1/2 (SFT) is done already: {} is its checkpoint; resuming phase 2 from {}", init,
                 spec.checkpoint.resume);
  } else if (skip_sft) {
    spdlog::info("phase 1/2 (SFT) is done already: {} is at step {} of {}; going on with phase 2", init, resumed_at,
                 spec.run.steps);
  } else {
    spdlog::info("phase 1/2: SFT, {} steps on the actor runtime (the pretraining run of this spec; {}), saving to {}",
                 spec.run.steps, split, sft_dir);
    model::TrainSummary ts;
    const int rc = run_pretrain(sft, make_run_plan(sft), nullptr, metrics, style, signals, &ts);
    if (rc != kExitOk) return rc;  // an interruption was reported with phase 1's resume hint
    const double s1 = seconds_since(t1);
    spdlog::info("phase 1/2 done: {} steps in {:.1f} s ({:.2f} steps/s)", ts.steps_done, s1,
                 s1 > 0 ? static_cast<double>(ts.steps_done) / s1 : 0.0);
  }
  const double sft_seconds = seconds_since(t1);
  const auto te = Clock::now();
  // A resumed phase 2 does not evaluate its init: score phase 1's checkpoint
  // here, as phase 2's first evaluation would have.
  const rl::RlEvalMetrics resumed_before = resume_rl ? init_eval(spec, init) : rl::RlEvalMetrics{};
  double eval_seconds = seconds_since(te);
  if (signals.requested()) return report_rl_interrupted(spec, signals, init, 0);

  // Phase 2: RL from phase 1's checkpoint.
  const auto t2 = Clock::now();
  metrics.write_line(JsonObject()
                         .add("type", std::string("phase"))
                         .add("phase", std::string("rl"))
                         .add("index", int64_t{2})
                         .add("steps", rl_spec.run.steps)
                         .add("init", init)
                         .add("checkpoint", rl_spec.checkpoint_dir())
                         .str());
  spdlog::info("phase 2/2: RL, {} steps from {}{} (lr {}, warmup {}), saving to {}", rl_spec.run.steps, init,
               resume_rl ? ", resumed from " + spec.checkpoint.resume : std::string(), rl_spec.optim.lr,
               rl_spec.optim.warmup_steps, rl_spec.checkpoint_dir());
  rl::RlSummary rs;
  const int rc = run_rl(rl_spec, make_run_plan(rl_spec), metrics, style, signals, &rs);
  if (rc == kExitInterrupted) return report_rl_interrupted(spec, signals, init, rs.steps_done);
  if (resume_rl) rs.first_eval = resumed_before;
  if (rc != kExitOk) return rc;
  const double rl_seconds = seconds_since(t2);
  spdlog::info("phase 2/2 done: {} RL steps in {:.1f} s ({:.2f} steps/s)", rs.steps_done, rl_seconds,
               rl_seconds > 0 ? static_cast<double>(rs.steps_done) / rl_seconds : 0.0);
  // Phase 2 scores both sides of the split at each evaluation: its first is
  // phase 1's checkpoint, its last the job's end. Without a split both rows
  // are every held-out problem, the target's own scores.
  const auto side = [](const rl::RlEvalMetrics& e) {
    if (e.sft_problems == 0) return e;
    rl::RlEvalMetrics s = e;
    s.problems = e.sft_problems;
    s.exact_match = e.sft_exact_match;
    s.mean_reward = e.sft_mean_reward;
    s.pass_at_k = e.sft_pass_at_k;
    return s;
  };
  const rl::RlEvalMetrics sft_before = side(rs.first_eval), sft_after = side(rs.last_eval);

  // The table: both tasks after each phase (after SFT = before RL).
  const bool by_side = !sft_side_pairs(spec).empty();
  const std::string sft_rows = by_side ? "SFT task: held-out, off the target split" : "SFT task: every held-out problem";
  const std::string target_rows = spec.data.target_pairs.empty() ? "RL target: every held-out problem"
                                                                 : "RL target: held-out target problems";
  std::string table = "summary (seed " + std::to_string(spec.run.seed) +
                      "): held-out exact match (greedy)  problems  after SFT  after RL   change\n";
  char line[320];
  const auto row = [&](const std::string& name, const rl::RlEvalMetrics& before, const rl::RlEvalMetrics& after) {
    std::snprintf(line, sizeof line, "  %-42s %8lld  %9s  %8s  %+6.1f pt  (pass@%lld %s -> %s)\n", name.c_str(),
                  static_cast<long long>(after.problems), pct(before.exact_match).c_str(),
                  pct(after.exact_match).c_str(), 100.0 * (after.exact_match - before.exact_match),
                  static_cast<long long>(after.k), pct(before.pass_at_k).c_str(), pct(after.pass_at_k).c_str());
    table += line;
  };
  row(sft_rows, sft_before, sft_after);
  row(target_rows, rs.first_eval, rs.last_eval);
  std::snprintf(line, sizeof line, "  %s; SFT %lld steps in %.0f s, RL %lld steps in %.0f s (with its evaluations)\n",
                split.c_str(), static_cast<long long>(skip_sft ? 0 : spec.run.steps), skip_sft ? 0.0 : sft_seconds,
                static_cast<long long>(rs.steps_done), rl_seconds + eval_seconds);
  table += line;
  std::printf("%s", table.c_str());
  std::fflush(stdout);
  spdlog::info("two-phase job done: SFT task {} -> {}, RL target {} -> {} (after SFT -> after RL)", pct(sft_before.exact_match),
               pct(sft_after.exact_match), pct(rs.first_eval.exact_match), pct(rs.last_eval.exact_match));
  metrics.write_line(JsonObject()
                         .add("type", std::string("summary"))
                         .add("seed", spec.run.seed)
                         .add("sft_steps", skip_sft ? int64_t{0} : spec.run.steps)
                         .add("rl_steps", rs.steps_done)
                         .add("sft_task_problems", sft_after.problems)
                         .add("sft_task_before", sft_before.exact_match)
                         .add("sft_task_after", sft_after.exact_match)
                         .add("sft_task_pass_at_k_before", sft_before.pass_at_k)
                         .add("sft_task_pass_at_k_after", sft_after.pass_at_k)
                         .add("sft_task_mean_reward_before", sft_before.mean_reward)
                         .add("sft_task_mean_reward_after", sft_after.mean_reward)
                         .add("target_problems", rs.last_eval.problems)
                         .add("target_before", rs.first_eval.exact_match)
                         .add("target_after", rs.last_eval.exact_match)
                         .add("target_pass_at_k_before", rs.first_eval.pass_at_k)
                         .add("target_pass_at_k_after", rs.last_eval.pass_at_k)
                         .add("target_mean_reward_before", rs.first_eval.mean_reward)
                         .add("target_mean_reward_after", rs.last_eval.mean_reward)
                         .add("k", rs.last_eval.k)
                         .add("sft_seconds", skip_sft ? 0.0 : sft_seconds)
                         .add("rl_seconds", rl_seconds)
                         .add("eval_seconds", eval_seconds)
                         .str());
  return kExitOk;
}

}  // namespace troupe::launch
