// The rule verifier and the addition task on a model::DataSource (task.hpp).
#include "rl/task.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "model/data.hpp"

namespace troupe::rl {

RuleVerifier::RuleVerifier(int32_t eos_token, const VerifierOptions& options, int32_t answer_marker)
    : eos_(eos_token), opt_(options), marker_(answer_marker) {
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
  std::span<const int32_t> said(completion.begin(), v.finished ? eos_at + 1 : completion.end());
  std::span<const int32_t> expected(prompt.answer);
  if (marker_ >= 0) {  // only what follows the last marker (none said: nothing)
    auto after_last = [&](std::span<const int32_t> x) {
      const auto r = std::find(x.rbegin(), x.rend(), marker_);
      return r == x.rend() ? x.subspan(x.size()) : x.subspan(static_cast<size_t>(x.rend() - r));
    };
    said = after_last(said);
    expected = after_last(expected);
  }
  v.correct = std::equal(said.begin(), said.end(), expected.begin(), expected.end());
  if (v.correct) {
    v.reward = 1.0;
  } else if (opt_.partial_credit > 0) {
    // Answer tokens right in place, the answer's closing EOS not counted.
    const size_t n = expected.size() - (!expected.empty() && expected.back() == eos_ ? 1 : 0);
    size_t right = 0;
    for (size_t i = 0; i < n && i < said.size(); ++i) right += said[i] == expected[i] ? 1 : 0;
    if (n > 0) v.reward = opt_.partial_credit * static_cast<double>(right) / static_cast<double>(n);
  }
  if (!v.finished) v.reward -= opt_.format_penalty;
  return v;
}

std::vector<Verdict> Verifier::score_batch(std::span<const Prompt* const> prompts,
                                           std::span<const std::span<const int32_t>> completions) const {
  if (prompts.size() != completions.size())
    throw std::invalid_argument("rl: score_batch needs one prompt per completion");
  std::vector<Verdict> out;
  out.reserve(prompts.size());
  for (size_t i = 0; i < prompts.size(); ++i) out.push_back(score(*prompts[i], completions[i]));
  return out;
}

namespace {

class AdditionTask final : public Task {
 public:
  // The verifier scores what follows the source's answer marker (the whole
  // completion without one).
  AdditionTask(std::unique_ptr<model::DataSource> source, const VerifierOptions& verifier, int64_t width)
      : source_(std::move(source)), verifier_(source_->eos_token(), verifier, source_->answer_marker()),
        max_prompt_(2 * width + 3) {}

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
  int64_t max_answer_tokens() const override { return source_->max_answer_tokens(); }

 private:
  std::unique_ptr<model::DataSource> source_;
  RuleVerifier verifier_;
  int64_t max_prompt_;
};

class MixedTask final : public Task {
 public:
  MixedTask(std::unique_ptr<Task> main, std::unique_ptr<Task> side, double fraction)
      : main_(std::move(main)), side_(std::move(side)), f_(fraction) {}

  std::string describe() const override {
    return main_->describe() + ", " + std::to_string(static_cast<int>(f_ * 100.0 + 0.5)) + "% of them from " +
           side_->describe();
  }

  Prompt train_prompt(int64_t index) const override {
    if (index < 0) throw std::invalid_argument("rl: train_prompt needs index >= 0, got " + std::to_string(index));
    const int64_t before = sides_before(index);  // side prompts among indices 0 .. index - 1
    const bool side = sides_before(index + 1) > before;
    Prompt p = side ? side_->train_prompt(before) : main_->train_prompt(index - before);
    p.index = index;
    return p;
  }

  std::vector<Prompt> eval_prompts(int64_t n) const override { return main_->eval_prompts(n); }
  const Verifier& verifier() const override { return main_->verifier(); }
  int32_t eos_token() const override { return main_->eos_token(); }
  int64_t max_prompt_tokens() const override {
    const int64_t a = main_->max_prompt_tokens(), b = side_->max_prompt_tokens();
    return a < 0 || b < 0 ? -1 : std::max(a, b);
  }
  int64_t max_answer_tokens() const override {
    const int64_t a = main_->max_answer_tokens(), b = side_->max_answer_tokens();
    return a < 0 || b < 0 ? -1 : std::max(a, b);
  }

 private:
  // floor(n f): how many of the indices 0 .. n - 1 go to the side task.
  int64_t sides_before(int64_t n) const {
    return static_cast<int64_t>(std::floor(static_cast<double>(n) * f_));
  }

  std::unique_ptr<Task> main_, side_;
  double f_;
};

}  // namespace

std::unique_ptr<Task> make_mixed_task(std::unique_ptr<Task> main, std::unique_ptr<Task> side, double fraction) {
  if (!main || !side) throw std::invalid_argument("rl: a mixed task needs both tasks");
  if (!(fraction >= 0 && fraction < 1))
    throw std::invalid_argument("rl: the side task's share must be in [0, 1), got " + std::to_string(fraction));
  if (main->eos_token() != side->eos_token())
    throw std::invalid_argument("rl: a mixed task's two tasks must share their EOS token");
  return std::make_unique<MixedTask>(std::move(main), std::move(side), fraction);
}

std::unique_ptr<Task> make_sft_side_task(const model::DataConfig& data, uint64_t seed,
                                         const VerifierOptions& verifier) {
  if (data.target_pairs.empty() || data.target_column < 0) return nullptr;
  model::DataConfig side = data;
  try {
    side.target_pairs = model::complement_pairs(data.target_pairs, data.target_column);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(std::string("data: ") + e.what());
  }
  if (side.target_pairs.empty()) return nullptr;
  return make_addition_task(side, seed, verifier);
}

std::unique_ptr<Task> make_addition_task(const model::DataConfig& data, uint64_t seed,
                                         const VerifierOptions& verifier) {
  if (data.source == model::DataKind::scratchpad)  // operands of the same width, up to digits
    return std::make_unique<AdditionTask>(model::make_data_source(data, seed), verifier, data.digits);
  if (data.source != model::DataKind::addition && data.source != model::DataKind::addition_plain)
    throw std::runtime_error(std::string("rl: the addition task needs data.source = \"addition\", \"addition_plain\" or "
                                         "\"scratchpad\", got \"") + model::data_kind_name(data.source) + "\"");
  return std::make_unique<AdditionTask>(model::make_data_source(data, seed), verifier,
                                        data.width > 0 ? data.width : data.digits);
}

}  // namespace troupe::rl
