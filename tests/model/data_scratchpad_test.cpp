// Tests of the scratchpad addition task (model/data_scratchpad.cpp): every
// line of the written work checked against the operands, the sum against a
// digit-by-digit reference, completion lengths 10n + 2 or 10n + 3, the
// long-tailed widths (the length distribution is printed), training rows only
// up to data.width with the loss on the completions, the held-out guarantee
// and determinism per seed.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>
#include <string>
#include <vector>

#include "model/data.hpp"

using namespace troupe::model;

namespace {

DataConfig scratchpad(int64_t digits, int64_t width = 0) {
  DataConfig c;
  c.source = parse_data_kind("scratchpad");
  c.digits = digits;
  c.width = width;
  return c;
}

// "a+b=" of a prompt "\na+b=": the operands as digit strings.
std::pair<std::string, std::string> operands(const DataSource& src, const TaskProblem& p) {
  const std::string text = src.decode(p.prompt);
  EXPECT_EQ(text.front(), '\n');
  EXPECT_EQ(text.back(), '=');
  const size_t plus = text.find('+');
  return {text.substr(1, plus - 1), text.substr(plus + 1, text.size() - plus - 2)};
}

// The sum of two equal-width digit strings, digit by digit (no integer type
// limits the width).
std::string add(const std::string& a, const std::string& b) {
  std::string out;
  int carry = 0;
  for (size_t i = a.size(); i-- > 0;) {
    const int t = (a[i] - '0') + (b[i] - '0') + carry;
    out.push_back(static_cast<char>('0' + t % 10));
    carry = t / 10;
  }
  if (carry) out.push_back('1');
  std::reverse(out.begin(), out.end());
  return out;
}

// Checks one problem's written work and answer; returns its width.
size_t check_problem(const DataSource& src, const TaskProblem& p) {
  const auto [a, b] = operands(src, p);
  EXPECT_EQ(a.size(), b.size()) << src.decode(p.prompt);
  const size_t n = a.size();
  EXPECT_TRUE(n == 1 || (a[0] != '0' && b[0] != '0')) << "no leading zero: " << src.decode(p.prompt);
  const std::string work = src.decode(p.answer);
  int carry = 0;
  for (size_t i = 0; i < n; ++i) {
    const std::string line = work.substr(9 * i, 9);
    const char x = a[n - 1 - i], y = b[n - 1 - i];
    const int t = (x - '0') + (y - '0') + carry;
    const std::string want = std::string{x, '+', y, '+', static_cast<char>('0' + carry), '=', static_cast<char>('0' + t / 10),
                                         static_cast<char>('0' + t % 10), ';'};
    EXPECT_EQ(line, want) << "column " << i << " of " << src.decode(p.prompt) << work;
    carry = t / 10;
  }
  EXPECT_EQ(work.substr(9 * n), "#" + add(a, b) + "\n") << src.decode(p.prompt) << work;
  EXPECT_TRUE(p.answer.size() == 10 * n + 2 || p.answer.size() == 10 * n + 3);
  return n;
}

TEST(ScratchpadData, EveryLineOfTheWorkAndTheAnswerAreRight) {
  const auto src = make_data_source(scratchpad(24), 7);
  EXPECT_EQ(src->vocab_size(), 16);
  EXPECT_EQ(src->decode(src->encode("12+34=4+2+0=06;#46\n_")), "12+34=4+2+0=06;#46\n_");
  size_t widest = 0;
  for (int64_t i = 0; i < 3000; ++i) widest = std::max(widest, check_problem(*src, src->train_problem(i)));
  for (const TaskProblem& p : src->eval_problems(500)) check_problem(*src, p);
  EXPECT_GE(widest, 15u) << "the tail reaches long problems";
  EXPECT_THROW(src->encode("12*3"), std::runtime_error);
}

// The length distribution RL prompts and evaluation draw from (printed for
// docs/rl.md): most completions are short, a few are long.
TEST(ScratchpadData, WidthsAreLongTailed) {
  const auto src = make_data_source(scratchpad(24), 7);
  std::vector<size_t> widths, lengths;
  for (int64_t i = 0; i < 20000; ++i) {
    const TaskProblem p = src->train_problem(i);
    widths.push_back(operands(*src, p).first.size());
    lengths.push_back(p.answer.size());
  }
  std::sort(widths.begin(), widths.end());
  std::sort(lengths.begin(), lengths.end());
  auto at = [](const std::vector<size_t>& v, double q) { return v[static_cast<size_t>(q * static_cast<double>(v.size() - 1))]; };
  double mean = 0;
  for (size_t x : lengths) mean += static_cast<double>(x);
  mean /= static_cast<double>(lengths.size());
  std::printf("digits 24: width p50 %zu p90 %zu p99 %zu max %zu; completion tokens mean %.1f p50 %zu p90 %zu p99 %zu max %zu\n",
              at(widths, 0.5), at(widths, 0.9), at(widths, 0.99), widths.back(), mean, at(lengths, 0.5), at(lengths, 0.9),
              at(lengths, 0.99), lengths.back());
  EXPECT_EQ(widths.front(), 1u);
  EXPECT_EQ(widths.back(), 24u);
  EXPECT_LE(at(widths, 0.5), 4u) << "most problems are short";
  EXPECT_GE(at(widths, 0.99), 15u) << "a long tail";
  EXPECT_LE(lengths.front(), 13u);
  EXPECT_GE(lengths.back(), 200u);
  EXPECT_GT(mean, static_cast<double>(at(lengths, 0.5))) << "the mean sits above the median";
}

TEST(ScratchpadData, TrainingRowsStayWithinTheirWidthAndTrainOnlyTheWork) {
  const int64_t seq = 160;
  const auto src = make_data_source(scratchpad(24, 6), 3, seq);
  const Batch b = src->train_batch(5, 4, seq);
  for (int64_t r = 0; r < b.batch; ++r) {
    std::vector<int32_t> row(b.inputs.begin() + r * seq, b.inputs.begin() + (r + 1) * seq);
    const std::string text = src->decode(row);
    ASSERT_EQ(text.front(), '\n');
    // Each problem: "a+b=" then the work; every operand at most 6 digits.
    size_t from = 1;
    int problems = 0;
    while (from < text.size() && text[from] != '_') {
      const size_t eq = text.find('=', from), plus = text.find('+', from);
      const size_t end = text.find('\n', from);
      if (end == std::string::npos) break;  // cut at the row's end: targets only
      EXPECT_LE(plus - from, 6u) << text;
      // Targets: none on the question, all on the work (shifted by one).
      for (size_t t = from; t < eq; ++t) EXPECT_EQ(b.targets[static_cast<size_t>(r * seq) + t - 1], -1) << text;
      for (size_t t = eq + 1; t <= end && t < static_cast<size_t>(seq); ++t)
        EXPECT_EQ(b.targets[static_cast<size_t>(r * seq) + t - 1], row[t]) << text;
      from = end + 1;
      ++problems;
    }
    EXPECT_GE(problems, 1) << text;
  }
  EXPECT_THROW(make_data_source(scratchpad(24, 6), 3, 60), std::runtime_error) << "a 6-digit problem needs 77 tokens";
  EXPECT_THROW(make_data_source(scratchpad(24, 25), 3), std::runtime_error);
  EXPECT_THROW(make_data_source(scratchpad(65), 3), std::runtime_error);
}

TEST(ScratchpadData, HeldOutProblemsNeverTrainAndDrawsArePureFunctionsOfTheSeed) {
  const auto a = make_data_source(scratchpad(8), 1), again = make_data_source(scratchpad(8), 1), b = make_data_source(scratchpad(8), 2);
  std::set<std::string> held;
  for (const TaskProblem& p : a->eval_problems(2000)) {
    const auto [x, y] = operands(*a, p);
    held.insert(x + "+" + y);
    held.insert(y + "+" + x);
  }
  int same_as_other_seed = 0;
  for (int64_t i = 0; i < 20000; ++i) {
    const TaskProblem p = a->train_problem(i);
    const auto [x, y] = operands(*a, p);
    // Short problems repeat by chance; a held-out pair never trains.
    EXPECT_EQ(held.count(x + "+" + y), 0u) << x << "+" << y;
    EXPECT_EQ(p.prompt, again->train_problem(i).prompt);
    same_as_other_seed += p.prompt == b->train_problem(i).prompt;
  }
  EXPECT_LT(same_as_other_seed, 4000) << "another seed draws other problems";
  EXPECT_EQ(a->eval_problems(50)[49].prompt, b->eval_problems(50)[49].prompt) << "evaluation does not depend on the seed";
}

// Evaluation scores each width apart (TaskProblem::size, TaskScore::size_accuracy).
TEST(ScratchpadData, EvaluationReportsExactMatchByWidth) {
  const auto src = make_data_source(scratchpad(12), 7);
  const std::vector<TaskProblem> problems = src->eval_problems(400);
  // A model that gets every problem of width <= 3 right and no other.
  auto model = [&](const std::vector<int32_t>& prompt, int64_t max_new) {
    for (const TaskProblem& p : problems)
      if (p.prompt == prompt) return p.size <= 3 ? p.answer : std::vector<int32_t>(static_cast<size_t>(max_new), 0);
    ADD_FAILURE() << "unknown prompt";
    return std::vector<int32_t>{};
  };
  const TaskScore score = src->score_task(model, 400);
  ASSERT_EQ(score.size_accuracy.size(), 13u);  // sizes 0 (none) .. 12
  EXPECT_TRUE(std::isnan(score.size_accuracy[0]));
  int64_t short_ones = 0;
  for (const TaskProblem& p : problems) {
    EXPECT_EQ(static_cast<size_t>(p.size), operands(*src, p).first.size());
    short_ones += p.size <= 3;
  }
  for (size_t z = 1; z < score.size_accuracy.size(); ++z)
    if (!std::isnan(score.size_accuracy[z])) EXPECT_EQ(score.size_accuracy[z], z <= 3 ? 1.0 : 0.0) << "width " << z;
  EXPECT_DOUBLE_EQ(score.exact_match, static_cast<double>(short_ones) / 400.0);
}

}  // namespace
