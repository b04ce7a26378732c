// Tests of rl/task (the rule verifier, the addition task as RL prompts) and of
// the addition source's pieces it needs in model/data_addition.cpp: the
// written width (data.width) and train_problem().
#include <gtest/gtest.h>

#include <algorithm>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include "model/data.hpp"
#include "rl/task.hpp"
#include "rl/trainer.hpp"

using namespace troupe;
using namespace troupe::rl;

namespace {

constexpr int32_t kPlus = 10, kEquals = 11, kEos = 12;

model::DataConfig addition(int64_t digits, int64_t width = 0, const std::string& source = "addition") {
  model::DataConfig c;
  c.source = model::parse_data_kind(source);
  c.digits = digits;
  c.width = width;
  return c;
}

// FNV-1a over every output a source gives (describe, train/val batches, eval
// problems, padded prompts, the seq_len error) for digits 1..9 of both formats.
uint64_t outputs_hash(int64_t width_for_digits /* 0, or -1 = width := digits */, int64_t target_column = 2) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&](const void* p, size_t n) {
    const auto* b = static_cast<const unsigned char*>(p);
    for (size_t i = 0; i < n; ++i) h = (h ^ b[i]) * 1099511628211ull;
  };
  auto mixv = [&](const std::vector<int32_t>& v) {
    const uint64_t n = v.size();
    mix(&n, 8);
    mix(v.data(), v.size() * 4);
  };
  for (const char* src : {"addition", "addition_plain"})
    for (int d : {1, 2, 3, 4, 6, 9}) {
      model::DataConfig c = addition(d, 0, src);
      if (width_for_digits < 0 && std::string(src) == "addition") c.width = d;
      c.target_column = target_column;  // no effect without target_pairs
      auto s = model::make_data_source(c, 1234 + static_cast<uint64_t>(d), 64);
      const std::string desc = s->describe();
      mix(desc.data(), desc.size());
      for (int64_t cur = 0; cur < 4; ++cur) {
        const auto b = s->train_batch(cur, 8, 64);
        mixv(b.inputs);
        mixv(b.targets);
      }
      for (int64_t i = 0; i < 2; ++i) {
        const auto b = s->val_batch(i, 8, 64);
        mixv(b.inputs);
        mixv(b.targets);
      }
      // seq_len 0: eval prompts start a row, as every prompt did at ac87254
      // (with seq_len > 0 they now also follow earlier problems; data.cpp).
      for (const auto& p : model::make_data_source(c, 1234 + static_cast<uint64_t>(d), 0)->eval_problems(40)) {
        mixv(p.prompt);
        mixv(p.answer);
      }
      mixv(s->encode_prompt("12+345="));
      mixv(s->encode_prompt("\n7+8="));
      try {
        model::make_data_source(c, 1, 3 * d + 3);
      } catch (const std::exception& e) {
        const std::string m = e.what();
        mix(m.data(), m.size());
      }
    }
  return h;
}

// Reads a number of `n` digits at tok[i..], most significant first unless reversed.
int64_t number_at(const std::vector<int32_t>& tok, size_t i, size_t n, bool reversed) {
  int64_t v = 0;
  for (size_t k = 0; k < n; ++k) {
    const int32_t d = tok.at(reversed ? i + n - 1 - k : i + k);
    EXPECT_GE(d, 0);
    EXPECT_LE(d, 9);
    v = v * 10 + d;
  }
  return v;
}

Prompt prompt_with_answer(const std::string& digits) {
  Prompt p;
  for (char ch : digits) p.answer.push_back(ch - '0');
  p.answer.push_back(kEos);
  return p;
}

std::vector<int32_t> tokens(const std::string& digits, bool eos) {
  std::vector<int32_t> out;
  for (char ch : digits) out.push_back(ch - '0');
  if (eos) out.push_back(kEos);
  return out;
}

}  // namespace

// The value is outputs_hash(0) computed with model/data*.cpp of commit ac87254
// (before data.width existed): width = 0 must leave every output byte-identical.
TEST(RlAdditionWidth, WidthZeroIsByteIdenticalToBeforeWidth) {
  EXPECT_EQ(outputs_hash(0), 0x0096c11e552818faull);
}

TEST(RlAdditionWidth, WidthEqualToDigitsIsWidthZero) { EXPECT_EQ(outputs_hash(-1), outputs_hash(0)); }

