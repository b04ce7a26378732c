// Topology resolution: from a validated Spec, every actor the run would
// spawn (pipeline stages, expert shards when there is more than one per layer,
// optimizer shards, the coordinator) with its device and process, placed as
// actors/supervision/runtime.cpp places them. Pure: no actors are created here.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "launch/spec.hpp"

namespace troupe::launch {

struct ActorPlan {
  std::string id;       // unique, e.g. "stage:1", "experts:L2:S0", "optimizer:0"
  std::string kind;     // coordinator, stage, experts, optimizer
  int64_t device = -1;  // -1: not bound to a compute device (control actors)
  int64_t process = 0;
  std::string detail;   // what it owns: layer range, expert ids, parameter range
};

struct DevicePlan {
  int64_t index = 0;
  int64_t process = 0;
  std::string kind;  // host, opencl, sim
};

struct Topology {
  std::vector<DevicePlan> devices;
  std::vector<ActorPlan> actors;
  int64_t parameters = 0;  // total elements of the flat parameter buffer
};

// Layers [begin, end) of each of `parts` contiguous, as-equal-as-possible chunks.
std::vector<std::pair<int64_t, int64_t>> split_even(int64_t n, int64_t parts);

Topology resolve_topology(const Spec& spec);
// Human-readable listing, grouped by process and device.
std::string format_topology(const Spec& spec, const Topology& topology);

}  // namespace troupe::launch
