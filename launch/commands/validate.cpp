// `troupe validate`: the spec is already parsed and checked by the time we get
// here; print what the run would build.
#include <map>
#include <cstdio>

#include <algorithm>
#include <filesystem>
#include <string>

#include "actors/cluster/cluster_tls.hpp"

#include "kernels/blas_core.hpp"
#include "launch/cli.hpp"
#include "rl/task.hpp"
#include "rl/task_jsonl.hpp"
#include "rl/trainer.hpp"
#include "model/data.hpp"
#include "model/tokenizer.hpp"
#include "launch/phases.hpp"
#include "launch/sim_plan.hpp"
#include "launch/run_plan.hpp"
#include "model/checkpoint.hpp"

namespace troupe::launch {

int check_input_checkpoints(const Spec& spec) {
  if (spec.run.mode != RunMode::pretrain && !spec.rl.init.empty()) {
    // A missing or damaged init is a bad input file.
    try {
      model::load_checkpoint(spec.rl.init);
    } catch (const model::CheckpointError& e) {
      std::fprintf(stderr, "troupe: %s: [rl] init: %s\n", spec.source.c_str(), e.what());
      return kExitBadInput;
    }
  }
  if (spec.run.mode == RunMode::rl && spec.rl.reward == rl::RewardSource::model) {
    try {
      model::load_checkpoint(spec.rl.reward_model);
    } catch (const model::CheckpointError& e) {
      std::fprintf(stderr, "troupe: %s: [rl] reward_model: %s\n", spec.source.c_str(), e.what());
      return kExitBadInput;
    }
  }
  if (spec.topology.processes > 1 && spec.topology.auth == runtime::ClusterAuth::tls && !spec.topology.auth_dir.empty()) {
    try {
      runtime::read_cluster_identity(spec.topology.auth_dir);
    } catch (const std::exception& e) {
      std::fprintf(stderr, "troupe: %s: [topology] auth_dir: %s\n", spec.source.c_str(), e.what());
      return kExitBadInput;
    }
  }
  if (spec.run.mode == RunMode::sft_rl && resumes_phase2(spec)) {
    // Resuming inside phase 2: its own checkpoint continues the RL run, and
    // phase 1's finished checkpoint is still its init (and the "after SFT"
    // column of the summary).
    const std::string sft_dir = sft_checkpoint_dir(spec);
    // (rl.sync = "latest" with a resume is a spec error already: it cannot resume.)
    int64_t sft_step = 0, rl_step = 0;
    try {
      sft_step = model::load_checkpoint(sft_dir).step;
    } catch (const model::CheckpointError& e) {
      std::fprintf(stderr, "troupe: %s: resuming phase 2 needs phase 1's checkpoint: %s\n", spec.source.c_str(), e.what());
      return kExitBadInput;
    }
    if (sft_step != spec.run.steps) {
      std::fprintf(stderr,
                   "troupe: %s: phase 1's checkpoint \"%s\" is at step %lld, not at its last step %lld: phase 2's "
                   "checkpoint \"%s\" cannot have started from it\n",
                   spec.source.c_str(), sft_dir.c_str(), static_cast<long long>(sft_step),
                   static_cast<long long>(spec.run.steps), spec.checkpoint.resume.c_str());
      return kExitBadInput;
    }
    try {
      rl_step = model::load_checkpoint(spec.checkpoint.resume).step;
    } catch (const model::CheckpointError& e) {
      std::fprintf(stderr, "troupe: %s: [checkpoint] resume: %s\n", spec.source.c_str(), e.what());
      return kExitBadInput;
    }
    if (rl_step >= spec.rl_section.steps) {
      std::fprintf(stderr,
                   "troupe: %s: [checkpoint] resume = \"%s\" is phase 2's checkpoint at RL step %lld, but [rl] steps "
                   "= %lld: nothing is left to train (raise rl.steps to continue phase 2)\n",
                   spec.source.c_str(), spec.checkpoint.resume.c_str(), static_cast<long long>(rl_step),
                   static_cast<long long>(spec.rl_section.steps));
      return kExitBadSpec;
    }
    return kExitOk;
  }
  if (!spec.checkpoint.resume.empty()) {
    int64_t step = 0;
    try {
      const model::TrainingState st = model::load_checkpoint(spec.checkpoint.resume);
      step = st.step;
      // Another model's checkpoint cannot continue this run: say so now, as a
      // spec error, rather than as a layout mismatch once the run loads it.
      if (const std::string diff = model::config_difference(spec.model, st.config); !diff.empty()) {
        std::fprintf(stderr,
                     "troupe: %s: [checkpoint] resume = \"%s\": the checkpoint's model differs from [model] (%s; "
                     "[model] first, the checkpoint second)\n",
                     spec.source.c_str(), spec.checkpoint.resume.c_str(), diff.c_str());
        return kExitBadSpec;
      }
    } catch (const model::CheckpointError& e) {
      std::fprintf(stderr, "troupe: %s: [checkpoint] resume: %s\n", spec.source.c_str(), e.what());
      return kExitBadInput;
    }
    // A two-phase job resumed at phase 1's last step goes straight to phase 2.
    const bool phase2 = spec.run.mode == RunMode::sft_rl && step == spec.run.steps;
    if (step >= spec.run.steps && !phase2) {
      std::fprintf(stderr,
                   "troupe: %s: [checkpoint] resume = \"%s\" is at step %lld, but [run] steps = %lld: nothing is left "
                   "to train (raise run.steps to continue the run)\n",
                   spec.source.c_str(), spec.checkpoint.resume.c_str(), static_cast<long long>(step),
                   static_cast<long long>(spec.run.steps));
      return kExitBadSpec;
    }
  }
  return kExitOk;
}

namespace {

// The decoupled RL actors by control / device, as format_topology lists the
// pipeline's (the plan's rl_actors).
std::string format_rl_actors(const Spec& spec, const RunPlan& rp) {
  const auto& r = spec.rl;
  const int devices = static_cast<int>(spec.topology.devices);
  const int processes = static_cast<int>(spec.topology.processes);
  const auto& actors = rp.plan.rl_actors;
  std::string out = "decoupled online RL (sync \"" + std::string(rl::sync_mode_name(r.sync)) + "\", max_staleness " +
                    std::to_string(r.max_staleness) +
                    "): " + std::to_string(devices) + " " + device_kind_name(spec.topology.device_kind) +
                    " device(s), " + std::to_string(actors.size()) + " actors" +
                    (processes > 1 ? " on " + std::to_string(processes) + " processes (mpirun -np " + std::to_string(processes) +
                                         "; weights and rollouts cross as Cap'n Proto envelopes)"
                                   : std::string()) + "\n";
  size_t width = 0;
  for (const auto& a : actors) width = std::max(width, a.name.size());
  auto print = [&](const runtime::ActorPlan& a) {
    out += "    " + a.name + std::string(width + 2 - a.name.size(), ' ') + a.detail + "\n";
  };
  const std::vector<int> dp = processes > 1 ? device_processes(spec) : std::vector<int>(static_cast<size_t>(devices), 0);
  for (int q = 0; q < processes; ++q) {
    out += "process " + std::to_string(q) + "\n";
    if (q == 0) {
      out += "  control\n";
      for (const auto& a : actors)
        if (a.device < 0) print(a);
    }
    for (int d = 0; d < devices; ++d) {
      bool any = false;
      for (const auto& a : actors) any = any || (a.device == d && a.process == q);
      if (!any && !(q == 0 && dp[static_cast<size_t>(d)] == 0)) continue;
      out += "  device " + std::to_string(d) + " (" + device_kind_name(spec.topology.device_kind) + ")\n";
      for (const auto& a : actors)
        if (a.device == d && a.process == q) print(a);
    }
  }
  return out;
}

}  // namespace

namespace {

// The faults the run would inject: the spec's own, then the [chaos] schedule.
// rl.sft_fraction: which prompts each step draws, as the task mixes them.
void print_prompt_mix(const Spec& spec) {
  const double f = spec.rl.sft_fraction;
  if (f <= 0) return;
  std::printf("prompts: %.0f%% from the SFT side of the split (rl.sft_fraction = %g: problems SFT trained on, "
              "same verifier), the rest target problems; about %.1f of the %lld per step\n",
              100.0 * f, f, f * static_cast<double>(spec.rl.prompts_per_step),
              static_cast<long long>(spec.rl.prompts_per_step));
}

void print_faults(const Spec& spec, const std::vector<runtime::FaultSpec>& chaos) {
  if (spec.faults.empty() && chaos.empty()) return;
  std::map<std::string, int> per_kind;
  for (const auto& f : chaos) ++per_kind[runtime::fault_kind_name(f.kind)];
  std::string kinds;
  for (const auto& [k, n] : per_kind) kinds += (kinds.empty() ? "" : ", ") + std::to_string(n) + " " + k;
  std::printf("faults: %zu from [[faults]], %zu from [chaos] (seed %lld%s%s)\n", spec.faults.size(), chaos.size(),
              static_cast<long long>(spec.chaos.seed), kinds.empty() ? "" : ": ", kinds.c_str());
  for (const auto& f : spec.faults) std::printf("  %s\n", runtime::describe(f).c_str());
  for (const auto& f : chaos) std::printf("  %s [chaos]\n", runtime::describe(f).c_str());
}

// What a run of `spec` (one phase) would build, after the "ok" line.
void describe(const Spec& spec) {
  const RunPlan rp = make_run_plan(spec);
  if (spec.run.mode == RunMode::rl && rl::decoupled(spec.rl.sync)) {
    const auto& r = spec.rl;
    std::printf("%s", format_rl_actors(spec, rp).c_str());
    if (rl_trainer_on_actors(spec))  // the trainer's own actors, as a pretraining run lists them
      std::printf("the trainer's actors (rl.trainer = \"actors\"; its faults hit RL step s at optimizer update "
                  "(s - 1) x %lld + 1):\n%s",
                  static_cast<long long>(spec.rl.updates_per_batch),
                  format_topology(spec, *rp.rl_trainer_plan).c_str());
    std::printf("each step samples %lld prompts x %lld completions (KV cache, %lld slots per generator, refilled as "
                "sequences finish, the next step's included; temperature %g, top_p %g, at most %lld new "
                "tokens) by policy version %smax(0, step - %lld), scores them with the %s task's rule verifier and trains "
                "with loss \"%s\" (%lld update(s) per batch) in the trainer actor; policy from %s\n",
                static_cast<long long>(r.prompts_per_step), static_cast<long long>(r.group_size),
                static_cast<long long>(rl::generation_slots(r)), r.temperature, r.top_p,
                static_cast<long long>(r.max_new_tokens),
                r.sync == rl::SyncMode::latest ? "newest published (taken between decode steps), at least " : "",
                static_cast<long long>(r.max_staleness), r.task.c_str(),
                rl::loss_kind_name(r.policy.kind), static_cast<long long>(r.updates_per_batch),
                r.init.empty() ? "a fresh initialisation" : r.init.c_str());
    print_prompt_mix(spec);
    print_faults(spec, rp.chaos);
    return;
  }
  if (spec.run.mode == RunMode::reward_model) {  // one process, no actors: nothing to place
    const auto& r = spec.rl;
    std::printf("reward model (one process): %s samples %lld training prompts and %lld held-out prompts x %lld completions "
                "(KV cache, temperature %g, top_p %g, at most %lld new tokens), the %s task's rule verifier labels each "
                "(exact match = 1); then %lld steps of %s, score = logit[yes] - "
                "logit[no] at a marker token (ids %lld, %lld, %lld); held-out accuracy (pointwise against the majority "
                "baseline, and pairwise) before and after; device 0 (%s, %lld thread(s))\n",
                r.init.empty() ? "a fresh initialisation" : r.init.c_str(), static_cast<long long>(r.rm_prompts),
                static_cast<long long>(spec.data.eval_problems), static_cast<long long>(r.group_size), r.temperature,
                r.top_p, static_cast<long long>(r.max_new_tokens), r.task.c_str(), static_cast<long long>(spec.run.steps),
                (r.rm_loss == rl::RmLoss::bradley_terry
                     ? "the Bradley-Terry loss on " + std::to_string(r.rm_batch / 2) +
                           " pairs each (an accepted against a rejected completion of one prompt)"
                     : "pointwise BCE on " + std::to_string(r.rm_batch) + " examples each")
                    .c_str(),
                static_cast<long long>(spec.model.vocab_size - 1),
                static_cast<long long>(spec.model.vocab_size - 2), static_cast<long long>(spec.model.vocab_size - 3),
                device_kind_name(spec.topology.device_kind), static_cast<long long>(spec.topology.threads_per_device));
    return;
  }
  if (!(spec.run.mode == RunMode::rl && sync_data_parallel(spec))) {
    std::printf("%s", format_topology(spec, rp.plan).c_str());
    std::printf("%s", format_elastic(spec).c_str());
  }
  if (spec.run.mode == RunMode::rl) {
    const auto& r = spec.rl;
    if (sync_data_parallel(spec))
      std::printf("data-parallel over devices 0..%lld (%s, %lld thread(s) each): each generates 1/%lld of a step's "
                  "sequences (the same rollouts as one device) and trains on its share of the step's rows (row "
                  "buckets); the gradients are summed in device order and AdamW runs on device 0\n",
                  static_cast<long long>(spec.topology.devices - 1), device_kind_name(spec.topology.device_kind),
                  static_cast<long long>(spec.topology.threads_per_device),
                  static_cast<long long>(spec.topology.devices));
    std::printf("online RL (synchronous, one process): each step samples %lld prompts x %lld completions "
                "(KV cache, %lld slots refilled as sequences finish; temperature %g, top_p %g, at most %lld new tokens), "
                "scores them with %s and trains with loss \"%s\" (%lld update(s) per batch); policy from %s\n",
                static_cast<long long>(r.prompts_per_step), static_cast<long long>(r.group_size),
                static_cast<long long>(rl::generation_slots(r)), r.temperature, r.top_p,
                static_cast<long long>(r.max_new_tokens),
                (r.reward == rl::RewardSource::model
                     ? "the frozen learned reward model " + r.reward_model + " (reward = sigmoid(score))"
                     : "the " + r.task + " task's rule verifier").c_str(),
                rl::loss_kind_name(r.policy.kind),
                static_cast<long long>(r.updates_per_batch), r.init.empty() ? "a fresh initialisation" : r.init.c_str());
    print_prompt_mix(spec);
  }
  // Say which engine runs it: a single-device sequential spec runs in the
  // single-process trainer (the same math, no actors needed).
  const bool expert_actors = spec.model.ffn == model::Ffn::moe && spec.topology.expert_shards > 1;
  const char* experts = expert_actors ? "the experts run in the expert-shard actors" : "the experts run inside the stage actors";
  if (uses_runtime(spec) && spec.topology.processes > 1)
    std::printf("runs on the actor runtime across %lld processes (mpirun -np %lld; %s)\n",
                static_cast<long long>(spec.topology.processes), static_cast<long long>(spec.topology.processes),
                experts);
  if (uses_runtime(spec) && spec.topology.processes > 1)
    std::printf("connections between processes: %s\n",
                spec.topology.auth == runtime::ClusterAuth::none
                    ? "plain (auth = \"none\": anyone who reaches the ports can talk to the actors)"
                : spec.topology.auth_dir.empty()
                    ? "mutual TLS with a key process 0 makes for this run (sent to the others over MPI)"
                    : ("mutual TLS with the cluster key in " + spec.topology.auth_dir).c_str());
  else if (spec.run.mode == RunMode::rl && sync_data_parallel(spec))
    std::printf("runs in the single-process RL trainer on %lld devices (no actors)\n",
                static_cast<long long>(spec.topology.devices));
  else if (uses_runtime(spec) && expert_actors)
    std::printf("runs on the actor runtime (one process; %s)\n", experts);
  else if (uses_runtime(spec))
    std::printf("runs on the actor runtime (one process; the experts run inside the stage actors)\n");
  else
    std::printf("single device: runs in the single-process trainer, with the same math as the actor runtime\n");
  if (spec.topology.device_kind == DeviceKind::host)
    std::printf("host kernels: OpenBLAS %s\n", kernels::describe_host_kernels(spec.topology.host_kernels).c_str());
  print_faults(spec, rp.chaos);
}

// run.mode = "sft_rl": both phases, each as its own run would print it.
void describe_sft_rl(const Spec& spec) {
  const Spec sft = sft_phase_spec(spec);
  std::string init = sft.checkpoint_dir();
  std::string resume, resume2;
  if (resumes_phase2(spec)) {
    resume = " (skipped: done, \"" + init + "\" is its checkpoint)";
    resume2 = " (resumed from its checkpoint \"" + spec.checkpoint.resume + "\" at RL step " +
              std::to_string(model::load_checkpoint(spec.checkpoint.resume).step) + ")";
  } else if (!spec.checkpoint.resume.empty()) {
    const int64_t step = model::load_checkpoint(spec.checkpoint.resume).step;  // loaded by check_input_checkpoints
    if (step >= spec.run.steps) {
      init = spec.checkpoint.resume;
      resume = " (skipped: [checkpoint] resume = \"" + spec.checkpoint.resume + "\" is at its last step)";
    } else {
      resume = " (resumed from \"" + spec.checkpoint.resume + "\" at step " + std::to_string(step) + ")";
    }
  }
  const Spec rl_spec = rl_phase_spec(spec, init);
  std::printf("two-phase job (run.mode = \"sft_rl\"): phase 1 trains %lld SFT steps and saves %s; phase 2 trains %lld "
              "RL steps from that checkpoint and saves %s; the summary gives held-out exact match on both tasks after "
              "each phase\n",
              static_cast<long long>(spec.run.steps), sft.checkpoint_dir().c_str(), static_cast<long long>(rl_spec.run.steps),
              rl_spec.checkpoint_dir().c_str());
  std::printf("\nphase 1/2: SFT%s, lr %g, warmup %lld: the pretraining run of this spec (`troupe run SPEC --set "
              "run.mode='\"pretrain\"'` alone)\n",
              resume.c_str(), spec.optim.lr, static_cast<long long>(spec.optim.warmup_steps));
  describe(sft);
  std::printf("\nphase 2/2: online RL%s, lr %g, warmup %lld, evaluation %s: run.mode = \"rl\" with rl.init = \"%s\"\n",
              resume2.c_str(), rl_spec.optim.lr, static_cast<long long>(rl_spec.optim.warmup_steps),
              rl_spec.run.eval_every > 0 ? ("every " + std::to_string(rl_spec.run.eval_every) + " steps").c_str()
                                    : "before the first step and after the last",
              init.c_str());
  describe(rl_spec);
  const std::string side = sft_side_pairs(spec);
  std::printf("\nsummary: held-out exact match (greedy) after SFT and after RL of the SFT task (%lld held-out problems%s) "
              "and of the RL target (%lld held-out problems%s)\n",
              static_cast<long long>(spec.data.eval_problems),
              side.empty() ? "" : (" whose column-" + std::to_string(spec.data.target_column) + " digits are not a target pair").c_str(),
              static_cast<long long>(spec.data.eval_problems),
              spec.data.target_pairs.empty() ? "" : (" with data.target_pairs \"" + spec.data.target_pairs + "\"").c_str());
}

// A user's task: the data, tokenizer and reward the run will use (nothing
// is started: a reward program is only checked).
void describe_user_task(const Spec& spec) {
  const bool sft = spec.data.source == model::DataKind::jsonl && spec.run.mode != RunMode::rl;
  const bool rl = !spec.rl_section.prompts.empty() && spec.run.mode != RunMode::pretrain;
  if (!sft && !rl) return;
  try {
    std::printf("tokenizer: %s\n", model::make_tokenizer(spec.data.tokenizer)->describe().c_str());
    if (sft)
      std::printf("data: %s\n", model::make_data_source(spec.data, static_cast<uint64_t>(spec.run.seed), spec.model.seq_len)
                                      ->describe().c_str());
    if (rl) {
      const auto task = rl::make_task(spec.rl, spec.data, static_cast<uint64_t>(spec.run.seed));  // starts nothing
      const std::string reward = rl::describe_reward(spec.rl);
      std::printf("rl prompts: %s\nreward: %s\n", task->describe().c_str(), reward.c_str());
    }
  } catch (const std::exception& e) {
    std::printf("user task: %s\n", e.what());  // the spec check reported it already
  }
}

}  // namespace

int command_validate(const CliOptions&, const Spec& spec) {
  if (spec.topology.device_kind == DeviceKind::sim) {  // no actors to place: show the simulated devices
    std::printf("%s: ok\n%s", spec.source.c_str(),
                (spec.run.mode == RunMode::rl ? format_rl_sim_plan(spec) : format_sim_plan(spec)).c_str());
    return kExitOk;
  }
  if (const int rc = check_input_checkpoints(spec); rc != kExitOk) return rc;
  std::printf("%s: ok\n", spec.source.c_str());
  describe_user_task(spec);
  if (spec.run.mode == RunMode::sft_rl) describe_sft_rl(spec);
  else describe(spec);
  std::printf("memory: %s, of %.3g GiB (%s)\n", estimate_memory(spec).describe().c_str(),
              memory_limit_bytes(spec) / (1024.0 * 1024 * 1024), spec.run.memory_limit > 0 ? "run.memory_limit" : "this machine");
  return kExitOk;
}

}  // namespace troupe::launch
