// `troupe validate`: the spec is already parsed and checked by the time we get
// here; print what the run would build.
#include <cstdio>

#include "launch/cli.hpp"
#include "launch/sim_plan.hpp"
#include "launch/topology.hpp"

namespace troupe::launch {

int command_validate(const CliOptions&, const Spec& spec) {
  if (spec.topology.device_kind == "sim") {  // no actors to place: show the simulated devices
    std::printf("%s: ok\n%s", spec.source.c_str(), format_sim_plan(spec).c_str());
    return kExitOk;
  }
  const runtime::Plan topo = resolve_topology(spec);
  std::printf("%s: ok\n%s", spec.source.c_str(), format_topology(spec, topo).c_str());
  // Say which engine runs it: a single-device sequential spec runs in the
  // single-process trainer (the same math, no actors needed).
  const bool expert_actors = spec.model.ffn == "moe" && spec.topology.expert_shards > 1;
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
