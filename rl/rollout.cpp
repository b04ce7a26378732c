// Scoring sampled groups into a training batch (rollout.hpp).
#include "rl/rollout.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace troupe::rl {

ScoredBatch score_groups(const Task& task, std::span<const Prompt> prompts, std::span<const Completion> completions,
                         int64_t group_size, const AdvantageOptions& options) {
  if (group_size < 1) throw std::invalid_argument("rl: group_size must be >= 1, got " + std::to_string(group_size));
  const auto groups = static_cast<int64_t>(prompts.size());
  const auto n = static_cast<int64_t>(completions.size());
  if (n != groups * group_size)
    throw std::invalid_argument("rl: " + std::to_string(groups) + " prompts with group_size " + std::to_string(group_size) + " need " +
                                std::to_string(groups * group_size) + " completions, got " + std::to_string(n));
  ScoredBatch b;
  b.groups = groups;
  b.group_size = group_size;
  b.verdicts.resize(static_cast<size_t>(n));
  b.rewards.resize(static_cast<size_t>(n));
  b.advantages.resize(static_cast<size_t>(n));
  b.keep.resize(static_cast<size_t>(groups));
  const int32_t eos = task.eos_token();
  // One batch for the verifier: a reward program scores the step in one round trip.
  {
    std::vector<const Prompt*> ps(static_cast<size_t>(n));
    std::vector<std::span<const int32_t>> cs(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const Completion& c = completions[static_cast<size_t>(i)];
      if (c.logp_behav.size() != c.tokens.size())
        throw std::invalid_argument("rl: completion " + std::to_string(i) + " has " +
                                    std::to_string(static_cast<int64_t>(c.tokens.size())) + " tokens but " +
                                    std::to_string(static_cast<int64_t>(c.logp_behav.size())) + " behaviour log-probs");
      ps[static_cast<size_t>(i)] = &prompts[static_cast<size_t>(i / group_size)];
      cs[static_cast<size_t>(i)] = c.tokens;
    }
    b.verdicts = task.verifier().score_batch(ps, cs);
  }
  int64_t correct = 0, finished = 0, passed = 0, length_sum = 0;
  for (int64_t g = 0; g < groups; ++g) {
    bool any = false;
    for (int64_t k = 0; k < group_size; ++k) {
      const auto i = static_cast<size_t>(g * group_size + k);
      b.rewards[i] = b.verdicts[i].reward;
      correct += b.verdicts[i].correct ? 1 : 0;
      finished += b.verdicts[i].finished ? 1 : 0;
      any = any || b.verdicts[i].correct;
    }
    passed += any ? 1 : 0;
  }
  b.stats = group_advantages(b.advantages, b.keep, b.rewards, group_size, options);

  b.offsets.reserve(static_cast<size_t>(n + 1));
  b.offsets.push_back(0);
  for (int64_t i = 0; i < n; ++i) {
    const Completion& c = completions[static_cast<size_t>(i)];
    const bool kept = b.keep[static_cast<size_t>(i / group_size)] != 0;
    const auto eos_at = std::find(c.tokens.begin(), c.tokens.end(), eos);
    const auto length = static_cast<int64_t>(eos_at == c.tokens.end() ? c.tokens.size() : eos_at - c.tokens.begin() + 1);
    length_sum += length;
    b.length_max = std::max(b.length_max, length);
    for (size_t t = 0; t < c.tokens.size(); ++t) {
      b.logp_behav.push_back(c.logp_behav[t]);
      b.advantage.push_back(b.advantages[static_cast<size_t>(i)]);
      b.mask.push_back(kept && static_cast<int64_t>(t) < length ? 1.0 : 0.0);
    }
    b.offsets.push_back(static_cast<int64_t>(b.mask.size()));
  }
  if (n > 0) {
    b.correct_share = static_cast<double>(correct) / static_cast<double>(n);
    b.finished_share = static_cast<double>(finished) / static_cast<double>(n);
    b.pass_share = static_cast<double>(passed) / static_cast<double>(groups);
    b.length_mean = static_cast<double>(length_sum) / static_cast<double>(n);
  }
  return b;
}

double pass_at_k(int64_t n, int64_t c, int64_t k) {
  if (!(c >= 0 && c <= n && k >= 1 && k <= n))
    throw std::invalid_argument("rl: pass@k needs 0 <= c <= n and 1 <= k <= n, got n " + std::to_string(n) + ", c " + std::to_string(c) +
                                ", k " + std::to_string(k));
  if (n - c < k) return 1.0;  // every k-subset holds a correct sample
  // C(n-c, k) / C(n, k) = prod_{i = n-c+1}^{n} (1 - k / i), computed stably.
  double miss = 1.0;
  for (int64_t i = n - c + 1; i <= n; ++i) miss *= 1.0 - static_cast<double>(k) / static_cast<double>(i);
  return 1.0 - miss;
}

}  // namespace troupe::rl
