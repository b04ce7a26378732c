// A user's SFT data (data.source = "jsonl"): records {prompt, completion}
// from data.path (field names data.prompt_field / data.completion_field),
// tokenized by the [tokenizer] (model/tokenizer.hpp). One record per row:
//   inputs  EOS prompt completion            (then EOS as padding)
//   targets  -  -..-  completion EOS         (-1: no loss; padding -1 too)
// so the loss is on the completion and its EOS only, as the addition task's
// is on its answer. Held out: data.eval_path's records, or else the share
// data.eval_fraction chosen by a hash of each line (model/jsonl.hpp), so the
// split never depends on the order of the lines. Training row i is record
// jsonl_permute(seed, epoch) of the training split: a pure function of
// (seed, i), every record once per epoch. The held-out records are the task
// problems the pretraining evaluator scores (prompt, then the exact
// completion and EOS) and the validation rows.
#include <algorithm>
#include <memory>
#include <sstream>
#include <stdexcept>

#include "model/data.hpp"
#include "model/jsonl.hpp"
#include "model/tokenizer.hpp"

namespace troupe::model::detail {
namespace {

struct Example {
  std::vector<int32_t> prompt;      // EOS, then the prompt's tokens
  std::vector<int32_t> completion;  // the completion's tokens, then EOS
  int64_t line = 0;
};

class JsonlSource final : public DataSource {
 public:
  JsonlSource(const DataConfig& c, uint64_t seed, int64_t seq_len)
      : config_(c), seed_(seed), tok_(make_tokenizer(c.tokenizer)) {
    const std::vector<JsonlRecord> train = read_jsonl(c.path, c.prompt_field, c.completion_field, false);
    const bool split = c.eval_path.empty();
    for (const JsonlRecord& r : train) (split && jsonl_held_out(r, c.eval_fraction) ? eval_ : train_).push_back(make(r));
    if (!split)
      for (const JsonlRecord& r : read_jsonl(c.eval_path, c.prompt_field, c.completion_field, false))
        eval_.push_back(make(r));
    if (train_.empty())
      throw JsonlError(c.path, 0, "every record is held out (data.eval_fraction = " + std::to_string(c.eval_fraction) +
                                      "): nothing is left to train on");
    if (eval_.empty())
      throw JsonlError(split ? c.path : c.eval_path, 0,
                       split ? "no record falls in the held-out share data.eval_fraction; raise it or give data.eval_path"
                             : "holds no held-out record");
    if (seq_len > 0) {
      check_fits(train_, c.path, seq_len);
      check_fits(eval_, split ? c.path : c.eval_path, seq_len);
    }
  }

  int64_t vocab_size() const override { return tok_->vocab_size(); }
  int32_t eos_token() const override { return tok_->eos_id(); }

  std::string describe() const override {
    std::ostringstream os;
    os << "jsonl '" << config_.path << "': " << train_.size() << " training records, " << eval_.size()
       << " held out (" << (config_.eval_path.empty() ? "data.eval_fraction " + std::to_string(config_.eval_fraction)
                                                      : "'" + config_.eval_path + "'")
       << "), fields \"" << config_.prompt_field << "\" / \"" << config_.completion_field << "\"; tokenizer "
       << tok_->describe();
    return os.str();
  }

  std::vector<int32_t> encode(const std::string& text) const override { return tok_->encode(text); }
  std::string decode(const std::vector<int32_t>& tokens) const override { return tok_->decode(tokens); }
  std::vector<int32_t> encode_prompt(const std::string& text) const override {
    std::vector<int32_t> p{tok_->eos_id()};
    const std::vector<int32_t> t = tok_->encode(text);
    p.insert(p.end(), t.begin(), t.end());
    return p;
  }

  bool has_task() const override { return true; }
  std::vector<TaskProblem> eval_problems(int64_t n) const override {
    std::vector<TaskProblem> out;
    for (int64_t i = 0; i < n && i < static_cast<int64_t>(eval_.size()); ++i) out.push_back(problem(eval_[static_cast<size_t>(i)]));
    return out;
  }
  TaskProblem train_problem(int64_t index) const override { return problem(train_example(index)); }
  int64_t max_answer_tokens() const override {
    size_t m = 0;
    for (const Example& e : train_) m = std::max(m, e.completion.size());
    return static_cast<int64_t>(m);
  }

 protected:
  void train_sequence(int32_t* inputs, int32_t* targets, int64_t index, int64_t seq) const override {
    fill(train_example(index), inputs, targets, seq);
  }
  void val_sequence(int32_t* inputs, int32_t* targets, int64_t index, int64_t seq) const override {
    fill(eval_[static_cast<size_t>(index % static_cast<int64_t>(eval_.size()))], inputs, targets, seq);
  }

 private:
  Example make(const JsonlRecord& r) const {
    Example e;
    e.line = r.line;
    e.prompt.push_back(tok_->eos_id());
    for (int32_t t : tok_->encode(r.first)) e.prompt.push_back(t);
    e.completion = tok_->encode(r.second);
    e.completion.push_back(tok_->eos_id());
    return e;
  }

  static void check_fits(const std::vector<Example>& v, const std::string& file, int64_t seq) {
    for (const Example& e : v) {
      const auto need = static_cast<int64_t>(e.prompt.size() + e.completion.size()) - 1;
      if (need > seq)
        throw JsonlError(file, e.line,
                         "the record is " + std::to_string(need) + " tokens (EOS, prompt " +
                             std::to_string(e.prompt.size() - 1) + ", completion and EOS " +
                             std::to_string(e.completion.size()) + "), more than model.seq_len = " +
                             std::to_string(seq) + "; raise model.seq_len or shorten the record");
    }
  }

  const Example& train_example(int64_t index) const {
    if (index < 0) throw std::invalid_argument("data: training index must be >= 0");
    return train_[static_cast<size_t>(jsonl_training_record(seed_, 0, static_cast<int64_t>(train_.size()), index))];
  }

  static TaskProblem problem(const Example& e) {
    TaskProblem p;
    p.prompt = e.prompt;
    p.answer = e.completion;
    return p;
  }

  void fill(const Example& e, int32_t* inputs, int32_t* targets, int64_t seq) const {
    const int32_t eos = tok_->eos_id();
    std::vector<int32_t> row(e.prompt);
    row.insert(row.end(), e.completion.begin(), e.completion.end());
    const auto first_target = static_cast<int64_t>(e.prompt.size()) - 1;  // predicts the completion's first token
    for (int64_t t = 0; t < seq; ++t) {
      const bool in_row = t + 1 < static_cast<int64_t>(row.size());
      inputs[t] = t < static_cast<int64_t>(row.size()) ? row[static_cast<size_t>(t)] : eos;
      targets[t] = in_row && t >= first_target ? row[static_cast<size_t>(t + 1)] : -1;
    }
  }

  DataConfig config_;
  uint64_t seed_;
  std::unique_ptr<Tokenizer> tok_;
  std::vector<Example> train_, eval_;
};

}  // namespace

std::unique_ptr<DataSource> make_jsonl_source(const DataConfig& config, uint64_t seed, int64_t seq_len) {
  return std::make_unique<JsonlSource>(config, seed, seq_len);
}

}  // namespace troupe::model::detail
