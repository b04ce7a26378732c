// `troupe run` for run.mode = "reward_model": trains the learned reward model
// (rl/rm_trainer.hpp) with progress on the terminal and one JSON line per
// step ("rm_step"), the labelled data ("rm_data": examples, pairs, groups
// that give no pair), each evaluation ("rm_eval": held-out and training
// accuracy, majority baseline, BCE; pairwise accuracy and Bradley–Terry loss)
// and the checkpoint in metrics.jsonl, then an "end" line with accuracy
// before/after.
#include <chrono>
#include <cmath>
#include <spdlog/spdlog.h>

#include "launch/cli.hpp"
#include "launch/commands/rl.hpp"
#include "rl/rm_trainer.hpp"

namespace troupe::launch {

namespace {

JsonObject& add_accuracy(JsonObject& j, const std::string& prefix, const rl::RmAccuracy& a) {
  return j.add((prefix + "_examples").c_str(), a.examples)
      .add((prefix + "_positives").c_str(), a.positives)
      .add((prefix + "_accuracy").c_str(), a.accuracy)
      .add((prefix + "_majority").c_str(), a.majority)
      .add((prefix + "_bce").c_str(), a.bce)
      .add((prefix + "_mean_score_pos").c_str(), a.mean_score_pos)
      .add((prefix + "_mean_score_neg").c_str(), a.mean_score_neg);
}

JsonObject& add_pairs(JsonObject& j, const std::string& prefix, const rl::RmPairAccuracy& a) {
  return j.add((prefix + "_pairs").c_str(), a.pairs)
      .add((prefix + "_pair_accuracy").c_str(), a.accuracy)
      .add((prefix + "_bt_loss").c_str(), a.loss);
}

JsonObject& add_groups(JsonObject& j, const std::string& prefix, const rl::RmGroupCounts& g) {
  return j.add((prefix + "_groups").c_str(), g.groups)
      .add((prefix + "_groups_all_right").c_str(), g.all_right)
      .add((prefix + "_groups_all_wrong").c_str(), g.all_wrong)
      .add((prefix + "_pairs").c_str(), g.pairs);
}

class RmProgress final : public rl::RmObserver {
 public:
  RmProgress(ProgressStyle style, int64_t total, int64_t every, MetricsWriter& metrics, rl::RmLoss loss)
      : style_(style), total_(total), every_(every), metrics_(metrics), loss_(loss),
        t0_(std::chrono::steady_clock::now()) {}

  void on_data(const rl::RmDataStats& d) override {
    if (metrics_.is_open()) {
      JsonObject j;
      j.add("type", std::string("rm_data"))
          .add("rm_loss", std::string(rl::rm_loss_name(loss_)))
          .add("train_examples", d.train_examples)
          .add("train_positives", d.train_positives)
          .add("heldout_examples", d.heldout_examples)
          .add("heldout_positives", d.heldout_positives);
      add_groups(j, "train", d.train_groups);
      add_groups(j, "heldout", d.heldout_groups);
      metrics_.write_line(j.add("seconds", d.seconds).str());
    }
    spdlog::info("reward-model data: {} training examples ({:.1f}% right), {} held-out ({:.1f}% right), labelled by the "
                 "verifier in {:.1f} s",
                 d.train_examples, pct(d.train_positives, d.train_examples), d.heldout_examples,
                 pct(d.heldout_positives, d.heldout_examples), d.seconds);
    for (const auto& [name, g] : {std::pair{"training", d.train_groups}, std::pair{"held-out", d.heldout_groups}})
      spdlog::info("  {} prompts: {} groups, {} all right and {} all wrong (no pair), {} accepted-vs-rejected pairs", name,
                   g.groups, g.all_right, g.all_wrong, g.pairs);
  }

  void on_step(const rl::RmStepMetrics& m) override {
    if (metrics_.is_open())
      metrics_.write_line(JsonObject()
                              .add("type", std::string("rm_step"))
                              .add("step", m.step)
                              .add("loss", m.loss)
                              .add("batch_accuracy", m.batch_accuracy)
                              .add("grad_norm", m.grad_norm)
                              .add("lr", m.lr)
                              .add("step_seconds", m.seconds)
                              .add("wall_seconds", wall())
                              .str());
    if (style_ == ProgressStyle::off) return;
    if (m.step % every_ == 0 || m.step == total_ || m.step == 1 || style_ == ProgressStyle::bar)
      std::fprintf(stderr, "rm step %lld/%lld %s %.4f batch %saccuracy %.1f%% grad norm %.3f lr %.2e\n",
                   static_cast<long long>(m.step), static_cast<long long>(total_),
                   loss_ == rl::RmLoss::bradley_terry ? "bt loss" : "bce", m.loss,
                   loss_ == rl::RmLoss::bradley_terry ? "pair " : "", 100.0 * m.batch_accuracy, m.grad_norm, m.lr);
  }

