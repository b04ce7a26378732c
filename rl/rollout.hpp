// From sampled groups to a training batch: each completion is scored by the
// task's verifier, advantages are computed within its group, and the
// completions are laid out as the per-token arrays policy_loss_* takes
// (group-major, completion tokens only: the prompt carries no loss). Also the
// per-step rollout metrics (reward, exact match, pass@group_size, lengths).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "rl/config.hpp"
#include "rl/group.hpp"
#include "rl/task.hpp"

namespace troupe::rl {

// One sampled completion of a prompt.
struct Completion {
  std::vector<int32_t> tokens;     // generated tokens only, at most max_new_tokens, EOS included when it came
  std::vector<double> logp_behav;  // [tokens.size()] log mu(token | context), recorded at sampling
};

struct ScoredBatch {
  int64_t groups = 0;
  int64_t group_size = 0;
  std::vector<Verdict> verdicts;   // [groups * group_size] group-major
  std::vector<double> rewards;     // [groups * group_size]
  std::vector<double> advantages;  // [groups * group_size]
  std::vector<uint8_t> keep;       // [groups] 0 = dropped by dynamic sampling
  GroupStats stats;
  // Per-token arrays over every completion's tokens, in the same order.
  std::vector<int64_t> offsets;     // [groups * group_size + 1]
  std::vector<double> logp_behav;   // [T]
  std::vector<double> advantage;    // [T] the completion's advantage on each of its tokens
  // [T] 1 = trained; 0 for tokens after the first EOS (not part of the
  // response) and for every token of a dropped group.
  std::vector<double> mask;
  // Metrics over all completions.
  double correct_share = 0.0;   // exact match
  double finished_share = 0.0;  // an EOS within max_new_tokens
  double pass_share = 0.0;      // groups with at least one exact answer: pass@group_size
  double length_mean = 0.0;     // response length in tokens, up to and including the first EOS
  int64_t length_max = 0;
};

// prompts[groups], completions[groups * group_size] (member k of group g at
// g * group_size + k). Throws std::invalid_argument for sizes that disagree
// (including a completion whose logp_behav is not one per token).
ScoredBatch score_groups(const Task& task, std::span<const Prompt> prompts, std::span<const Completion> completions,
                         int64_t group_size, const AdvantageOptions& options);

// Unbiased pass@k from n samples of which c are correct (Chen et al. 2021):
// 1 - C(n - c, k) / C(n, k). Throws std::invalid_argument unless
// 0 <= c <= n and 1 <= k <= n.
double pass_at_k(int64_t n, int64_t c, int64_t k);

}  // namespace troupe::rl
