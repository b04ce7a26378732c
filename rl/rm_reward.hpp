// RL rewarded by a frozen learned reward model (rl.reward = "model") in place
// of the rule verifier: each completion's reward is sigmoid(score), the RM's
// probability that it is exactly right (rl/reward_model.hpp). The RM is a
// checkpoint of the same [model] trained by run.mode = "reward_model"; its
// weights never change during RL. Verdicts keep the rule verifier's
// `correct` and `finished` so the step metrics (exact-match share) still
// report the truth; only the reward, and so the advantages, come from the RM.
#pragma once

#include <memory>
#include <string>

#include "kernels/backend.hpp"
#include "model/config.hpp"
#include "rl/config.hpp"

namespace troupe::rl {

class Task;
struct StepRollouts;
struct ScoredBatch;

class ModelReward {
 public:
  // Loads `checkpoint` (model::CheckpointError) and checks it holds `config`
  // (std::invalid_argument). Rows hold at most max_row_tokens tokens.
  ModelReward(kernels::Backend& backend, const model::ModelConfig& config, const std::string& checkpoint,
              const Task& task, int64_t batch, int64_t max_row_tokens);
  ~ModelReward();
  ModelReward(const ModelReward&) = delete;
  ModelReward& operator=(const ModelReward&) = delete;

  // score_step (rl/rollout_step.hpp) with the RM's rewards.
  ScoredBatch score_step(const RlConfig& rl, const StepRollouts& rollouts);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace troupe::rl
