// The learned reward model's data, BCE loss and head (see reward_model.hpp;
// the Bradley–Terry loss is rm_pairs.hpp).
#include "rl/reward_model.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "model/decoder.hpp"
#include "rl/group.hpp"
#include "rl/rm_pairs.hpp"
#include "rl/task.hpp"

namespace troupe::rl {

RmTokens rm_tokens(int64_t vocab_size) {
  if (vocab_size < 4)
    throw std::invalid_argument("reward model: the vocabulary (" + std::to_string(vocab_size) +
                                " tokens) has no room for the marker / yes / no tokens (at least 4 needed)");
  const auto v = static_cast<int32_t>(vocab_size);
  return RmTokens{v - 1, v - 2, v - 3};
}

std::vector<RmExample> label_completions(model::BatchGenerator& gen, const model::ModelWeights& w, const Task& task,
                                         const std::vector<Prompt>& prompts, int64_t group_size,
                                         const model::GenerateOptions& options, uint64_t salt) {
  if (group_size < 1) throw std::invalid_argument("label_completions: group_size must be >= 1");
  std::vector<RmExample> out;
  out.reserve(prompts.size() * static_cast<size_t>(group_size));
  constexpr size_t kChunkPrompts = 16;  // prompts per generator batch
  for (size_t at = 0; at < prompts.size(); at += kChunkPrompts) {
    const size_t n = std::min(kChunkPrompts, prompts.size() - at);
    std::vector<std::vector<int32_t>> ps;
    std::vector<model::SamplerRng> rngs;
    for (size_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < group_size; ++j) {
        ps.push_back(prompts[at + i].tokens);
        rngs.emplace_back(sampler_seed(GroupId{salt, 0, prompts[at + i].index}, j));
      }
    const auto comps = gen.generate(w, ps, std::span<model::SamplerRng>(rngs), options);
    for (size_t i = 0; i < n; ++i)
      for (int64_t j = 0; j < group_size; ++j) {
        const Prompt& p = prompts[at + i];
        const auto& c = comps[i * static_cast<size_t>(group_size) + static_cast<size_t>(j)].tokens;
        RmExample e;
        e.prompt_index = p.index;
        e.prompt = p.tokens;
        // Up to and including the first EOS: what the verifier reads.
        const auto end = std::find(c.begin(), c.end(), task.eos_token());
        e.completion.assign(c.begin(), end == c.end() ? end : end + 1);
        e.label = task.verifier().score(p, c).correct ? 1 : 0;
        out.push_back(std::move(e));
      }
  }
  return out;
}

double bce_with_logits(std::span<const double> s, std::span<const int> y, std::vector<double>* ds) {
  if (s.size() != y.size() || s.empty())
    throw std::invalid_argument("bce_with_logits: " + std::to_string(s.size()) + " scores and " +
                                std::to_string(y.size()) + " labels (need the same, non-zero count)");
  const double n = static_cast<double>(s.size());
  if (ds) ds->assign(s.size(), 0.0);
  double sum = 0.0;
  for (size_t i = 0; i < s.size(); ++i) {
    if (y[i] != 0 && y[i] != 1) throw std::invalid_argument("bce_with_logits: label " + std::to_string(y[i]) + " is not 0 or 1");
    if (!std::isfinite(s[i])) throw std::invalid_argument("bce_with_logits: score " + std::to_string(i) + " is not finite");
    // -log sigmoid(s) = softplus(-s); -log(1 - sigmoid(s)) = softplus(s).
    const double z = y[i] ? -s[i] : s[i];
    sum += std::max(z, 0.0) + std::log1p(std::exp(-std::abs(z)));
    if (ds) {
      const double p = s[i] >= 0 ? 1.0 / (1.0 + std::exp(-s[i])) : std::exp(s[i]) / (1.0 + std::exp(s[i]));
      (*ds)[i] = (p - y[i]) / n;
    }
  }
  return sum / n;
}

RmAccuracy rm_accuracy(std::span<const double> scores, std::span<const int> labels) {
  RmAccuracy a;
  a.examples = static_cast<int64_t>(scores.size());
  if (scores.empty()) return a;
  int64_t right = 0;
  double sp = 0.0, sn = 0.0;
  for (size_t i = 0; i < scores.size(); ++i) {
    a.positives += labels[i];
    right += (scores[i] > 0) == (labels[i] == 1);
    (labels[i] ? sp : sn) += scores[i];
  }
  const double n = static_cast<double>(a.examples), pos = static_cast<double>(a.positives);
  a.accuracy = static_cast<double>(right) / n;
  a.majority = std::max(pos, n - pos) / n;
  a.bce = bce_with_logits(scores, labels, nullptr);
  a.mean_score_pos = a.positives > 0 ? sp / pos : 0.0;
  a.mean_score_neg = a.positives < a.examples ? sn / (n - pos) : 0.0;
  return a;
}

RewardModel::RewardModel(kernels::Backend& be, const model::ModelConfig& c, int64_t batch, int64_t max_row_tokens)
    : be_(be), cfg_(c), batch_(batch), tok_(rm_tokens(c.vocab_size)) {
  if (batch < 1) throw std::invalid_argument("RewardModel: batch must be >= 1");
  S_ = std::min<int64_t>(c.seq_len, (std::max<int64_t>(max_row_tokens, 1) + 7) / 8 * 8);
  if (max_row_tokens > c.seq_len)
    throw std::invalid_argument("RewardModel: rows of " + std::to_string(max_row_tokens) +
                                " tokens (prompt + completion + marker) do not fit seq_len " + std::to_string(c.seq_len));
  cfg_.seq_len = S_;
  dec_ = std::make_unique<model::Decoder>(be, cfg_, batch);
}

RewardModel::~RewardModel() = default;

void RewardModel::forward(const model::ModelWeights& w, std::span<const RmExample> ex, std::vector<double>& scores) {
  const int64_t n = static_cast<int64_t>(ex.size()), V = cfg_.vocab_size;
  if (n < 1 || n > batch_) throw std::invalid_argument("RewardModel: a batch of " + std::to_string(n) + " examples (1.." + std::to_string(batch_) + ")");
  inputs_.assign(static_cast<size_t>(batch_ * S_), tok_.marker);  // padding rows: a lone marker
  targets_.assign(inputs_.size(), -1);
  pos_.assign(static_cast<size_t>(n), 0);
  for (int64_t i = 0; i < n; ++i) {
    const RmExample& e = ex[static_cast<size_t>(i)];
    const int64_t len = static_cast<int64_t>(e.prompt.size() + e.completion.size()) + 1;
    if (len > S_)
      throw std::invalid_argument("RewardModel: example of prompt " + std::to_string(e.prompt_index) + " has " +
                                  std::to_string(len) + " tokens with the marker, rows hold " + std::to_string(S_));
    int32_t* row = inputs_.data() + i * S_;
    int64_t t = 0;
    for (int32_t x : e.prompt) row[t++] = x;
    for (int32_t x : e.completion) row[t++] = x;
    row[t] = tok_.marker;
    pos_[static_cast<size_t>(i)] = i * S_ + t;
  }
  dec_->forward(w, inputs_, targets_);
  logits_.resize(static_cast<size_t>(batch_ * S_ * V));
  be_.download(logits_.data(), dec_->logits(), logits_.size() * sizeof(float));
  scores.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const float* l = logits_.data() + pos_[static_cast<size_t>(i)] * V;
    scores[static_cast<size_t>(i)] = static_cast<double>(l[tok_.yes]) - static_cast<double>(l[tok_.no]);
  }
}

