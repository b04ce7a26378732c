// The run plan of a validated spec: the runtime options it maps onto, their
// topology plan (actors/plan.hpp: every actor with its name, role, device,
// process and ranges), the faults [chaos] draws, the RL trainer's runtime and
// where generators run; built once per command (make_run_plan) and read by
// validate, run, rl and calibrate. Every plan launch/ needs is made here
// (plan_of in run_plan.cpp is launch's one call of runtime::make_plan). Also
// the listings `troupe validate` prints. No actors are created here; the
// runtime spawns exactly the plan's actors under the same names.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "actors/plan.hpp"
#include "actors/options.hpp"
#include "launch/spec/spec.hpp"

namespace troupe::launch {

// A spec, translated once for the runtime.
struct RunPlan {
  // Pretraining on the actor runtime: the [topology], [run] supervision,
  // [experts], [[faults]] and [[elastic]] keys, plus [chaos]'s faults.
  runtime::RuntimeOptions runtime;
  // The topology plan of `runtime` (what validate lists, the runtime
  // spawns); with decoupled RL also its actors (plan.rl_actors).
  runtime::Plan plan;
  std::vector<runtime::FaultSpec> chaos;  // what [chaos] draws (for training, also in runtime.faults)
  // Decoupled RL with rl.trainer = "actors": the trainer's runtime and plan.
  std::optional<runtime::RuntimeOptions> rl_trainer;
  std::optional<runtime::Plan> rl_trainer_plan;
  std::vector<int> generator_process;     // decoupled RL across processes: each generator's process
};

// Throws std::invalid_argument for a topology the runtime rejects (a loaded
// spec has had every such problem reported on its keys).
RunPlan make_run_plan(const Spec& spec);

// The runtime's view of the spec. The spec counts microbatches per replica;
// the runtime counts them over all replicas. [topology] expert_shards = 1
// keeps the experts inside their stage (runtime expert_shards = 0).
// Its faults are the spec's [[faults]] followed by chaos_faults(spec).
runtime::RuntimeOptions runtime_options(const Spec& spec);

// Decoupled RL with rl.trainer = "actors": the trainer's runtime (the
// [topology] keys on its own rl_trainer_devices(spec) devices, a batch of
// prompts_per_step x group_size rows, one optimizer update per step of the
// runtime, so its [[faults]] on "stage:", "optimizer:" and "expert:" targets
// hit RL step s at update (s - 1) x updates_per_batch + 1). The model and
// the row length are filled in by the RL trainer (actors/rl/runtime_policy.hpp).
bool rl_trainer_on_actors(const Spec& spec);
int rl_trainer_devices(const Spec& spec);
runtime::RuntimeOptions rl_trainer_runtime(const Spec& spec);
// Decoupled RL on [topology] processes = N > 1: the process of each
// generator (its device's process: contiguous blocks of devices per process,
// or device_processes); empty for one process. The trainer (its runtime
// included) and the control actors stay on process 0.
std::vector<int> rl_generator_processes(const Spec& spec);
// The process each device is on (one entry per device).
std::vector<int> device_processes(const Spec& spec);
// Whether a [[faults]] target names one of the trainer's runtime actors.
bool is_trainer_fault_target(const std::string& target);

// [chaos] as the runtime's ChaosOptions; throws std::invalid_argument naming
// an unknown kind ("kinds: ...") or role ("roles: ...").
runtime::ChaosOptions chaos_options(const Spec& spec);
// The faults the [chaos] nemesis injects into this spec's run (none when
// mean_steps_between_faults is 0), in step order.
std::vector<runtime::FaultSpec> chaos_faults(const Spec& spec);

// Layers [begin, end) of each of `parts` contiguous, as-equal-as-possible chunks.
std::vector<std::pair<int64_t, int64_t>> split_even(int64_t n, int64_t parts);

// The plan of runtime_options(spec) (the spec checks' question; commands read RunPlan::plan).
runtime::Plan resolve_topology(const Spec& spec);
// The plan in force during 1-based step `step` ([[elastic]] events change the expert shards).
runtime::Plan plan_at_step(const Spec& spec, int64_t step);
// The plan of rl_trainer_runtime(spec).
runtime::Plan rl_trainer_plan(const Spec& spec);
// Human-readable listing, grouped by process and device.
std::string format_topology(const Spec& spec, const runtime::Plan& plan);
// With [[elastic]] events: the expert placement (shard -> experts -> device)
// in force before and after each event, and a line on the eplb policy;
// "" without either.
std::string format_elastic(const Spec& spec);

}  // namespace troupe::launch
