// The RL trainer's policy update on the actor runtime: pipeline ranks,
// expert shards and ZeRO-1 optimizer shards (actors/runtime.hpp) with the
// policy loss as the last stage's loss head (rl/policy_stage_head.hpp). The
// decoupled RL trainer (rl_driver.cpp) gets one through
// rl::RlTrainOptions::make_updater; each optimizer update is one runtime step
// on a fed batch, so the runtime's supervision (kill-and-replay, message
// faults, deadlines) covers the trainer's actors too.
#pragma once

#include "actors/runtime.hpp"
#include "rl/config.hpp"
#include "rl/policy_updater.hpp"

namespace troupe::runtime {

// `topology`: the trainer's runtime (schedule, stages, devices, expert and
// optimizer shards, data_parallel, train.microbatches, backend, supervision,
// faults counted in optimizer updates). The factory fills in the model with
// the RL rows' length, the optimizer, the batch (rows), the run's updates,
// the loss head and the start state; the runtime's checks apply
// (std::invalid_argument, e.g. rows the micro-batches do not divide).
rl::PolicyUpdaterFactory runtime_policy_updater(RuntimeOptions topology, const rl::PolicyLossOptions& loss,
                                                double temperature);

}  // namespace troupe::runtime