TEST(RlAdditionWidth, OperandsAreWrittenInTheWiderFormat) {
  const auto src = model::make_data_source(addition(3, 4), 7, 64);
  // seq_len 0: every eval prompt starts a row (with 64 some follow earlier problems).
  for (const auto& p : model::make_data_source(addition(3, 4), 7, 0)->eval_problems(200)) {
    // EOS dddd + dddd =, answer ddddd EOS (LSB first).
    ASSERT_EQ(p.prompt.size(), 11u);
    ASSERT_EQ(p.answer.size(), 6u);
    EXPECT_EQ(p.prompt[0], kEos);
    EXPECT_EQ(p.prompt[5], kPlus);
    EXPECT_EQ(p.prompt[10], kEquals);
    EXPECT_EQ(p.prompt[1], 0) << "3-digit operands written with 4 digits lead with 0";
    EXPECT_EQ(p.prompt[6], 0);
    const int64_t a = number_at(p.prompt, 1, 4, false), b = number_at(p.prompt, 6, 4, false);
    EXPECT_LT(a, 1000);
    EXPECT_LT(b, 1000);
    EXPECT_EQ(number_at(p.answer, 0, 5, true), a + b);
    EXPECT_EQ(p.answer.back(), kEos);
    EXPECT_TRUE(model::addition_held_out(a, b));
  }
  EXPECT_EQ(src->decode(src->encode_prompt("12+345=")), "\n0012+0345=");
  EXPECT_NE(src->describe().find("zero-padded to 4 digits"), std::string::npos) << src->describe();

  // Training rows: every problem in the 4-digit format with the answer's loss mask.
  const auto batch = src->train_batch(0, 4, 64);
  for (int64_t r = 0; r < 4; ++r) {
    const std::vector<int32_t> row(batch.inputs.begin() + r * 64, batch.inputs.begin() + (r + 1) * 64);
    ASSERT_EQ(row[0], kEos);
    size_t i = 1;
    int problems = 0;
    while (i + 16 <= row.size() && row[i] != 13) {  // 13 = PAD; a whole problem is 16 tokens
      EXPECT_EQ(row[i + 4], kPlus);
      EXPECT_EQ(row[i + 9], kEquals);
      EXPECT_EQ(row[i + 15], kEos);
      const int64_t a = number_at(row, i, 4, false), b = number_at(row, i + 5, 4, false);
      EXPECT_LT(a, 1000);
      EXPECT_EQ(number_at(row, i + 10, 5, true), a + b);
      EXPECT_FALSE(model::addition_held_out(a, b));
      i += 16;
      ++problems;
    }
    EXPECT_GE(problems, 3);
  }
  // The longest problem now needs 3 * 4 + 4 tokens.
  EXPECT_NO_THROW(model::make_data_source(addition(3, 4), 7, 16));
  EXPECT_THROW(model::make_data_source(addition(3, 4), 7, 15), std::runtime_error);
}