std::vector<double> RewardModel::score(const model::ModelWeights& w, std::span<const RmExample> ex) {
  std::vector<double> out, part;
  out.reserve(ex.size());
  for (size_t at = 0; at < ex.size(); at += static_cast<size_t>(batch_)) {
    forward(w, ex.subspan(at, std::min(static_cast<size_t>(batch_), ex.size() - at)), part);
    out.insert(out.end(), part.begin(), part.end());
  }
  return out;
}

double RewardModel::train_batch(const model::ModelWeights& w, const model::ModelWeights& grads,
                                std::span<const RmExample> ex, double aux_scale, std::vector<double>* scores_out) {
  std::vector<double> scores, ds;
  forward(w, ex, scores);
  std::vector<int> labels;
  labels.reserve(ex.size());
  for (const RmExample& e : ex) labels.push_back(e.label);
  const double loss = bce_with_logits(scores, labels, &ds);
  backward_scores(w, grads, ds, aux_scale);
  if (scores_out) *scores_out = std::move(scores);
  return loss;
}

double RewardModel::train_pairs(const model::ModelWeights& w, const model::ModelWeights& grads,
                                std::span<const RmExample> rows, std::span<const RmPair> pairs, double aux_scale,
                                std::vector<double>* scores_out) {
  std::vector<double> scores;
  forward(w, rows, scores);
  std::vector<double> sp, sn, dp, dn;
  for (const RmPair& p : pairs) {
    if (p.pos < 0 || p.neg < 0 || static_cast<size_t>(std::max(p.pos, p.neg)) >= rows.size())
      throw std::invalid_argument("RewardModel::train_pairs: a pair indexes past the " + std::to_string(rows.size()) + " rows");
    sp.push_back(scores[static_cast<size_t>(p.pos)]);
    sn.push_back(scores[static_cast<size_t>(p.neg)]);
  }
  const double loss = bradley_terry_loss(sp, sn, &dp, &dn);
  // A row in several pairs gathers each pair's share.
  std::vector<double> ds(rows.size(), 0.0);
  for (size_t i = 0; i < pairs.size(); ++i) {
    ds[static_cast<size_t>(pairs[i].pos)] += dp[i];
    ds[static_cast<size_t>(pairs[i].neg)] += dn[i];
  }
  backward_scores(w, grads, ds, aux_scale);
  if (scores_out) *scores_out = std::move(scores);
  return loss;
}

void RewardModel::backward_scores(const model::ModelWeights& w, const model::ModelWeights& grads,
                                  std::span<const double> ds, double aux_scale) {
  // d s / d logit[yes] = 1, d s / d logit[no] = -1, at the marker only.
  const int64_t V = cfg_.vocab_size;
  dlogits_.assign(logits_.size(), 0.0f);
  for (size_t i = 0; i < ds.size(); ++i) {
    float* d = dlogits_.data() + pos_[i] * V;
    d[tok_.yes] = static_cast<float>(ds[i]);
    d[tok_.no] = static_cast<float>(-ds[i]);
  }
  dec_->backward_logits(w, grads, dlogits_, aux_scale);
}

}  // namespace troupe::rl
