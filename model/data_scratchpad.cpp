// Built-in reasoning task: long addition with a written scratchpad, whose
// completions vary in length with the problem (issue 30).
//
// Tokenizer (vocab 16): '0'..'9' -> 0..9, '+' -> 10, '=' -> 11, EOS ('\n')
// -> 12, PAD ('_') -> 13, ';' -> 14, '#' -> 15.
//
// A problem adds two operands of the same width n (n digits each, no leading
// zero unless n = 1). The prompt is "EOS a+b=", most significant digit
// first. The completion works column by column from the units, one line per
// column: "x+y+c=ks;" with the column's digits x and y, the incoming carry c
// and the column's total written as two digits, carry k then digit s. Then
// "#", the sum (most significant digit first, no leading zero) and EOS:
//   "\n47+85=" -> "7+5+0=12;4+8+1=13;#132\n"
// The completion is 10n + 2 or 10n + 3 tokens: 12 or 13 for one digit, 202
// or 203 for twenty. The verifier of the RL task (rl/task.cpp) scores only
// the answer after the last '#'; the scratchpad is the model's own work.
//
// Widths are long-tailed: P(n) proportional to n^-1.3 on 1..digits, so most
// problems are short and a few are long. Digits 24, 20,000 draws
// (tests/model/data_scratchpad_test.cpp prints them): width median 2, p90
// 13, p99 23; completion tokens mean 49.5, median 23, p90 133, p99 233,
// max 243. Training rows (SFT) use only widths
// up to config.width (0 = digits): the format is taught on the short part of
// the distribution; RL prompts and evaluation use all of it.
//
// Held-out problems: a fixed hash of the unordered operand pair, ~1 in 10, as
// the addition task's rule; training draws reject them, evaluation and
// validation draw only them, independent of the seed. A training row is EOS
// then whole problems (question and completion) while they fit, then PAD;
// only the completion tokens carry a loss.
#include <algorithm>
#include <cmath>
#include <sstream>
#include <stdexcept>

#include "model/data.hpp"
#include "model/data_synthetic.hpp"

namespace troupe::model {
namespace {

constexpr int32_t kPlus = 10, kEquals = 11, kEos = 12, kPad = 13, kSemi = 14, kHash = 15, kVocab = 16;
constexpr int64_t kMaxWidth = 64;
constexpr double kTail = 1.3;  // P(n) ~ n^-kTail
constexpr uint64_t kHeldOutSalt = 0x7363'7261'7463'6831ull;
constexpr uint64_t kTrainSalt = 0x7363'7261'7472'6e31ull;
constexpr uint64_t kValSalt = 0x7363'7261'7476'6c31ull;
constexpr uint64_t kEvalSalt = 0x7363'7261'7465'7631ull;
constexpr uint64_t kTaskSalt = 0x7363'7261'7470'7231ull;

using synthetic::mix64;
using synthetic::Stream;

// Digits most significant first.
using Number = std::vector<int32_t>;

struct Problem {
  Number a, b;
};

uint64_t hash_number(const Number& x) {
  uint64_t h = 0x6e756d62ull;
  for (int32_t d : x) h = mix64(h ^ static_cast<uint64_t>(d + 1));
  return h;
}

bool held_out(const Problem& p) {
  uint64_t x = hash_number(p.a), y = hash_number(p.b);
  if (x > y) std::swap(x, y);
  return mix64(mix64(x ^ kHeldOutSalt) + y) % 10 == 0;
}

class ScratchpadSource final : public DataSource {
 public:
  ScratchpadSource(int64_t digits, int64_t train_width, uint64_t seed)
      : digits_(digits), train_width_(train_width > 0 ? train_width : digits), seed_(seed),
        all_(cumulative(digits)), train_(cumulative(train_width_)) {}

  int64_t vocab_size() const override { return kVocab; }

  std::string describe() const override {
    std::ostringstream os;
    os << "scratchpad addition: operands of 1.." << digits_ << " digits (long-tailed, P(n) ~ n^-" << kTail
       << "), one scratchpad line per column then '#' and the sum, completions of " << completion_tokens(1)
       << ".." << max_answer_tokens() << " tokens; training rows up to " << train_width_
       << " digits; vocab " << kVocab << ", ~1 in 10 problems held out for evaluation";
    return os.str();
  }

