// Built-in synthetic task: multi-digit addition.
//
// Tokenizer (vocab 14): '0'..'9' -> 0..9, '+' -> 10, '=' -> 11, EOS ('\n') -> 12,
// PAD ('_') -> 13. A training sequence is EOS followed by packed problems, each
// "a+b=c" + EOS, and PAD up to the end when the next problem does not fit
// (problems are never cut, so every problem a sequence shows is whole). The
// evaluation prompt for problem i is "EOS", then i % P earlier held-out problems
// with their answers, then "a+b=": P is the number of problems one training row
// of seq_len holds, so the scored problem sits at every position it has in
// training (with seq_len unknown, 0, every prompt is at the start of a row).
//
// Loss: only the answer digits and the EOS that ends them carry a target.
// The operands are random: predicting them teaches nothing and adds
// irreducible loss (log 10 per digit) and gradient noise; the answer is the
// only part that is a function of the context.
//
// Format of "addition" (the default), for d = 3: 12+345 is written
// "012+345=7530": operands zero-padded to d digits, the sum zero-padded to
// d+1 digits and written least-significant digit first. Both are known tricks
// that make addition far easier for small transformers: reversed, each answer
// digit depends only on two operand digits and the carry just produced (in
// normal order the first digit emitted depends on every carry); padded, the
// operand digits an answer digit needs are always at the same distance from
// it, whatever the operands' lengths. "addition_plain" writes "12+345=357".
//
// Written width (config.width, 0 = digits): operands of up to `digits` digits
// can be written in a wider format, e.g. digits 3, width 4: "0012+0345=75300".
// A model trained so has seen every position of the 4-digit format but never
// a nonzero leading digit, so 4-digit problems (digits 4, width 4) are new to
// it while the format is not (the RL task of issue #11 trains there).
//
// Held-out problems: addition_held_out(a, b) hashes the unordered pair with a
// fixed salt; about 1 in 10 pairs is held out. Training draws reject held-out
// pairs, and validation/evaluation draw ONLY held-out pairs, so no evaluation
// problem (in either operand order) can ever appear in training, whatever the
// seed. Evaluation and validation data do not depend on the seed either.
//
// Target split (config.target_pairs, see AdditionTarget in data.hpp): a set
// of unordered digit pairs at one column, e.g. "1+4, 2+5" at column 2 (the
// hundreds), or at any column (target_column = -1). Training and validation
// rows reject target problems (one more rejection after the held-out rule,
// from the same stream), train_problem() (the RL prompts) accepts only target
// problems, and eval_problems() draws only held-out target problems (context
// problems: held-out, non-target). So a model trained on the rows has never
// seen the answer of any problem the RL task asks or scores. With one column,
// every pair still occurs in the other columns; with any column, a pair's
// cell of the addition table is never shown at all. Unset, no draw changes.
//
// Operand distribution: for training, each operand is uniform in [0, 10^d) half
// of the time, and otherwise has a digit count uniform in 1..d, so short
// operands are seen too. Evaluation draws both operands uniform in [0, 10^d)
// (for d = 3, 81% of problems are 3+3 digits).
#include <algorithm>
#include <sstream>
#include <stdexcept>
#include <utility>

#include "model/data.hpp"
#include "model/data_synthetic.hpp"

