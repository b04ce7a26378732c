// The names of a run's actors and what can happen to them (CAF-free, so the
// spec parser can use it): roles and targets ("stage:1", "expert:0/1",
// "generator:0", "process:1"), the [[faults]] vocabulary (which actor an
// entry names, when it is killed), and what the supervisor reports when it
// restarts one.
//
// A kill happens "at a seeded point inside the step": at the start of step
// `at_step` (1-based, as progress lines count steps; its first attempt) the coordinator arms the target with a count k;
// the target dies (exit_reason::kill) on receiving the k-th message after
// that, before handling it. k is drawn from (seed, step, target) by
// kill_point(), uniformly in [1, N] where N is how many messages the target
// handles in one step, so the same spec kills at the same point of the
// target's message stream (k = 1: before it did anything; k = N: before its
// last message, after everything else of the step happened).
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace troupe::runtime {

// The role of an actor of the topology (actors/plan.hpp names them): the
// coordinator, a ZeRO-1 optimizer shard, a pipeline rank (the actor running
// one op list; named "stage:K", and it may hold two model stages), an expert
// shard; in a decoupled RL run (Plan::rl_actors) the RL coordinator, the
// rollout buffer, the trainer, a rollout generator ("generator:K") or a
// reward actor ("reward:K" / "reward_model:K").
enum class Role { Coordinator, Optimizer, Rank, Expert, Generator, Reward, RlCoordinator, Buffer, Trainer };

// An actor of the topology by role and index: "stage:1" (pipeline rank 1 of
// data-parallel replica 0), "stage:1/replica:1", "optimizer:0", or an expert
// shard "expert:L/S" (shard S of MoE layer L; "expert:L/S/replica:R").
struct FaultTarget {
  Role role = Role::Rank;
  int index = 0;    // pipeline rank, optimizer shard, or (experts) the global layer
  int replica = 0;  // stage and expert targets only
  int shard = 0;    // expert targets: the shard within the layer
};

// Parses "stage:K", "stage:K/replica:R", "optimizer:K", "expert:L/S" or
// "expert:L/S/replica:R" (non-negative decimals); nullopt otherwise.
// "stage:K" names pipeline rank K (actors/plan.hpp); "rank:K[/replica:R]"
// is accepted as an alias of it.
inline std::optional<FaultTarget> parse_fault_target(const std::string& text) {
  auto number = [](const std::string& s, int& out) {
    if (s.empty() || s.size() > 6 || s.find_first_not_of("0123456789") != std::string::npos) return false;
    out = std::stoi(s);
    return true;
  };
  FaultTarget t;
  if (text.rfind("expert:", 0) == 0) {
    // expert:L/S or expert:L/S/replica:R
    const std::string rest = text.substr(7);
    const auto a = rest.find('/');
    if (a == std::string::npos) return std::nullopt;
    const auto b = rest.find('/', a + 1);
    const std::string shard = rest.substr(a + 1, b == std::string::npos ? std::string::npos : b - a - 1);
    if (!number(rest.substr(0, a), t.index) || !number(shard, t.shard)) return std::nullopt;
    if (b != std::string::npos) {
      const std::string tail = rest.substr(b + 1);
      if (tail.rfind("replica:", 0) != 0 || !number(tail.substr(8), t.replica)) return std::nullopt;
    }
    t.role = Role::Expert;
    return t;
  }
  std::string head = text;
  if (const auto slash = text.find('/'); slash != std::string::npos) {
    const std::string tail = text.substr(slash + 1);
    head = text.substr(0, slash);
    if (tail.rfind("replica:", 0) != 0 || !number(tail.substr(8), t.replica)) return std::nullopt;
    if (head.rfind("stage:", 0) != 0 && head.rfind("rank:", 0) != 0) return std::nullopt;  // shards serve every replica
  }
  const auto colon = head.find(':');
  if (colon == std::string::npos || !number(head.substr(colon + 1), t.index)) return std::nullopt;
  const std::string role = head.substr(0, colon);
  if (role == "stage" || role == "rank") t.role = Role::Rank;
  else if (role == "optimizer") t.role = Role::Optimizer;
  else return std::nullopt;
  return t;
}

// The decoupled RL actors (actors/rl/): "generator:K", "reward:K" or
// "reward_model:K" (a non-negative decimal K; the reward actors are named
// reward_model:K when rl.reward = "model", see rl_reward_actor_name). Sets
// `generator` and `index`; false otherwise.
inline bool parse_rl_fault_target(const std::string& text, bool& generator, int& index) {
  std::string num;
  if (text.rfind("generator:", 0) == 0) generator = true, num = text.substr(10);
  else if (text.rfind("reward:", 0) == 0) generator = false, num = text.substr(7);
  else if (text.rfind("reward_model:", 0) == 0) generator = false, num = text.substr(13);
  else return false;
  if (num.empty() || num.size() > 4 || num.find_first_not_of("0123456789") != std::string::npos) return false;
  index = std::stoi(num);
  return true;
}

// The decoupled RL run's rollout buffer as a fault target (kill only; its
// state outlives it, actors/rl/rl_messages.hpp BufferStore).
inline bool is_rl_buffer_target(const std::string& text) { return text == "rollout_buffer"; }

// The name of reward actor K: "reward_model:K" when it serves the learned
// reward model (rl.reward = "model"), else "reward:K" (the rule verifier).
inline std::string rl_reward_actor_name(bool reward_model, int index) {
  return (reward_model ? "reward_model:" : "reward:") + std::to_string(index);
}

// Kill points of a generator or reward actor within one job (a seeded kill
// draws one of them): 1 on receiving it, 2 after computing before sending
// the result (the work dies with the actor), 3 after sending it.
inline constexpr uint32_t kRlKillPoints = 3;

// What a [[faults]] entry does to its target:
//   kill       the actor exits (exit_reason::kill) at a seeded point; it is
//              restarted and the step replayed;
//   drop       the next `count` step messages sent to it are lost; the step's
//              deadline catches the stall and the step is replayed;
//   duplicate  the next `count` messages to it arrive twice (it drops the copies);
//   delay      the next `count` messages to it arrive delay_ms late (in order);
//   pause      it receives nothing for duration_ms (a frozen actor; what it
//              was sent arrives afterwards, in order);
//   corrupt    the next `count` Envelopes sent to it arrive with one seeded
//              bit of their wire frame flipped: the frame's CRC-32 rejects
//              them, the receiver drops and counts them as lost (never
//              accepted with wrong values) and tells the coordinator, which
//              replays the step at once (no deadline wait);
//   slow       the device the target runs on takes `factor` times as long
//              for every closure (a straggler), for duration_ms, or else for
//              duration_steps steps from at_step (FaultSpec::steps);
//   partition  the target's device (every actor placed on it) is cut off
//              from the rest of the run for duration_ms: step messages
//              between an actor on it and one elsewhere (the coordinator
//              counts as elsewhere) are held, both ways, and arrive in order
//              when the window ends, as TCP delivers them after a partition
//              shorter than its timeout; a window longer than the step
//              deadline has the step replayed (the replay's crossing
//              messages wait for the window too);
//   stop       (target "process:P" only) the whole process P is SIGSTOPped
//              as step at_step starts: a hung process, found by the
//              heartbeat (peer_timeout), then SIGKILLed and recovered like a
//              killed one. `kill` on "process:P" SIGKILLs process P.
// Drop, duplicate, delay, pause, corrupt and partition act on messages in flight,
// through the one seam on step messages (actors/supervision/interposer.hpp);
// slow acts in the device (actors/device/device.hpp).
enum class FaultKind : uint8_t { kill, drop, duplicate, delay, pause, corrupt, slow, stop, partition };
inline const char* fault_kind_name(FaultKind k) {
  switch (k) {
    case FaultKind::kill: return "kill";
    case FaultKind::drop: return "drop";
    case FaultKind::duplicate: return "duplicate";
    case FaultKind::delay: return "delay";
    case FaultKind::pause: return "pause";
    case FaultKind::corrupt: return "corrupt";
    case FaultKind::slow: return "slow";
    case FaultKind::stop: return "stop";
    case FaultKind::partition: return "partition";
  }
  return "?";
}
inline constexpr FaultKind kFaultKinds[] = {FaultKind::kill,  FaultKind::drop,    FaultKind::duplicate, FaultKind::delay,
                                           FaultKind::pause, FaultKind::corrupt, FaultKind::slow,      FaultKind::partition};
// The kinds aimed at actors ([chaos] draws from these); `stop` is for
// process targets only and is not among them.
// Kinds that act on messages in flight (the FaultInjector at the seam).
inline bool on_messages(FaultKind k) { return k != FaultKind::kill && k != FaultKind::slow && k != FaultKind::stop; }

// The kinds a decoupled RL run's actors take ([[faults]] and [chaos]): a
// kill at a seeded point of the job; a drop of the generator's next weight
// sync (its deadline retries it, a second loss restarts the generator);
// duplicate, delay and pause of what the RL coordinator sends the actor
// (jobs, weight syncs, rollouts to score). Corrupt, slow and partition do
// not apply yet: RL payloads pass by reference in one process (no bytes to
// damage) and the RL actors compute on threads of their own, not on plan
// devices.
inline constexpr FaultKind kRlChaosKinds[] = {FaultKind::kill, FaultKind::drop, FaultKind::duplicate, FaultKind::delay,
                                             FaultKind::pause};
inline bool rl_fault_kind(FaultKind k) {
  for (FaultKind x : kRlChaosKinds)
    if (x == k) return true;
  return false;
}

// A process target "process:P" (P a non-negative decimal): sets `process`;
// false otherwise. Only `kill` and `stop` apply to it (the whole process is
// SIGKILLed or SIGSTOPped; actors/cluster/runtime_cluster.cpp).
inline bool parse_process_target(const std::string& text, int& process) {
  if (text.rfind("process:", 0) != 0) return false;
  const std::string num = text.substr(8);
  if (num.empty() || num.size() > 6 || num.find_first_not_of("0123456789") != std::string::npos) return false;
  process = std::stoi(num);
  return true;
}

// One [[faults]] entry.
struct FaultSpec {
  int64_t at_step = 1;      // 1-based step (1..steps) whose first attempt is hit
  std::string target;       // "stage:K", "stage:K/replica:R", "optimizer:K", "expert:L/S[/replica:R]"; RL: "generator:K", "reward:K"
  FaultKind kind = FaultKind::kill;
  int64_t at_message = 0;   // kill: 0 = seeded point; k > 0: die on the k-th message (tests pin phases)
  int64_t count = 1;        // drop, duplicate, delay, corrupt: how many messages
  double delay_ms = 0.0;    // delay: how late each arrives
  double duration_ms = 0.0; // pause: how long the actor receives nothing; slow: the window (0: `steps`); partition: the window
  double factor = 1.0;      // slow: how many times longer each device closure takes
  int64_t steps = 1;        // slow without duration_ms ([[faults]] duration_steps): steps at_step .. at_step + steps - 1
};

// The spelling of a target its seeded kill point is drawn from: the alias
// "rank:" counts as "stage:", so both spellings kill at the same point.
inline std::string fault_key(const std::string& target) {
  return target.rfind("rank:", 0) == 0 ? "stage:" + target.substr(5) : target;
}

// The seeded kill point in [1, n] (n >= 1) for `target` in `step`; with
// `salt`, other seeded draws (which bit a corrupt fault flips).
inline uint32_t kill_point(uint64_t seed, uint64_t step, const std::string& target, uint32_t n, uint64_t salt = 0) {
  // splitmix64 over the seed, the step and the target's name: cheap, fixed, portable.
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + step + salt * 0xD1B54A32D192ED03ull;
  for (char c : target) x = (x ^ static_cast<unsigned char>(c)) * 0x100000001B3ull;
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  x ^= x >> 31;
  return n == 0 ? 1 : static_cast<uint32_t>(1 + x % n);
}

// The supervisor's restart strategy ([run] supervision), Erlang's names:
//   one_for_one   the actor that went down is respawned alone;
//   one_for_all   every supervised actor is respawned with it;
//   rest_for_one  it and the actors started after it (start order: optimizer
//                 shards, pipeline ranks replica-major, expert shards).
// Whichever, the running step is replayed from its snapshot, so the result
// is the same; what differs is how much is torn down (and its cost). A
// restart of several actors counts once against the restart intensity.
enum class Strategy : uint8_t { one_for_one, one_for_all, rest_for_one };
inline std::string strategy_name(Strategy s) {
  switch (s) {
    case Strategy::one_for_one: return "one_for_one";
    case Strategy::one_for_all: return "one_for_all";
    case Strategy::rest_for_one: return "rest_for_one";
  }
  return "?";
}

// What the supervisor did about one actor that went down.
struct RestartEvent {
  int64_t step = 0;     // 1-based step that was running (or is about to run)
  int attempt = 0;      // 1-based attempt of that step that runs next
  std::string actor;    // "stage:1", "stage:1/replica:1" (data-parallel runs), "optimizer:0", "expert:0/1"
  std::string cause;    // "killed", or the exit reason
  std::string phase;    // where in the step a killed actor was (when it said so)
  bool replayed = false;  // the running step was discarded and is run again
  bool deadline = false;  // no actor died: the step missed its deadline (actor: what it waited for)
  bool damaged = false;   // no actor died: `actor` dropped a message damaged in flight (cause: why)
  bool gap = false;       // no actor died: a message was lost, seen by a sequence gap (actor: what the step waited for)
  // [experts] on_failure = "shrink": `actor` broke its restart budget and
  // its slot was removed instead of restarting it (expert shards per MoE
  // layer shards_before -> shards_after).
  bool shrink = false;
  int shards_before = 0, shards_after = 0;
  // With shrink: the shards' process was lost (not a budget broken); actor
  // names them all.
  bool process_lost = false;
  std::string str() const {
    if (shrink)
      return "removed " + actor + " (" + cause + ") in step " + std::to_string(step) +
             (process_lost ? ": their process was lost, " : ": over its restart budget, ") +
             "expert shards per layer " + std::to_string(shards_before) + " -> " + std::to_string(shards_after) +
             (replayed ? ", step replayed, attempt " + std::to_string(attempt) : ", between steps");
    if (damaged)
      return "step " + std::to_string(step) + " lost a message (" + actor + " dropped it as damaged: " + cause +
             "): step replayed, attempt " + std::to_string(attempt);
    if (gap)
      return "step " + std::to_string(step) + " lost a message (" + cause + "; waiting for " + actor +
             "): step replayed, attempt " + std::to_string(attempt);
    if (deadline)
      return "step " + std::to_string(step) + " missed its deadline (" + cause + "; waiting for " + actor +
             "): step replayed, attempt " + std::to_string(attempt);
    std::string s = "restarted " + actor + " (" + cause + (phase.empty() ? "" : ", " + phase) + ") in step " +
                    std::to_string(step) + ", attempt " + std::to_string(attempt);
    return s + (replayed ? ": step replayed" : ": between steps, state restored");
  }
};

}  // namespace troupe::runtime