TEST(RlAdditionWidth, BadWidthIsAClearError) {
  auto message = [](const model::DataConfig& c) {
    try {
      model::make_data_source(c, 1);
    } catch (const std::runtime_error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message(addition(3, 2)).find("width must be 0 (= digits) or in [digits = 3, 9], got 2"), std::string::npos)
      << message(addition(3, 2));
  EXPECT_NE(message(addition(3, 10)).find("got 10"), std::string::npos);
  EXPECT_NE(message(addition(3, 4, "addition_plain")).find("needs the padded format"), std::string::npos)
      << message(addition(3, 4, "addition_plain"));
  EXPECT_NO_THROW(model::make_data_source(addition(3, 3), 1));
  EXPECT_NO_THROW(model::make_data_source(addition(3, 9), 1));
}

TEST(RlAdditionTask, TrainPromptsArePureTrainingSplitDraws) {
  const auto task = make_addition_task(addition(2), 11, {});
  const auto same = make_addition_task(addition(2), 11, {});
  const auto other = make_addition_task(addition(2), 12, {});
  int differs = 0, short_operands = 0;
  std::set<std::pair<int64_t, int64_t>> seen;
  for (int64_t i = 0; i < 3000; ++i) {
    const Prompt p = task->train_prompt(i);
    EXPECT_EQ(p.index, i);
    const Prompt q = same->train_prompt(i);
    EXPECT_EQ(p.tokens, q.tokens);
    EXPECT_EQ(p.answer, q.answer);
    differs += other->train_prompt(i).tokens != p.tokens ? 1 : 0;
    // "EOS dd+dd=" and "ddd EOS".
    ASSERT_EQ(p.tokens.size(), 7u);
    ASSERT_EQ(p.answer.size(), 4u);
    const int64_t a = number_at(p.tokens, 1, 2, false), b = number_at(p.tokens, 4, 2, false);
    EXPECT_FALSE(model::addition_held_out(a, b)) << a << "+" << b << " is held out";
    EXPECT_EQ(number_at(p.answer, 0, 3, true), a + b);
    short_operands += a < 10 ? 1 : 0;
    seen.insert({a, b});
  }
  EXPECT_GT(differs, 2500) << "another seed draws other prompts";
  // Training operands: half uniform, half with a uniform digit count, so about
  // 0.5 * 0.1 + 0.5 * 0.5 = 30% are 1-digit.
  EXPECT_GT(short_operands, 600);
  EXPECT_LT(short_operands, 1200);
  EXPECT_GT(seen.size(), 1500u);
  EXPECT_THROW(task->train_prompt(-1), std::invalid_argument);
  EXPECT_NE(task->describe().find("RL prompts of addition"), std::string::npos);
}

TEST(RlAdditionTask, EvalPromptsAreTheHeldOutProblems) {
  model::DataConfig c = addition(3, 4);
  const auto task = make_addition_task(c, 5, {});
  const auto src = model::make_data_source(c, 99);
  const auto prompts = task->eval_prompts(100);
  const auto problems = src->eval_problems(100);
  ASSERT_EQ(prompts.size(), 100u);
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(prompts[i].index, static_cast<int64_t>(i));
    EXPECT_EQ(prompts[i].tokens, problems[i].prompt) << "eval prompts do not depend on the seed";
    EXPECT_EQ(prompts[i].answer, problems[i].answer);
  }
  EXPECT_EQ(task->eos_token(), kEos);
  // Every held-out answer scores 1 with the task's verifier; a training prompt never is an eval prompt.
  for (const auto& p : prompts) EXPECT_TRUE(task->verifier().score(p, p.answer).correct);
}

TEST(RlAdditionTask, NeedsAnAdditionSource) {
  model::DataConfig c;
  c.source = troupe::model::DataKind::text;
  c.path = "/nonexistent";
  EXPECT_THROW(make_addition_task(c, 1, {}), std::runtime_error);
  c.source = troupe::model::DataKind::addition;
  c.path.clear();
  EXPECT_THROW(make_addition_task(c, 1, VerifierOptions{1.0, 0.0}), std::invalid_argument);
  // A source with no task says so.
  const std::string path = ::testing::TempDir() + "rl_task_text.txt";
  {
    std::ofstream out(path);
    for (int i = 0; i < 2000; ++i) out << "some text to train on\n";
  }
  model::DataConfig text;
  text.source = troupe::model::DataKind::text;
  text.path = path;
  EXPECT_THROW(model::make_data_source(text, 1)->train_problem(0), std::logic_error);
}

TEST(RlVerifier, ExactMatchIsOneElseZero) {
  const RuleVerifier v(kEos, {});
  const Prompt p = prompt_with_answer("7530");
  Verdict r = v.score(p, tokens("7530", true));
  EXPECT_TRUE(r.correct);
  EXPECT_TRUE(r.finished);
  EXPECT_EQ(r.reward, 1.0);
  r = v.score(p, tokens("7531", true));
  EXPECT_FALSE(r.correct);
  EXPECT_EQ(r.reward, 0.0);
  // Tokens after the first EOS are not part of the answer.
  std::vector<int32_t> tail = tokens("7530", true);
  tail.insert(tail.end(), {1, 2, kEos});
  EXPECT_EQ(v.score(p, tail).reward, 1.0);
  // Right digits without EOS, or an extra digit, are wrong.
  r = v.score(p, tokens("7530", false));
  EXPECT_FALSE(r.correct);
  EXPECT_FALSE(r.finished);
  EXPECT_EQ(r.reward, 0.0);
  EXPECT_EQ(v.score(p, tokens("75301", true)).reward, 0.0);
  EXPECT_EQ(v.score(p, tokens("753", true)).reward, 0.0);
  EXPECT_EQ(v.score(p, {}).reward, 0.0);
}

