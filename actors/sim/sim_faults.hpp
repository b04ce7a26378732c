// Failures of sim devices and what they cost: goodput of a long training run
// on N devices under troupe's recovery against checkpoint-restart.
//
// Failures: each device fails independently at a mean time between failures
// `mtbf_hours`, so the job sees a Poisson process of rate N / mtbf_hours
// (exponential gaps drawn from the seed, the failing device uniform over N).
// Llama 3's 16,384-GPU run saw 419 interruptions in 54 days: a job MTBF of
// 3.1 h, i.e. a device MTBF of ~50,700 h.
//
// The run is a sequence of steps of `step_s` (the simulated step time of the
// topology). Over `horizon_hours` of wall time, both policies see the same
// failure times:
//   troupe (replay): every step pays `snapshot_overhead` x step_s for the
//     in-memory snapshot kill-and-replay needs. A failure loses the step in
//     flight (at most one step), then costs `detect_s` (deadline/heartbeat)
//     plus `recover_s` (restart the lost actors elsewhere and restore them
//     from the buddy snapshot) before the step is replayed.
//   checkpoint-restart every `checkpoint_every_min`: every checkpoint stalls
//     the run `checkpoint_write_s`; a failure loses everything since the last
//     completed checkpoint and costs `detect_s` plus `checkpoint_restart_s`
//     (requeue the job, reload the checkpoint).
// A failure during a recovery starts the recovery again. Goodput = useful
// step time (completed steps x step_s) / wall time. The model also runs
// checkpoint-restart at the Young/Daly interval sqrt(2 x write x job MTBF),
// the best periodic interval to first order, so the comparison is not
// against a badly tuned baseline.
// Left out: correlated failures (a whole host or switch), failures that need
// a spare device that is not there, stragglers, and the step time changing
// after a device is lost.
#pragma once

#include <cstdint>
#include <string>

namespace troupe::sim {

struct FaultModel {
  int64_t devices = 1;
  double step_s = 1.0;             // one step's wall time without faults
  double mtbf_hours = 0;           // per device; 0 = no failures
  double horizon_hours = 1296;     // wall time simulated (54 days)
  uint64_t seed = 1;
  double detect_s = 3;             // failure -> noticed
  double recover_s = 10;           // troupe: restart + restore from the buddy snapshot
  double snapshot_overhead = 0.02; // troupe: per-step snapshot cost, share of step_s
  double checkpoint_every_min = 60;
  double checkpoint_write_s = 60;  // stall per checkpoint
  double checkpoint_restart_s = 600;
};

struct PolicyResult {
  std::string name;
  double goodput = 0;          // useful step time / wall time
  int64_t steps = 0;           // steps completed and kept
  double lost_work_s = 0;      // computed, then thrown away by failures
  double downtime_s = 0;       // detecting and recovering
  double overhead_s = 0;       // snapshots or checkpoint writes
  double max_lost_steps = 0;   // the most steps one failure threw away
};

struct FaultStudy {
  int64_t failures = 0;
  double job_mtbf_hours = 0;
  double young_daly_min = 0;   // the checkpoint interval sqrt(2 C M), in minutes
  PolicyResult troupe, checkpoint, checkpoint_young_daly;
};

// Throws std::invalid_argument on a model that makes no sense (no devices,
// step_s <= 0, negative times).
FaultStudy study_faults(const FaultModel& m);

}  // namespace troupe::sim
