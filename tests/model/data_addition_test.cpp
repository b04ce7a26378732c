// Tests of the built-in addition task (model/data_addition.cpp): sequence
// format, loss mask, held-out guarantee, determinism, tokenizer, exact match.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "model/data.hpp"

using namespace troupe::model;

namespace {

constexpr int32_t kPlus = 10, kEquals = 11, kEos = 12, kPad = 13;

struct Problem {
  int64_t a, b, c;
};

DataConfig addition_config(int64_t digits, const std::string& source = "addition") {
  DataConfig c;
  c.source = parse_data_kind(source);
  c.digits = digits;
  return c;
}

int64_t read_number(const std::vector<int32_t>& tok, size_t& i, bool reversed) {
  std::string digits;
  while (i < tok.size() && tok[i] >= 0 && tok[i] <= 9) digits.push_back(static_cast<char>('0' + tok[i++]));
  EXPECT_FALSE(digits.empty());
  if (reversed) digits.assign(digits.rbegin(), digits.rend());
  return digits.empty() ? -1 : std::stoll(digits);
}

// Parses one row (seq + the final target) and checks the format and the loss
// mask along the way; returns the problems it holds.
std::vector<Problem> parse_row(const int32_t* inputs, const int32_t* targets, int64_t seq, bool reversed) {
  // Rebuild seq + 1 tokens: the last one is only known when it is a target;
  // otherwise it is not part of any answer and parsing stops before it.
  std::vector<int32_t> tok(inputs, inputs + seq);
  std::vector<Problem> out;
  EXPECT_EQ(tok[0], kEos) << "a sequence starts with EOS";
  size_t i = 1;
  while (i < tok.size() && tok[i] != kPad) {
    const size_t start = i;
    Problem p{};
    p.a = read_number(tok, i, false);
    if (i >= tok.size()) break;
    EXPECT_EQ(tok[i++], kPlus);
    p.b = read_number(tok, i, false);
    if (i >= tok.size()) break;
    EXPECT_EQ(tok[i++], kEquals);
    const size_t answer_at = i;
    // Answer digits: from inputs, plus the final token from targets if needed.
    std::vector<int32_t> ans;
    size_t j = answer_at;
    while (true) {
      const int32_t t = j < tok.size() ? tok[j] : targets[seq - 1];
      ans.push_back(t);
      if (t == kEos) break;
      ++j;
      if (j > tok.size()) break;
    }
    size_t k = 0;
    p.c = read_number(ans, k, reversed);
    EXPECT_EQ(p.c, p.a + p.b) << "wrong answer in a training sequence";
    // Loss mask: targets[t] is set exactly when token t+1 is in the answer.
    for (size_t t = start - 1; t < answer_at + ans.size() && t < static_cast<size_t>(seq); ++t) {
      const bool in_answer = t + 1 >= answer_at && t + 1 < answer_at + ans.size();
      const int32_t next = t + 1 < tok.size() ? tok[t + 1] : targets[seq - 1];
      if (in_answer) EXPECT_EQ(targets[t], next) << "answer token without a target at " << t;
      else EXPECT_EQ(targets[t], -1) << "non-answer token with a target at " << t;
    }
    out.push_back(p);
    i = answer_at + ans.size();
  }
  for (; i < tok.size(); ++i) {
    EXPECT_EQ(tok[i], kPad);
    EXPECT_EQ(targets[i], -1);
  }
  return out;
}

// An eval prompt: EOS, whole answered problems "a+b=c EOS" (the context), then
// the question "a+b=". Checks the format; returns the context problems and
// sets a, b of the question.
std::vector<Problem> parse_prompt(const std::vector<int32_t>& tok, bool reversed, int64_t& a, int64_t& b) {
  std::vector<Problem> context;
  EXPECT_FALSE(tok.empty());
  EXPECT_EQ(tok.front(), kEos) << "a prompt starts with EOS, as a training row does";
  size_t i = 1;
  for (;;) {
    Problem p{};
    p.a = read_number(tok, i, false);
    EXPECT_LT(i, tok.size());
    if (i >= tok.size()) return context;
    EXPECT_EQ(tok[i++], kPlus);
    p.b = read_number(tok, i, false);
    EXPECT_LT(i, tok.size());
    if (i >= tok.size()) return context;
    EXPECT_EQ(tok[i++], kEquals);
    if (i == tok.size()) {  // the question
      a = p.a, b = p.b;
      return context;
    }
    p.c = read_number(tok, i, reversed);
    EXPECT_EQ(p.c, p.a + p.b) << "a context problem with a wrong answer";
    EXPECT_LT(i, tok.size());
    if (i >= tok.size()) return context;
    EXPECT_EQ(tok[i++], kEos);
    context.push_back(p);
  }
}

}  // namespace

