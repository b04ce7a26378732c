// RL sim calibration: what an RL spec's steps cost on this machine, measured
// on the real synchronous loop (rl::RlTrainer), and the [sim] rl_* table
// that makes the RL sim (actors/sim/rl_sim.hpp) predict the real runs.
// `troupe calibrate` on a spec with run.mode = "rl" prints and writes it
// (launch/commands/calibrate.cpp).
//
// How: the synchronous loop from the spec's rl.init, warm-up steps then timed
// steps, twice: on ONE device with the spec's threads per device (the
// one-device costs: a decoupled generator's decode, a decoupled trainer's
// update), then data-parallel over the spec's [topology] devices (every
// device generating and training at once: the shared-host costs the sim's
// synchronous model needs). Both start from the same checkpoint, so they time
// the same steps. Per generated token:
//   decode: one device's generation seconds (a decode step here costs in
//     proportion to its live rows, so the sim decodes one row at a time,
//     rl_slots = 1, at the batched per-token rate);
//   parallel decode: each device's busy seconds (its share; idle at the join
//     left out, since the sim models that imbalance from the lengths);
//   train: the training phase outside its serial part, and the serial part
//     (layout, loss, optimizer step) as rl_train_step_ms; with 2+ devices,
//     measured on a third run, the decoupled loop itself (fixed_lag 1, the
//     trainer on device 0, one generator on device 1): a trainer that only
//     trains took up to 13% less a token than the synchronous loop's
//     training between two generations (bench/results/rl_async.md);
//   parallel train: the parallel training phase's wall time (its devices'
//     imbalance included: the sim splits a step's tokens perfectly) beyond
//     the one-device serial part, times the devices.
// The completion lengths of the timed steps give the log-normal fit
// (rl_mean_tokens, rl_sigma); rl_sync_ms is a parameter download plus an
// upload to a second backend (what publishing a version copies).
#pragma once

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

#include "launch/signals.hpp"
#include "launch/spec/spec.hpp"

namespace troupe::launch {

struct RlPhaseTimes {
  int devices = 1;
  int64_t steps = 0;                   // timed
  int64_t tokens = 0, completions = 0;  // generated in the timed steps
  double gen_s = 0, reward_s = 0, train_s = 0, train_serial_s = 0;  // summed over the timed steps
  double gen_busy_s = 0;               // summed over devices (each device's generation work)
  std::vector<double> idle_share;      // per device, over the timed steps (data-parallel only)
  double step_s() const { return steps ? (gen_s + reward_s + train_s) / static_cast<double>(steps) : 0.0; }
};

struct RlCalibration {
  RlPhaseTimes alone, parallel;  // parallel.steps == 0: the spec has one device
  RlPhaseTimes decoupled;        // the trainer of a fixed_lag run (steps == 0: one device, or no signals given)
  std::vector<int64_t> lengths;  // completion lengths of the timed one-device steps
  double sync_ms = 0;
  // The [sim] costs derived from the two phases (see the top of this file).
  double decode_ms = 0, parallel_decode_ms = 0, train_ms = 0, parallel_train_ms = 0, train_step_ms = 0, reward_ms = 0;
  double sync_train_ms = 0;  // the one-device synchronous loop's training per token (train_ms when no decoupled run)
  double mean_tokens = 0, sigma = 0;  // log-normal fit of `lengths`
  bool interrupted = false;
};

struct RlCalibrateOptions {
  int64_t warmup = 2, repeat = 8;           // steps per phase
  const std::atomic<bool>* stop = nullptr;  // set: stop after the running step (interrupted)
  // The decoupled run's signal handlers (run_rl takes them); null: no
  // decoupled run, the synchronous loop's training cost is used.
  const StopOnSignal* signals = nullptr;
};

// Why an RL spec cannot be calibrated ("" when it can): the actor-runtime
// trainer (rl.trainer = "actors"), several processes. The spec's rl.sync is
// not what is timed: the sim models both loops from these costs.
std::string calibrate_rl_refusal(const Spec& spec);

// Measures (see the top of this file). Throws what rl::RlTrainer throws.
RlCalibration calibrate_rl(const Spec& spec, const RlCalibrateOptions& options);

// The log-normal's mean and sigma fitted to `lengths` (maximum likelihood:
// the mean and standard deviation of ln L; the mean returned is the
// distribution's, exp(mu + sigma^2 / 2), as rl_mean_tokens wants it).
void fit_log_normal(const std::vector<int64_t>& lengths, double& mean, double& sigma);

// The [sim] table `troupe calibrate` prints and writes for an RL spec:
// comments (where, how, the measured step times and length percentiles),
// then the rl_* keys.
std::string rl_sim_table(const Spec& spec, const std::string& spec_path, const RlCalibration& c,
                         const RlCalibrateOptions& options);

}  // namespace troupe::launch
