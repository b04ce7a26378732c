// Shared by the RL trainer and RL actor tests: a trivially learnable task
// (reward 1 when the first generated token is kTarget) and a tiny model.
#pragma once

#include <string>
#include <vector>

#include "model/config.hpp"
#include "rl/task.hpp"
#include "rl/trainer.hpp"

namespace troupe::test {

// Reward 1 when the first generated token is kTarget, else 0; prompts are a
// BOS-like token followed by one of a few fixed tokens. A random policy over
// a 16-token vocabulary earns ~1/16.
constexpr int32_t kTarget = 7;
constexpr int32_t kEos = 12;

class FirstTokenVerifier final : public rl::Verifier {
 public:
  rl::Verdict score(const rl::Prompt&, std::span<const int32_t> completion) const override {
    rl::Verdict v;
    v.correct = !completion.empty() && completion[0] == kTarget;
    v.reward = v.correct ? 1.0 : 0.0;
    for (int32_t t : completion) v.finished = v.finished || t == kEos;
    return v;
  }
};

class FirstTokenTask final : public rl::Task {
 public:
  std::string describe() const override { return "first token is 7"; }
  rl::Prompt train_prompt(int64_t index) const override { return make(index); }
  std::vector<rl::Prompt> eval_prompts(int64_t n) const override {
    std::vector<rl::Prompt> out;
    for (int64_t i = 0; i < n; ++i) out.push_back(make(1000 + i));
    return out;
  }
  const rl::Verifier& verifier() const override { return verifier_; }
  int32_t eos_token() const override { return kEos; }

 private:
  static rl::Prompt make(int64_t index) {
    rl::Prompt p;
    p.index = index;
    p.tokens = {kEos, static_cast<int32_t>(index % 5), static_cast<int32_t>(10 + index % 2)};
    p.answer = {kTarget, kEos};
    return p;
  }
  FirstTokenVerifier verifier_;
};

inline rl::RlTrainOptions tiny_options(const std::string& ffn) {
  rl::RlTrainOptions o;
  model::ModelConfig& c = o.model;
  c.vocab_size = 16;
  c.d_model = 32;
  c.n_layers = 2;
  c.n_heads = 4;
  c.seq_len = 16;
  c.ffn = troupe::model::parse_ffn(ffn);
  c.dense_hidden = 64;
  c.n_experts = 4;
  c.top_k = 2;
  c.expert_hidden = 32;
  c.tie_embeddings = false;
  c.init_std = 0.02;
  o.optim.lr = 1e-2;
  o.optim.warmup_steps = 0;
  o.optim.schedule = troupe::model::LrSchedule::constant;
  o.optim.weight_decay = 0.0;
  o.data.eval_problems = 8;
  o.rl.group_size = 8;
  o.rl.prompts_per_step = 4;
  o.rl.max_new_tokens = 3;
  o.rl.temperature = 1.0;
  o.seed = 5;
  o.steps = 30;
  return o;
}

// The small decoupled-RL run the actor tests share: the MoE model, 3
// prompts x 4 completions per step, a KL term, 4 held-out problems.
inline rl::RlTrainOptions small_options(int64_t steps) {
  rl::RlTrainOptions o = tiny_options("moe");
  o.steps = steps;
  o.rl.policy.kl_coef = 0.01;
  o.rl.prompts_per_step = 3;
  o.rl.group_size = 4;
  o.data.eval_problems = 4;
  return o;
}

}  // namespace troupe::test
