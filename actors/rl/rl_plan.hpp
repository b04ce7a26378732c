// The actors of a decoupled RL run (rl.sync = "fixed_lag" / "latest") and where they
// sit, computed once from the [rl] values and the device count: `troupe
// validate` lists them, the run logs them. CAF-free.
//
// Placement: the trainer on device 0; generators on devices 1..D-1
// round-robin (all on device 0 when D = 1), so with 2 devices generation and
// training run side by side; the coordinator, the buffer and the reward
// actors (rule verifiers, microseconds per group) are control actors with no
// device. On host devices a device is a thread: each generator and the
// trainer compute on their own thread with their own backend.
#pragma once

#include <algorithm>
#include <string>
#include <vector>

#include "rl/config.hpp"

namespace troupe::runtime {

struct RlActorPlacement {
  std::string name;  // "rl_coordinator", "rollout_buffer", "trainer", "generator:K", "reward:K"
  int device = -1;   // -1: a control actor with no device
  std::string detail;
  int process = 0;   // generators may sit on processes > 0; everything else is on process 0
};

// Across processes a policy version is one envelope, at most this long
// (DecodeLimits::max_message_bytes; rl_wire.cpp checks they agree).
inline constexpr uint64_t kRlMaxMessageBytes = 256ull << 20;

// Generators go round-robin on the devices after the trainer's
// (trainer_devices of them: 1, or the runtime's with rl.trainer = "actors"),
// on the trainer's own when there are none.
inline int rl_generator_device(int generator, int devices, int trainer_devices = 1) {
  if (devices <= trainer_devices) return devices <= 1 ? 0 : generator % devices;
  return trainer_devices + generator % (devices - trainer_devices);
}

// runtime_devices: 0 = the trainer is one actor on device 0; n >= 1 = it
// runs on the actor runtime's ranks and shards on devices 0..n-1.
// generator_process: the process of each generator (empty: all on process 0).
inline std::vector<RlActorPlacement> rl_actor_plan(const rl::RlConfig& c, int devices, int runtime_devices = 0,
                                                   const std::vector<int>& generator_process = {}) {
  const int trainer_devices = std::max(1, runtime_devices);
  std::vector<RlActorPlacement> out;
  const std::string eta = std::to_string(c.max_staleness);
  const bool latest = c.sync == rl::SyncMode::latest;
  out.push_back({"rl_coordinator", -1, "deals step s to generator s % " + std::to_string(c.generators) +
                                           (latest ? " once version max(0, s - " + eta + ") is out; pushes every version to every generator"
                                                   : " with version max(0, s - " + eta + ")") +
                                           "; weight-sync deadlines; supervises generators and reward actors"});
  out.push_back({"rollout_buffer", -1, (latest ? "admission (every token's version in [s - " + eta + ", s])"
                                               : "admission (version exactly max(0, s - " + eta + "))") +
                                           " and the ledger: each group (seed, step, index) admitted and trained once"});
  out.push_back({"trainer", 0, "the policy update (loss " + std::string(loss_kind_name(c.policy.kind)) + ")" +
                                   (runtime_devices > 0
                                        ? "; on the actor runtime's pipeline ranks, expert and optimizer shards, devices 0.." +
                                              std::to_string(trainer_devices - 1)
                                        : std::string()) +
                                   "; publishes version v+1 after each step"});
  for (int k = 0; k < c.generators; ++k)
    out.push_back({"generator:" + std::to_string(k), rl_generator_device(k, devices, trainer_devices),
                   "policy copy + version; samples " + std::to_string(c.prompts_per_step) + " x " +
                       std::to_string(c.group_size) + " completions per step (KV cache" +
                       (latest ? "; takes new versions between decode steps)" : ")"),
                   generator_process.empty() ? 0 : generator_process[static_cast<size_t>(k)]});
  for (int k = 0; k < c.reward_actors; ++k) {
    if (c.reward == rl::RewardSource::model)
      out.push_back({"reward_model:" + std::to_string(k), -1,
                     "the learned reward model " + c.reward_model + " (frozen; a step's completions in one batch), group advantages"});
    else
      out.push_back({"reward:" + std::to_string(k), -1, "rule verifier and group advantages"});
  }
  return out;
}

}  // namespace troupe::runtime
