// Load-aware expert placement over contiguous shards (the "eplb" policy of
// the actor runtime's elastic experts, actors/supervision/elastic.cpp). A
// layer's experts stay split into contiguous ranges, one per shard, given by
// boundaries b_0 = 0 < b_1 < ... < b_S = E; a move shifts one boundary by
// one expert, i.e. hands one expert to the neighbouring shard.
// Also an EPLB-style placement with replicas (DeepSeek's EPLB, plus an
// incremental variant that keeps experts where they are): a hot expert gets
// several copies on different devices and its tokens are split evenly over
// them. The sim of expert parallelism uses it (actors/sim/ep_sim.hpp).
// The actor runtime's replicas ([experts] redundant_experts) are second
// copies of the hottest experts on top of the contiguous ranges
// (place_copies below). Plain math: no actors.
#pragma once

#include <cstdint>
#include <span>
#include <utility>
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

// Shrink: the boundaries without shard `shard` (0 <= shard < S, S >= 2):
// its experts join the neighbour holding fewer experts (ties: the left one;
// the first and last shard have one neighbour), so the other shards keep
// theirs and only one shard's range grows. Throws std::invalid_argument.
std::vector<int64_t> remove_shard_bounds(const std::vector<int64_t>& bounds, int shard);

// max / mean of the per-shard sums of `loads` under `bounds` (1 = balanced,
// 0 when everything is 0).
double bounds_imbalance(std::span<const double> loads, const std::vector<int64_t>& bounds);

// Redundant copies on top of contiguous ranges (the actor runtime's
// replicas): shard s holds its range [b_s, b_s+1) plus `copies[s]`, a sorted
// list of experts of other ranges it holds a copy of. An expert's holders
// are its home shard and the shards with a copy, in shard order; its rows
// (token order) are split over them in contiguous blocks, evenly or by the
// expert's shares: integer weights per holder out of kShareTotal.
inline constexpr int kShareTotal = 4096;
struct Replication {
  std::vector<std::vector<int64_t>> copies;  // [shard] sorted copies of other shards' experts
  std::vector<std::vector<int>> shares;      // [expert] its holders' weights (sum kShareTotal); empty: even
  friend bool operator==(const Replication&, const Replication&) = default;
};

// The rows [first, end) of an expert's `rows` that holder `copy` of
// `holders` takes: [rows*copy/holders, rows*(copy+1)/holders).
std::pair<int64_t, int64_t> copy_rows(int64_t rows, int holders, int copy);
// The same with weights (one per holder, >= 0, summing to kShareTotal):
// [rows*W_copy/kShareTotal, rows*W_copy+1/kShareTotal), W the running sums.
// Empty weights: copy_rows. Throws std::invalid_argument on bad weights.
std::pair<int64_t, int64_t> share_rows(int64_t rows, std::span<const int> weights, int holders, int copy);

// The shards holding `expert`, ascending (home shard and copies).
std::vector<int> expert_holders(const std::vector<int64_t>& bounds, const std::vector<std::vector<int64_t>>& copies,
                                int64_t expert);

// Per-shard loads with copies: an expert's load divided over its holders by
// its shares (evenly without: the expected split of share_rows).
std::vector<double> replicated_shard_loads(std::span<const double> loads, const std::vector<int64_t>& bounds,
                                           const Replication& r);
// Their max / mean (1 = balanced, 0 when everything is 0).
double replicated_imbalance(std::span<const double> loads, const std::vector<int64_t>& bounds, const Replication& r);

// At most `redundant` copies that balance the shards, with shares: starting
// from the ranges, the busiest shard (ties: lowest) repeatedly hands load to
// the least busy one (ties: lowest) by sharing with it the expert it holds
// most load of among those the other does not hold (ties: lowest id),
// moving min(its excess over the mean, the other's gap to the mean, the
// expert's load there); it stops when the busiest shard is within 1e-9 of
// the mean or `redundant` copies are made. Each copy brings the busiest or
// the least busy shard to the mean unless the shared expert's load on the
// busiest is smaller (then that expert moves there whole and the next copy
// goes on), so S - 1 copies balance S shards whose busiest hold a big
// enough expert, and more copies balance any loads (up to the shares'
// 1/kShareTotal grain).
// Shares are the moved loads' proportions, rounded. Throws
// std::invalid_argument when bounds are not a split of loads, redundant < 0,
// redundant > E, or redundant > 0 with fewer than 2 shards.
Replication place_copies(std::span<const double> loads, const std::vector<int64_t>& bounds, int redundant);

// Replicated placement of E logical experts on D devices with S physical
// expert slots each (D*S >= E; D*S - E redundant slots). A device's load is
// the sum over its slots of loads[e] / replicas[e].
struct ReplicatedPlacement {
  std::vector<int> replicas;                // per logical expert, >= 1
  std::vector<std::vector<int64_t>> slots;  // per device: the logical expert in each slot
  std::vector<double> device_load;          // per device, under the loads it was made for
  double max_load = 0, mean_load = 0;
  // max / mean device load (1 = balanced, 0 when everything is 0).
  double imbalance() const { return mean_load > 0 ? max_load / mean_load : 0.0; }
};

// Replicas per expert for `physical` slots: start at one each and give the
// remaining physical - E, one at a time, to the expert with the largest
// loads[e] / replicas[e] (ties: lowest index), at most `max_replicas` each.
std::vector<int> replicate_hottest(std::span<const double> loads, int64_t physical, int max_replicas);

// Full EPLB placement: replicate_hottest over devices*slots_per_device, then
// pack the copies heaviest first (loads[e] / replicas[e]) onto the least
// loaded device that has a free slot and no copy of that expert yet (ties:
// lowest device), so every device ends with exactly slots_per_device copies;
// then trades of a copy on the most loaded device for a lighter one elsewhere
// while that lowers the maximum.
// Throws std::invalid_argument when devices*slots_per_device < E or
// slots_per_device > E.
ReplicatedPlacement eplb_placement(std::span<const double> loads, int devices, int slots_per_device);

// Incremental EPLB: the replica counts for the new loads, but each copy of
// `current` stays on its device (heaviest first) while that device's load
// stays within (1 + tolerance) x the mean device load; only the copies that
// do not fit (and new replicas) are packed as in eplb_placement, and trades
// are made only while the maximum exceeds that target. Keeps the device and
// slot counts of `current`.
ReplicatedPlacement eplb_incremental(std::span<const double> loads, const ReplicatedPlacement& current, double tolerance);

// The static placement: even contiguous ranges (even_bounds), one copy each.
ReplicatedPlacement contiguous_placement(std::span<const double> loads, int devices);

// Fills device_load, max_load and mean_load of `p` for `loads` (e.g. this
// step's loads under a placement made from older ones).
void evaluate_placement(std::span<const double> loads, ReplicatedPlacement& p);

// Expert copies each device must receive to go from `from` to `to`: the
// copies of each expert it holds in `to` beyond those it held in `from`.
std::vector<int64_t> copies_received(const ReplicatedPlacement& from, const ReplicatedPlacement& to);
// Their sum: the expert copies a move sends.
int64_t copies_moved(const ReplicatedPlacement& from, const ReplicatedPlacement& to);

}  // namespace troupe::moe
