// A user's data as JSONL (model/jsonl.hpp, model/data_jsonl.cpp): strict
// reading with file:line errors, the hash split (independent of line order),
// rows whose loss is on the completion only, and training rows that are a
// pure function of (seed, index) and never a held-out record.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "model/data.hpp"
#include "model/jsonl.hpp"
#include "model/tokenizer.hpp"

namespace troupe::model {
namespace {

namespace fs = std::filesystem;

class JsonlTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("troupe_jsonl_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }
  std::string write(const std::string& name, const std::string& bytes) {
    const std::string p = (dir_ / name).string();
    std::ofstream(p, std::ios::binary) << bytes;
    return p;
  }
  // The error read_jsonl throws for `bytes`, or "" when it reads them.
  std::string error_of(const std::string& bytes) {
    const std::string p = write("x.jsonl", bytes);
    try {
      read_jsonl(p, "prompt", "completion", false);
    } catch (const JsonlError& e) {
      return e.what();
    }
    return "";
  }
  fs::path dir_;
};

std::string records(int n, int offset = 0) {
  std::string s;
  for (int i = 0; i < n; ++i)
    s += "{\"prompt\": \"p" + std::to_string(i + offset) + " =\", \"completion\": \" c" + std::to_string(i + offset) + "\"}\n";
  return s;
}

TEST_F(JsonlTest, BadInputIsAnErrorNamingFileAndLine) {
  const std::string f = (dir_ / "x.jsonl").string();
  EXPECT_EQ(error_of("{\"prompt\": \"a\", \"completion\": \"b\"}\n{\"prompt\": \"a\", \n").rfind(f + ":2: not valid JSON (", 0), 0u);
  EXPECT_NE(error_of(records(2) + "{oops}\n").find(f + ":3: not valid JSON"), std::string::npos);
  EXPECT_EQ(error_of(records(1) + "{\"prompt\": \"a\"}\n"), f + ":2: no \"completion\" field (the line has \"prompt\")");
  EXPECT_EQ(error_of("{\"prompt\": 7, \"completion\": \"b\"}\n"), f + ":1: \"prompt\" is a number; expected a string");
  EXPECT_EQ(error_of("[1, 2]\n"), f + ":1: expected a JSON object, got an array");
  EXPECT_EQ(error_of(""), f + ": holds no record (an empty file, or only blank lines)");
  EXPECT_EQ(error_of("\n  \n"), f + ": holds no record (an empty file, or only blank lines)");
  EXPECT_EQ(error_of(records(1) + "{\"prompt\": \"a\xff\", \"completion\": \"b\"}\n"), f + ":2: invalid UTF-8 at byte 14 of the line");
  EXPECT_EQ(error_of("{\"prompt\": \"\xc0\xaf\", \"completion\": \"b\"}\n"), f + ":1: invalid UTF-8 at byte 13 of the line");  // overlong
  const std::string huge = "{\"prompt\": \"" + std::string(10 << 20, 'a') + "\", \"completion\": \"b\"}\n";
  EXPECT_EQ(error_of(records(3) + huge), f + ":4: line is longer than 1048576 bytes (1 MiB); one record per line, and no record needs that much");
  try {
    read_jsonl((dir_ / "missing.jsonl").string(), "prompt", "completion", false);
    ADD_FAILURE() << "a missing file was read";
  } catch (const JsonlError& e) {
    EXPECT_NE(std::string(e.what()).find("missing.jsonl: cannot open"), std::string::npos) << e.what();
  }
}

TEST_F(JsonlTest, BomCrlfBlankLinesAndMetaAreAccepted) {
  const std::string p = write("ok.jsonl", "\xEF\xBB\xBF{\"prompt\": \"a\", \"completion\": \"b\", \"meta\": {\"k\": [1, 2]}}\r\n\r\n"
                                          "{\"prompt\": \"caf\xC3\xA9\", \"completion\": \"\xF0\x9F\x99\x82\"}\r\n");
  const auto r = read_jsonl(p, "prompt", "completion", true);
  ASSERT_EQ(r.size(), 2u);
  EXPECT_EQ(r[0].first, "a");
  EXPECT_EQ(r[0].second, "b");
  EXPECT_EQ(r[0].meta_json, "{\"k\":[1,2]}");
  EXPECT_EQ(r[0].line, 1);
  EXPECT_EQ(r[1].line, 3);
  EXPECT_EQ(r[1].first, "caf\xC3\xA9");
  EXPECT_EQ(r[1].meta_json, "null");
  // Custom field names.
  const std::string q = write("q.jsonl", "{\"question\": \"x\", \"response\": \"y\"}\n");
  EXPECT_EQ(read_jsonl(q, "question", "response", false)[0].second, "y");
}

TEST_F(JsonlTest, TheSplitDependsOnTheLineNotItsPosition) {
  std::string text = records(400);
  std::vector<std::string> lines;
  for (size_t a = 0, b; (b = text.find('\n', a)) != std::string::npos; a = b + 1) lines.push_back(text.substr(a, b - a));
  std::mt19937 rng(3);
  std::shuffle(lines.begin(), lines.end(), rng);
  std::string shuffled;
  for (const auto& l : lines) shuffled += l + "\n";
  auto held = [&](const std::string& path) {
    std::set<std::string> out;
    for (const auto& r : read_jsonl(path, "prompt", "completion", false))
      if (jsonl_held_out(r, 0.1)) out.insert(r.first);
    return out;
  };
  const auto a = held(write("a.jsonl", text)), b = held(write("b.jsonl", shuffled));
  EXPECT_EQ(a, b);
  EXPECT_GT(a.size(), 20u);  // about 40 of 400
  EXPECT_LT(a.size(), 70u);
}

TEST(JsonlPermute, IsABijectionThatChangesWithTheKey) {
  for (int64_t n : {1, 2, 7, 64, 1000}) {
    std::vector<int64_t> a, b;
    for (int64_t i = 0; i < n; ++i) a.push_back(jsonl_permute(11, n, i)), b.push_back(jsonl_permute(12, n, i));
    std::vector<int64_t> sa = a;
    std::sort(sa.begin(), sa.end());
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(sa[static_cast<size_t>(i)], i) << "n " << n;
    if (n >= 64) EXPECT_NE(a, b);
  }
}

TEST_F(JsonlTest, RowsTrainTheCompletionOnlyAndNeverAHeldOutRecord) {
  DataConfig c;
  c.source = DataKind::jsonl;
  c.path = write("d.jsonl", records(300));
  c.eval_fraction = 0.1;
  const auto src = make_data_source(c, 5, 24);
  const auto tok = make_byte_tokenizer();
  EXPECT_EQ(src->vocab_size(), 257);
  EXPECT_EQ(src->eos_token(), 256);
  // Held-out prompts, by the same rule the source uses.
  std::set<std::string> held;
  for (const auto& r : read_jsonl(c.path, "prompt", "completion", false))
    if (jsonl_held_out(r, 0.1)) held.insert(r.first);
  ASSERT_FALSE(held.empty());
  const auto n_train = static_cast<int64_t>(300 - held.size());
  const Batch b = src->train_batch(0, n_train, 24);
  std::set<std::string> seen;
  for (int64_t row = 0; row < b.batch; ++row) {
    const int32_t* in = b.inputs.data() + row * 24;
    const int32_t* tg = b.targets.data() + row * 24;
    ASSERT_EQ(in[0], 256);  // EOS first
    int64_t eq = 1;
    while (in[eq] != '=') ++eq;
    const std::string prompt(in + 1, in + eq + 1);
    seen.insert(prompt);
    EXPECT_EQ(held.count(prompt), 0u) << "a held-out record was trained on: " << prompt;
    // No loss on the prompt; the completion " cN" and EOS are the targets.
    for (int64_t t = 0; t < eq; ++t) EXPECT_EQ(tg[t], -1) << "row " << row << " position " << t;
    std::string completion;
    int64_t t = eq;
    for (; tg[t] != 256; ++t) completion.push_back(static_cast<char>(tg[t]));
    EXPECT_EQ(completion, " c" + prompt.substr(1, prompt.size() - 3));
    for (++t; t < 24; ++t) EXPECT_EQ(tg[t], -1);
  }
  EXPECT_EQ(seen.size() + held.size(), 300u);  // one epoch: every training record once
  // A pure function of (seed, index): again, and in pieces.
  EXPECT_EQ(src->train_batch(0, n_train, 24).inputs, b.inputs);
  const auto again = make_data_source(c, 5, 24);
  EXPECT_EQ(again->train_batch(3, 10, 24).inputs, std::vector<int32_t>(b.inputs.begin() + 30 * 24, b.inputs.begin() + 40 * 24));
  EXPECT_NE(make_data_source(c, 6, 24)->train_batch(0, n_train, 24).inputs, b.inputs);
  // Held-out problems: the prompt, then the exact completion and EOS.
  const auto problems = src->eval_problems(5);
  ASSERT_EQ(problems.size(), 5u);
  EXPECT_EQ(problems[0].prompt.front(), 256);
  EXPECT_EQ(problems[0].answer.back(), 256);
}

TEST_F(JsonlTest, ARecordLongerThanSeqLenIsRefusedNamingItsLine) {
  DataConfig c;
  c.source = DataKind::jsonl;
  c.path = write("d.jsonl", records(20) + "{\"prompt\": \"" + std::string(40, 'x') + "\", \"completion\": \"y\"}\n");
  c.eval_fraction = 0.0;
  c.eval_path = write("e.jsonl", records(3, 100));
  try {
    make_data_source(c, 1, 24);
    ADD_FAILURE() << "a record longer than seq_len was accepted";
  } catch (const JsonlError& e) {
    EXPECT_NE(std::string(e.what()).find("d.jsonl:21: the record is 42 tokens"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(make_data_source(c, 1, 64));
}

}  // namespace
}  // namespace troupe::model
