// Group bookkeeping and group-relative advantages (group.hpp).
#include "rl/group.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

namespace troupe::rl {
namespace {

uint64_t mix64(uint64_t x) {  // splitmix64 finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

constexpr uint64_t kSamplerSalt = 0x726c'7361'6d70'6c65ull;

}  // namespace

int64_t prompt_index(const GroupId& id, int64_t prompts_per_step) {
  if (prompts_per_step < 1) throw std::invalid_argument("rl: prompts_per_step must be >= 1, got " + std::to_string(prompts_per_step));
  if (id.step < 0) throw std::invalid_argument("rl: a group's step must be >= 0, got " + std::to_string(id.step));
  if (id.index < 0 || id.index >= prompts_per_step)
    throw std::invalid_argument("rl: group index " + std::to_string(id.index) + " is outside 0 .. prompts_per_step - 1 = " +
                                std::to_string(prompts_per_step - 1));
  return id.step * prompts_per_step + id.index;
}

uint64_t sampler_seed(const GroupId& id, int64_t member) {
  // Chained so that each field changes every later hash input.
  uint64_t h = mix64(id.seed ^ kSamplerSalt);
  h = mix64(h ^ static_cast<uint64_t>(id.step));
  h = mix64(h ^ static_cast<uint64_t>(id.index));
  return mix64(h ^ static_cast<uint64_t>(member));
}

GroupStats group_advantages(std::span<double> advantages, std::span<uint8_t> keep, std::span<const double> rewards,
                            int64_t group_size, const AdvantageOptions& options) {
  if (group_size < 1) throw std::invalid_argument("rl: group_size must be >= 1, got " + std::to_string(group_size));
  const auto n = static_cast<int64_t>(rewards.size());
  if (n % group_size != 0)
    throw std::invalid_argument("rl: " + std::to_string(n) + " rewards are not whole groups of " + std::to_string(group_size));
  const int64_t groups = n / group_size;
  if (static_cast<int64_t>(advantages.size()) != n || static_cast<int64_t>(keep.size()) != groups)
    throw std::invalid_argument("rl: group_advantages needs advantages[" + std::to_string(n) + "] and keep[" + std::to_string(groups) +
                                "], got " + std::to_string(static_cast<int64_t>(advantages.size())) + " and " +
                                std::to_string(static_cast<int64_t>(keep.size())));
  if (!(options.std_eps > 0)) throw std::invalid_argument("rl: std_eps must be > 0");
  for (int64_t i = 0; i < n; ++i)
    if (!std::isfinite(rewards[static_cast<size_t>(i)]))
      throw std::invalid_argument("rl: reward " + std::to_string(i) + " is not finite");

  GroupStats st;
  st.groups = groups;
  double sum = 0.0, sum_sq = 0.0;
  for (int64_t g = 0; g < groups; ++g) {
    const double* r = rewards.data() + g * group_size;
    double* a = advantages.data() + g * group_size;
    bool uniform = true;
    double mean = 0.0;
    for (int64_t k = 0; k < group_size; ++k) {
      uniform = uniform && r[k] == r[0];
      mean += r[k];
    }
    mean /= static_cast<double>(group_size);
    double var = 0.0;
    for (int64_t k = 0; k < group_size; ++k) var += (r[k] - mean) * (r[k] - mean);
    // Sample std; a group of one has none (its advantage is 0 anyway).
    const double sd = group_size > 1 ? std::sqrt(var / static_cast<double>(group_size - 1)) : 0.0;
    for (int64_t k = 0; k < group_size; ++k) {
      // Set to exactly 0 rather than r - mean: the mean of equal values can be off by an ulp.
      const double centred = uniform ? 0.0 : r[k] - mean;
      a[k] = options.scale_by_std ? centred / (sd + options.std_eps) : centred;
    }
    st.zero_variance_groups += uniform ? 1 : 0;
    keep[static_cast<size_t>(g)] = uniform && options.drop_zero_variance ? 0 : 1;
    st.kept_groups += keep[static_cast<size_t>(g)];
  }
  for (double r : rewards) sum += r;
  if (n > 0) {
    st.reward_mean = sum / static_cast<double>(n);
    for (double r : rewards) sum_sq += (r - st.reward_mean) * (r - st.reward_mean);
    st.reward_std = std::sqrt(sum_sq / static_cast<double>(n));
    st.zero_variance_share = static_cast<double>(st.zero_variance_groups) / static_cast<double>(groups);
  }
  return st;
}

void check_offsets(std::span<const int64_t> offsets, int64_t tokens) {
  if (offsets.empty()) throw std::invalid_argument("rl: offsets needs at least one entry (offsets[0] = 0)");
  if (offsets.front() != 0) throw std::invalid_argument("rl: offsets[0] must be 0, got " + std::to_string(offsets.front()));
  for (size_t s = 1; s < offsets.size(); ++s)
    if (offsets[s] < offsets[s - 1])
      throw std::invalid_argument("rl: offsets must be non-decreasing, but offsets[" + std::to_string(static_cast<int64_t>(s)) +
                                  "] = " + std::to_string(offsets[s]) + " < offsets[" + std::to_string(static_cast<int64_t>(s - 1)) +
                                  "] = " + std::to_string(offsets[s - 1]));
  if (offsets.back() != tokens)
    throw std::invalid_argument("rl: offsets end at " + std::to_string(offsets.back()) + " but there are " + std::to_string(tokens) +
                                " tokens");
}

void expand_to_tokens(std::span<double> out, std::span<const double> per_sequence, std::span<const int64_t> offsets) {
  check_offsets(offsets, static_cast<int64_t>(out.size()));
  if (per_sequence.size() + 1 != offsets.size())
    throw std::invalid_argument("rl: " + std::to_string(static_cast<int64_t>(per_sequence.size())) + " sequence values for " +
                                std::to_string(static_cast<int64_t>(offsets.size()) - 1) + " sequences");
  for (size_t s = 0; s + 1 < offsets.size(); ++s)
    for (int64_t t = offsets[s]; t < offsets[s + 1]; ++t) out[static_cast<size_t>(t)] = per_sequence[s];
}

}  // namespace troupe::rl
