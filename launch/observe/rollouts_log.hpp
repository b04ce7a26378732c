// rollouts.jsonl: what the policy wrote, for people to read (log.rollouts =
// N: every N-th RL step). One JSON line per group: the step it trained,
// the policy version that sampled it, the prompt as text and, per
// completion, the text, the reward, whether it was exactly right, the
// advantage, and per token the behaviour log-prob and the policy version
// that sampled it (rl.sync = "latest" changes versions mid-completion).
// Rewards, advantages and log-probs are written with 17 significant digits,
// so they read back as the same doubles (a test recomputes each group's
// advantages from its rewards). Written line by line and flushed by the
// same writer as metrics.jsonl.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "launch/observe/progress.hpp"
#include "rl/rollout.hpp"
#include "rl/rollout_step.hpp"

namespace troupe::launch {

// Token ids to text (the data source's decode).
using Detokenize = std::function<std::string(const std::vector<int32_t>&)>;

// The JSON line of group `group` of a step's rollouts.
std::string rollout_group_json(const rl::StepRollouts& r, const rl::ScoredBatch& sb, int64_t group,
                               const Detokenize& text);

class RolloutLog {
 public:
  // Opens `path` for appending (a resumed run continues it); throws
  // std::runtime_error naming the path when it cannot.
  RolloutLog(const std::string& path, Detokenize text);
  // Every group of the step, one line each.
  void write(const rl::StepRollouts& r, const rl::ScoredBatch& sb);

 private:
  Detokenize text_;
  MetricsWriter out_;
};

}  // namespace troupe::launch