namespace troupe::model {
namespace {

constexpr int32_t kPlus = 10, kEquals = 11, kEos = 12, kPad = 13, kVocab = 14;
constexpr int64_t kMaxDigits = 9;  // a + b < 2e9: fits int64 comfortably
constexpr uint64_t kHeldOutSalt = 0x6865'6c64'6f75'7431ull;
constexpr uint64_t kTrainSalt = 0x6164'6474'7261'696eull;
constexpr uint64_t kValSalt = 0x6164'6476'616c'6964ull;
constexpr uint64_t kEvalSalt = 0x6164'6465'7661'6c73ull;
constexpr uint64_t kTaskSalt = 0x6164'6470'726f'6d70ull;  // train_problem(): RL prompts
constexpr uint64_t kEvalContextSalt = 0x6164'6463'6f6e'7478ull;

using synthetic::mix64;
using synthetic::Stream;

int64_t pow10(int64_t d) {
  int64_t p = 1;
  for (int64_t i = 0; i < d; ++i) p *= 10;
  return p;
}

// Appends the decimal digits of v, zero-padded to `width` digits (0 = no padding).
void push_number(std::vector<int32_t>& out, int64_t v, bool reversed, int64_t width = 0) {
  const size_t start = out.size();
  do {
    out.push_back(static_cast<int32_t>(v % 10));
    v /= 10;
  } while (v > 0);
  while (static_cast<int64_t>(out.size() - start) < width) out.push_back(0);
  if (!reversed) std::reverse(out.begin() + static_cast<std::ptrdiff_t>(start), out.end());
}

class AdditionSource final : public DataSource {
 public:
  AdditionSource(int64_t digits, int64_t width, uint64_t seed, bool reversed, bool padded, int64_t seq_len,
                 const AdditionTarget& target, std::string target_text)
      : digits_(digits), width_(width > 0 ? width : digits), seed_(seed), reversed_(reversed), padded_(padded),
        limit_(pow10(digits)), eval_positions_(seq_len > 0 ? std::max<int64_t>(1, seq_len / min_seq()) : 1),
        target_(target), has_target_(target.any()), target_text_(std::move(target_text)) {}

  int64_t vocab_size() const override { return kVocab; }

  std::string describe() const override {
    std::ostringstream os;
    os << "addition: operands of up to " << digits_ << " digits"
       << (padded_ ? " (zero-padded" : "");
    if (padded_ && width_ != digits_) os << " to " << width_ << " digits";
    os << (padded_ ? ")" : "") << ", answer "
       << (reversed_ ? "least-significant digit first" : "in normal digit order")
       << ", vocab " << kVocab << ", ~1 in 10 problems held out for evaluation";
    if (has_target_)
      os << "; target split: digit pairs {" << target_text_ << "} at "
         << (target_.column < 0 ? std::string("any column") : "column " + std::to_string(target_.column) + " (0 = units)")
         << " never in training rows, the only RL prompts and evaluation problems";
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
      else
        throw std::runtime_error("data: the addition tokenizer has no token for character '" +
                                 std::string(1, c) + "' at position " + std::to_string(i) +
                                 " (it knows 0-9 + = _ and newline)");
    }
    return out;
  }

  std::string decode(const std::vector<int32_t>& tokens) const override {
    static const char kChars[kVocab + 1] = "0123456789+=\n_";
    std::string out;
    for (int32_t t : tokens) out.push_back(t >= 0 && t < kVocab ? kChars[t] : '?');
    return out;
  }

  // Also writes "a+b=" prompts in the padded training format ("12+345=" ->
  // "012+345=" for 3 digits), so users can type problems naturally.
  std::vector<int32_t> encode_prompt(const std::string& text) const override {
    std::vector<int32_t> out = encode(padded_ ? pad_problem(text) : text);
    if (out.empty() || out.front() != kEos) out.insert(out.begin(), kEos);
    return out;
  }

  int32_t eos_token() const override { return kEos; }
  bool has_task() const override { return true; }

