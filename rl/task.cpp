// The rule verifier and the addition task on a model::DataSource (task.hpp).
#include "rl/task.hpp"

#include <algorithm>
#include <stdexcept>

#include "model/data.hpp"

namespace troupe::rl {

RuleVerifier::RuleVerifier(int32_t eos_token, const VerifierOptions& options) : eos_(eos_token), opt_(options) {
  if (!(opt_.partial_credit >= 0 && opt_.partial_credit < 1))
    throw std::invalid_argument("rl: partial_credit must be in [0, 1), got " + std::to_string(opt_.partial_credit));
  if (!(opt_.format_penalty >= 0))
    throw std::invalid_argument("rl: format_penalty must be >= 0, got " + std::to_string(opt_.format_penalty));
}

Verdict RuleVerifier::score(const Prompt& prompt, std::span<const int32_t> completion) const {
  const auto eos_at = std::find(completion.begin(), completion.end(), eos_);
  Verdict v;
  v.finished = eos_at != completion.end();
  // Up to and including the first EOS: what the model answered.
  const std::span<const int32_t> said(completion.begin(), v.finished ? eos_at + 1 : completion.end());
  v.correct = std::equal(said.begin(), said.end(), prompt.answer.begin(), prompt.answer.end());
  if (v.correct) {
    v.reward = 1.0;
  } else if (opt_.partial_credit > 0) {
    // Answer tokens right in place, the answer's closing EOS not counted.
    const size_t n = prompt.answer.size() - (!prompt.answer.empty() && prompt.answer.back() == eos_ ? 1 : 0);
    size_t right = 0;
    for (size_t i = 0; i < n && i < said.size(); ++i) right += said[i] == prompt.answer[i] ? 1 : 0;
    if (n > 0) v.reward = opt_.partial_credit * static_cast<double>(right) / static_cast<double>(n);
  }
  if (!v.finished) v.reward -= opt_.format_penalty;
  return v;
}

namespace {

class AdditionTask final : public Task {
 public:
  AdditionTask(std::unique_ptr<model::DataSource> source, const VerifierOptions& verifier, int64_t width)
      : source_(std::move(source)), verifier_(source_->eos_token(), verifier), max_prompt_(2 * width + 3) {}

  std::string describe() const override { return "RL prompts of " + source_->describe(); }

  Prompt train_prompt(int64_t index) const override {
    if (index < 0) throw std::invalid_argument("rl: train_prompt needs index >= 0, got " + std::to_string(index));
    model::TaskProblem p = source_->train_problem(index);
    return Prompt{index, std::move(p.prompt), std::move(p.answer)};
  }

  std::vector<Prompt> eval_prompts(int64_t n) const override {
    std::vector<model::TaskProblem> problems = source_->eval_problems(n);
    std::vector<Prompt> out;
    out.reserve(problems.size());
    for (size_t i = 0; i < problems.size(); ++i)
      out.push_back(Prompt{static_cast<int64_t>(i), std::move(problems[i].prompt), std::move(problems[i].answer)});
    return out;
  }

  const Verifier& verifier() const override { return verifier_; }
  int32_t eos_token() const override { return source_->eos_token(); }
  // "EOS a+b=" with operands of at most `width` written digits.
  int64_t max_prompt_tokens() const override { return max_prompt_; }

 private:
  std::unique_ptr<model::DataSource> source_;
  RuleVerifier verifier_;
  int64_t max_prompt_;
};

}  // namespace

std::unique_ptr<Task> make_addition_task(const model::DataConfig& data, uint64_t seed,
                                         const VerifierOptions& verifier) {
  if (data.source != model::DataKind::addition && data.source != model::DataKind::addition_plain)
    throw std::runtime_error(std::string("rl: the addition task needs data.source = \"addition\" or \"addition_plain\", got \"") +
                             model::data_kind_name(data.source) + "\"");
  return std::make_unique<AdditionTask>(model::make_data_source(data, seed), verifier,
                                        data.width > 0 ? data.width : data.digits);
}

}  // namespace troupe::rl