TEST(RlVerifier, PartialCreditAndFormatPenalty) {
  const RuleVerifier v(kEos, VerifierOptions{0.5, 0.1});
  const Prompt p = prompt_with_answer("7530");
  EXPECT_EQ(v.score(p, tokens("7530", true)).reward, 1.0);
  // 7,5,_,0 right in place: 3 of 4 answer digits.
  EXPECT_DOUBLE_EQ(v.score(p, tokens("7500", true)).reward, 0.5 * 3 / 4);
  EXPECT_DOUBLE_EQ(v.score(p, tokens("0000", true)).reward, 0.5 * 1 / 4);
  EXPECT_DOUBLE_EQ(v.score(p, tokens("75301", true)).reward, 0.5);  // all 4 digits right, then junk
  EXPECT_DOUBLE_EQ(v.score(p, tokens("75", true)).reward, 0.5 * 2 / 4);  // the EOS is not a digit
  // No EOS within max_new_tokens: the penalty, on top of the partial credit.
  EXPECT_DOUBLE_EQ(v.score(p, tokens("7530", false)).reward, 0.5 - 0.1);
  EXPECT_DOUBLE_EQ(v.score(p, tokens("12", false)).reward, -0.1);
  EXPECT_THROW(RuleVerifier(kEos, VerifierOptions{1.0, 0.0}), std::invalid_argument);
  EXPECT_THROW(RuleVerifier(kEos, VerifierOptions{-0.1, 0.0}), std::invalid_argument);
  EXPECT_THROW(RuleVerifier(kEos, VerifierOptions{0.0, -1.0}), std::invalid_argument);
}

// ---- The target split (data.target_pairs / data.target_column) ----

namespace {

model::DataConfig split3(const std::string& pairs = "1+4, 2+5, 3+6, 4+7, 5+8, 6+9, 7+1, 8+2, 9+3", int64_t column = 2) {
  model::DataConfig c = addition(3);
  c.target_pairs = pairs;
  c.target_column = column;
  return c;
}

int64_t digit_at(int64_t v, int64_t column) {
  for (int64_t i = 0; i < column; ++i) v /= 10;
  return v % 10;
}

// The reference rule, written independently of the source: the digits at
// column 2 form one of the unordered pairs {d, d+3 (cyclic in 1..9)}.
bool is_target_ref(int64_t a, int64_t b) {
  const int64_t x = digit_at(a, 2), y = digit_at(b, 2);
  if (x == 0 || y == 0) return false;
  auto next3 = [](int64_t d) { return (d - 1 + 3) % 9 + 1; };
  return next3(x) == y || next3(y) == x;
}

// The (a, b) of every whole problem of a 3-digit reversed row of `seq` tokens
// (EOS, then "ddd+ddd=dddd" EOS problems, then PAD); checks each answer.
std::vector<std::pair<int64_t, int64_t>> row_problems(const std::vector<int32_t>& inputs, int64_t r, int64_t seq) {
  const std::vector<int32_t> row(inputs.begin() + r * seq, inputs.begin() + (r + 1) * seq);
  std::vector<std::pair<int64_t, int64_t>> out;
  EXPECT_EQ(row[0], kEos);
  size_t i = 1;
  while (i + 13 <= row.size() && row[i] != 13) {
    EXPECT_EQ(row[i + 3], kPlus);
    EXPECT_EQ(row[i + 7], kEquals);
    EXPECT_EQ(row[i + 12], kEos);
    const int64_t a = number_at(row, i, 3, false), b = number_at(row, i + 4, 3, false);
    EXPECT_EQ(number_at(row, i + 8, 4, true), a + b);
    out.push_back({a, b});
    i += 13;
  }
  return out;
}

}  // namespace