  // Problem i is the first held-out draw of its own stream (so it does not
  // depend on n or on seq_len); its context, i % eval_positions_ earlier
  // held-out problems written out with their answers, comes from a second
  // stream. Nothing depends on the seed.
  std::vector<TaskProblem> eval_problems(int64_t n) const override {
    if (n < 0) throw std::invalid_argument("data: eval_problems needs n >= 0");
    std::vector<TaskProblem> out(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      Stream rng{mix64(kEvalSalt ^ static_cast<uint64_t>(i))};
      const auto [a, b] = held_out_problem(rng, true);
      TaskProblem& p = out[static_cast<size_t>(i)];
      p.context = i % eval_positions_;
      p.prompt.push_back(kEos);
      Stream ctx{mix64(kEvalContextSalt ^ static_cast<uint64_t>(i))};
      for (int64_t c = 0; c < p.context; ++c) {
        const auto [ca, cb] = held_out_problem(ctx, false);
        push_question(p.prompt, ca, cb);
        push_answer(p.prompt, ca + cb);
      }
      push_question(p.prompt, a, b);
      push_answer(p.answer, a + b);
    }
    return out;
  }

  TaskProblem train_problem(int64_t index) const override {
    Stream rng{mix64(mix64(seed_ ^ kTaskSalt) ^ static_cast<uint64_t>(index))};
    const auto [a, b] = train_pair(rng, true);
    TaskProblem p;
    p.prompt.push_back(kEos);
    push_question(p.prompt, a, b);
    push_answer(p.answer, a + b);
    return p;
  }

  // Longest problem: w + '+' + w + '=' + (w + 1) + EOS after the leading EOS,
  // w = the written width (digits when not padded: the longest operand).
  int64_t min_seq() const { return 3 * width_ + 4; }

  void check_seq(int64_t seq) const {
    if (seq < min_seq())
      throw std::runtime_error("data: addition with " + std::to_string(width_) +
                               "-digit operands needs seq_len >= " + std::to_string(min_seq()) +
                               ", got " + std::to_string(seq));
  }

 protected:
  void train_sequence(int32_t* inputs, int32_t* targets, int64_t index, int64_t seq) const override {
    Stream rng{mix64(mix64(seed_ ^ kTrainSalt) ^ static_cast<uint64_t>(index))};
    pack(inputs, targets, seq, [&] { return train_pair(rng, false); });
  }

  void val_sequence(int32_t* inputs, int32_t* targets, int64_t index, int64_t seq) const override {
    Stream rng{mix64(kValSalt ^ static_cast<uint64_t>(index))};
    pack(inputs, targets, seq, [&] { return held_out_problem(rng, false); });
  }

 private:
  // "[\n]a+b=" with decimal a, b -> operands zero-padded to width_; other text unchanged.
  std::string pad_problem(const std::string& text) const {
    const size_t start = !text.empty() && text[0] == '\n' ? 1 : 0;
    const size_t plus = text.find('+', start);
    if (plus == std::string::npos || text.size() < plus + 3 || text.back() != '=') return text;
    const std::string a = text.substr(start, plus - start), b = text.substr(plus + 1, text.size() - plus - 2);
    auto is_number = [](const std::string& s) {
      return !s.empty() && std::all_of(s.begin(), s.end(), [](char c) { return c >= '0' && c <= '9'; });
    };
    if (!is_number(a) || !is_number(b)) return text;
    auto pad = [&](const std::string& s) {
      return static_cast<int64_t>(s.size()) < width_ ? std::string(static_cast<size_t>(width_) - s.size(), '0') + s : s;
    };
    return text.substr(0, start) + pad(a) + "+" + pad(b) + "=";
  }

  int64_t operand_width() const { return padded_ ? width_ : 0; }
  int64_t answer_width() const { return padded_ ? width_ + 1 : 0; }

  // "a+b=" in this source's format.
  void push_question(std::vector<int32_t>& out, int64_t a, int64_t b) const {
    push_number(out, a, false, operand_width());
    out.push_back(kPlus);
    push_number(out, b, false, operand_width());
    out.push_back(kEquals);
  }
  // The answer digits in this source's format, then EOS.
  void push_answer(std::vector<int32_t>& out, int64_t sum) const {
    push_number(out, sum, reversed_, answer_width());
    out.push_back(kEos);
  }