TEST(AdditionData, SequencesAreWholeCorrectProblemsWithAnswerOnlyLoss) {
  for (const bool reversed : {true, false}) {
    auto src = make_data_source(addition_config(3, reversed ? "addition" : "addition_plain"), 1, 64);
    EXPECT_EQ(src->vocab_size(), 14);
    EXPECT_TRUE(src->has_task());
    int64_t problems = 0, full_width = 0;
    for (int64_t cursor = 0; cursor < 20; ++cursor) {
      const Batch b = src->train_batch(cursor, 8, 64);
      ASSERT_EQ(b.inputs.size(), 8u * 64u);
      for (int64_t r = 0; r < 8; ++r) {
        for (const Problem& p : parse_row(&b.inputs[r * 64], &b.targets[r * 64], 64, reversed)) {
          EXPECT_GE(p.a, 0);
          EXPECT_LT(p.a, 1000);
          EXPECT_LT(p.b, 1000);
          EXPECT_FALSE(addition_held_out(p.a, p.b)) << p.a << "+" << p.b << " is held out but in training";
          ++problems;
          full_width += (p.a >= 100 && p.b >= 100) ? 1 : 0;
        }
      }
    }
    EXPECT_GT(problems, 160 * 3) << "sequences should be packed with several problems";
    EXPECT_GT(full_width, problems / 5) << "3+3 digit problems should be common in training";
  }
}

TEST(AdditionData, ReversedAnswerFormat) {
  auto src = make_data_source(addition_config(4), 1);
  const auto problems = src->eval_problems(50);
  for (const TaskProblem& p : problems) {
    const std::string prompt = src->decode(p.prompt), answer = src->decode(p.answer);
    ASSERT_EQ(prompt.front(), '\n');
    ASSERT_EQ(prompt.back(), '=');
    const auto plus = prompt.find('+');
    const long long a = std::stoll(prompt.substr(1, plus - 1)), b = std::stoll(prompt.substr(plus + 1));
    ASSERT_EQ(answer.back(), '\n');
    EXPECT_EQ(plus, 5u) << "operands are padded to 4 digits: " << prompt;
    EXPECT_EQ(prompt.size(), 11u) << prompt;
    EXPECT_EQ(answer.size(), 6u) << "answers are padded to 5 digits: " << answer;
    std::string c = answer.substr(0, answer.size() - 1);
    c.assign(c.rbegin(), c.rend());
    EXPECT_EQ(std::stoll(c), a + b) << prompt << answer;
  }
  auto plain = make_data_source(addition_config(4, "addition_plain"), 1);
  EXPECT_EQ(plain->decode(plain->encode("")), "");
  const auto pp = plain->eval_problems(1)[0];
  const std::string pr = plain->decode(pp.prompt);
  const auto plus = pr.find('+');
  EXPECT_EQ(plain->decode(pp.answer),
            std::to_string(std::stoll(pr.substr(1, plus - 1)) + std::stoll(pr.substr(plus + 1))) + "\n");
}

TEST(AdditionData, HeldOutRuleIsSymmetricAndAboutOneInTen) {
  int64_t held = 0, total = 0;
  for (int64_t a = 0; a < 1000; a += 3)
    for (int64_t b = 0; b < 1000; b += 7) {
      EXPECT_EQ(addition_held_out(a, b), addition_held_out(b, a));
      held += addition_held_out(a, b);
      ++total;
    }
  const double rate = static_cast<double>(held) / static_cast<double>(total);
  EXPECT_GT(rate, 0.08);
  EXPECT_LT(rate, 0.12);
  // Even one-digit addition has held-out problems, so evaluation can be built.
  int held_1digit = 0;
  for (int a = 0; a < 10; ++a)
    for (int b = 0; b < 10; ++b) held_1digit += addition_held_out(a, b);
  EXPECT_GT(held_1digit, 0);
}