TEST(RlAdditionTarget, ParsesPairsAndRejectsBadOnes) {
  const model::AdditionTarget t = model::parse_addition_target(" 1+4,2+5 ,9+9", 1);
  EXPECT_EQ(t.column, 1);
  EXPECT_TRUE(t.any());
  int set = 0;
  for (int x = 0; x < 10; ++x)
    for (int y = 0; y < 10; ++y) {
      const bool want = (x == 1 && y == 4) || (x == 4 && y == 1) || (x == 2 && y == 5) || (x == 5 && y == 2) ||
                        (x == 9 && y == 9);
      EXPECT_EQ(t.pair[static_cast<size_t>(x * 10 + y)], want) << x << "+" << y;
      set += t.pair[static_cast<size_t>(x * 10 + y)] ? 1 : 0;
    }
  EXPECT_EQ(set, 5);
  // Column 1 is the tens: 140 + 250 has tens digits 4 and 5, no pair; 41 + 17 has 4 and 1.
  EXPECT_TRUE(t.contains(41, 17));
  EXPECT_TRUE(t.contains(917, 41));
  EXPECT_FALSE(t.contains(140, 250));
  EXPECT_FALSE(model::parse_addition_target("", 2).any());
  EXPECT_FALSE(model::parse_addition_target("  ", 2).any());
  auto message = [](const std::string& pairs, int64_t column = 2) {
    try {
      model::parse_addition_target(pairs, column);
    } catch (const std::invalid_argument& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  EXPECT_NE(message("1+4,").find("got \"\""), std::string::npos) << message("1+4,");
  EXPECT_NE(message("14").find("digit pairs \"x+y\""), std::string::npos) << message("14");
  EXPECT_NE(message("1+a").find("got \"1+a\""), std::string::npos);
  EXPECT_NE(message("1+10").find("got \"1+10\""), std::string::npos);
  EXPECT_NE(message("9-6+1").find("got \"9-6+1\""), std::string::npos) << "a range runs upwards";
  EXPECT_NE(message("6-+1").find("got \"6-+1\""), std::string::npos);
  EXPECT_NE(message("0-9+0-9").find("all 55 digit pairs"), std::string::npos);
  // A pair listed twice (either order) is listed once.
  EXPECT_EQ(model::parse_addition_target("1+4, 4+1", 2).pair, model::parse_addition_target("1+4", 2).pair);
  // Ranges: "6-9+0-9" is every pair with a digit in 6..9 (34 unordered pairs).
  const model::AdditionTarget r = model::parse_addition_target("6-9+0-9", 2);
  for (int x = 0; x < 10; ++x)
    for (int y = 0; y < 10; ++y)
      EXPECT_EQ(r.pair[static_cast<size_t>(x * 10 + y)], x >= 6 || y >= 6) << x << "+" << y;
  EXPECT_EQ(model::parse_addition_target("2-3+5", 0).pair, model::parse_addition_target("2+5, 5+3", 0).pair);
  EXPECT_NE(message("1+4", 9).find("column must be -1 (any) or in [0, 8], got 9"), std::string::npos) << message("1+4", 9);
  EXPECT_NE(message("1+4", -2).find("got -2"), std::string::npos);
  std::string all;
  for (int x = 0; x < 10; ++x)
    for (int y = x; y < 10; ++y) all += (all.empty() ? "" : ",") + std::to_string(x) + "+" + std::to_string(y);
  EXPECT_NE(message(all).find("all 55 digit pairs"), std::string::npos) << message(all);
  // The source reports them as data errors, and a column it lacks.
  EXPECT_THROW(model::make_data_source(split3("1+x"), 1), std::runtime_error);
  model::DataConfig high = split3("1+4", 3);
  EXPECT_THROW(model::make_data_source(high, 1), std::runtime_error);
  model::DataConfig text;
  text.source = troupe::model::DataKind::text;
  text.target_pairs = "1+4";
  EXPECT_THROW(model::make_data_source(text, 1), std::runtime_error);
}

TEST(RlAdditionTarget, NoPairsIsByteIdenticalWhateverTheColumn) {
  EXPECT_EQ(outputs_hash(0, 0), 0x0096c11e552818faull);
  EXPECT_EQ(outputs_hash(0, 5), 0x0096c11e552818faull);
}

TEST(RlAdditionTarget, TrainingRowsNeverShowATargetProblem) {
  const auto src = model::make_data_source(split3(), 5, 128);
  const auto plain = model::make_data_source(addition(3), 5, 128);
  int64_t problems = 0, target_digits_elsewhere = 0, plain_targets = 0;
  for (int64_t cur = 0; cur < 40; ++cur) {
    const auto b = src->train_batch(cur, 16, 128);
    const auto v = src->val_batch(cur, 16, 128);
    const auto p = plain->train_batch(cur, 16, 128);
    for (int64_t r = 0; r < 16; ++r) {
      for (const auto& [a, bb] : row_problems(b.inputs, r, 128)) {
        EXPECT_FALSE(is_target_ref(a, bb)) << a << "+" << bb << " is a target problem in a training row";
        EXPECT_FALSE(model::addition_held_out(a, bb));
        ++problems;
        // The pairs still occur in the other columns (units, tens).
        for (int64_t col : {0, 1}) {
          const int64_t x = digit_at(a, col), y = digit_at(bb, col);
          target_digits_elsewhere += (x > 0 && y > 0 && ((x + 2) % 9 + 1 == y || (y + 2) % 9 + 1 == x)) ? 1 : 0;
        }
      }
      for (const auto& [a, bb] : row_problems(v.inputs, r, 128)) {
        EXPECT_FALSE(is_target_ref(a, bb)) << a << "+" << bb << " is a target problem in a validation row";
        EXPECT_TRUE(model::addition_held_out(a, bb));
      }
      for (const auto& [a, bb] : row_problems(p.inputs, r, 128)) plain_targets += is_target_ref(a, bb) ? 1 : 0;
    }
  }
  EXPECT_GT(problems, 5000);
  EXPECT_GT(target_digits_elsewhere, problems / 10) << "the target pairs are seen in the units and tens columns";
  EXPECT_GT(plain_targets, 300) << "without the split, training rows do hold such problems (the check has teeth)";
  // Deterministic: the same seed gives the same rows.
  const auto again = model::make_data_source(split3(), 5, 128);
  EXPECT_EQ(again->train_batch(3, 16, 128).inputs, src->train_batch(3, 16, 128).inputs);
  EXPECT_NE(src->describe().find("target split: digit pairs {1+4, 2+5"), std::string::npos) << src->describe();
}

TEST(RlAdditionTarget, RlPromptsAndEvaluationAreOnlyTargetProblems) {
  const auto task = make_addition_task(split3(), 11, {});
  const auto same = make_addition_task(split3(), 11, {});
  std::set<std::pair<int64_t, int64_t>> pairs_seen;  // hundreds digits
  for (int64_t i = 0; i < 2000; ++i) {
    const Prompt p = task->train_prompt(i);
    ASSERT_EQ(p.tokens.size(), 9u);
    const int64_t a = number_at(p.tokens, 1, 3, false), b = number_at(p.tokens, 5, 3, false);
    EXPECT_TRUE(is_target_ref(a, b)) << a << "+" << b << " is not a target problem";
    EXPECT_FALSE(model::addition_held_out(a, b)) << a << "+" << b << " is held out";
    EXPECT_EQ(number_at(p.answer, 0, 4, true), a + b);
    EXPECT_EQ(same->train_prompt(i).tokens, p.tokens);
    pairs_seen.insert({digit_at(a, 2), digit_at(b, 2)});
  }
  EXPECT_EQ(pairs_seen.size(), 18u) << "all 9 unordered pairs, in both orders";
  const std::vector<Prompt> eval = task->eval_prompts(300);
  for (const Prompt& p : eval) {
    ASSERT_EQ(p.tokens.size(), 9u) << "the RL task's eval prompts start a row";
    const int64_t a = number_at(p.tokens, 1, 3, false), b = number_at(p.tokens, 5, 3, false);
    EXPECT_TRUE(is_target_ref(a, b));
    EXPECT_TRUE(model::addition_held_out(a, b));
  }
  EXPECT_EQ(make_addition_task(split3(), 99, {})->eval_prompts(300)[17].tokens, eval[17].tokens)
      << "evaluation does not depend on the seed";
  // With seq_len the context problems before a scored one are non-target.
  const auto src = model::make_data_source(split3(), 5, 128);
  int64_t contexts = 0;
  for (const auto& p : src->eval_problems(60)) {
    ASSERT_EQ(p.prompt.size(), static_cast<size_t>(1 + 13 * p.context + 8));
    for (int64_t c = 0; c < p.context; ++c) {
      const size_t at = static_cast<size_t>(1 + 13 * c);
      const int64_t a = number_at(p.prompt, at, 3, false), b = number_at(p.prompt, at + 4, 3, false);
      EXPECT_FALSE(is_target_ref(a, b));
      EXPECT_TRUE(model::addition_held_out(a, b));
      ++contexts;
    }
    const size_t at = static_cast<size_t>(1 + 13 * p.context);
    EXPECT_TRUE(is_target_ref(number_at(p.prompt, at, 3, false), number_at(p.prompt, at + 4, 3, false)));
  }
  EXPECT_GT(contexts, 100);
}

TEST(RlAdditionTarget, AnyColumnHidesThePairsEverywhere) {
  const std::string pairs = "1+4, 2+7, 3+8, 5+9, 6+6";
  auto in_set = [](int64_t x, int64_t y) {
    const int64_t lo = std::min(x, y), hi = std::max(x, y);
    return (lo == 1 && hi == 4) || (lo == 2 && hi == 7) || (lo == 3 && hi == 8) || (lo == 5 && hi == 9) ||
           (lo == 6 && hi == 6);
  };
  auto any_column = [&](int64_t a, int64_t b) {
    for (int64_t c = 0; c < 3; ++c)
      if (in_set(digit_at(a, c), digit_at(b, c))) return true;
    return false;
  };
  const model::AdditionTarget t = model::parse_addition_target(pairs, -1);
  EXPECT_TRUE(t.contains(4, 1));
  EXPECT_TRUE(t.contains(300, 800));
  EXPECT_TRUE(t.contains(66, 60));
  EXPECT_FALSE(t.contains(41, 41));
  const auto src = model::make_data_source(split3(pairs, -1), 3, 128);
  int64_t problems = 0;
  for (int64_t cur = 0; cur < 20; ++cur) {
    const auto b = src->train_batch(cur, 16, 128);
    for (int64_t r = 0; r < 16; ++r)
      for (const auto& [a, bb] : row_problems(b.inputs, r, 128)) {
        EXPECT_FALSE(any_column(a, bb)) << a << "+" << bb << " shows a target pair in a training row";
        ++problems;
      }
  }
  EXPECT_GT(problems, 2000);
  const auto task = make_addition_task(split3(pairs, -1), 11, {});
  int64_t units_only = 0;
  for (int64_t i = 0; i < 1000; ++i) {
    const Prompt p = task->train_prompt(i);
    const int64_t a = number_at(p.tokens, 1, 3, false), b = number_at(p.tokens, 5, 3, false);
    EXPECT_TRUE(any_column(a, b)) << a << "+" << b << " is not a target problem";
    EXPECT_FALSE(model::addition_held_out(a, b));
    units_only += in_set(a % 10, b % 10) && !in_set(digit_at(a, 1), digit_at(b, 1)) &&
                  !in_set(digit_at(a, 2), digit_at(b, 2)) ? 1 : 0;
  }
  EXPECT_GT(units_only, 100) << "a pair in the units column alone makes a target problem";
  for (const Prompt& p : task->eval_prompts(200))
    EXPECT_TRUE(any_column(number_at(p.tokens, 1, 3, false), number_at(p.tokens, 5, 3, false)));
  EXPECT_NE(src->describe().find("at any column"), std::string::npos) << src->describe();
}

// ---- Retention: RL prompts partly from the SFT side (rl.sft_fraction) ----

TEST(RlSftSide, ComplementPairsAreTheOtherSideOfTheSplit) {
  EXPECT_EQ(model::complement_pairs("", 2), "");
  const std::string side = model::complement_pairs("6-9+6-9", 2);
  const model::AdditionTarget t = model::parse_addition_target("6-9+6-9", 2);
  const model::AdditionTarget c = model::parse_addition_target(side, 2);
  for (size_t i = 0; i < 100; ++i) EXPECT_NE(t.pair[i], c.pair[i]) << "pair " << i / 10 << "+" << i % 10;
}

TEST(RlSftSide, SideTaskPromptsAndEvaluationAreTheProblemsSftSees) {
  EXPECT_EQ(make_sft_side_task(addition(3), 1, {}), nullptr) << "no split, no other side";
  EXPECT_EQ(make_sft_side_task(split3("6-9+6-9", -1), 1, {}), nullptr) << "any-column splits have no one other side";
  const auto side = make_sft_side_task(split3(), 11, {});
  ASSERT_NE(side, nullptr);
  for (int64_t i = 0; i < 500; ++i) {
    const Prompt p = side->train_prompt(i);
    const int64_t a = number_at(p.tokens, 1, 3, false), b = number_at(p.tokens, 5, 3, false);
    EXPECT_FALSE(is_target_ref(a, b)) << a << "+" << b << " is a target problem";
    EXPECT_FALSE(model::addition_held_out(a, b)) << a << "+" << b << " is held out";
  }
  for (const Prompt& p : side->eval_prompts(200)) {
    const int64_t a = number_at(p.tokens, 1, 3, false), b = number_at(p.tokens, 5, 3, false);
    EXPECT_FALSE(is_target_ref(a, b));
    EXPECT_TRUE(model::addition_held_out(a, b));
  }
}

TEST(RlSftSide, MixedTaskSpreadsTheShareEvenlyAndRepeatsNoPrompt) {
  RlConfig rl;
  rl.sft_fraction = 0.25;
  const auto mixed = make_task(rl, split3(), 11);
  const auto target = make_addition_task(split3(), 11, {});
  const auto side = make_sft_side_task(split3(), 11, {});
  int64_t from_side = 0, from_target = 0;
  std::set<std::vector<int32_t>> seen;
  for (int64_t step = 0; step < 20; ++step) {
    int64_t in_step = 0;
    for (int64_t g = 0; g < 32; ++g) {
      const int64_t i = step * 32 + g;
      const Prompt p = mixed->train_prompt(i);
      EXPECT_EQ(p.index, i);
      const int64_t a = number_at(p.tokens, 1, 3, false), b = number_at(p.tokens, 5, 3, false);
      // Each prompt is the next unused one of its own task, in order.
      if (is_target_ref(a, b)) {
        EXPECT_EQ(p.tokens, target->train_prompt(from_target++).tokens);
      } else {
        EXPECT_EQ(p.tokens, side->train_prompt(from_side++).tokens);
        ++in_step;
      }
      EXPECT_EQ(number_at(p.answer, 0, 4, true), a + b);
      seen.insert(p.tokens);
    }
    EXPECT_EQ(in_step, 8) << "step " << step << ": a quarter of 32 prompts from the SFT side";
  }
  EXPECT_GT(seen.size(), 600u) << "prompts are drawn, not repeated";
  EXPECT_EQ(mixed->eval_prompts(50)[7].tokens, target->eval_prompts(50)[7].tokens) << "evaluation stays the target's";
  rl.sft_fraction = 0.0;
  EXPECT_EQ(make_task(rl, split3(), 11)->train_prompt(5).tokens, target->train_prompt(5).tokens);
  rl.sft_fraction = 0.3;
  EXPECT_THROW(make_task(rl, addition(3), 11), std::invalid_argument) << "no split to draw the SFT side from";
  EXPECT_THROW(make_mixed_task(make_addition_task(split3(), 1, {}), nullptr, 0.3), std::invalid_argument);
  EXPECT_THROW(make_mixed_task(make_addition_task(split3(), 1, {}), make_sft_side_task(split3(), 1, {}), 1.0),
               std::invalid_argument);
}

// The scratchpad task (data.source = "scratchpad"): the verifier scores only
// the answer after the last '#'; the written work before it is the model's.
TEST(RlScratchpadTask, TheVerifierScoresOnlyTheFinalAnswer) {
  VerifierOptions vo;
  vo.partial_credit = 0.5;
  const auto task = make_addition_task(addition(12, 0, "scratchpad"), 5, vo);
  const auto src = model::make_data_source(addition(12, 0, "scratchpad"), 5);
  EXPECT_EQ(task->max_prompt_tokens(), 2 * 12 + 3);
  EXPECT_EQ(task->max_answer_tokens(), 10 * 12 + 3);
  const Prompt p = task->train_prompt(0);
  const std::string right = src->decode(p.answer);
  auto score = [&](const std::string& text) { return task->verifier().score(p, src->encode(text)); };
  const Verdict exact = score(right);
  EXPECT_TRUE(exact.correct);
  EXPECT_EQ(exact.reward, 1.0);
  // Wrong work, right answer: right. (The work is whatever the model wrote.)
  const size_t hash = right.rfind('#');
  EXPECT_TRUE(score("9+9+9=99;" + right.substr(hash)).correct);
  EXPECT_TRUE(score(right.substr(hash)).correct) << "no work at all";
  // The answer is what follows the LAST '#'.
  EXPECT_TRUE(score("#0;" + right).correct);
  // Right work, wrong answer: wrong; partial credit counts the answer's digits only.
  std::string wrong = right;
  wrong[hash + 1] = wrong[hash + 1] == '9' ? '8' : static_cast<char>(wrong[hash + 1] + 1);
  const Verdict w = score(wrong);
  EXPECT_FALSE(w.correct);
  const double digits = static_cast<double>(right.size() - hash - 2);
  EXPECT_DOUBLE_EQ(w.reward, 0.5 * (digits - 1) / digits);
  // No answer marker, or no EOS: not right.
  EXPECT_FALSE(score(right.substr(0, hash)).correct);
  EXPECT_FALSE(score(right.substr(0, right.size() - 1)).correct);
}
