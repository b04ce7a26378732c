// rollouts.jsonl (launch/observe/rollouts_log.hpp), written by a real RL
// trainer through RlTrainOptions::on_rollouts and read back: one line per
// group of every N-th step, the prompt and completions as the data source's
// text, per-token log-probs and versions as long as the completion, and the
// advantages recomputed from the logged rewards with the run's advantage
// options equal the logged ones to the bit.
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <unistd.h>

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include "launch/observe/rollouts_log.hpp"
#include "model/data.hpp"
#include "rl/group.hpp"
#include "rl/trainer.hpp"
#include "tests/rl/rl_test_util.hpp"

namespace troupe::test {
namespace {

namespace fs = std::filesystem;

TEST(RolloutLog, EveryNthStepsGroupsReadBackWithTheirAdvantages) {
  const fs::path dir = fs::temp_directory_path() / ("troupe_rollouts_" + std::to_string(::getpid()));
  fs::create_directories(dir);
  const std::string path = (dir / "rollouts.jsonl").string();
  rl::RlTrainOptions o = tiny_options("dense");
  o.steps = 4;
  o.rl.prompts_per_step = 3;
  o.rl.group_size = 4;
  o.rl.max_new_tokens = 5;
  std::shared_ptr<const model::DataSource> data = model::make_data_source(o.data, o.seed, o.model.seq_len);
  {
    launch::RolloutLog log(path, [data](const std::vector<int32_t>& t) { return data->decode(t); });
    o.rollouts_every = 2;
    o.on_rollouts = [&log](const rl::StepRollouts& r, const rl::ScoredBatch& sb) { log.write(r, sb); };
    rl::RlTrainer tr(o);
    for (int i = 0; i < 4; ++i) tr.step();
  }
  std::ifstream in(path);
  std::vector<nlohmann::json> lines;
  for (std::string line; std::getline(in, line);) lines.push_back(nlohmann::json::parse(line));
  ASSERT_EQ(lines.size(), 6u) << "steps 2 and 4, 3 groups each";
  for (size_t i = 0; i < lines.size(); ++i) {
    const nlohmann::json& j = lines[i];
    EXPECT_EQ(j["type"], "rollouts");
    EXPECT_EQ(j["step"], i < 3 ? 2 : 4);
    EXPECT_EQ(j["version"], j["step"].get<int64_t>() - 1) << "synchronous: sampled by the version before the step";
    EXPECT_EQ(j["group"], static_cast<int64_t>(i % 3));
    EXPECT_FALSE(j["prompt"].get<std::string>().empty());
    const auto& cs = j["completions"];
    ASSERT_EQ(cs.size(), 4u);
    std::vector<double> rewards, logged;
    for (const auto& c : cs) {
      const size_t n = c["tokens"].get<size_t>();
      EXPECT_EQ(c["logp"].size(), n);
      EXPECT_EQ(c["version"].size(), n);
      for (const auto& v : c["version"]) EXPECT_EQ(v, j["version"]);
      for (const auto& lp : c["logp"]) EXPECT_LE(lp.get<double>(), 0.0);
      rewards.push_back(c["reward"].get<double>());
      logged.push_back(c["advantage"].get<double>());
    }
    std::vector<double> recomputed(rewards.size());
    std::vector<uint8_t> keep(1);
    rl::group_advantages(recomputed, keep, rewards, 4, o.rl.advantage);
    for (size_t k = 0; k < rewards.size(); ++k)
      EXPECT_EQ(std::memcmp(&recomputed[k], &logged[k], sizeof(double)), 0)
          << "line " << i << " completion " << k << ": logged " << logged[k] << ", recomputed " << recomputed[k];
    EXPECT_EQ(j["kept"].get<bool>(), keep[0] != 0);
  }
  fs::remove_all(dir);
}

}  // namespace
}  // namespace troupe::test
