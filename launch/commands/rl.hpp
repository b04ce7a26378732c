// run.mode = "rl" inside `troupe run` (launch/commands/rl.cpp).
#pragma once

#include <memory>
#include <string>

#include "launch/observe/progress.hpp"
#include "launch/run_plan.hpp"
#include "launch/signals.hpp"
#include "launch/spec/spec.hpp"
#include "rl/trainer.hpp"

namespace troupe::model {
struct TrainSummary;
}
namespace troupe::runtime {
struct ClusterComm;
}

namespace troupe::launch {

rl::RlTrainOptions rl_train_options(const Spec& spec);
// Runs the synchronous RL loop or the decoupled actors; returns an ExitCode
// (kExitInterrupted when `signals` stopped it) and, when `out` is given, the
// loop's summary; then the caller reports an interruption (how to continue
// depends on it). Throws like rl::train.
// `comm`: a multi-process run (decoupled RL with generators on processes > 0).
// `plan` is make_run_plan(spec).
int run_rl(const Spec& spec, const RunPlan& plan, MetricsWriter& metrics, ProgressStyle style, const StopOnSignal& signals,
           rl::RlSummary* out = nullptr, const std::shared_ptr<runtime::ClusterComm>& comm = nullptr);
// A process > 0 of a decoupled RL run: hosts its generators until process 0
// ends the run. Returns an ExitCode.
int serve_rl_generators(const Spec& spec, const RunPlan& plan, const std::shared_ptr<runtime::ClusterComm>& comm);
// run.mode = "pretrain" (launch/commands/run.cpp): the actor runtime (as
// `plan`, make_run_plan(spec), says) or the single-process trainer; `out`
// gets the summary. Returns an ExitCode.
int run_pretrain(const Spec& spec, const RunPlan& plan, const std::shared_ptr<runtime::ClusterComm>& comm, MetricsWriter& metrics,
                 ProgressStyle style, const StopOnSignal& signals, model::TrainSummary* out = nullptr);
// run.mode = "sft_rl" (launch/commands/sft_rl.cpp): phase 1 (run_pretrain),
// phase 2 (run_rl) from phase 1's checkpoint, then the before/after table of
// both tasks. Returns an ExitCode.
int run_sft_rl(const Spec& spec, MetricsWriter& metrics, ProgressStyle style, const StopOnSignal& signals);
// run.mode = "reward_model" (launch/commands/rm.cpp): trains the learned
// reward model; returns an ExitCode.
int run_reward_model(const Spec& spec, MetricsWriter& metrics, ProgressStyle style, const StopOnSignal& signals);
// Logs where an interrupted run saved its checkpoint; returns kExitInterrupted.
int report_interrupted(const Spec& spec, const StopOnSignal& signals, int64_t steps_done);

}  // namespace troupe::launch
