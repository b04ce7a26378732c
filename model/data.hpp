// Data sources for training: a byte-level text file and built-in synthetic tasks
// (multi-digit addition). A source is a pure function of (seed, index): the
// whole data position of a run is ONE integer, the cursor, which a checkpoint
// stores and a resumed run passes back. No source knows anything of the model:
// task accuracy is measured through a caller-supplied generate function.
#pragma once

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "model/config.hpp"

namespace troupe::model {

// One batch of token sequences, row-major [batch, seq].
struct Batch {
  std::vector<int32_t> inputs;   // [batch * seq] token ids
  std::vector<int32_t> targets;  // [batch * seq] next token, or -1 = no loss here
  int64_t batch = 0;
  int64_t seq = 0;
};

// The model, seen from a task: given prompt tokens, return up to
// max_new_tokens NEW tokens (the prompt is not repeated). The model may stop
// early after the source's eos_token().
using GenerateFn =
    std::function<std::vector<int32_t>(const std::vector<int32_t>& prompt, int64_t max_new_tokens)>;

// One held-out task problem: the prompt to feed and the exact tokens expected
// back (ending with eos_token()). `context` counts the whole problems (with
// answers) the prompt shows before this one, as earlier problems of a
// training row do.
struct TaskProblem {
  std::vector<int32_t> prompt;
  std::vector<int32_t> answer;
  int64_t context = 0;
  // The problem's size where the task varies it (scratchpad: the operands'
  // width, 1..digits); 0 where it does not.
  int64_t size = 0;
};

// How well a model answers held-out task problems (greedy generation).
struct TaskScore {
  int64_t problems = 0;
  double exact_match = 0.0;  // share of problems whose whole answer (EOS included) is right
  // [answer position] share of problems whose answer token at that position,
  // in the order generated, is right; answer digits only (the final EOS is
  // not a digit). For the default reversed format, position 0 is the units.
  std::vector<double> digit_accuracy;
  // [context] exact match over the problems with that many earlier problems
  // in their prompt (NaN where there are none).
  std::vector<double> context_accuracy;
  // [size] exact match over the problems of that size (TaskProblem::size;
  // NaN where there are none); empty when no problem has a size.
  std::vector<double> size_accuracy;
};

class DataSource {
 public:
  virtual ~DataSource() = default;

  // Training batch number `cursor` (0, 1, 2, ...): its rows are the global
  // training sequences cursor*batch .. cursor*batch + batch - 1, each a pure
  // function of (seed, sequence index). The trainer passes the number of
  // batches consumed so far (the step, with one batch per step), stores it in
  // the checkpoint and passes it back on resume. Microbatches and
  // data-parallel replicas split the rows of one batch.
  Batch train_batch(int64_t cursor, int64_t batch, int64_t seq) const;
  // Validation batch number `index` (0, 1, ...): held-out data, independent of
  // the seed, so validation losses compare across runs.
  Batch val_batch(int64_t index, int64_t batch, int64_t seq) const;

  virtual int64_t vocab_size() const = 0;
  virtual std::string describe() const = 0;

  // Tokenizer. encode throws std::runtime_error naming a character the
  // vocabulary lacks; decode never throws (unknown ids print as '?').
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;
  virtual std::string decode(const std::vector<int32_t>& tokens) const = 0;
  // Tokens to feed the model for a user prompt: encode() plus whatever the
  // training sequences put in front (the addition task starts with EOS).
  virtual std::vector<int32_t> encode_prompt(const std::string& text) const { return encode(text); }
  // End-of-sequence token that stops generation, or -1 when there is none.
  virtual int32_t eos_token() const { return -1; }

  // Tasks with an exact answer (addition): the first n problems of the
  // held-out evaluation set, deterministic and independent of the seed. Their
  // prompts place them after 0, 1, ... earlier problems, as training rows do.
  // Sources without a task return false / throw std::logic_error.
  virtual bool has_task() const { return false; }
  virtual std::vector<TaskProblem> eval_problems(int64_t n) const;
  // Training problem number `index` (0, 1, ...) as a task problem, for RL
  // prompts: drawn from the training split only (never a held-out problem), a
  // pure function of (seed, index). Sources without a task throw std::logic_error.
  virtual TaskProblem train_problem(int64_t index) const;
  // Tasks whose answers follow written work (scratchpad): the token after
  // whose last occurrence the answer stands, and the most tokens a right
  // answer (work included, EOS included) takes. -1 where the whole answer
  // counts / the task cannot say.
  virtual int32_t answer_marker() const { return -1; }
  virtual int64_t max_answer_tokens() const { return -1; }
  // Scores the first n_problems held-out problems: generate(prompt,
  // answer.size()) is compared token by token with the expected answer.
  TaskScore score_task(const GenerateFn& generate, int64_t n_problems) const;
  // score_task(...).exact_match.
  double exact_match(const GenerateFn& generate, int64_t n_problems) const;

