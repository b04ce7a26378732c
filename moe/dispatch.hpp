// Dispatch plan: which permuted row each (token, choice) pair goes to. Built
// on the host from the router's ids so that it is the same on every backend
// and can be sent as a message to the actors that own the experts.
//
// Rows are grouped by expert (expert 0's rows first), and within an expert in
// token order. With a capacity factor cf > 0 each expert takes at most
// capacity = ceil(cf * T * k / E) rows; assignments beyond that are dropped in
// token order (later tokens lose) and get slot -1. cf = 0 is dropless.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace troupe::moe {

struct DispatchPlan {
  int64_t tokens = 0;     // T
  int64_t top_k = 0;      // k
  int64_t n_experts = 0;  // E
  int64_t capacity = -1;  // rows per expert at most; -1 = dropless
  std::vector<int32_t> token_index;  // [N] source token of each permuted row
  std::vector<int32_t> slots;        // [T*k] permuted row of choice (t,j), -1 if dropped
  std::vector<int64_t> offsets;      // [E+1] expert e owns rows [offsets[e], offsets[e+1])
  std::vector<int64_t> routed;       // [E] assignments before dropping (the expert load)
  int64_t dropped = 0;               // assignments dropped by the capacity limit

  int64_t rows() const { return offsets.empty() ? 0 : offsets.back(); }
  int64_t count(int64_t e) const { return offsets[e + 1] - offsets[e]; }
};

// ids: [T*k] expert ids from the router (each in [0,E) and distinct per token;
// throws std::invalid_argument otherwise).
DispatchPlan build_dispatch_plan(std::span<const int32_t> ids, int64_t tokens, int64_t top_k,
                                 int64_t n_experts, double capacity_factor);

// Capacity for T tokens, k choices, E experts and factor cf (-1 when cf <= 0).
int64_t expert_capacity(int64_t tokens, int64_t top_k, int64_t n_experts, double capacity_factor);

}  // namespace troupe::moe
