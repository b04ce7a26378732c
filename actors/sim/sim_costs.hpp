// Cost models of sim devices ([topology] device_kind = "sim", [sim] in the
// spec): what one micro-batch costs at one pipeline stage, in virtual
// nanoseconds, and how long a message takes on a link. Pure functions of the
// model config; no CAF, no backend.
//
// Three models:
//   fixed  every stage costs the spec's forward / backward / weight times;
//          `backward` is the FULL backward (inputs + weights) and `weight` its
//          weight-gradient part, so a split B costs backward - weight (the
//          schedules' convention: BW = B + W).
//   flops  each stage's cost is derived from the model config and micro-batch
//          size: time = max(FLOPs / device GFLOP/s, bytes / device GB/s) (a
//          roofline), computed separately for the forward, the input part
//          and the weight part of the backward. FLOPs and bytes: see
//          stage_work() in sim_costs.cpp.
//   measured  each stage has its own forward / backward / weight times, as
//          `troupe calibrate` measures them on a machine (launch/
//          commands/calibrate.cpp): one value per stage of the schedule's
//          layout. Used where one FLOP rate cannot fit the stages (the
//          attention core, the loss and the copies run far below the GEMMs'
//          rate; bench/results/calibrate.md).
// An overlapped F&B op (DualPipe) costs F + B: the sim models no compute
// overlap inside a device, only the schedule's ordering.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "model/config.hpp"

namespace troupe::sim {

// Costs of one micro-batch through one pipeline stage (virtual ns).
struct StageCost {
  int64_t f = 0;  // forward
  int64_t b = 0;  // full backward (inputs + weights)
  int64_t w = 0;  // weight-gradient part of b (a split B costs b - w)
  friend bool operator==(const StageCost&, const StageCost&) = default;
};

enum class CostModel : uint8_t { fixed, flops, measured };  // "fixed", "flops", "measured"
inline const char* cost_model_name(CostModel m) {
  return m == CostModel::fixed ? "fixed" : m == CostModel::flops ? "flops" : "measured";
}

// The [sim] section of a spec, in its units.
struct CostConfig {
  CostModel model = CostModel::fixed;  // fixed op times, or FLOPs and bytes over rates
  double forward_ms = 1.0;      // fixed: forward of one micro-batch at one stage
  double backward_ms = 2.0;     // fixed: full backward (inputs + weights)
  double weight_ms = 1.0;       // fixed: weight-gradient part of backward_ms
  double gflops = 100.0;        // flops: device compute rate (GFLOP/s = FLOPs per ns)
  double gbps = 20.0;           // flops: device memory bandwidth (GB/s = bytes per ns)
  // measured: one value per pipeline stage (the layout's num_stages), ms;
  // stage_weight_ms empty = no weight part (a split B costs the full backward).
  std::vector<double> stage_forward_ms, stage_backward_ms, stage_weight_ms;
  double link_latency_us = 0.0; // every message between two devices
  double link_gbps = 0.0;       // link bandwidth; 0 = unlimited
  double optimizer_ms = 0.0;    // fixed optimizer step after the pipeline drains; 0 = not modelled
  // run.mode = "rl" on sim devices (actors/sim/rl_sim.hpp). The defaults are
  // assumptions for a ~7B policy on one GPU each, not measurements.
  double rl_mean_tokens = 1000;        // mean completion length (log-normal)
  double rl_sigma = 1.0;               // its sigma: the long tail
  int64_t rl_max_tokens = 8192;        // length cap
  int64_t rl_slots = 64;               // concurrent sequences per generating device
  double rl_decode_ms_per_token = 20;  // one decode step
  double rl_reward_ms = 0;             // per completion
  double rl_train_ms_per_token = 0.26; // one device's training time per token
  double rl_parallel_decode_ms_per_token = 0;  // decode step while > 1 device generates; 0 = rl_decode_ms_per_token
  double rl_parallel_train_ms_per_token = 0;   // per device and token while > 1 device trains; 0 = rl_train_ms_per_token
  double rl_train_step_ms = 0;                 // serial part of every training step
  double rl_sync_ms = 0;               // publish a policy version to the generators
  // Expert parallelism on sim devices (expert_shards > 1; actors/sim/ep_sim.hpp).
  int64_t ep_slots_per_device = 0;     // physical expert slots per device; 0 = ceil(n_experts / expert_shards)
  double ep_zipf = 1.0;                // skew of the expert loads
  int64_t ep_drift_every = 10;         // steps between drifts of the expert ranking; 0 = never
  double ep_drift = 0.1;               // share of experts whose rank changes at a drift
  double ep_ema = 0.3;                 // moving-average weight of the newest step's loads
  int64_t ep_rebalance_every = 10;     // eplb: steps between rebalances
  double ep_imbalance_threshold = 0;   // eplb: also rebalance a layer past this max/mean; 0 = only periodically
  double ep_tolerance = 0.02;          // eplb: a copy stays while its device is within 1 + this of the mean
  int64_t ep_bytes_per_param = 12;     // migration: bytes moved per expert parameter
  // Device failures and their cost (actors/sim/sim_faults.hpp). Assumptions,
  // not measurements; mtbf_hours = 0 leaves failures out.
  double mtbf_hours = 0;               // per device
  double fault_horizon_hours = 1296;   // wall time the goodput study covers (54 days)
  double detect_s = 3;                 // a failure noticed
  double recover_s = 10;               // troupe: restart elsewhere + restore from the buddy snapshot
  double snapshot_overhead = 0.02;     // troupe: per-step snapshot, share of the step
  double checkpoint_every_min = 60;    // the checkpoint-restart baseline
  double checkpoint_write_s = 60;
  double checkpoint_restart_s = 600;
};

// FLOPs and bytes of one micro-batch at one stage.
struct StageWork {
  int64_t layer_begin = 0, layer_end = 0;  // layers [begin, end) of the stage
  double params = 0;                        // parameters the stage holds
  double f_flops = 0, bin_flops = 0, w_flops = 0;  // forward, backward (inputs), backward (weights)
  double f_bytes = 0, bin_bytes = 0, w_bytes = 0;
};

// Work of each of `num_stages` stages (layers split as model::split_layers
// splits them; stage 0 also embeds, the last stage also runs the final norm,
// LM head and loss) for a micro-batch of `mb_sequences` sequences.
std::vector<StageWork> stage_work(const model::ModelConfig& config, int64_t mb_sequences, int num_stages);

// Per-stage costs under `cost` (fixed: the same for every stage; measured:
// the lists must have num_stages entries).
// Throws std::invalid_argument for a cost config that makes no sense.
std::vector<StageCost> stage_costs(const CostConfig& cost, const model::ModelConfig& config,
                                   int64_t mb_sequences, int num_stages);

// Bytes of one activation or gradient message: tokens x d_model float32.
int64_t message_bytes(const model::ModelConfig& config, int64_t mb_sequences);

// Milliseconds / microseconds to virtual nanoseconds (rounded to nearest).
int64_t ms_to_ns(double ms);
int64_t us_to_ns(double us);

}  // namespace troupe::sim
