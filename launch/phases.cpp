// The two phases of run.mode = "sft_rl" as ordinary specs (see phases.hpp).
#include "launch/phases.hpp"

#include <filesystem>

#include "model/data.hpp"

namespace troupe::launch {

std::string sft_checkpoint_dir(const Spec& spec) { return spec.checkpoint_dir() + "_sft"; }

Spec sft_phase_spec(const Spec& spec) {
  Spec a = spec;
  a.run.mode = RunMode::pretrain;
  a.checkpoint.dir = sft_checkpoint_dir(spec);
  // [rl] belongs to phase 2; a pretraining spec carries none.
  a.rl_section = RlSection{};
  a.rl = rl::RlConfig{};
  return a;
}

bool resumes_phase2(const Spec& spec) {
  if (spec.checkpoint.resume.empty()) return false;
  std::error_code ec;
  const auto a = std::filesystem::weakly_canonical(spec.checkpoint.resume, ec);
  if (ec) return false;
  const auto b = std::filesystem::weakly_canonical(spec.checkpoint_dir(), ec);
  return !ec && a == b;
}

Spec rl_phase_spec(const Spec& spec, const std::string& init) {
  Spec b = spec;
  const RlSection& r = spec.rl_section;
  b.run.mode = RunMode::rl;
  b.run.steps = r.steps;
  b.run.eval_every = r.eval_every;
  b.optim.lr = r.lr;
  b.optim.warmup_steps = r.warmup_steps;
  b.rl_section.init = init;
  b.rl.init = init;
  // Phase 1's checkpoint is phase 2's init, never its resume; only phase 2's
  // own checkpoint resumes it (fixed_lag and synchronous runs resume bit for bit).
  if (!resumes_phase2(spec)) b.checkpoint.resume.clear();
  auto& t = b.topology;
  const auto& t0 = spec.topology;
  const bool actors = rl::decoupled(r.sync);
  t.devices = actors ? t0.devices : 1;
  t.threads_per_device = actors ? t0.threads_per_device : t0.threads_per_device * t0.devices;
  t.processes = 1;
  t.device_processes.clear();
  // rl.trainer = "actors": phase 1's pipeline, expert and optimizer shards
  // train the policy too; otherwise the trainer is one actor on device 0.
  if (actors && r.trainer == "actors") return b;
  t.stages = 1;
  t.schedule = sched::Kind::sequential;
  t.microbatches = 1;
  t.expert_shards = 1;
  t.optimizer_shards = 1;
  t.data_parallel = 1;
  t.device_processes.clear();
  return b;
}

std::string sft_side_pairs(const Spec& spec) {
  if (spec.data.target_pairs.empty() || spec.data.target_column < 0) return "";
  return model::complement_pairs(spec.data.target_pairs, spec.data.target_column);
}

}  // namespace troupe::launch