  int64_t train_operand(Stream& rng) const {
    if (rng.next() & 1) return rng.below(limit_);
    const int64_t nd = 1 + rng.below(digits_);
    const int64_t lo = nd == 1 ? 0 : pow10(nd - 1);
    return lo + rng.below(pow10(nd) - lo);
  }

  // A problem on the target side `target` of the split (any problem when
  // there is no split).
  bool on_side(int64_t a, int64_t b, bool target) const { return !has_target_ || target_.contains(a, b) == target; }

  // A training-split problem (never held out) on side `target` of the split.
  std::pair<int64_t, int64_t> train_pair(Stream& rng, bool target) const {
    // ~10% rejections without a split; a split's side can be rare (a single
    // target pair at the top column is ~1% of draws) but never empty: the
    // column is below digits, and a split never holds every pair.
    for (;;) {
      const int64_t a = train_operand(rng), b = train_operand(rng);
      if (!addition_held_out(a, b) && on_side(a, b, target)) return {a, b};
    }
  }

  // A held-out problem on side `target` of the split.
  std::pair<int64_t, int64_t> held_out_problem(Stream& rng, bool target) const {
    // ~10 tries on average without a split (~1,000 for the rarest split
    // side); the bound only guards against a pool with no such pair at all.
    for (int tries = 0; tries < 10000000; ++tries) {
      const int64_t a = rng.below(limit_), b = rng.below(limit_);
      if (addition_held_out(a, b) && on_side(a, b, target)) return {a, b};
    }
    throw std::logic_error("data: no held-out addition problem found");
  }

  // Fills one sequence: EOS, whole problems while they fit, then PAD.
  template <class Draw>
  void pack(int32_t* inputs, int32_t* targets, int64_t seq, Draw draw) const {
    check_seq(seq);
    synthetic::pack_problems(inputs, targets, seq, kEos, kPad, [&](std::vector<int32_t>& problem) {
      const auto [a, b] = draw();
      push_question(problem, a, b);
      const size_t answer_at = problem.size();
      push_answer(problem, a + b);
      return answer_at;
    });
  }

  int64_t digits_;
  int64_t width_;  // written digits per operand when padded (>= digits_)
  uint64_t seed_;
  bool reversed_;
  bool padded_;  // operands written with exactly width_ digits, answers with width_ + 1
  int64_t limit_;  // 10^digits: operands are in [0, limit_)
  int64_t eval_positions_;  // problems one training row holds: eval contexts are 0 .. this - 1
  AdditionTarget target_;
  bool has_target_;
  std::string target_text_;  // the pairs as configured, for describe()
};

}  // namespace

bool AdditionTarget::any() const { return std::find(pair.begin(), pair.end(), true) != pair.end(); }

bool AdditionTarget::contains(int64_t a, int64_t b) const {
  if (column >= 0) {
    const int64_t p = pow10(column);
    return pair[static_cast<size_t>((a / p) % 10 * 10 + (b / p) % 10)];
  }
  for (int64_t c = 0; c < columns; ++c, a /= 10, b /= 10)
    if (pair[static_cast<size_t>(a % 10 * 10 + b % 10)]) return true;
  return false;
}

