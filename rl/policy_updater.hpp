// The RL policy update run outside the trainer's own backend: the actor
// runtime's pipeline ranks, expert shards and optimizer shards
// (actors/rl/runtime_policy.hpp builds one). RlTrainer keeps sampling,
// scoring, advantages, metrics and checkpoints; it hands each optimizer
// update's rows and per-token inputs (rl/policy_stage_head.hpp's columns) to
// the updater, which runs forward, the policy head, backward, clipping and
// AdamW, and gets the per-token log-probs and entropies back. The updater
// holds the parameters and AdamW moments; RlTrainer reads them back after
// each RL step (generation, evaluation, publication, checkpoints). No actors
// here.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "model/checkpoint.hpp"
#include "model/config.hpp"

namespace troupe::rl {

class PolicyUpdater {
 public:
  struct Result {
    std::vector<double> report;  // [rows * seq_len * PolicyStageHead::kReportColumns]
    double grad_norm = 0.0, lr = 0.0, aux_loss = 0.0;
  };
  virtual ~PolicyUpdater() = default;
  // Every batch has this many rows of seq_len() tokens.
  virtual int64_t rows() const = 0;
  virtual int64_t seq_len() const = 0;
  // One optimizer update. inputs/targets [rows*seq_len] (-1: no target),
  // token_data [rows*seq_len*PolicyStageHead::kColumns].
  virtual Result update(std::vector<int32_t> inputs, std::vector<int32_t> targets, std::vector<double> token_data) = 0;
  // The parameters after the last update (every RL step: publication).
  virtual std::vector<float> read_params() = 0;
  // The parameters and AdamW moments after the last update (checkpoints).
  virtual void read_state(std::vector<float>& params, std::vector<float>& adam_m, std::vector<float>& adam_v) = 0;
};

// What an updater starts from: the policy (params, moments, optimizer
// updates done = RL steps done x updates_per_batch), the model with rows of
// `seq_len` tokens, and the whole run's optimizer updates (the LR schedule).
struct PolicyUpdaterStart {
  model::ModelConfig model;          // seq_len: the training rows' length
  model::OptimConfig optim;
  model::TrainingState state;        // params, adam_m, adam_v (may be empty: zeros), step
  int64_t rows = 0;                  // prompts_per_step x group_size
  int64_t total_updates = 0;         // steps x updates_per_batch
  uint64_t seed = 1;
};
using PolicyUpdaterFactory = std::function<std::unique_ptr<PolicyUpdater>(const PolicyUpdaterStart&)>;

}  // namespace troupe::rl
