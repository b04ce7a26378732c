// Sim calibration: what the spec's pipeline ops cost on this machine, read
// from the real actor runtime's device trace, and the [sim] table that makes
// a sim spec predict the real runtime. `troupe calibrate`
// (launch/commands/calibrate.cpp) prints and writes the table;
// bench/sim_calibration.cpp compares its predictions with real runs.
//
// How: copies of the spec's pipeline (its model, stages, schedule,
// micro-batch size, optimizer shards, backend, threads per device), each
// with every actor on ONE device, step in lockstep rounds: first one copy
// alone, then as many copies at once as the spec has devices (so the ops
// share the cores, caches and memory bandwidth as in the real run). Per
// stage: the mean forward and full backward of a micro-batch (a chunk's B
// plus its W where the schedule splits them) and, when the schedule splits
// some backwards (zb1p, dualpipe, dualpipev), the mean W: the weight part the
// sim's split B subtracts. The
// optimizer step is what runs after the pipeline: per phase (gradient
// download, reduce, AdamW, snapshot copies and parameter load) the busiest
// device of the spec's placement, summed over the phases, since each phase
// waits for the previous one on every device; the link latency
// is the median idle gap between two closures (one actor hop in one process).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "actors/runtime.hpp"
#include "actors/sim/sim_costs.hpp"
#include "launch/run_plan.hpp"
#include "launch/spec/spec.hpp"

namespace troupe::launch {

// Op times of some steps of a runtime, in ms (F and B per micro-batch).
struct OpTimes {
  std::vector<double> f, b;             // per stage: means (a step pays its slow ops too)
  std::vector<double> w;                // per stage: mean W (weight pass); empty when no backward was split
  // Post-pipeline closures per step, per device of the spec's placement, in
  // four phases that wait for each other across devices (a shard reduces
  // once every rank's gradients are in; AdamW once every shard's norm is in):
  // 0 gradient download (ranks), 1 reduce, 2 update, 3 snapshot and
  // parameter load. Keyed (phase, device).
  std::map<std::pair<int, int>, double> post;
  std::map<int, double> post_by_device;  // the phases summed per device
  double optimizer = 0.0;                // the post phases' critical path: sum over phases of the busiest device
  std::map<int, double> busy_by_device; // closures per step (median), per device of the trace
  double gap_us = 0.0;                  // median idle gap between two closures of a device
  double step = 0.0;                    // median wall time of a step
  int64_t samples = 0, steps = 0;       // F and B closures timed, steps they came from
};

// Reads the op times of the steps `steps` ([start, end] steady_clock ns)
// from `traces` of a runtime running `spec`'s pipeline; `placement` names
// the device of every rank and optimizer shard (the spec's plan; for a
// calibration copy, the spec's, not the copy's). Throws when a stage ran no
// forward or backward in those steps.
OpTimes read_op_times(const std::vector<runtime::DeviceTrace>& traces,
                      const std::vector<std::pair<int64_t, int64_t>>& steps, const Spec& spec,
                      const runtime::Plan& placement);

// The flops roofline fitted to measured stage times: gbps from a copy
// (bytes read + written per second), gflops so that the predicted total of
// every F and B equals the measured total.
struct FlopsFit {
  double gflops = 0, gbps = 0;
  double worst = 0;          // largest relative error of one op
  std::vector<double> f, b;  // predicted ms per stage
};

struct CalibrateOptions {
  int64_t warmup = 2, repeat = 8;             // rounds per phase (alone, then all devices busy)
  const std::atomic<bool>* stop = nullptr;    // set: stop after the running round (interrupted)
  std::function<void()> between;              // run after every round (the bench steps a real runtime here)
};

struct Calibration {
  OpTimes alone, busy;  // one copy alone; as many copies as the spec has devices
  int copies = 1;
  FlopsFit fit;         // of `busy`
  int64_t mb_sequences = 0;
  bool interrupted = false;
};

// A number as the [sim] tables write it: 6 significant digits, as %g (and so
// `troupe validate`) prints it back.
std::string round_sig(double x);

// This machine's host name ("?" when it cannot be read): the tables' first comment.
std::string host_name();

// Why `spec` cannot be calibrated ("" when it can): a sim spec, a mode other
// than pretrain or rl, expert shards, several processes (rl: see
// launch/calibrate_rl.hpp).
std::string calibrate_refusal(const Spec& spec);

// Measures (see the top of this file) the spec's run plan (make_run_plan:
// its runtime options and placement). Throws what the runtime throws.
Calibration calibrate(const Spec& spec, const RunPlan& plan, const CalibrateOptions& options);

// The [sim] costs of a calibration: `measured` per-stage lists or the flops
// fit, with link latency and optimizer step; `alone` takes the one-copy times.
sim::CostConfig calibrated_costs(const Calibration& c, bool measured, bool alone = false);

// The [sim] table as `troupe calibrate` prints and writes it: comments (where
// and how it was measured, the one-copy times, the flops fit), then the keys.
std::string sim_table(const Spec& spec, const std::string& spec_path, const Calibration& c, bool measured,
                      const CalibrateOptions& options);

}  // namespace troupe::launch