  std::vector<int32_t> encode(const std::string& text) const override {
    std::vector<int32_t> out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size(); ++i) {
      const char c = text[i];
      if (c >= '0' && c <= '9') out.push_back(c - '0');
      else if (c == '+') out.push_back(kPlus);
      else if (c == '=') out.push_back(kEquals);
      else if (c == '\n') out.push_back(kEos);
      else if (c == '_') out.push_back(kPad);
      else if (c == ';') out.push_back(kSemi);
      else if (c == '#') out.push_back(kHash);
      else
        throw std::runtime_error("data: the scratchpad tokenizer has no token for character '" + std::string(1, c) +
                                 "' at position " + std::to_string(i) + " (it knows 0-9 + = ; # _ and newline)");
    }
    return out;
  }

  std::string decode(const std::vector<int32_t>& tokens) const override {
    static const char kChars[kVocab + 1] = "0123456789+=\n_;#";
    std::string out;
    for (int32_t t : tokens) out.push_back(t >= 0 && t < kVocab ? kChars[t] : '?');
    return out;
  }

  std::vector<int32_t> encode_prompt(const std::string& text) const override {
    std::vector<int32_t> out = encode(text);
    if (out.empty() || out.front() != kEos) out.insert(out.begin(), kEos);
    return out;
  }

  int32_t eos_token() const override { return kEos; }
  bool has_task() const override { return true; }
  int32_t answer_marker() const override { return kHash; }
  // n lines of 9 tokens, '#', at most n + 1 sum digits, EOS.
  int64_t max_answer_tokens() const override { return completion_tokens(digits_) + 1; }

  // Problem i: the first held-out draw of its own stream, widths from the
  // whole distribution; independent of the seed. No context problems.
  std::vector<TaskProblem> eval_problems(int64_t n) const override {
    if (n < 0) throw std::invalid_argument("data: eval_problems needs n >= 0");
    std::vector<TaskProblem> out(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      Stream rng{mix64(kEvalSalt ^ static_cast<uint64_t>(i))};
      out[static_cast<size_t>(i)] = task_problem(draw(rng, all_, true));
    }
    return out;
  }

  TaskProblem train_problem(int64_t index) const override {
    Stream rng{mix64(mix64(seed_ ^ kTaskSalt) ^ static_cast<uint64_t>(index))};
    return task_problem(draw(rng, all_, false));
  }

  // The longest training problem, question and completion, after the row's EOS.
  int64_t min_seq() const { return 2 * train_width_ + 2 + completion_tokens(train_width_) + 1; }

  void check_seq(int64_t seq) const {
    if (seq < min_seq())
      throw std::runtime_error("data: scratchpad addition with training rows of up to " + std::to_string(train_width_) +
                               "-digit operands needs seq_len >= " + std::to_string(min_seq()) + ", got " +
                               std::to_string(seq));
  }

 protected:
  void train_sequence(int32_t* inputs, int32_t* targets, int64_t index, int64_t seq) const override {
    Stream rng{mix64(mix64(seed_ ^ kTrainSalt) ^ static_cast<uint64_t>(index))};
    pack(inputs, targets, seq, [&] { return draw(rng, train_, false); });
  }

  void val_sequence(int32_t* inputs, int32_t* targets, int64_t index, int64_t seq) const override {
    Stream rng{mix64(kValSalt ^ static_cast<uint64_t>(index))};
    pack(inputs, targets, seq, [&] { return draw(rng, train_, true); });
  }

 private:
  // Without the final carry: n lines of 9 tokens, '#', n digits, EOS.
  static int64_t completion_tokens(int64_t n) { return 10 * n + 2; }

  // [n - 1] P(width <= n), for widths 1..max.
  static std::vector<double> cumulative(int64_t max) {
    std::vector<double> c(static_cast<size_t>(max));
    double total = 0;
    for (int64_t n = 1; n <= max; ++n) c[static_cast<size_t>(n - 1)] = total += std::pow(static_cast<double>(n), -kTail);
    for (double& x : c) x /= total;
    return c;
  }

