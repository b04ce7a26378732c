// run.mode = "rl" inside `troupe run` (launch/commands_rl.cpp).
#pragma once

#include <string>

#include "launch/progress.hpp"
#include "launch/signals.hpp"
#include "launch/spec.hpp"
#include "rl/trainer.hpp"

namespace troupe::launch {

rl::RlTrainOptions rl_train_options(const Spec& spec);
// Runs the synchronous RL loop; returns an ExitCode (kExitInterrupted when
// `signals` stopped it). Throws like rl::train.
int run_rl(const Spec& spec, MetricsWriter& metrics, ProgressStyle style, const StopOnSignal& signals);
// run.mode = "reward_model" (launch/commands_rm.cpp): trains the learned
// reward model; returns an ExitCode.
int run_reward_model(const Spec& spec, MetricsWriter& metrics, ProgressStyle style, const StopOnSignal& signals);
// Logs where an interrupted run saved its checkpoint; returns kExitInterrupted.
int report_interrupted(const Spec& spec, const StopOnSignal& signals, int64_t steps_done);

}  // namespace troupe::launch
