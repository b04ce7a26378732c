// The seeded nemesis ([chaos]) and the fault summary of a run. No CAF: the
// spec validator lists the schedule it would inject, the runtime takes it as
// more [[faults]] entries (one fault list, one injection path), and the
// coordinator fills the summary that `troupe run` prints at the end.
//
// The schedule: fault arrivals are a Poisson process in steps (exponential
// gaps with mean mean_steps_between_faults), each fault of a kind drawn
// uniformly from `kinds`, aimed at an actor drawn uniformly from the plan's
// actors of a role drawn uniformly from `roles`. Everything comes from one
// splitmix64 stream seeded by `seed`: the same seed and topology give the
// same schedule. At most one fault per actor and step (as for [[faults]]):
// a draw that lands on a taken (actor, step) is redrawn a few times, then
// skipped.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "actors/names.hpp"

namespace troupe::runtime {

struct Plan;

struct ChaosOptions {
  uint64_t seed = 1;
  double mean_steps_between_faults = 0.0;  // 0: no chaos
  std::vector<FaultKind> kinds;            // empty: every kind
  std::vector<Role> roles;                 // empty: every role the plan has (stage, optimizer, expert; RL: generator, reward)
};

// "stage", "optimizer" or "expert" (the roles a fault can hit; role_name()
// in plan.hpp spells them), in an RL run "generator" or "reward" (alias
// "reward_model"); nullopt otherwise.
std::optional<Role> parse_role(const std::string& name);

// The faults the nemesis injects into a run of `steps` steps on `plan`,
// sorted by step; `taken` (the spec's own [[faults]]) are never doubled up
// on. The parameters per kind are fixed: kill at a seeded point of the step;
// drop 1 message; duplicate 2; delay 2 by 20 ms; pause 50 ms; corrupt 1;
// slow: the device 4x slower for the step.
std::vector<FaultSpec> chaos_schedule(const ChaosOptions& c, const Plan& plan, int64_t steps,
                                      const std::vector<FaultSpec>& taken = {});

// The nemesis of a decoupled RL run (roles generator and reward; kinds from
// kRlChaosKinds, the default): the same draw as chaos_schedule, each fault
// aimed at the generator or reward actor that handles its step (step s goes
// to generator (s-1) % generators, reward actor (s-1) % reward_actors;
// "reward_model:K" when reward_model), a drop only at a generator.
std::vector<FaultSpec> rl_chaos_schedule(const ChaosOptions& c, int generators, int reward_actors, bool reward_model,
                                         int64_t steps, const std::vector<FaultSpec>& taken = {});

// One line per fault: "step 3: corrupt optimizer:1".
std::string describe(const FaultSpec& f);

// What the faults of a run cost, filled by the coordinator as steps end.
struct FaultSummary {
  std::map<std::string, int64_t> injected;  // by kind: faults armed (their step was reached)
  int64_t recovered = 0;   // of those, faults whose step then finished
  int64_t restarts = 0;    // actors respawned by the supervisor
  int64_t replays = 0;     // step attempts discarded (an actor died, or the deadline fired)
  int64_t suspicions = 0;  // of those, deadline replays (nothing reported a loss; in a fault-free run: false ones)
  int64_t gaps = 0;        // of those, losses found by a sequence gap (interposer.hpp, LossDetector)
  int64_t damaged = 0;     // messages receivers dropped as damaged in flight (corrupt)
  int64_t partitioned = 0; // step messages a partition held back until its window ended
  int64_t steps = 0;       // steps finished
  int64_t processes_lost = 0;   // processes lost and recovered from (2-process runs)
  double detect_seconds = 0.0;  // summed: from the start of the step a loss hit to its detection
  // Seconds from each step's first attempt to its end, summed; and the
  // seconds of the attempts that finished (useful work). A straggler's slow
  // step counts as useful: it is slow, not repeated.
  double wall_seconds = 0.0, useful_seconds = 0.0;
  // Time to repair, by role: from the failure being noticed (the actor's
  // down message, a receiver's report of a damaged message, or the step
  // deadline firing for a lost message or a frozen actor) until the step it
  // hit finished.
  struct Repair {
    int64_t count = 0;
    double total_seconds = 0.0, max_seconds = 0.0;
    double mean() const { return count > 0 ? total_seconds / static_cast<double>(count) : 0.0; }
  };
  std::map<std::string, Repair> repairs;

  int64_t total_injected() const;
  double lost_seconds() const { return wall_seconds - useful_seconds; }
  double goodput() const { return wall_seconds > 0 ? useful_seconds / wall_seconds : 1.0; }
  // Several lines for people: faults per kind, recovered, time lost, goodput, MTTR per role.
  std::string str() const;
};

}  // namespace troupe::runtime
