// The learned reward model (docs/rl.md, "Learned reward model"): the
// decoder itself, read as a binary classifier of (prompt, completion).
//
// Scalar head without new decoder code: a row is prompt + completion + a
// marker token, and the score is the difference of two LM-head logits at the
// marker's position, s = logit[yes] - logit[no]. That is a linear head
// (w_yes - w_no) . h on the final normalised hidden state h, so training it
// with pointwise BCE, p = sigmoid(s) against the verifier's label, or with
// the Bradley–Terry loss on pairs (rm_pairs.hpp), flows through
// Decoder::backward_logits with dlogits non-zero in two columns of one row
// per example. The RM is an ordinary checkpoint of the same model.
//
// The three token ids are the last three of the model's vocabulary (marker =
// V-1, yes = V-2, no = V-3), which the addition task (14 tokens) never uses;
// the spec parser checks that the data's vocabulary leaves them free.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "kernels/backend.hpp"
#include "model/config.hpp"
#include "model/kv_generate.hpp"
#include "model/weights.hpp"

namespace troupe::model {
class Decoder;
}

namespace troupe::rl {

class Task;
struct Prompt;

struct RmTokens {
  int32_t marker = 0, yes = 0, no = 0;
};
// The marker / yes / no ids for a vocabulary of `vocab_size` (>= 4, else
// std::invalid_argument).
RmTokens rm_tokens(int64_t vocab_size);

// One labelled example: a generated completion (up to and including its first
// EOS) of a prompt, and the verifier's verdict on it (1 = exact match).
struct RmExample {
  int64_t prompt_index = 0;  // the task's prompt number (training or held-out)
  std::vector<int32_t> prompt;
  std::vector<int32_t> completion;
  int label = 0;
};

// Indices, into one example set, of an accepted (label 1) and a rejected
// (label 0) completion of the same prompt: a Bradley–Terry pair (rm_pairs.hpp).
struct RmPair {
  int64_t pos = 0, neg = 0;
};

// Samples `group_size` completions of each prompt with the KV-cache generator
// (options: temperature, max_new_tokens, eos) and labels each with the task's
// verifier (correct -> 1). Completion j of prompt p draws from
// sampler_seed({salt, 0, p.index}, j), so the data is a pure function of
// (weights, prompts, salt). Prompt-major order.
std::vector<RmExample> label_completions(model::BatchGenerator& gen, const model::ModelWeights& w, const Task& task,
                                         const std::vector<Prompt>& prompts, int64_t group_size,
                                         const model::GenerateOptions& options, uint64_t salt);

// Pointwise BCE with logits, in float64: mean over i of
// -[y log sigmoid(s) + (1 - y) log(1 - sigmoid(s))], written stably; dscores
// (resized) gets d mean / d s_i = (sigmoid(s_i) - y_i) / n.
double bce_with_logits(std::span<const double> scores, std::span<const int> labels, std::vector<double>* dscores);

// What a set of scores says against its labels.
struct RmAccuracy {
  int64_t examples = 0;
  int64_t positives = 0;
  double accuracy = 0.0;  // share with (score > 0) == label
  double majority = 0.0;  // the majority-class baseline: max(positive share, 1 - positive share)
  double bce = 0.0;       // mean BCE of the scores
  double mean_score_pos = 0.0, mean_score_neg = 0.0;
};
RmAccuracy rm_accuracy(std::span<const double> scores, std::span<const int> labels);

// Scores and trains the decoder as a reward model on batches of examples.
// Rows are padded to a fixed length (prompt + max_new_tokens + marker,
// rounded up to 8) and batches to `batch` rows, so one decoder serves every
// call; causal attention makes the padding after the marker irrelevant.
class RewardModel {
 public:
  RewardModel(kernels::Backend& backend, const model::ModelConfig& config, int64_t batch, int64_t max_row_tokens);
  ~RewardModel();
  RewardModel(const RewardModel&) = delete;
  RewardModel& operator=(const RewardModel&) = delete;

  // Scores of every example (any count; scored `batch` at a time).
  std::vector<double> score(const model::ModelWeights& w, std::span<const RmExample> examples);
  // One batch (at most `batch` examples): forward, mean BCE, and its
  // backward (plus aux_scale * the MoE aux loss) ACCUMULATED into grads.
  // Returns the mean BCE; scores_out (optional) gets the batch's scores.
  double train_batch(const model::ModelWeights& w, const model::ModelWeights& grads,
                     std::span<const RmExample> examples, double aux_scale, std::vector<double>* scores_out = nullptr);
  // The same for the Bradley–Terry loss: `rows` (at most `batch`) are scored
  // in one forward, `pairs` index into them (a row may serve several pairs);
  // the mean of -log sigmoid(s_pos - s_neg) over the pairs is returned and
  // its backward accumulated into grads.
  double train_pairs(const model::ModelWeights& w, const model::ModelWeights& grads, std::span<const RmExample> rows,
                     std::span<const RmPair> pairs, double aux_scale, std::vector<double>* scores_out = nullptr);
  // The decoder (expert_load() after a train_batch, for the router-bias rule).
  model::Decoder& decoder() { return *dec_; }
  int64_t row_tokens() const { return S_; }
  const RmTokens& tokens() const { return tok_; }

 private:
  // Lays out up to batch_ examples and runs the forward; fills host logits
  // at each example's marker position into scores.
  void forward(const model::ModelWeights& w, std::span<const RmExample> examples, std::vector<double>& scores);
  // d loss / d score of each row of the last forward -> the decoder's backward.
  void backward_scores(const model::ModelWeights& w, const model::ModelWeights& grads, std::span<const double> dscores,
                       double aux_scale);

  kernels::Backend& be_;
  model::ModelConfig cfg_;
  int64_t batch_, S_;
  RmTokens tok_;
  std::unique_ptr<model::Decoder> dec_;
  std::vector<int32_t> inputs_, targets_;
  std::vector<int64_t> pos_;     // flat row position of each example's marker, last forward
  std::vector<float> logits_;    // [batch*S, V] host copy
  std::vector<float> dlogits_;
};

}  // namespace troupe::rl
