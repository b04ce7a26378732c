// Group sampling bookkeeping and group-relative advantages. Step s of an RL
// run samples prompts_per_step groups; group g trains on the task's prompt
// number prompt_index(), and its group_size members each sample with their own
// RNG seed, so which generator samples a completion, and in what order, never
// changes it. Rewards and advantages are laid out group-major:
// [n_groups * group_size], member k of group g at g * group_size + k.
#pragma once

#include <compare>
#include <cstdint>
#include <span>

#include "rl/config.hpp"

namespace troupe::rl {

// Identity of one rollout group (issue #12's ledger key).
struct GroupId {
  uint64_t seed = 0;  // the run's seed
  int64_t step = 0;   // the optimizer step that trains on it
  int64_t index = 0;  // 0 .. prompts_per_step - 1 within the step
  auto operator<=>(const GroupId&) const = default;
};

// The task's training prompt for a group: step * prompts_per_step + index, so
// every step draws new prompts and a resumed run draws the same ones.
// Throws std::invalid_argument for a negative step or index out of range.
int64_t prompt_index(const GroupId& id, int64_t prompts_per_step);

// Seed of member `member`'s sampler RNG (model::SamplerRng): a hash of
// (seed, step, index, member).
uint64_t sampler_seed(const GroupId& id, int64_t member);

struct GroupStats {
  int64_t groups = 0;
  int64_t zero_variance_groups = 0;  // every reward equal: every advantage of the group is 0
  double zero_variance_share = 0.0;  // zero_variance_groups / groups
  int64_t kept_groups = 0;           // groups with keep = 1
  double reward_mean = 0.0;          // over all completions
  double reward_std = 0.0;           // population std over all completions
};

// Group-relative advantages. rewards[n_groups * group_size] group-major;
// writes advantages[same] and keep[n_groups]:
//   scale_by_std: A = (R - mean_g) / (std_g + std_eps), std_g the sample
//                 standard deviation (divisor group_size - 1, as TRL and verl);
//   otherwise:    A = R - mean_g (Dr. GRPO).
// A zero-variance group gets A = 0 exactly, and keep = 0 when
// drop_zero_variance (DAPO dynamic sampling), else 1. Throws
// std::invalid_argument for group_size < 1, sizes that disagree, or a
// non-finite reward.
GroupStats group_advantages(std::span<double> advantages, std::span<uint8_t> keep, std::span<const double> rewards,
                            int64_t group_size, const AdvantageOptions& options);

// out[t] = per_sequence[s] for every token t of sequence s, where sequence s
// is tokens offsets[s] .. offsets[s+1] - 1 (offsets[S+1], offsets[0] = 0,
// non-decreasing, offsets[S] = out.size()). Spreads a sequence's advantage,
// or a kept group's 1/0, over its tokens.
void expand_to_tokens(std::span<double> out, std::span<const double> per_sequence, std::span<const int64_t> offsets);

// Throws std::invalid_argument unless offsets describe `tokens` tokens as above.
void check_offsets(std::span<const int64_t> offsets, int64_t tokens);

}  // namespace troupe::rl
