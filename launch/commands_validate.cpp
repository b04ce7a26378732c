// `troupe validate`: the spec is already parsed and checked by the time we get
// here; print what the run would build.
#include <cstdio>

#include "launch/cli.hpp"
#include "launch/sim_plan.hpp"
#include "launch/topology.hpp"
#include "model/checkpoint.hpp"

namespace troupe::launch {

int check_input_checkpoints(const Spec& spec) {
  if (spec.run.mode == RunMode::rl && !spec.rl.init.empty()) {
    // A missing or damaged init is a bad input file.
    try {
      model::load_checkpoint(spec.rl.init);
    } catch (const model::CheckpointError& e) {
      std::fprintf(stderr, "troupe: %s: [rl] init: %s\n", spec.source.c_str(), e.what());
      return kExitBadInput;
    }
  }
  if (!spec.checkpoint.resume.empty()) {
    int64_t step = 0;
    try {
      step = model::load_checkpoint(spec.checkpoint.resume).step;
    } catch (const model::CheckpointError& e) {
      std::fprintf(stderr, "troupe: %s: [checkpoint] resume: %s\n", spec.source.c_str(), e.what());
      return kExitBadInput;
    }
    if (step >= spec.run.steps) {
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

int command_validate(const CliOptions&, const Spec& spec) {
  if (spec.topology.device_kind == DeviceKind::sim) {  // no actors to place: show the simulated devices
    std::printf("%s: ok\n%s", spec.source.c_str(), format_sim_plan(spec).c_str());
    return kExitOk;
  }
  if (const int rc = check_input_checkpoints(spec); rc != kExitOk) return rc;
  const runtime::Plan topo = resolve_topology(spec);
  std::printf("%s: ok\n%s", spec.source.c_str(), format_topology(spec, topo).c_str());
  std::printf("%s", format_elastic(spec).c_str());
  if (spec.run.mode == RunMode::rl) {
    const auto& r = spec.rl;
    std::printf("online RL (synchronous, one process): each step samples %lld prompts x %lld completions "
                "(KV cache, temperature %g, top_p %g, at most %lld new tokens), scores them with the %s task's rule "
                "verifier and trains with loss \"%s\" (%lld update(s) per batch); policy from %s\n",
                static_cast<long long>(r.prompts_per_step), static_cast<long long>(r.group_size), r.temperature, r.top_p,
                static_cast<long long>(r.max_new_tokens), r.task.c_str(), rl::loss_kind_name(r.policy.kind),
                static_cast<long long>(r.updates_per_batch), r.init.empty() ? "a fresh initialisation" : r.init.c_str());
  }
  // Say which engine runs it: a single-device sequential spec runs in the
  // single-process trainer (the same math, no actors needed).
  const bool expert_actors = spec.model.ffn == model::Ffn::moe && spec.topology.expert_shards > 1;
  const char* experts = expert_actors ? "the experts run in the expert-shard actors" : "the experts run inside the stage actors";
  if (uses_runtime(spec) && spec.topology.processes > 1)
    std::printf("runs on the actor runtime across %lld processes (mpirun -np %lld; %s)\n",
                static_cast<long long>(spec.topology.processes), static_cast<long long>(spec.topology.processes),
                experts);
  else if (uses_runtime(spec) && expert_actors)
    std::printf("runs on the actor runtime (one process; %s)\n", experts);
  else if (uses_runtime(spec))
    std::printf("runs on the actor runtime (one process; the experts run inside the stage actors)\n");
  else
    std::printf("single device: runs in the single-process trainer, with the same math as the actor runtime\n");
  return kExitOk;
}

}  // namespace troupe::launch
