// `troupe validate`: the spec is already parsed and checked by the time we get
// here; print what the run would build.
#include <cstdio>

#include "launch/cli.hpp"
#include "launch/topology.hpp"

namespace troupe::launch {

int command_validate(const CliOptions&, const Spec& spec) {
  const Topology topo = resolve_topology(spec);
  std::printf("%s: ok\n%s", spec.source.c_str(), format_topology(spec, topo).c_str());
  // Honest about what runs today: the actors above are the plan; until the
  // actor runtime lands, `troupe run` executes a single-device spec in one
  // process with the same math (model::train).
  std::printf("note: the actor runtime is not built yet; `troupe run` trains this single-device topology "
              "in one process (the single-process trainer), with the same math the actors will run\n");
  return kExitOk;
}

}  // namespace troupe::launch