TEST(AdditionData, EvalAndValidationAreHeldOutAndSeedIndependent) {
  auto s1 = make_data_source(addition_config(3), 1, 40);
  auto s2 = make_data_source(addition_config(3), 2, 40);
  const auto e1 = s1->eval_problems(500), e2 = s2->eval_problems(500);
  ASSERT_EQ(e1.size(), 500u);
  std::set<std::vector<int32_t>> distinct;
  int full_width = 0;
  std::set<std::pair<int64_t, int64_t>> distinct_questions;
  for (size_t i = 0; i < e1.size(); ++i) {
    EXPECT_EQ(e1[i].prompt, e2[i].prompt);
    EXPECT_EQ(e1[i].answer, e2[i].answer);
    distinct.insert(e1[i].prompt);
    int64_t a = -1, b = -1;
    for (const Problem& p : parse_prompt(e1[i].prompt, true, a, b))
      EXPECT_TRUE(addition_held_out(p.a, p.b)) << "context problems are held out too";
    EXPECT_TRUE(addition_held_out(a, b));
    distinct_questions.insert({a, b});
    full_width += (a >= 100 && b >= 100);
  }
  EXPECT_GT(distinct.size(), 480u);
  EXPECT_GT(distinct_questions.size(), 480u);
  EXPECT_GT(full_width, 350) << "eval operands are uniform in [0, 1000)";
  // The first n problems do not depend on n.
  EXPECT_EQ(s1->eval_problems(10)[9].prompt, e1[9].prompt);

  const Batch v1 = s1->val_batch(3, 4, 40), v2 = s2->val_batch(3, 4, 40);
  EXPECT_EQ(v1.inputs, v2.inputs);
  EXPECT_EQ(v1.targets, v2.targets);
  for (int64_t r = 0; r < 4; ++r)
    for (const Problem& p : parse_row(&v1.inputs[r * 40], &v1.targets[r * 40], 40, true))
      EXPECT_TRUE(addition_held_out(p.a, p.b));
  EXPECT_NE(s1->val_batch(0, 4, 40).inputs, s1->val_batch(1, 4, 40).inputs);
}

// Eval prompts put the question after 0 .. P-1 earlier problems, P being the
// problems one training row of seq_len holds (9 for 3 digits in 128 tokens),
// so every position a problem has in training is scored, evenly. The question
// of problem i does not depend on seq_len; without seq_len there is no context.
TEST(AdditionData, EvalPromptsCoverEveryPositionOfATrainingRow) {
  for (const bool reversed : {true, false}) {
    const std::string source = reversed ? "addition" : "addition_plain";
    auto row = make_data_source(addition_config(3, source), 1, 128);
    auto bare = make_data_source(addition_config(3, source), 1);
    const auto with = row->eval_problems(180), without = bare->eval_problems(180);
    std::vector<int> per_context(9, 0);
    for (size_t i = 0; i < with.size(); ++i) {
      const TaskProblem& p = with[i];
      ASSERT_GE(p.context, 0);
      ASSERT_LT(p.context, 9);
      EXPECT_EQ(p.context, static_cast<int64_t>(i % 9));
      ++per_context[static_cast<size_t>(p.context)];
      int64_t a = -1, b = -1;
      const auto context = parse_prompt(p.prompt, reversed, a, b);
      EXPECT_EQ(static_cast<int64_t>(context.size()), p.context);
      // Prompt and answer fit one row, as the problem would in training.
      EXPECT_LE(p.prompt.size() + p.answer.size(), 129u);
      // The same question and answer as with no context.
      EXPECT_EQ(p.answer, without[i].answer);
      EXPECT_EQ(without[i].context, 0);
      int64_t a0 = -1, b0 = -1;
      EXPECT_TRUE(parse_prompt(without[i].prompt, reversed, a0, b0).empty());
      EXPECT_EQ(a, a0);
      EXPECT_EQ(b, b0);
    }
    for (int c = 0; c < 9; ++c) EXPECT_EQ(per_context[static_cast<size_t>(c)], 20) << "context " << c;
  }
  // The row holds exactly 9 problems: a 10th would not fit 128 tokens.
  auto src = make_data_source(addition_config(3), 1, 128);
  const Batch b = src->train_batch(0, 1, 128);
  EXPECT_EQ(parse_row(b.inputs.data(), b.targets.data(), 128, true).size(), 9u);
}

