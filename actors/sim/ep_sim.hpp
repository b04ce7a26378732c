// Expert parallelism on sim devices: a closed-form model on a virtual clock
// (integer ns; no actors and no math) for studying expert-load imbalance
// and EPLB rebalancing at 1,024+ devices.
//
// The workload: every step, each of `layers` MoE layers routes tokens * top_k
// token copies to `experts` experts with Zipf(zipf) shares over a ranking of
// the experts; the ranking is a seeded random permutation per layer that
// drifts every `drift_every` steps (round(drift * experts / 2) times, the
// expert at a random rank r swaps places with one at rank r+1..2r+1, so a
// rank moves by at most a factor of two), so loads stay skewed but change.
// Costs, per layer and step, for device d receiving n_d token copies:
//   compute: n_d * expert_flops_per_token / rate (forward and backward of a
//     SwiGLU expert: 18 * d_model * expert_hidden FLOPs per token copy);
//   traffic: four all-to-alls (dispatch and combine, forward and backward),
//     each latency + max(sent, received) bytes / link bandwidth, a token copy
//     being d_model float32 values; every device sends tokens * top_k / D;
//   the layer waits for its slowest device; the step is the sum over layers.
// Placements: "static" (even contiguous ranges, one copy per expert),
// "eplb" (moe::eplb_placement / eplb_incremental over slots_per_device slots
// per device, from a moving average of the measured loads, after step 0
// (placed for uniform loads until then), every rebalance_every steps, and
// in between for a layer whose max/mean under the moving average exceeds
// imbalance_threshold (when > 0); a layer's new placement is taken only when its
// predicted gain over the next rebalance_every steps exceeds its migration
// time; the migration, each moved copy's parameters and Adam moments over the
// receiving device's link, is a stall in that step) and "balanced" (every
// device gets tokens * top_k / D: the lower bound).
// What it leaves out: attention and dense layers (the step is the MoE
// layers' time only, the part placement changes), token dropping, overlap
// of traffic with compute, network contention beyond one link per device,
// and routing noise within a step (loads are their expected values).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace troupe::sim {

struct EpSimOptions {
  int devices = 1024;              // EP ranks, one per device
  int64_t experts = 4096;          // routed experts per MoE layer
  int slots_per_device = 5;        // eplb: physical expert slots per device (devices * slots >= experts)
  int layers = 4;                  // MoE layers
  int steps = 100;
  int64_t tokens = 1 << 22;        // tokens per step, all devices together
  int64_t top_k = 8;
  int64_t d_model = 4096;
  int64_t expert_hidden = 2048;
  double flops_per_ns = 400000;    // device compute rate (GFLOP/s = FLOPs per ns)
  double link_bytes_per_ns = 50;   // link bandwidth (GB/s = bytes per ns); 0 = unlimited
  int64_t link_latency_ns = 0;
  double zipf = 1.0;               // skew exponent (0 = uniform)
  int drift_every = 10;            // steps between ranking drifts; 0 = never
  double drift = 0.1;              // share of experts whose rank changes at a drift
  double ema = 0.3;                // moving average weight of the newest step's loads
  int rebalance_every = 10;        // eplb: steps between rebalances
  double imbalance_threshold = 0;  // eplb: also rebalance a layer whose max/mean under the moving average exceeds this; 0 = only every rebalance_every
  double tolerance = 0.02;         // eplb: a copy stays while its device is within (1 + tolerance) x the mean
  int64_t bytes_per_param = 12;    // migration: float32 weights and two Adam moments per parameter
  uint64_t seed = 1;
};

struct EpSimResult {
  std::string placement;                // "static", "eplb" or "balanced"
  std::vector<int64_t> step_ns;         // per step, stall included
  std::vector<double> imbalance;        // per step: max/mean token copies per device, mean over layers
  int64_t total_ns = 0;
  int64_t stall_ns = 0;                 // migration stalls, all steps
  int64_t max_stall_ns = 0;             // the largest single one
  int rebalances = 0;                   // layer placements replaced
  int skipped = 0;                      // candidates refused (gain below migration time)
  int64_t copies_moved = 0;
  double after_rebalance = 0;           // max/mean on the step right after each rebalance step, mean
  double planned = 0;                   // max/mean under the moving-average loads the placements were made for, mean
};

// Token copies routed to each expert of `layer` at `step` (sums to tokens * top_k).
// Steps must be asked in order per options; see EpLoads.
class EpLoads {
 public:
  explicit EpLoads(const EpSimOptions& o);
  // Loads of every layer at the next step (the first call gives step 0).
  const std::vector<std::vector<double>>& next();

 private:
  const EpSimOptions o_;
  std::vector<double> share_;              // Zipf share of rank r
  std::vector<std::vector<int64_t>> order_;  // per layer: the expert at each rank, hottest first
  std::vector<std::vector<double>> loads_;
  int step_ = 0;
};

// Per-layer time, in ns, when device d receives `copies[d]` token copies.
int64_t ep_layer_ns(const EpSimOptions& o, const std::vector<double>& copies);
// Expert FLOPs per token copy (forward and backward).
double ep_flops_per_copy(const EpSimOptions& o);

EpSimResult simulate_ep_static(const EpSimOptions& o);
EpSimResult simulate_ep_eplb(const EpSimOptions& o);
EpSimResult simulate_ep_balanced(const EpSimOptions& o);

// Throws std::invalid_argument naming the first bad field.
void validate(const EpSimOptions& o);

}  // namespace troupe::sim
