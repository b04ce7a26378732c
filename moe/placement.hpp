// Load-aware expert placement over contiguous shards (the "eplb" policy of
// the actor runtime's elastic experts, actors/supervision/elastic.cpp). A
// layer's experts stay split into contiguous ranges, one per shard, given by
// boundaries b_0 = 0 < b_1 < ... < b_S = E; a move shifts one boundary by
// one expert, i.e. hands one expert to the neighbouring shard. Plain math:
// no actors.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace troupe::moe {

// Even boundaries (the first E % S shards one expert more), as the static
// placement splits.
std::vector<int64_t> even_bounds(int64_t n_experts, int shards);

// Incremental rebalancing: up to `max_moves` times, hand the edge expert of
// the most loaded shard to the neighbour on that side when that lowers the
// larger of the two shards' loads (every shard keeps at least one expert).
// `loads` are per expert (e.g. a moving average of routed tokens). Returns
// the new boundaries; `moves` (when given) gets the number of experts moved.
// Deterministic: ties go to the lowest shard, then to the left neighbour.
std::vector<int64_t> rebalance_bounds(std::span<const double> loads, const std::vector<int64_t>& bounds,
                                      int max_moves, int* moves = nullptr);

// max / mean of the per-shard sums of `loads` under `bounds` (1 = balanced,
// 0 when everything is 0).
double bounds_imbalance(std::span<const double> loads, const std::vector<int64_t>& bounds);

}  // namespace troupe::moe
