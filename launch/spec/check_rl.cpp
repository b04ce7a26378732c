// The spec checks of online RL: [rl] becomes rl::RlConfig (convert_rl), its
// topology, processes and trainer on actors, its inputs, and the two-phase job.
#include "launch/spec/parser.hpp"
#include "rl/reward_command.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>

#include "actors/names.hpp"
#include "actors/schedule/schedule.hpp"
#include "launch/phases.hpp"
#include "launch/spec/keys.hpp"
#include "launch/run_plan.hpp"
#include "model/checkpoint.hpp"
#include "model/data.hpp"
#include "model/params.hpp"
#include "rl/task.hpp"
#include "rl/trainer.hpp"


namespace troupe::launch::spec_detail {

// The decoupled RL actors run on [topology] devices (generators may sit on
// other processes); every other topology degree stays at 1.
bool rl_topology_ok(const Spec& s) {
  const auto& t = s.topology;
  return t.stages == 1 && t.schedule == sched::Kind::sequential && t.optimizer_shards == 1 && t.data_parallel == 1 &&
         t.expert_shards == 1;
}

// Decoupled RL on [topology] processes = N > 1: the trainer's devices are on
// process 0 and every other process holds at least one generator.
void check_rl_processes(const Spec& s, SpecSites& p) {
  const int64_t n = s.topology.processes;
  if (n <= 1 || s.topology.processes > s.topology.devices) return;  // the latter is reported on its key
  auto v = [](int64_t x) { return std::to_string(x); };
  if (s.topology.device_kind == DeviceKind::sim) return;
  std::vector<int> dp;
  try {
    dp = device_processes(s);
  } catch (const std::exception&) {
    return;  // a bad device_processes: reported on its key
  }
  const int trainer = rl_trainer_devices(s);
  for (int d = 0; d < trainer && d < static_cast<int>(dp.size()); ++d)
    if (dp[static_cast<size_t>(d)] != 0) {
      p.error(p.where("topology.processes"), "[topology] processes = " + v(n) + ": the RL trainer's device " + v(d) +
                                                 " would be on process " + v(dp[static_cast<size_t>(d)]) + "; the trainer " +
                                                 "runs on process 0 (its devices 0.." + v(trainer - 1) +
                                                 "), generators on the others: add devices or set device_processes");
      return;
    }
  // A version crosses as one envelope, and envelopes are bounded
  // (DecodeLimits::max_message_bytes): a larger model could never sync.
  int64_t params = 0;
  try {
    params = model::build_param_layout(s.model).total();
  } catch (const std::exception&) {
  }
  const uint64_t limit = runtime::kRlMaxMessageBytes;
  if (static_cast<uint64_t>(params) * sizeof(float) + (1u << 20) > limit) {
    p.error(p.where("topology.processes"), "[topology] processes = " + v(n) + ": the model's " + v(params) +
                                               " parameters (" + v(params * 4 / (1 << 20)) + " MiB per version) exceed " +
                                               "the " + v(static_cast<int64_t>(limit >> 20)) + " MiB a message may carry, so "
                                               "no weight sync could reach a generator on another process");
    return;
  }
  const std::vector<int> gp = rl_generator_processes(s);
  for (int64_t q = 1; q < n; ++q)
    if (std::find(gp.begin(), gp.end(), static_cast<int>(q)) == gp.end()) {
      p.error(p.where("topology.processes"), "[topology] processes = " + v(n) + ": process " + v(q) + " would hold no " +
                                                 "generator (rl.generators = " + v(s.rl_section.generators) + " on devices " +
                                                 v(trainer) + ".." + v(s.topology.devices - 1) + "); in decoupled RL the " +
                                                 "processes after 0 hold generators only");
      return;
    }
}

// rl.trainer = "actors": decoupled RL whose policy update runs on the
// [topology]'s pipeline ranks, expert and optimizer shards; the runtime's own
// rules (micro-batches against the RL batch, schedule, shards) say what fits.
void check_rl_trainer(const Spec& s, SpecSites& p) {
  const RlSection& r = s.rl_section;
  auto v = [](int64_t x) { return std::to_string(x); };
  if (!rl::decoupled(s.rl.sync)) {
    p.error(p.where("rl.trainer"), "[rl] trainer = \"actors\" trains the policy on the actor runtime beside generator and "
                                   "reward actors: it needs sync = \"fixed_lag\" or \"latest\"");
    return;
  }
  if (s.rl.row_buckets > 1)
    p.error(p.where("rl.row_buckets"), "[rl] row_buckets = " + v(s.rl.row_buckets) + " with trainer = \"actors\": the "
                                       "actors' policy update takes rows of one length; use 1 (or trainer = \"single\")");
  const int trainer = rl_trainer_devices(s);
  if (trainer > s.topology.devices)
    p.error(p.where(r.trainer_devices > 0 ? "rl.trainer_devices" : "topology.devices"),
            "[rl] trainer = \"actors\" puts the trainer on " + v(trainer) + " device(s) (" +
                (r.trainer_devices > 0 ? std::string("trainer_devices") : std::string("stages x data_parallel")) +
                ") but [topology] devices = " + v(s.topology.devices));
  const int64_t rows = r.prompts_per_step * r.group_size, mbs = s.topology.microbatches * s.topology.data_parallel;
  if (rows % mbs != 0) {
    p.error(p.where("topology.microbatches"), "[rl] trainer = \"actors\": the RL batch of " + v(rows) +
                                                  " rows (prompts_per_step x group_size) must split into [topology] "
                                                  "microbatches x data_parallel = " + v(mbs) + " equal micro-batches");
    return;
  }
  // The trainer's actors a [[faults]] entry names must exist in its plan.
  std::optional<runtime::Plan> plan;
  try {
    plan = rl_trainer_plan(s);
  } catch (const std::exception&) {  // a bad topology: reported on its own keys
    return;
  }
  for (size_t i = 0; i < s.faults.size(); ++i) {
    const auto t = runtime::parse_fault_target(s.faults[i].target);
    if (t && p.fault_ok(i) && !plan->target(*t))
      p.error(p.fault_where(i, "target"), "[[faults]] target = \"" + s.faults[i].target + "\" is not an actor of the "
                                          "trainer's runtime (stage:0.." + v(plan->sl.num_ranks - 1) + ", optimizer:0.." +
                                          v(plan->num_shards() - 1) +
                                          (plan->expert_parallel() ? ", expert:L/0.." + v(plan->expert_shards - 1) : std::string()) +
                                          "; `troupe validate` lists them)");
  }
}

// [rl] becomes rl::RlConfig once, here: the loss's preset, then every key the
// spec sets. Its own rules come from rl::check_config; the rules that involve
// other sections follow.
void convert_rl(Spec& s, SpecSites& p) {
  const RlSection& r = s.rl_section;
  auto v = [](int64_t x) { return std::to_string(x); };
  rl::RlConfig c = rl::rl_preset(rl::parse_loss_kind(r.loss), r.max_new_tokens);
  c.init = r.init;
  c.task = r.task;
  c.prompts_per_step = r.prompts_per_step;
  c.group_size = r.group_size;
  c.max_new_tokens = r.max_new_tokens;
  c.temperature = r.temperature;
  c.top_p = r.top_p;
  c.updates_per_batch = r.updates_per_batch;
  c.sft_fraction = r.sft_fraction;
  if (r.clip_low >= 0) c.policy.clip_low = r.clip_low;
  if (r.clip_high >= 0) c.policy.clip_high = r.clip_high;
  if (r.behaviour_weight_cap >= 0) c.policy.behaviour_weight_cap = r.behaviour_weight_cap;
  c.policy.kl_coef = r.kl_coef;
  if (r.advantage_std != "auto") c.advantage.scale_by_std = r.advantage_std == "on";
  if (r.dynamic_sampling != "auto") c.advantage.drop_zero_variance = r.dynamic_sampling == "on";
  c.verifier.partial_credit = r.partial_credit;
  c.verifier.format_penalty = r.format_penalty;
  c.sync = r.sync;
  c.max_staleness = r.max_staleness;
  c.generators = r.generators;
  c.reward_actors = r.reward_actors;
  c.sync_deadline_ms = r.sync_deadline_ms;
  c.recompute_kv = r.recompute_kv;
  c.slots = r.slots;
  c.row_buckets = r.row_buckets;
  c.rm_prompts = r.rm_prompts;
  c.rm_batch = r.rm_batch;
  c.rm_loss = r.rm_loss;
  c.reward = r.reward;
  c.reward_model = r.reward_model;
  c.prompts = r.prompts;
  c.eval_prompts = r.eval_prompts;
  c.reward_tolerance = r.reward_tolerance;
  c.answer_pattern = r.answer_pattern;
  c.reward_command = r.reward_command;
  c.reward_dir = r.reward_dir;
  c.reward_timeout = r.reward_timeout;
  c.reward_errors_zero = r.reward_errors == "zero";
  s.rl = c;
  if (s.run.mode == RunMode::pretrain) {
    // Phase 1 of a two-phase file alone (--set run.mode="pretrain"): its [rl]
    // section is phase 2's and is ignored.
    if (p.file_mode == RunMode::sft_rl) return;
    if (const Pos* at = p.first_set_in("rl"))
      p.error(*at, std::string("[rl] keys apply only to [run] mode = \"rl\", \"reward_model\" or \"sft_rl\" (this spec has mode = \"") + run_mode_name(s.run.mode) + "\")");
    return;
  }
  if (s.run.mode != RunMode::reward_model)
    if (const Pos* at = p.set_at("rl.rm_loss"))
      p.error(*at, std::string("[rl] rm_loss applies to [run] mode = \"reward_model\" (it is how a reward model trains; "
                               "this spec has mode = \"") + run_mode_name(s.run.mode) + "\")");
  if (s.run.mode == RunMode::reward_model) {
    // One process, one device: the RM trainer (rl/rm_trainer.hpp).
    if (c.sync != rl::SyncMode::synchronous)
      p.error(p.where("rl.sync"), "[rl] sync = \"" + std::string(rl::sync_mode_name(c.sync)) + "\": run.mode = \"reward_model\" "
                                  "trains in one process without actors; leave sync = \"synchronous\"");
    if (s.topology.device_kind == DeviceKind::sim)
      p.error(p.where("topology.device_kind"), "[topology] device_kind = \"sim\": run.mode = \"reward_model\" trains a real "
                                               "model (use \"host\" or \"opencl\")");
    else if (uses_runtime(s))
      p.error(p.where("run.mode"), "[run] mode = \"reward_model\" trains on one device in one process; set [topology] devices = 1, "
                                   "stages = 1, schedule = \"sequential\", expert_shards = 1, optimizer_shards = 1, data_parallel = 1");
    if (c.reward == rl::RewardSource::model)
      p.error(p.where("rl.reward"), "[rl] reward = \"model\" applies to run.mode = \"rl\"; a reward-model run trains on the "
                                    "rule verifier's labels");
    if (s.model.vocab_size < 17)
      p.error(p.where("model.vocab_size"), "[model] vocab_size = " + v(s.model.vocab_size) + ": the reward model reads its "
                                           "score from the last three token ids (marker, yes, no), which must lie above the "
                                           "addition task's 14 tokens; use vocab_size >= 17");
  }
  for (const rl::ConfigProblem& prob : rl::check_config(c))
    p.error(p.where("rl." + prob.key), "[rl] " + prob.key + ": " + prob.message);
  if (r.sft_fraction > 0) {
    if (s.run.mode == RunMode::reward_model)
      p.error(p.where("rl.sft_fraction"), "[rl] sft_fraction applies to RL runs (run.mode = \"rl\" or \"sft_rl\"); a "
                                          "reward-model run labels its own prompts");
    else if (s.data.target_pairs.empty() || s.data.target_column < 0)
      p.error(p.where("rl.sft_fraction"), "[rl] sft_fraction = " + num_text(r.sft_fraction) +
                                              " draws RL prompts from the SFT side of a target split, and this spec has "
                                              "none: set [data] target_pairs and a target_column >= 0 (this spec has "
                                              "target_pairs = \"" + s.data.target_pairs + "\", target_column = " +
                                              v(s.data.target_column) + ")");
  }
  if (s.run.mode == RunMode::reward_model) {
    // placement checked above
  } else if (s.topology.device_kind == DeviceKind::sim) {
    // The synchronous-vs-decoupled timing model (actors/sim/rl_sim.hpp); no math.
    if (s.topology.devices < 2)
      p.error(p.where("topology.devices"), "[run] mode = \"rl\" on sim devices compares synchronous and decoupled RL, "
                                           "which splits the devices: devices must be >= 2");
    // The timing model runs in process 0 alone: processes after 0 would wait
    // for generators that are never placed (mpirun would hang).
    if (s.topology.processes > 1)
      p.error(p.where("topology.processes"), "[topology] processes = " + v(s.topology.processes) + ": [run] mode = \"rl\" "
                                             "on sim devices simulates every device in one process; set processes = 1");
  } else if (r.trainer == "actors") {
    check_rl_trainer(s, p);
    check_rl_processes(s, p);
  } else if (rl::decoupled(c.sync) && rl_topology_ok(s)) {
    check_rl_processes(s, p);
  } else if (rl::decoupled(c.sync))
    p.error(p.where("run.mode"), "[run] mode = \"rl\" with sync = \"" + std::string(rl::sync_mode_name(c.sync)) + "\" runs its actors on [topology] "
                                 "devices (the trainer on device 0, generators on the others); set stages = 1, schedule = "
                                 "\"sequential\", expert_shards = 1, optimizer_shards = 1, data_parallel = 1 "
                                 "(this spec has stages = " + v(s.topology.stages) + ", schedule = \"" +
                                 std::string(sched::to_string(s.topology.schedule)) + "\")");
  else if (!rl::decoupled(c.sync) && uses_runtime(s) && !sync_data_parallel(s))
    p.error(p.where("run.mode"), "[run] mode = \"rl\" with sync = \"synchronous\" runs the RL loop in one process, "
                                 "data-parallel over data_parallel = devices devices "
                                 "(rl.sync = \"fixed_lag\" or \"latest\" runs generator and reward actors); set [topology] "
                                 "stages = 1, schedule = \"sequential\", expert_shards = 1, optimizer_shards = 1, "
                                 "data_parallel = devices (this spec has devices = " + v(s.topology.devices) + ", data_parallel = " +
                                 v(s.topology.data_parallel) + ", stages = " +
                                 v(s.topology.stages) + ", schedule = \"" + std::string(sched::to_string(s.topology.schedule)) + "\")");
  if (r.prompts.empty() && (s.data.source == model::DataKind::text || s.data.source == model::DataKind::jsonl))
    p.error(p.where("data.source"), "[rl] task = \"" + r.task + "\" draws its problems from [data] source = \"addition\", "
                                    "\"addition_plain\" or \"scratchpad\" (this spec has \"" +
                                    model::data_kind_name(s.data.source) + "\"); a user's task gives rl.prompts = FILE.jsonl");
}

// [rl] against the task and the init checkpoint: prompts and completions fit
// the context, answers fit max_new_tokens, and init holds this spec's model.
// A missing or damaged init is left to `run` / `validate`, which report it as
// a bad input file (exit 4) naming the file.
void check_rl_inputs(const Spec& s, SpecSites& p) {
  if (s.run.mode == RunMode::pretrain) return;
  const RlSection& r = s.rl_section;
  auto v = [](int64_t x) { return std::to_string(x); };
  // A reward program is checked (found, executable), not started: validate
  // runs nothing, and making the task below starts no program either.
  if (s.rl.reward == rl::RewardSource::command) {
    if (r.reward_command.empty())
      p.error(p.where("rl.reward"), "[rl] reward = \"command\" needs rl.reward_command = [\"program\", \"arg\", ...]");
    else if (const std::string bad = rl::check_reward_command(r.reward_command, r.reward_dir); !bad.empty())
      p.error(p.where("rl.reward_command"), "[rl] reward_command: " + bad);
  }
  const bool user_reward = s.rl.reward == rl::RewardSource::exact || s.rl.reward == rl::RewardSource::numeric ||
                           s.rl.reward == rl::RewardSource::regex || s.rl.reward == rl::RewardSource::command;
  if (user_reward && r.prompts.empty())
    p.error(p.where("rl.reward"), std::string("[rl] reward = \"") + rl::reward_source_name(s.rl.reward) +
                                      "\" scores a user's task: set rl.prompts = FILE.jsonl (the built-in task takes \"verifier\" or \"model\")");
  if (s.rl.reward == rl::RewardSource::regex && r.answer_pattern.empty())
    p.error(p.where("rl.reward"), "[rl] reward = \"regex\" needs rl.answer_pattern (e.g. \"#### (.*)\")");
  try {
    const auto task = rl::make_task(s.rl, s.data, static_cast<uint64_t>(s.run.seed));
    const rl::Prompt probe = task->train_prompt(0);
    // The longest prompt and answer when the task varies them (scratchpad), else the probe's.
    const int64_t prompt = std::max<int64_t>(static_cast<int64_t>(probe.tokens.size()), task->max_prompt_tokens());
    const int64_t answer = std::max<int64_t>(static_cast<int64_t>(probe.answer.size()), task->max_answer_tokens());
    if (prompt + r.max_new_tokens > s.model.seq_len)
      p.error(p.where("rl.max_new_tokens"), "[rl] max_new_tokens = " + v(r.max_new_tokens) + " does not fit: the task's prompts are " +
                                                v(prompt) + " tokens and [model] seq_len = " + v(s.model.seq_len) +
                                                " (at most " + v(s.model.seq_len - prompt) + " new tokens)");
    else if (r.max_new_tokens < answer)
      p.error(p.where("rl.max_new_tokens"),
              "[rl] max_new_tokens = " + v(r.max_new_tokens) +
                  (task->max_answer_tokens() > 0
                       ? " is shorter than the task's longest right completion (" + v(answer) +
                             " tokens with the EOS): its longest problems could never be answered"
                       : " is shorter than the task's answers (" + v(answer) + " tokens with the EOS): no completion could be right"));
  } catch (const std::exception& e) {
    if (!r.prompts.empty()) p.error(p.where("rl.prompts"), "[rl] prompts: " + std::string(e.what()));
    else p.error(p.where("rl.task"), "[rl] task: " + std::string(e.what()));
  }
  if (!r.reward_model.empty()) {
    try {
      const model::TrainingState st = model::load_checkpoint(r.reward_model);
      const std::string diff = model::config_difference(s.model, st.config);
      if (!diff.empty())
        p.error(p.where("rl.reward_model"), "[rl] reward_model = \"" + r.reward_model + "\": the checkpoint's model differs from [model] (" +
                                                diff + "; [model] first, the checkpoint second)");
    } catch (const model::CheckpointError&) {
      // reported by run/validate as a bad input file
    }
  }
  if (r.init.empty()) return;
  try {
    const model::TrainingState st = model::load_checkpoint(r.init);
    const std::string diff = model::config_difference(s.model, st.config);
    if (!diff.empty())
      p.error(p.where("rl.init"), "[rl] init = \"" + r.init + "\": the checkpoint's model differs from [model] (" + diff +
                                      "; [model] first, the checkpoint second)");
  } catch (const model::CheckpointError&) {
    // reported by run/validate as a bad input file
  }
}

// rl.steps, rl.eval_every, rl.lr, rl.warmup_steps are phase 2's values in a
// two-phase spec; a one-phase RL run reads [run] and [optim] for them.
void check_phase_keys(const Spec& s, SpecSites& p) {
  if (s.run.mode == RunMode::pretrain) return;  // every [rl] key is reported there
  // A two-phase file run as one RL run (--set run.mode="rl") reads [run] and
  // [optim] like any RL run; its phase-2 values are left unused.
  if (p.file_mode == RunMode::sft_rl) return;
  for (const char* key : {"steps", "eval_every", "lr", "warmup_steps"})
    if (const Pos* at = p.set_at(std::string("rl.") + key))
      p.error(*at, std::string("[rl] ") + key + " is phase 2's value in run.mode = \"sft_rl\"; this run has mode = \"" +
                       run_mode_name(s.run.mode) + "\" and reads " + (key[0] == 's' || key[0] == 'e' ? "[run] " : "[optim] ") +
                       key + " instead");
}

// run.mode = "sft_rl": each phase's derived spec (launch/phases.hpp) passes
// the checks its own mode would get, and what the pair cannot do yet is said.
void check_sft_rl(Spec& s, SpecSites& p) {
  const std::string why = " in run.mode = \"sft_rl\"";
  if (s.topology.device_kind == DeviceKind::sim)
    p.error(p.where("topology.device_kind"), "[topology] device_kind = \"sim\"" + why + ": the two-phase job trains a real "
                                             "model (use \"host\" or \"opencl\")");
  if (s.topology.processes > 1)
    p.error(p.where("topology.processes"), "[topology] processes = " + std::to_string(s.topology.processes) + why +
                                               ": the two-phase job runs in one process (run the phases as separate runs)");
  if (!s.faults.empty())
    p.error(p.fault_where(0, ""), "[[faults]]" + why + ": not built for the two-phase job yet (run phase 1 with --set "
                                  "run.mode='\"pretrain\"', or phase 2 as its own run.mode = \"rl\" spec)");
  if (s.chaos.mean_steps_between_faults > 0)
    p.error(p.where("chaos.mean_steps_between_faults"), "[chaos]" + why + ": not built for the two-phase job yet");
  if (!s.elastic.empty())
    p.error(p.elastic_where(0, ""), "[[elastic]]" + why + ": not built for the two-phase job yet");
  if (!s.rl_section.init.empty())
    p.error(p.where("rl.init"), "[rl] init" + why + ": phase 2 starts from phase 1's checkpoint (" + sft_checkpoint_dir(s) +
                                    "); leave init out");
  if (s.rl_section.reward == rl::RewardSource::model)
    p.error(p.where("rl.reward"), "[rl] reward = \"model\"" + why + ": not built for the two-phase job yet (phase 2 uses "
                                  "the rule verifier)");
  const size_t before = p.diagnostics().size();
  Spec sft = sft_phase_spec(s);
  check_cross_fields(sft, p);
  check_supported(sft, p);
  check_checkpoint_dir(sft, p);
  Spec rl_spec = rl_phase_spec(s, "");  // phase 1's checkpoint does not exist yet
  check_cross_fields(rl_spec, p);
  check_supported(rl_spec, p);
  convert_rl(rl_spec, p);
  check_checkpoint_dir(rl_spec, p);
  s.rl = rl_spec.rl;
  if (p.diagnostics().size() == before) {
    check_data(sft, p);
    if (p.diagnostics().size() == before) check_rl_inputs(rl_spec, p);
  }
}

}  // namespace troupe::launch::spec_detail