TEST(AdditionData, TrainingIsAPureFunctionOfSeedAndIndex) {
  auto a = make_data_source(addition_config(3), 5);
  auto b = make_data_source(addition_config(3), 5);
  auto c = make_data_source(addition_config(3), 6);
  EXPECT_EQ(a->train_batch(7, 4, 48).inputs, b->train_batch(7, 4, 48).inputs);
  EXPECT_NE(a->train_batch(7, 4, 48).inputs, c->train_batch(7, 4, 48).inputs);
  EXPECT_NE(a->train_batch(7, 4, 48).inputs, a->train_batch(8, 4, 48).inputs);
  // Batch 2 of size 4 = sequences 8..11 = the first half of batch 1 of size 8.
  const Batch small = a->train_batch(2, 4, 48), big = a->train_batch(1, 8, 48);
  EXPECT_TRUE(std::equal(small.inputs.begin(), small.inputs.end(), big.inputs.begin()));
  EXPECT_TRUE(std::equal(small.targets.begin(), small.targets.end(), big.targets.begin()));
}

TEST(AdditionData, Tokenizer) {
  auto src = make_data_source(addition_config(3), 1);
  const auto t = src->encode("12+345=753\n_");
  EXPECT_EQ(t, (std::vector<int32_t>{1, 2, kPlus, 3, 4, 5, kEquals, 7, 5, 3, kEos, kPad}));
  EXPECT_EQ(src->decode(t), "12+345=753\n_");
  EXPECT_EQ(src->decode({0, 99, -1}), "0??");
  // Prompts are written in the training format: EOS first, operands zero-padded.
  EXPECT_EQ(src->encode_prompt("1+23="), (std::vector<int32_t>{kEos, 0, 0, 1, kPlus, 0, 2, 3, kEquals}));
  EXPECT_EQ(src->encode_prompt("\n1+2="), src->encode_prompt("1+2="));
  EXPECT_EQ(src->encode_prompt("1234+5="), src->encode("\n1234+005="));
  EXPECT_EQ(src->encode_prompt("12"), (std::vector<int32_t>{kEos, 1, 2}));
  auto plain = make_data_source(addition_config(3, "addition_plain"), 1);
  EXPECT_EQ(plain->encode_prompt("1+2="), (std::vector<int32_t>{kEos, 1, kPlus, 2, kEquals}));
  EXPECT_EQ(src->eos_token(), kEos);
  try {
    src->encode("1 + 2");
    FAIL() << "a space should be rejected";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("' '"), std::string::npos) << e.what();
  }
}

TEST(AdditionData, ExactMatchScoresTheGeneratedAnswer) {
  auto src = make_data_source(addition_config(3), 1);
  const auto problems = src->eval_problems(40);
  // An oracle that knows the answers, and one that is wrong on every 4th problem.
  int64_t calls = 0;
  GenerateFn oracle = [&](const std::vector<int32_t>& prompt, int64_t max_new) {
    EXPECT_EQ(max_new, static_cast<int64_t>(problems[static_cast<size_t>(calls)].answer.size()));
    EXPECT_EQ(prompt, problems[static_cast<size_t>(calls)].prompt);
    auto out = problems[static_cast<size_t>(calls++)].answer;
    out.push_back(5);  // tokens after the answer's EOS are ignored
    return out;
  };
  EXPECT_DOUBLE_EQ(src->exact_match(oracle, 40), 1.0);
  calls = 0;
  GenerateFn flaky = [&](const std::vector<int32_t>&, int64_t) {
    auto out = problems[static_cast<size_t>(calls)].answer;
    if (calls++ % 4 == 0) out[0] = (out[0] + 1) % 10;
    return out;
  };
  EXPECT_DOUBLE_EQ(src->exact_match(flaky, 40), 0.75);
  GenerateFn silent = [](const std::vector<int32_t>&, int64_t) { return std::vector<int32_t>{}; };
  EXPECT_DOUBLE_EQ(src->exact_match(silent, 40), 0.0);
  GenerateFn no_eos = [&](const std::vector<int32_t>& prompt, int64_t) {
    for (const auto& p : problems)
      if (p.prompt == prompt) return std::vector<int32_t>(p.answer.begin(), p.answer.end() - 1);
    return std::vector<int32_t>{};
  };
  EXPECT_DOUBLE_EQ(src->exact_match(no_eos, 40), 0.0) << "the answer must end with EOS";
  EXPECT_THROW(src->exact_match(silent, 0), std::invalid_argument);
}

