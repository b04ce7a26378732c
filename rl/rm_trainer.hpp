// run.mode = "reward_model": trains the decoder as a learned reward model
// (rl/reward_model.hpp) on data the task produces. At construction the
// starting policy (rl.init, usually the SFT checkpoint) samples group_size
// completions of rl.rm_prompts training prompts and of data.eval_problems
// held-out prompts with the KV-cache generator at rl.temperature; the task's
// rule verifier labels each (exact match = 1). Then each step is one AdamW
// step of rl.rm_loss: pointwise BCE on rl.rm_batch training examples, or the
// Bradley–Terry loss on rl.rm_batch / 2 pairs (rm_pairs.hpp: an accepted and
// a rejected completion of one prompt), drawn in a seeded permutation of the
// examples / pairs per epoch. The RM starts from the same weights that generated
// its data and is saved as an ordinary checkpoint of the same model.
//
// Evaluations score every held-out example (completions of prompts the RM
// never trained on) and every training example: accuracy of score > 0
// against the label, the majority-class baseline, mean BCE, and, whatever the
// loss, the pairwise accuracy (s_pos > s_neg) and mean Bradley–Terry loss on
// the set's pairs. Deterministic
// for a seed: the data, the batch order and the updates are functions of the
// spec and seed alone, and a resumed run (checkpoint.resume) continues bit for
// bit: it relabels the same data from rl.init, checks it against the
// fingerprint its checkpoint holds, and reloads weights and AdamW moments.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "rl/reward_model.hpp"
#include "rl/rm_pairs.hpp"
#include "rl/trainer.hpp"

namespace troupe::rl {

struct RmDataStats {
  int64_t train_examples = 0, train_positives = 0;
  int64_t heldout_examples = 0, heldout_positives = 0;
  RmGroupCounts train_groups, heldout_groups;  // prompts, unpairable ones, Bradley–Terry pairs
  double seconds = 0.0;  // generating and labelling both sets
};

struct RmStepMetrics {
  int64_t step = 0;  // steps done (1 after the first)
  double loss = 0.0;            // the batch's mean loss (BCE or Bradley–Terry) before the update
  double batch_accuracy = 0.0;  // the batch's accuracy before the update (pairwise for Bradley–Terry)
  double grad_norm = 0.0, lr = 0.0, aux_loss = 0.0;
  double seconds = 0.0;
};

struct RmEvalMetrics {
  int64_t step = 0;
  RmAccuracy heldout;  // completions of held-out prompts
  RmAccuracy train;    // the training examples
  RmPairAccuracy heldout_pairs, train_pairs;  // the same scores, pair by pair
  double seconds = 0.0;
};

class RmObserver {
 public:
  virtual ~RmObserver() = default;
  virtual void on_data(const RmDataStats&) {}
  virtual void on_step(const RmStepMetrics&) {}
  virtual void on_eval(const RmEvalMetrics&) {}
  virtual void on_checkpoint(int64_t /*step*/, const std::string& /*dir*/) {}
};

struct RmSummary {
  int64_t steps_done = 0;
  RmDataStats data;
  RmEvalMetrics first_eval, last_eval;  // before the first step (fresh runs only) and after the last
  int64_t resumed_from = 0;             // steps the checkpoint it resumed from had done (0: a fresh run)
  bool interrupted = false;
};

class RmTrainer {
 public:
  // options: model, optim, data (eval_problems = held-out prompts), rl (init,
  // task, group_size, temperature, top_p, max_new_tokens, rm_prompts,
  // rm_batch, rm_loss), seed, steps, resume_from (a checkpoint of this run;
  // model::CheckpointError when it cannot be read, is not a reward-model
  // checkpoint, or its model, seed, data fingerprint, loss or batch differ).
  // Bradley–Terry with no training pair is refused (invalid_argument). resume_from is not supported (invalid_argument).
  // The task defaults to the built-in one named by rl.task.
  explicit RmTrainer(const RlTrainOptions& options, std::unique_ptr<Task> task = nullptr);
  ~RmTrainer();
  RmTrainer(const RmTrainer&) = delete;
  RmTrainer& operator=(const RmTrainer&) = delete;

  RmStepMetrics step();
  RmEvalMetrics evaluate();
  void save(const std::string& dir);
  int64_t steps_done() const;  // resumed steps included
  int64_t resumed_from() const;
  const RmDataStats& data_stats() const;
  const std::vector<RmExample>& train_examples() const;
  const std::vector<RmExample>& heldout_examples() const;
  const RmPairSet& train_pairs() const;
  const RmPairSet& heldout_pairs() const;
  // Current scores of any examples (the RM's weights as they are now).
  std::vector<double> score(const std::vector<RmExample>& examples);
  std::vector<float> parameters() const;
  const Task& task() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The one training loop (model/training_loop.hpp) with an RmTrainer as its
// engine: evaluates before the first step and every eval_every steps (and
// after the last), saves as configured.
RmSummary train_reward_model(const RlTrainOptions& options, RmObserver& observer);

}  // namespace troupe::rl
