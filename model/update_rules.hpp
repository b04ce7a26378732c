// The hyper-parameter rules of one optimizer step, written once and called by
// both engines: model::Trainer (single process) and the runtime's optimizer
// shards (actors/optimizer/). The LR schedule model::learning_rate is declared
// in trainer.hpp and defined in update_rules.cpp; the router-bias rule is
// moe::update_router_bias (moe/balance.hpp). Here: AdamW's hyper-parameters
// for a step, and global-norm clipping given the global norm (which the
// runtime reduces across shards first).
#pragma once

#include <cstdint>
#include <string>

#include "kernels/backend.hpp"
#include "model/config.hpp"
#include "model/params.hpp"

namespace troupe::model {

// AdamW hyper-parameters of optimizer step `step` (0-based) of `total`: the
// scheduled LR, betas, eps, the bias-correction step (step + 1), weight
// decay where `decay` (false for norms, see OptimizerRange), and global-norm
// clipping given the gradients' global norm `grad_norm` (the runtime reduces
// it across shards first): when it exceeds optim.grad_clip > 0, grad_scale =
// grad_clip / (grad_norm + 1e-6), as kernels::clip_grad_norm, applied by the
// AdamW kernel as it reads the gradients (no separate scale pass).
kernels::AdamWParams adamw_params(const OptimConfig& optim, int64_t step, int64_t total, bool decay,
                                  double grad_norm);

// Saves a single-device engine's state after `step` steps (the data cursor is
// the step): model::Trainer, and rl/'s RL and reward-model trainers.
// rng_state is stored as TrainingState::rng_state (the reward model keeps a
// fingerprint of its data there, so a resume can check it).
void save_device_state(const std::string& dir, const ModelConfig& config, uint64_t seed, int64_t step,
                       kernels::Backend& backend, const kernels::Tensor& params, const kernels::Tensor& adam_m,
                       const kernels::Tensor& adam_v, const ParamLayout& layout, const std::string& rng_state = {});

}  // namespace troupe::model