// score_task: per-digit accuracy per answer position, exact match per context.
TEST(AdditionData, ScoreTaskReportsDigitsAndContexts) {
  auto src = make_data_source(addition_config(3), 1, 40);  // 3 problems per row: contexts 0, 1, 2
  const auto problems = src->eval_problems(60);
  auto answer_of = [&](const std::vector<int32_t>& prompt) {
    for (const auto& p : problems)
      if (p.prompt == prompt) return p;
    ADD_FAILURE() << "unknown prompt";
    return TaskProblem{};
  };
  // Wrong units digit (position 0 of the reversed answer) on every problem,
  // and the hundreds digit wrong after two earlier problems only.
  GenerateFn units_wrong = [&](const std::vector<int32_t>& prompt, int64_t) {
    const TaskProblem p = answer_of(prompt);
    auto out = p.answer;
    out[0] = (out[0] + 3) % 10;
    if (p.context == 2) out[2] = (out[2] + 1) % 10;
    return out;
  };
  const TaskScore s = src->score_task(units_wrong, 60);
  EXPECT_EQ(s.problems, 60);
  EXPECT_DOUBLE_EQ(s.exact_match, 0.0);
  ASSERT_EQ(s.digit_accuracy.size(), 4u) << "3-digit operands: 4 answer digits";
  EXPECT_DOUBLE_EQ(s.digit_accuracy[0], 0.0);
  EXPECT_DOUBLE_EQ(s.digit_accuracy[1], 1.0);
  EXPECT_DOUBLE_EQ(s.digit_accuracy[2], 2.0 / 3.0);
  EXPECT_DOUBLE_EQ(s.digit_accuracy[3], 1.0);
  // Right everywhere except after exactly one earlier problem.
  GenerateFn context1_wrong = [&](const std::vector<int32_t>& prompt, int64_t) {
    const TaskProblem p = answer_of(prompt);
    auto out = p.answer;
    if (p.context == 1) out.back() = kPad;  // no EOS: the digits alone are not an exact match
    return out;
  };
  const TaskScore c = src->score_task(context1_wrong, 60);
  EXPECT_DOUBLE_EQ(c.exact_match, 2.0 / 3.0);
  ASSERT_EQ(c.context_accuracy.size(), 3u);
  EXPECT_DOUBLE_EQ(c.context_accuracy[0], 1.0);
  EXPECT_DOUBLE_EQ(c.context_accuracy[1], 0.0);
  EXPECT_DOUBLE_EQ(c.context_accuracy[2], 1.0);
  for (double d : c.digit_accuracy) EXPECT_DOUBLE_EQ(d, 1.0);
  // A model that stops early scores its missing digits as wrong.
  GenerateFn two_digits = [&](const std::vector<int32_t>& prompt, int64_t) {
    const TaskProblem p = answer_of(prompt);
    return std::vector<int32_t>(p.answer.begin(), p.answer.begin() + 2);
  };
  const TaskScore t = src->score_task(two_digits, 60);
  EXPECT_DOUBLE_EQ(t.exact_match, 0.0);
  EXPECT_DOUBLE_EQ(t.digit_accuracy[1], 1.0);
  EXPECT_DOUBLE_EQ(t.digit_accuracy[2], 0.0);
  EXPECT_THROW(src->score_task(two_digits, 0), std::invalid_argument);
}

TEST(AdditionData, ClearErrors) {
  EXPECT_THROW(make_data_source(addition_config(0), 1), std::runtime_error);
  EXPECT_THROW(make_data_source(addition_config(10), 1), std::runtime_error);
  try {
    make_data_source(addition_config(3), 1, 12);
    FAIL() << "seq 12 is too short for 3-digit problems";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("seq_len >= 13"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(make_data_source(addition_config(3), 1, 13));
  auto src = make_data_source(addition_config(3), 1);
  EXPECT_THROW(src->train_batch(0, 1, 12), std::runtime_error);
  EXPECT_THROW(src->train_batch(-1, 1, 64), std::invalid_argument);
  EXPECT_THROW(src->train_batch(0, 0, 64), std::invalid_argument);
  // Source kinds are an enum, converted from their names where a spec is
  // read: an unknown name is rejected there.
  try {
    parse_data_kind("wikipedia");
    FAIL();
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find("wikipedia"), std::string::npos);
  }
}

TEST(AdditionData, OneDigitProblemsStillWork) {
  auto src = make_data_source(addition_config(1), 3, 8);
  const auto problems = src->eval_problems(20);
  for (const auto& p : problems) EXPECT_LE(p.prompt.size(), 5u);
  const Batch b = src->train_batch(0, 16, 8);
  for (int64_t r = 0; r < 16; ++r) parse_row(&b.inputs[r * 8], &b.targets[r * 8], 8, true);
}
