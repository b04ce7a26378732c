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
// scheduled LR, betas, eps, the bias-correction step (step + 1) and weight
// decay where `decay` (false for norms, see OptimizerRange).
kernels::AdamWParams adamw_params(const OptimConfig& optim, int64_t step, int64_t total, bool decay);

// Scales `grads` so that a global norm `norm` becomes `max_norm` when it is
// larger (factor max_norm / (norm + 1e-6), as kernels::clip_grad_norm);
// max_norm <= 0: no clipping. `grads` may be a slice of the gradients whose
// norm is `norm`.
void clip_to_norm(kernels::Backend& backend, const kernels::Tensor& grads, double norm, double max_norm);

// Saves a single-device engine's state after `step` steps (the data cursor is
// the step): model::Trainer, and rl/'s RL and reward-model trainers.
void save_device_state(const std::string& dir, const ModelConfig& config, uint64_t seed, int64_t step,
                       kernels::Backend& backend, const kernels::Tensor& params, const kernels::Tensor& adam_m,
                       const kernels::Tensor& adam_v, const ParamLayout& layout);

}  // namespace troupe::model
