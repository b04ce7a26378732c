// A user's RL task (rl/task_jsonl.hpp): prompts from JSONL, held out by a hash
// or a file, the built-in text rewards (exact, numeric, regex) and a reward
// program through the batch protocol, scored the same way the RL loop does.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>

#include "model/jsonl.hpp"
#include "model/tokenizer.hpp"
#include "rl/reward_command.hpp"
#include "rl/task_jsonl.hpp"

namespace troupe::rl {
namespace {

namespace fs = std::filesystem;

class JsonlTaskTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("troupe_rl_jsonl_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::create_directories(dir_);
    std::string lines;
    for (int i = 0; i < 200; ++i)
      lines += "{\"prompt\": \"q" + std::to_string(i) + "\", \"answer\": \"" + std::to_string(i * 3) +
               "\", \"meta\": {\"i\": " + std::to_string(i) + "}}\n";
    std::ofstream(dir_ / "p.jsonl") << lines;
    rl_.prompts = (dir_ / "p.jsonl").string();
    rl_.reward_dir = dir_.string();
    data_.eval_fraction = 0.1;
  }
  void TearDown() override { fs::remove_all(dir_); }
  // Scores `text` (as a completion, then EOS) against prompt p.
  Verdict score(const Task& t, const Prompt& p, const std::string& text) {
    const auto tok = model::make_byte_tokenizer();
    std::vector<int32_t> c = tok->encode(text);
    c.push_back(tok->eos_id());
    return t.verifier().score(p, c);
  }
  fs::path dir_;
  RlConfig rl_;
  model::DataConfig data_;
};

TEST_F(JsonlTaskTest, PromptsCarryTheRecordAndNeverAHeldOutOne) {
  const auto task = make_jsonl_task(rl_, data_, 7);
  std::set<std::string> held;
  for (const auto& r : model::read_jsonl(rl_.prompts, "prompt", "answer", true))
    if (model::jsonl_held_out(r, 0.1)) held.insert(r.first);
  ASSERT_FALSE(held.empty());
  std::set<std::string> trained;
  for (int64_t i = 0; i < 400; ++i) {
    const Prompt p = task->train_prompt(i);
    EXPECT_EQ(held.count(p.text), 0u) << p.text;
    trained.insert(p.text);
    EXPECT_EQ(p.tokens.front(), 256);
    EXPECT_EQ(p.answer.back(), 256);
    EXPECT_EQ(p.answer_text, std::to_string(std::stoi(p.text.substr(1)) * 3));
    EXPECT_EQ(p.meta_json, "{\"i\":" + p.text.substr(1) + "}");
  }
  EXPECT_EQ(trained.size() + held.size(), 200u);  // two epochs cover every training prompt
  EXPECT_EQ(task->train_prompt(17).text, make_jsonl_task(rl_, data_, 7)->train_prompt(17).text);  // pure in (seed, index)
  const auto eval = task->eval_prompts(1000);
  EXPECT_EQ(eval.size(), held.size());
  for (const auto& p : eval) EXPECT_EQ(held.count(p.text), 1u);
}

TEST_F(JsonlTaskTest, TextRewards) {
  const auto exact = make_jsonl_task(rl_, data_, 1);
  const Prompt p = exact->train_prompt(0);
  const std::string a = p.answer_text;
  EXPECT_TRUE(score(*exact, p, "  " + a + "\n").correct);
  EXPECT_EQ(score(*exact, p, a).reward, 1.0);
  EXPECT_FALSE(score(*exact, p, a + "0").correct);
  EXPECT_EQ(score(*exact, p, "x").reward, 0.0);

  rl_.reward = RewardSource::numeric;
  rl_.reward_tolerance = 0.01;
  const auto numeric = make_jsonl_task(rl_, data_, 1);
  const double v = std::stod(a);
  EXPECT_TRUE(score(*numeric, p, "the answer is " + std::to_string(v + 0.005 * std::max(1.0, v))).correct);
  EXPECT_FALSE(score(*numeric, p, "the answer is " + std::to_string(v + 0.02 * std::max(1.0, v))).correct);
  EXPECT_TRUE(score(*numeric, p, "3 then " + a).correct);  // the last number counts
  EXPECT_FALSE(score(*numeric, p, "no number").correct);

  rl_.reward = RewardSource::regex;
  rl_.answer_pattern = "#### (.*)";
  const auto regex = make_jsonl_task(rl_, data_, 1);
  EXPECT_TRUE(score(*regex, p, "work... #### " + a).correct);
  EXPECT_FALSE(score(*regex, p, a).correct);  // no marker: no answer
  rl_.answer_pattern = "([";
  EXPECT_THROW(make_jsonl_task(rl_, data_, 1), std::invalid_argument);
}

TEST_F(JsonlTaskTest, ARewardProgramScoresTheBatchWithPromptAnswerAndMeta) {
  // Reward: 1 when the completion equals the answer, else meta.i / 1000.
  std::ofstream(dir_ / "r.py") << "import json, sys\n"
                                  "for line in sys.stdin:\n"
                                  "    q = json.loads(line)\n"
                                  "    ok = q['completion'].strip() == q['answer']\n"
                                  "    print(json.dumps({'id': q['id'], 'reward': 1.0 if ok else q['meta']['i'] / 1000, 'correct': ok}), flush=True)\n";
  rl_.reward = RewardSource::command;
  rl_.reward_command = {"python3", "r.py"};
  const auto task = make_jsonl_task(rl_, data_, 1);
  const auto tok = model::make_byte_tokenizer();
  std::vector<Prompt> ps;
  for (int64_t i = 0; i < 6; ++i) ps.push_back(task->train_prompt(i));
  std::vector<std::vector<int32_t>> cs;
  for (size_t i = 0; i < ps.size(); ++i) {
    cs.push_back(tok->encode(i % 2 == 0 ? ps[i].answer_text : "wrong"));
    cs.back().push_back(tok->eos_id());
  }
  std::vector<const Prompt*> pp;
  std::vector<std::span<const int32_t>> cc;
  for (size_t i = 0; i < ps.size(); ++i) pp.push_back(&ps[i]), cc.push_back(cs[i]);
  const auto v = task->verifier().score_batch(pp, cc);
  ASSERT_EQ(v.size(), 6u);
  for (size_t i = 0; i < v.size(); ++i) {
    EXPECT_EQ(v[i].correct, i % 2 == 0);
    EXPECT_TRUE(v[i].finished);
    const double want = i % 2 == 0 ? 1.0 : std::stoi(ps[i].text.substr(1)) / 1000.0;
    EXPECT_DOUBLE_EQ(v[i].reward, want);
  }
  // The same completions score the same (a deterministic program).
  EXPECT_EQ(task->verifier().score_batch(pp, cc)[3].reward, v[3].reward);
}

TEST_F(JsonlTaskTest, AGeneratorsCopyNeverStartsTheProgram) {
  rl_.reward = RewardSource::command;
  rl_.reward_command = {(dir_ / "missing-program").string()};
  const auto task = make_jsonl_task(rl_, data_, 1);  // prompts only: nothing started
  EXPECT_NO_THROW(task->train_prompt(3));
  EXPECT_THROW(task->verifier(), RewardCommandError);  // the first scorer finds it missing
}

}  // namespace
}  // namespace troupe::rl