AdditionTarget parse_addition_target(const std::string& pairs, int64_t column) {
  if (column < -1 || column >= kMaxDigits)
    throw std::invalid_argument("target column must be -1 (any) or in [0, " + std::to_string(kMaxDigits - 1) +
                                "], got " + std::to_string(column));
  AdditionTarget t;
  t.column = column;
  std::string compact;  // the text without spaces
  for (char c : pairs)
    if (c != ' ' && c != '\t') compact.push_back(c);
  if (compact.empty()) return t;
  auto digit = [](char c) { return c >= '0' && c <= '9'; };
  // One side of a pair: "d" or "lo-hi" (lo <= hi); false when it is neither.
  auto side = [&](const std::string& x, int& lo, int& hi) {
    if (x.size() == 1 && digit(x[0])) {
      lo = hi = x[0] - '0';
      return true;
    }
    if (x.size() == 3 && digit(x[0]) && x[1] == '-' && digit(x[2]) && x[0] <= x[2]) {
      lo = x[0] - '0';
      hi = x[2] - '0';
      return true;
    }
    return false;
  };
  size_t start = 0;
  for (;;) {
    const size_t comma = compact.find(',', start);
    const std::string item = compact.substr(start, comma == std::string::npos ? std::string::npos : comma - start);
    const size_t plus = item.find('+');
    int xlo = 0, xhi = 0, ylo = 0, yhi = 0;
    if (plus == std::string::npos || !side(item.substr(0, plus), xlo, xhi) || !side(item.substr(plus + 1), ylo, yhi))
      throw std::invalid_argument(
          "target pairs are digit pairs \"x+y\" separated by commas, each side a digit or a range lo-hi "
          "(e.g. \"1+4, 2+5\" or \"6-9+0-9\"), got \"" + item + "\" in \"" + pairs + "\"");
    for (int x = xlo; x <= xhi; ++x)
      for (int y = ylo; y <= yhi; ++y) t.pair[static_cast<size_t>(x * 10 + y)] = t.pair[static_cast<size_t>(y * 10 + x)] = true;
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  if (std::find(t.pair.begin(), t.pair.end(), false) == t.pair.end())
    throw std::invalid_argument("target pairs \"" + pairs + "\" hold all 55 digit pairs: training rows would have no problem left");
  return t;
}

std::string complement_pairs(const std::string& pairs, int64_t column) {
  const AdditionTarget t = parse_addition_target(pairs, column);
  if (!t.any()) return "";
  std::string out;
  for (int x = 0; x < 10; ++x)
    for (int y = x; y < 10; ++y)
      if (!t.pair[static_cast<size_t>(x * 10 + y)])
        out += (out.empty() ? "" : ", ") + std::to_string(x) + "+" + std::to_string(y);
  return out;
}

bool addition_held_out(int64_t a, int64_t b) {
  const auto lo = static_cast<uint64_t>(std::min(a, b)), hi = static_cast<uint64_t>(std::max(a, b));
  return mix64(mix64(lo ^ kHeldOutSalt) + hi) % 10 == 0;
}

namespace detail {

std::unique_ptr<DataSource> make_addition_source(const DataConfig& config, uint64_t seed,
                                                 int64_t seq_len, bool reverse_answer, bool padded) {
  if (config.digits < 1 || config.digits > kMaxDigits)
    throw std::runtime_error("data: addition digits must be in [1, " + std::to_string(kMaxDigits) +
                             "], got " + std::to_string(config.digits));
  if (config.width != 0 && !padded)
    throw std::runtime_error("data: width = " + std::to_string(config.width) +
                             " needs the padded format (source \"addition\"); this source writes numbers unpadded");
  if (config.width != 0 && (config.width < config.digits || config.width > kMaxDigits))
    throw std::runtime_error("data: addition width must be 0 (= digits) or in [digits = " +
                             std::to_string(config.digits) + ", " + std::to_string(kMaxDigits) + "], got " +
                             std::to_string(config.width));
  AdditionTarget target;
  try {
    target = parse_addition_target(config.target_pairs, config.target_column);
  } catch (const std::invalid_argument& e) {
    throw std::runtime_error(std::string("data: ") + e.what());
  }
  target.columns = config.digits;
  if (target.any() && target.column >= config.digits)
    throw std::runtime_error("data: target_column = " + std::to_string(target.column) +
                             " needs operands of more digits (digits = " + std::to_string(config.digits) +
                             "; column 0 is the units)");
  auto src = std::make_unique<AdditionSource>(config.digits, config.width, seed, reverse_answer, padded, seq_len,
                                              target, config.target_pairs);
  if (seq_len > 0) src->check_seq(seq_len);
  return src;
}

}  // namespace detail
}  // namespace troupe::model
