// run.mode = "rl" inside `troupe run` (launch/commands_rl.cpp).
#pragma once

#include <string>

#include "launch/progress.hpp"
#include "launch/spec.hpp"
#include "rl/trainer.hpp"

namespace troupe::launch {

rl::RlTrainOptions rl_train_options(const Spec& spec);
// Runs the synchronous RL loop; returns an ExitCode. Throws like rl::train.
int run_rl(const Spec& spec, MetricsWriter& metrics, const std::string& style);

}  // namespace troupe::launch