  static int64_t width(Stream& rng, const std::vector<double>& cdf) {
    const double u = rng.unit();
    const auto it = std::upper_bound(cdf.begin(), cdf.end(), u);
    return std::min<int64_t>(static_cast<int64_t>(it - cdf.begin()) + 1, static_cast<int64_t>(cdf.size()));
  }

  static Number number(Stream& rng, int64_t n) {
    Number x(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) x[static_cast<size_t>(i)] = static_cast<int32_t>(i == 0 && n > 1 ? 1 + rng.below(9) : rng.below(10));
    return x;
  }

  // A problem with its width drawn from `cdf`, held out or not.
  static Problem draw(Stream& rng, const std::vector<double>& cdf, bool held) {
    for (int tries = 0; tries < 10000000; ++tries) {
      const int64_t n = width(rng, cdf);
      Problem p{number(rng, n), number(rng, n)};
      if (held_out(p) == held) return p;
    }
    throw std::logic_error("data: no scratchpad problem found");
  }

  static void push_question(std::vector<int32_t>& out, const Problem& p) {
    out.insert(out.end(), p.a.begin(), p.a.end());
    out.push_back(kPlus);
    out.insert(out.end(), p.b.begin(), p.b.end());
    out.push_back(kEquals);
  }

  // The scratchpad, '#', the sum and EOS.
  static void push_completion(std::vector<int32_t>& out, const Problem& p) {
    const size_t n = p.a.size();
    Number sum;
    int32_t carry = 0;
    for (size_t i = 0; i < n; ++i) {
      const int32_t x = p.a[n - 1 - i], y = p.b[n - 1 - i];
      const int32_t t = x + y + carry;
      out.insert(out.end(), {x, kPlus, y, kPlus, carry, kEquals, t / 10, t % 10, kSemi});
      sum.push_back(t % 10);
      carry = t / 10;
    }
    if (carry) sum.push_back(carry);
    out.push_back(kHash);
    out.insert(out.end(), sum.rbegin(), sum.rend());
    out.push_back(kEos);
  }

  static TaskProblem task_problem(const Problem& p) {
    TaskProblem t;
    t.size = static_cast<int64_t>(p.a.size());
    t.prompt.push_back(kEos);
    push_question(t.prompt, p);
    push_completion(t.answer, p);
    return t;
  }

  template <class Draw>
  void pack(int32_t* inputs, int32_t* targets, int64_t seq, Draw next) const {
    check_seq(seq);
    synthetic::pack_problems(inputs, targets, seq, kEos, kPad, [&](std::vector<int32_t>& problem) {
      const Problem p = next();
      push_question(problem, p);
      const size_t answer_at = problem.size();
      push_completion(problem, p);
      return answer_at;
    });
  }

  int64_t digits_;       // widest operand of RL prompts and evaluation
  int64_t train_width_;  // widest operand of training and validation rows
  uint64_t seed_;
  std::vector<double> all_, train_;  // width distributions (cumulative)
};

}  // namespace

namespace detail {

std::unique_ptr<DataSource> make_scratchpad_source(const DataConfig& config, uint64_t seed, int64_t seq_len) {
  if (config.digits < 1 || config.digits > kMaxWidth)
    throw std::runtime_error("data: scratchpad digits must be in [1, " + std::to_string(kMaxWidth) + "], got " +
                             std::to_string(config.digits));
  if (config.width < 0 || config.width > config.digits)
    throw std::runtime_error("data: scratchpad width (the widest operand of training rows) must be 0 (= digits) or in "
                             "[1, digits = " + std::to_string(config.digits) + "], got " + std::to_string(config.width));
  if (!config.target_pairs.empty())
    throw std::runtime_error("data: target_pairs is a split of the addition task; source \"scratchpad\" has none");
  auto src = std::make_unique<ScratchpadSource>(config.digits, config.width, seed);
  if (seq_len > 0) src->check_seq(seq_len);
  return src;
}

}  // namespace detail
}  // namespace troupe::model
