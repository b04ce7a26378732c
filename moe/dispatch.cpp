// Builds the deterministic dispatch plan (per-expert row lists, capacity
// dropping, inverse slot map).
#include "moe/dispatch.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

namespace troupe::moe {

int64_t expert_capacity(int64_t tokens, int64_t top_k, int64_t n_experts,
                        double capacity_factor) {
  if (capacity_factor <= 0.0) return -1;
  const double c = std::ceil(capacity_factor * static_cast<double>(tokens * top_k) /
                             static_cast<double>(n_experts));
  return static_cast<int64_t>(c);
}

DispatchPlan build_dispatch_plan(std::span<const int32_t> ids, int64_t tokens, int64_t top_k,
                                 int64_t n_experts, double capacity_factor) {
  if (tokens < 0 || top_k <= 0 || n_experts <= 0 || top_k > n_experts)
    throw std::invalid_argument("build_dispatch_plan: bad sizes T=" + std::to_string(tokens) +
                                " k=" + std::to_string(top_k) + " E=" + std::to_string(n_experts));
  if (static_cast<int64_t>(ids.size()) != tokens * top_k)
    throw std::invalid_argument("build_dispatch_plan: expected " + std::to_string(tokens * top_k) +
                                " ids, got " + std::to_string(ids.size()));
  DispatchPlan p;
  p.tokens = tokens;
  p.top_k = top_k;
  p.n_experts = n_experts;
  p.capacity = expert_capacity(tokens, top_k, n_experts, capacity_factor);
  p.routed.assign(static_cast<size_t>(n_experts), 0);
  p.slots.assign(static_cast<size_t>(tokens * top_k), -1);

  // Pass 1: position of each kept assignment within its expert, in token order.
  std::vector<int64_t> kept(static_cast<size_t>(n_experts), 0);
  std::vector<int64_t> position(static_cast<size_t>(tokens * top_k), -1);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t j = 0; j < top_k; ++j) {
      const int32_t e = ids[static_cast<size_t>(t * top_k + j)];
      if (e < 0 || e >= n_experts)
        throw std::invalid_argument("build_dispatch_plan: token " + std::to_string(t) +
                                    " routed to expert " + std::to_string(e) + " of " +
                                    std::to_string(n_experts));
      for (int64_t i = 0; i < j; ++i)
        if (ids[static_cast<size_t>(t * top_k + i)] == e)
          throw std::invalid_argument("build_dispatch_plan: token " + std::to_string(t) +
                                      " picks expert " + std::to_string(e) + " twice");
      p.routed[e]++;
      if (p.capacity >= 0 && kept[e] >= p.capacity) {
        p.dropped++;
        continue;
      }
      position[static_cast<size_t>(t * top_k + j)] = kept[e]++;
    }
  }
  // Pass 2: expert offsets, then the row of every kept assignment.
  p.offsets.assign(static_cast<size_t>(n_experts + 1), 0);
  for (int64_t e = 0; e < n_experts; ++e) p.offsets[e + 1] = p.offsets[e] + kept[e];
  p.token_index.assign(static_cast<size_t>(p.rows()), 0);
  for (int64_t t = 0; t < tokens; ++t) {
    for (int64_t j = 0; j < top_k; ++j) {
      const size_t s = static_cast<size_t>(t * top_k + j);
      if (position[s] < 0) continue;
      const int64_t row = p.offsets[ids[s]] + position[s];
      p.slots[s] = static_cast<int32_t>(row);
      p.token_index[static_cast<size_t>(row)] = static_cast<int32_t>(t);
    }
  }
  return p;
}

}  // namespace troupe::moe