  void on_eval(const rl::RmEvalMetrics& e) override {
    if (metrics_.is_open()) {
      JsonObject j;
      j.add("type", std::string("rm_eval")).add("step", e.step);
      add_accuracy(j, "heldout", e.heldout);
      add_accuracy(j, "train", e.train);
      add_pairs(j, "heldout", e.heldout_pairs);
      add_pairs(j, "train", e.train_pairs);
      metrics_.write_line(j.add("seconds", e.seconds).add("wall_seconds", wall()).str());
    }
    spdlog::info("rm eval step {}: held-out accuracy {:.1f}% (majority baseline {:.1f}%, bce {:.4f}, {} examples), pairwise "
                 "{:.1f}% ({} pairs, bt loss {:.4f}); training accuracy {:.1f}% (bce {:.4f}), pairwise {:.1f}%",
                 e.step, 100.0 * e.heldout.accuracy, 100.0 * e.heldout.majority, e.heldout.bce, e.heldout.examples,
                 100.0 * e.heldout_pairs.accuracy, e.heldout_pairs.pairs, e.heldout_pairs.loss, 100.0 * e.train.accuracy,
                 e.train.bce, 100.0 * e.train_pairs.accuracy);
  }

  void on_checkpoint(int64_t step, const std::string& dir) override {
    if (metrics_.is_open())
      metrics_.write_line(JsonObject().add("type", std::string("checkpoint")).add("step", step).add("dir", dir).str());
    spdlog::info("checkpoint step {} -> {}", step, dir);
  }

 private:
  static double pct(int64_t a, int64_t n) { return n > 0 ? 100.0 * static_cast<double>(a) / static_cast<double>(n) : 0.0; }
  double wall() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }
  ProgressStyle style_;
  int64_t total_, every_;
  MetricsWriter& metrics_;
  rl::RmLoss loss_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace

int run_reward_model(const Spec& spec, MetricsWriter& metrics, ProgressStyle style, const StopOnSignal& signals) {
  const auto& r = spec.rl;
  spdlog::info("reward model: task {}, {} training + {} held-out prompts x {} completions (temperature {}, at most {} new "
               "tokens) from {}, labelled by the rule verifier; {} on score = logit[yes] - logit[no] at a marker, "
               "{} completions per step",
               r.task, r.rm_prompts, spec.data.eval_problems, r.group_size, r.temperature, r.max_new_tokens,
               r.init.empty() ? std::string("a fresh initialisation") : r.init,
               r.rm_loss == rl::RmLoss::bradley_terry ? "Bradley-Terry pairs" : "pointwise BCE", r.rm_batch);
  RmProgress progress(style, spec.run.steps, spec.log.progress_every, metrics, r.rm_loss);
  rl::RlTrainOptions options = rl_train_options(spec);
  options.stop = signals.flag();
  const rl::RmSummary s = rl::train_reward_model(options, progress);
  // A resumed run did not evaluate the untrained head: its end line has no
  // "before" figures, and says where it resumed instead.
  const bool fresh = s.resumed_from == 0;
  JsonObject end;
  end.add("type", std::string("end")).add("steps", s.steps_done);
  if (fresh) end.add("heldout_accuracy_before", s.first_eval.heldout.accuracy);
  else end.add("resumed_from_step", s.resumed_from);
  end.add("heldout_accuracy_after", s.last_eval.heldout.accuracy).add("heldout_majority", s.last_eval.heldout.majority);
  if (fresh) end.add("heldout_pair_accuracy_before", s.first_eval.heldout_pairs.accuracy);
  end.add("heldout_pair_accuracy_after", s.last_eval.heldout_pairs.accuracy);
  if (fresh) end.add("train_bce_before", s.first_eval.train.bce);
  end.add("train_bce_after", s.last_eval.train.bce).add_raw("interrupted", s.interrupted ? "true" : "false");
  metrics.write_line(end.str());
  if (s.interrupted) return report_interrupted(spec, signals, s.steps_done);
  if (fresh)
    spdlog::info("done: {} steps; held-out accuracy {:.1f}% -> {:.1f}% (majority baseline {:.1f}%), pairwise {:.1f}% -> "
                 "{:.1f}%; training bce {:.4f} -> {:.4f}",
                 s.steps_done, 100.0 * s.first_eval.heldout.accuracy, 100.0 * s.last_eval.heldout.accuracy,
                 100.0 * s.last_eval.heldout.majority, 100.0 * s.first_eval.heldout_pairs.accuracy,
                 100.0 * s.last_eval.heldout_pairs.accuracy, s.first_eval.train.bce, s.last_eval.train.bce);
  else
    spdlog::info("done: {} steps after resuming at step {}; held-out accuracy {:.1f}% (majority baseline {:.1f}%), "
                 "pairwise {:.1f}%; training bce {:.4f}",
                 s.steps_done, s.resumed_from, 100.0 * s.last_eval.heldout.accuracy, 100.0 * s.last_eval.heldout.majority,
                 100.0 * s.last_eval.heldout_pairs.accuracy, s.last_eval.train.bce);
  if (!std::isfinite(s.last_eval.train.bce)) {
    spdlog::error("reward-model training diverged (loss is not finite)");
    return kExitRuntime;
  }
  return kExitOk;
}

}  // namespace troupe::launch
