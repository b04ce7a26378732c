// Sim devices from the launch spec ([topology] device_kind = "sim", [sim]):
// the options of the actor simulation (actors/sim/sim_runtime.hpp), what
// `troupe validate` prints about them, and `troupe run` on such a spec.
#pragma once

#include <string>

#include "actors/sim/sim_runtime.hpp"
#include "launch/run_plan.hpp"
#include "launch/spec/spec.hpp"

namespace troupe::launch {

class MetricsWriter;

// The simulation a validated sim spec describes: schedule, stages, replicas,
// micro-batches per replica, per-stage costs, link, optimizer step, steps.
sim::SimOptions sim_options(const Spec& spec);

// `troupe validate` for a sim spec: devices, cost model, per-stage costs and
// which stages each device holds.
std::string format_sim_plan(const Spec& spec);

// `troupe run` for a sim spec: runs [run] steps through the sim actors,
// prints progress and a summary table (stdout), writes metrics lines and the
// trace ([log] trace). Throws std::runtime_error when the simulation fails.
int run_sim(const Spec& spec, const RunPlan& plan, MetricsWriter& metrics);

// run.mode = "rl" on sim devices (launch/commands/rl_sim.cpp, actors/sim/rl_sim.hpp):
// what validate prints, and run's comparison of synchronous and decoupled RL.
std::string format_rl_sim_plan(const Spec& spec);
int run_rl_sim(const Spec& spec, MetricsWriter& metrics);

// [topology] expert_shards > 1 on sim devices (launch/commands/ep_sim.cpp,
// actors/sim/ep_sim.hpp): what validate prints, and run's comparison of
// static, eplb and perfectly balanced expert placement.
std::string format_ep_sim_plan(const Spec& spec);
int run_ep_sim(const Spec& spec, MetricsWriter& metrics);

}  // namespace troupe::launch
