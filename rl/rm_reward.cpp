// The learned reward model as the RL reward (see rm_reward.hpp).
#include "rl/rm_reward.hpp"

#include <cmath>
#include <map>
#include <stdexcept>
#include <vector>

#include "model/checkpoint.hpp"
#include "model/params.hpp"
#include "model/weights.hpp"
#include "rl/reward_model.hpp"
#include "rl/rollout.hpp"
#include "rl/rollout_step.hpp"
#include "rl/task.hpp"

namespace troupe::rl {

namespace {

// Row key of a (prompt, completion up to its first EOS) pair.
std::vector<int32_t> row_key(std::span<const int32_t> prompt, std::span<const int32_t> completion, int32_t eos) {
  std::vector<int32_t> k(prompt.begin(), prompt.end());
  k.push_back(-1);
  for (int32_t t : completion) {
    k.push_back(t);
    if (t == eos) break;
  }
  return k;
}

// The base task with a verifier whose rewards were set for this step.
class ScoredTask final : public Task, public Verifier {
 public:
  explicit ScoredTask(const Task& base) : base_(base) {}
  std::string describe() const override { return base_.describe() + ", rewarded by a learned reward model"; }
  Prompt train_prompt(int64_t index) const override { return base_.train_prompt(index); }
  std::vector<Prompt> eval_prompts(int64_t n) const override { return base_.eval_prompts(n); }
  const Verifier& verifier() const override { return *this; }
  int32_t eos_token() const override { return base_.eos_token(); }

  Verdict score(const Prompt& prompt, std::span<const int32_t> completion) const override {
    Verdict v = base_.verifier().score(prompt, completion);  // correct / finished: the truth, for metrics
    const auto it = rewards_.find(row_key(prompt.tokens, completion, base_.eos_token()));
    if (it == rewards_.end()) throw std::logic_error("learned reward: a completion that was not scored");
    v.reward = it->second;
    return v;
  }
  std::map<std::vector<int32_t>, double> rewards_;

 private:
  const Task& base_;
};

}  // namespace

struct ModelReward::Impl {
  const Task& task;
  model::ParamLayout layout;
  kernels::Tensor params;
  model::ModelWeights w;
  RewardModel rm;
  ScoredTask scored;

  Impl(kernels::Backend& be, const model::ModelConfig& c, const std::string& dir, const Task& t, int64_t batch,
       int64_t max_row)
      : task(t), layout(model::build_param_layout(c)), rm(be, c, batch, max_row), scored(t) {
    model::TrainingState st = model::load_checkpoint(dir, layout);
    const std::string diff = model::config_difference(c, st.config);
    if (!diff.empty())
      throw std::invalid_argument("rl.reward_model " + dir + ": the checkpoint's model differs from [model] (" + diff + ")");
    params = be.from_f32({layout.total()}, st.params);
    w = model::bind_weights(layout, c, params);
  }
};

ModelReward::ModelReward(kernels::Backend& be, const model::ModelConfig& c, const std::string& checkpoint,
                         const Task& task, int64_t batch, int64_t max_row_tokens)
    : impl_(std::make_unique<Impl>(be, c, checkpoint, task, batch, max_row_tokens)) {}
ModelReward::~ModelReward() = default;

ScoredBatch ModelReward::score_step(const RlConfig& rl, const StepRollouts& r) {
  const int64_t G = rl.group_size;
  const int32_t eos = impl_->task.eos_token();
  std::vector<RmExample> ex(r.completions.size());
  for (size_t i = 0; i < ex.size(); ++i) {
    const Prompt& p = r.prompts[i / static_cast<size_t>(G)];
    ex[i].prompt_index = p.index;
    ex[i].prompt = p.tokens;
    const std::vector<int32_t> k = row_key(p.tokens, r.completions[i].tokens, eos);
    ex[i].completion.assign(k.begin() + static_cast<std::ptrdiff_t>(p.tokens.size()) + 1, k.end());
  }
  const std::vector<double> s = impl_->rm.score(impl_->w, ex);
  impl_->scored.rewards_.clear();
  for (size_t i = 0; i < ex.size(); ++i)
    impl_->scored.rewards_[row_key(ex[i].prompt, ex[i].completion, eos)] = 1.0 / (1.0 + std::exp(-s[i]));
  return rl::score_step(impl_->scored, rl, r);
}

}  // namespace troupe::rl