 protected:
  // One sequence of seq tokens: inputs[t] and targets[t] as in Batch.
  virtual void train_sequence(int32_t* inputs, int32_t* targets, int64_t index, int64_t seq) const = 0;
  virtual void val_sequence(int32_t* inputs, int32_t* targets, int64_t index, int64_t seq) const = 0;
};

// Builds the source named by config.source:
//   "text"           byte-level file at config.path (vocab 256); the last
//                    val_fraction of the bytes is the validation split;
//   "addition"       a+b=c with operands of up to config.digits digits, written
//                    zero-padded to exactly `digits` digits (config.width
//                    digits when it is set, width >= digits), and the answer
//                    zero-padded to one digit more, least-significant digit
//                    first: 12+345= -> "012+345=7530" (see data_addition.cpp);
//   "addition_plain" the same problems in plain form: "12+345=357";
//   "scratchpad"     long addition with written work: operands of the same
//                    width, long-tailed over 1..config.digits (training rows
//                    up to config.width, 0 = digits), completion one line per
//                    column "x+y+c=ks;", then '#', the sum and EOS: its length
//                    grows with the problem (data_scratchpad.cpp).
// seq_len > 0 also checks up front that sequences of that length can be made,
// and lets the addition task's eval prompts follow as many earlier problems
// as a training row of seq_len holds (with 0, every prompt starts a row).
// Throws std::runtime_error with a clear message (unknown source, missing,
// empty or too-short file, bad digits or val_fraction).
std::unique_ptr<DataSource> make_data_source(const DataConfig& config, uint64_t seed,
                                             int64_t seq_len = 0);

// The addition task's held-out rule: true when the problem a+b (in either
// order) belongs to the evaluation pool and therefore never appears in
// training data. A fixed hash of the unordered pair, independent of the seed
// and of `digits`; about one problem in ten is held out.
bool addition_held_out(int64_t a, int64_t b);

// The addition task's target split (DataConfig::target_pairs/target_column):
// problems whose operand digits at one column (0 = units), or with column -1
// at any column, form one of a set of unordered digit pairs. With a split, training rows (SFT) and validation rows
// never show a target problem, train_problem() (RL prompts) yields only target
// problems, and eval_problems() scores only held-out target problems (their
// context problems are non-target). Without one (pairs empty) nothing changes.
struct AdditionTarget {
  int64_t column = 0;    // -1: any of the columns 0 .. columns - 1
  int64_t columns = 9;   // the operands' columns (the source sets its digits)
  std::array<bool, 100> pair{};  // [x * 10 + y], symmetric
  bool any() const;
  // True when the digits of a and b at `column` (at some column, for -1)
  // form a target pair.
  bool contains(int64_t a, int64_t b) const;
};

// Parses "x+y, x+y, ..." (commas between pairs, spaces allowed; an empty
// string is no split). Each side is a digit or a range lo-hi: "6-9+0-9" is
// every pair with one digit in 6..9; x+y and y+x are the same pair, and a
// pair listed twice is listed once. Throws std::invalid_argument naming what
// is wrong: not a digit pair, or all 55 pairs (training would have nothing left).
AdditionTarget parse_addition_target(const std::string& pairs, int64_t column);

// The pairs of the split's column that are NOT in `pairs`, written as
// parse_addition_target accepts them ("0+0, 0+1, ..."): with them as
// target_pairs, train_problem() and eval_problems() yield the problems the
// split's training rows do show (the SFT side). Empty when `pairs` is no
// split. Throws std::invalid_argument as parse_addition_target does.
std::string complement_pairs(const std::string& pairs, int64_t column);

}  // namespace troupe::model
