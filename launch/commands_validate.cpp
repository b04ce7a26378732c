// `troupe validate`: the spec is already parsed and checked by the time we get
// here; print what the run would build.
#include <cstdio>

#include "launch/cli.hpp"
#include "launch/topology.hpp"

namespace troupe::launch {

int command_validate(const CliOptions&, const Spec& spec) {
  const Topology topo = resolve_topology(spec);
  std::printf("%s: ok\n%s", spec.source.c_str(), format_topology(spec, topo).c_str());
  return kExitOk;
}

}  // namespace troupe::launch
