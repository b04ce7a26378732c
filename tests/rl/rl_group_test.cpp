// Tests of rl/group (group ids, prompt indices, sampler seeds, group-relative
// advantages, zero-variance groups) and rl/config (presets, names, checks).
#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <vector>

#include "model/sampling.hpp"
#include "rl/config.hpp"
#include "rl/group.hpp"

using namespace troupe::rl;

namespace {

struct Advantages {
  std::vector<double> a;
  std::vector<uint8_t> keep;
  GroupStats stats;
};

Advantages run(const std::vector<double>& rewards, int64_t group_size, AdvantageOptions opt) {
  Advantages out;
  out.a.assign(rewards.size(), -99.0);
  out.keep.assign(rewards.size() / static_cast<size_t>(group_size), 7);
  out.stats = group_advantages(out.a, out.keep, rewards, group_size, opt);
  return out;
}

AdvantageOptions grpo() { return AdvantageOptions{true, 1e-6, false}; }
AdvantageOptions dr_grpo() { return AdvantageOptions{false, 1e-6, false}; }

}  // namespace

TEST(RlAdvantages, HandComputedGrpoAndDrGrpo) {
  // One group {1, 0, 0, 1}: mean 0.5; sample std sqrt(4 * 0.25 / 3) = sqrt(1/3).
  const std::vector<double> r{1, 0, 0, 1};
  const double sd = std::sqrt(1.0 / 3.0);
  const Advantages g = run(r, 4, grpo());
  const std::vector<double> expect_g{0.5 / (sd + 1e-6), -0.5 / (sd + 1e-6), -0.5 / (sd + 1e-6), 0.5 / (sd + 1e-6)};
  for (size_t i = 0; i < 4; ++i) EXPECT_NEAR(g.a[i], expect_g[i], 1e-12) << i;
  EXPECT_NEAR(g.a[0], 0.8660254, 1e-5);  // 0.5 * sqrt(3), less a hair for the eps
  const Advantages d = run(r, 4, dr_grpo());
  const std::vector<double> expect_d{0.5, -0.5, -0.5, 0.5};
  EXPECT_EQ(d.a, expect_d);
  // Rewards 3 of 4 right: mean 0.75, Dr. GRPO gives +0.25 / -0.75.
  const Advantages d2 = run({1, 1, 0, 1}, 4, dr_grpo());
  EXPECT_EQ(d2.a, (std::vector<double>{0.25, 0.25, -0.75, 0.25}));
  EXPECT_EQ(d2.keep, std::vector<uint8_t>{1});
}

TEST(RlAdvantages, MatchFloat64ReferenceOnRandomGroups) {
  troupe::model::SamplerRng rng(3);
  for (int64_t g : {2, 3, 8, 16}) {
    std::vector<double> r(static_cast<size_t>(5 * g));
    for (double& x : r) x = std::floor(rng.next_double() * 4) / 3.0 - 0.2;  // a few distinct values
    for (bool scale : {true, false}) {
      const Advantages out = run(r, g, AdvantageOptions{scale, 1e-4, false});
      for (int64_t grp = 0; grp < 5; ++grp) {
        long double mean = 0;
        for (int64_t k = 0; k < g; ++k) mean += r[static_cast<size_t>(grp * g + k)];
        mean /= g;
        long double ss = 0;
        for (int64_t k = 0; k < g; ++k) {
          const long double dlt = r[static_cast<size_t>(grp * g + k)] - mean;
          ss += dlt * dlt;
        }
        const long double sd = std::sqrt(ss / (g - 1));
        for (int64_t k = 0; k < g; ++k) {
          const auto i = static_cast<size_t>(grp * g + k);
          const long double centred = r[i] - mean;
          const double expect = static_cast<double>(scale ? centred / (sd + 1e-4L) : centred);
          EXPECT_NEAR(out.a[i], ss == 0 ? 0.0 : expect, 1e-12) << "g " << g << " group " << grp << " k " << k;
        }
      }
    }
  }
}

TEST(RlAdvantages, ZeroVarianceGroupsAreExactlyZeroCountedAndOptionallyDropped) {
  // Groups: all right, mixed, all 0.1 (its float mean is not exactly 0.1), all wrong.
  const std::vector<double> r{1, 1, 1, 0, 1, 0, 0.1, 0.1, 0.1, 0, 0, 0};
  for (bool drop : {false, true}) {
    const Advantages out = run(r, 3, AdvantageOptions{true, 1e-6, drop});
    for (size_t i : {0u, 1u, 2u, 6u, 7u, 8u, 9u, 10u, 11u}) EXPECT_EQ(out.a[i], 0.0) << i;
    EXPECT_LT(out.a[3], 0.0);  // the mixed group {0, 1, 0}
    EXPECT_GT(out.a[4], 0.0);
    EXPECT_EQ(out.stats.groups, 4);
    EXPECT_EQ(out.stats.zero_variance_groups, 3);
    EXPECT_DOUBLE_EQ(out.stats.zero_variance_share, 0.75);
    const std::vector<uint8_t> keep = drop ? std::vector<uint8_t>{0, 1, 0, 0} : std::vector<uint8_t>{1, 1, 1, 1};
    EXPECT_EQ(out.keep, keep);
    EXPECT_EQ(out.stats.kept_groups, drop ? 1 : 4);
  }
}

TEST(RlAdvantages, RewardStatsAndErrors) {
  const Advantages out = run({1, 0, 0, 0, 1, 1, 1, 0}, 4, grpo());
  EXPECT_DOUBLE_EQ(out.stats.reward_mean, 0.5);
  EXPECT_DOUBLE_EQ(out.stats.reward_std, 0.5);
  std::vector<double> a(4);
  std::vector<uint8_t> keep(1);
  const std::vector<double> r{1, 0, 1, 0};
  EXPECT_THROW(group_advantages(a, keep, r, 3, grpo()), std::invalid_argument);  // not whole groups
  EXPECT_THROW(group_advantages(a, keep, r, 0, grpo()), std::invalid_argument);
  std::vector<uint8_t> keep2(2);
  EXPECT_THROW(group_advantages(a, keep2, r, 4, grpo()), std::invalid_argument);
  const std::vector<double> nan{1, NAN, 0, 1};
  EXPECT_THROW(group_advantages(a, keep, nan, 4, grpo()), std::invalid_argument);
  EXPECT_THROW(group_advantages(a, keep, r, 4, AdvantageOptions{true, 0.0, false}), std::invalid_argument);
}

TEST(RlGroups, PromptIndicesAndSamplerSeedsAreAPureFunctionOfTheId) {
  EXPECT_EQ(prompt_index(GroupId{1, 0, 0}, 8), 0);
  EXPECT_EQ(prompt_index(GroupId{1, 3, 5}, 8), 29);
  EXPECT_EQ(prompt_index(GroupId{2, 3, 5}, 8), 29) << "the seed picks the task's stream, not the index";
  EXPECT_THROW(prompt_index(GroupId{1, 0, 8}, 8), std::invalid_argument);
  EXPECT_THROW(prompt_index(GroupId{1, -1, 0}, 8), std::invalid_argument);
  EXPECT_THROW(prompt_index(GroupId{1, 0, 0}, 0), std::invalid_argument);
  // Every (seed, step, index, member) gets its own seed, the same each time.
  std::set<uint64_t> seeds;
  for (uint64_t seed : {0ull, 1ull})
    for (int64_t step = 0; step < 20; ++step)
      for (int64_t index = 0; index < 8; ++index)
        for (int64_t member = 0; member < 8; ++member) {
          const GroupId id{seed, step, index};
          EXPECT_EQ(sampler_seed(id, member), sampler_seed(GroupId{seed, step, index}, member));
          seeds.insert(sampler_seed(id, member));
        }
  EXPECT_EQ(seeds.size(), 2u * 20 * 8 * 8);
  EXPECT_LT(GroupId(1, 2, 3), GroupId(1, 2, 4));
  EXPECT_EQ(GroupId(1, 2, 3), GroupId(1, 2, 3));
}

TEST(RlGroups, ExpandToTokensAndOffsetChecks) {
  const std::vector<int64_t> offsets{0, 2, 2, 5};
  std::vector<double> out(5);
  expand_to_tokens(out, std::vector<double>{1.5, 9.0, -2.0}, offsets);
  EXPECT_EQ(out, (std::vector<double>{1.5, 1.5, -2.0, -2.0, -2.0}));
  EXPECT_THROW(expand_to_tokens(out, std::vector<double>{1, 2}, offsets), std::invalid_argument);
  EXPECT_THROW(check_offsets(std::vector<int64_t>{1, 5}, 5), std::invalid_argument);
  EXPECT_THROW(check_offsets(std::vector<int64_t>{0, 3, 2, 5}, 5), std::invalid_argument);
  EXPECT_THROW(check_offsets(std::vector<int64_t>{0, 4}, 5), std::invalid_argument);
  EXPECT_THROW(check_offsets(std::vector<int64_t>{}, 0), std::invalid_argument);
  EXPECT_NO_THROW(check_offsets(std::vector<int64_t>{0}, 0));
}

TEST(RlConfig, PresetsFollowThePublishedSettings) {
  const RlConfig g = rl_preset(LossKind::grpo, 6);
  EXPECT_TRUE(g.advantage.scale_by_std);
  EXPECT_EQ(g.policy.aggregation, Aggregation::seq_mean);
  EXPECT_EQ(g.policy.clip_low, 0.2);
  EXPECT_EQ(g.policy.clip_high, 0.2);
  const RlConfig d = rl_preset(LossKind::dr_grpo, 6);
  EXPECT_FALSE(d.advantage.scale_by_std);
  EXPECT_EQ(d.policy.aggregation, Aggregation::seq_constant);
  EXPECT_EQ(d.policy.constant_norm, 6.0);
  const RlConfig a = rl_preset(LossKind::dapo, 6);
  EXPECT_EQ(a.policy.clip_low, 0.2);
  EXPECT_EQ(a.policy.clip_high, 0.28);
  EXPECT_EQ(a.policy.aggregation, Aggregation::token_mean);
  EXPECT_TRUE(a.advantage.drop_zero_variance);
  const RlConfig p = rl_preset(LossKind::decoupled_ppo, 6);
  EXPECT_EQ(p.policy.kind, LossKind::decoupled_ppo);
  EXPECT_EQ(p.policy.cap_mode, CapMode::mask);
  EXPECT_GT(p.policy.behaviour_weight_cap, 1.0);
  for (LossKind k : {LossKind::grpo, LossKind::dr_grpo, LossKind::dapo, LossKind::decoupled_ppo}) {
    EXPECT_EQ(rl_preset(k, 6).policy.kind, k);
    EXPECT_TRUE(check_config(rl_preset(k, 6)).empty()) << loss_kind_name(k);
    EXPECT_EQ(parse_loss_kind(loss_kind_name(k)), k);
  }
  for (Aggregation x : {Aggregation::token_mean, Aggregation::seq_mean, Aggregation::seq_constant})
    EXPECT_EQ(parse_aggregation(aggregation_name(x)), x);
  for (CapMode x : {CapMode::mask, CapMode::clip}) EXPECT_EQ(parse_cap_mode(cap_mode_name(x)), x);
}

TEST(RlConfig, UnknownNamesListTheChoices) {
  try {
    parse_loss_kind("grpo2");
    FAIL() << "no error";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("'grpo2' (expected \"grpo\", \"dr_grpo\", \"dapo\" or \"decoupled_ppo\")"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(parse_aggregation("mean"), std::invalid_argument);
  EXPECT_THROW(parse_cap_mode("drop"), std::invalid_argument);
}

TEST(RlConfig, ChecksNameTheKeyAndTheRule) {
  auto keys = [](const RlConfig& c) {
    std::vector<std::string> out;
    for (const auto& p : check_config(c)) out.push_back(p.key);
    return out;
  };
  RlConfig c = rl_preset(LossKind::grpo, 8);
  c.group_size = 1;
  ASSERT_EQ(keys(c), std::vector<std::string>{"group_size"});
  EXPECT_NE(check_config(c)[0].message.find("group-relative"), std::string::npos);
  c = rl_preset(LossKind::decoupled_ppo, 8);
  c.policy.behaviour_weight_cap = 0.5;
  EXPECT_EQ(keys(c), std::vector<std::string>{"behaviour_weight_cap"});
  c.policy.behaviour_weight_cap = 0.0;  // no cap
  EXPECT_TRUE(keys(c).empty());
  c.policy.clip_low = 1.0;
  c.policy.clip_high = -0.1;
  c.policy.kl_coef = -1;
  EXPECT_EQ(keys(c), (std::vector<std::string>{"clip_low", "clip_high", "kl_coef"}));
  EXPECT_EQ(check_config(c)[0].message, "clip_low = 1 must be in [0, 1) (the ratio is clipped below at 1 - clip_low)");
  EXPECT_EQ(check_config(c)[1].message, "clip_high = -0.1 must be >= 0");
  c = rl_preset(LossKind::dr_grpo, 0);  // the config carries max_new_tokens, which must be >= 1 too
  EXPECT_EQ(keys(c), (std::vector<std::string>{"max_new_tokens", "constant_norm"}));
  c = rl_preset(LossKind::grpo, 8);
  c.prompts_per_step = 0;
  c.temperature = 0.0;
  c.top_p = 1.5;
  c.updates_per_batch = 0;
  EXPECT_EQ(keys(c), (std::vector<std::string>{"prompts_per_step", "temperature", "top_p", "updates_per_batch"}));
  EXPECT_NE(check_config(c)[1].message.find("greedy decoding would make every completion of a group the same"),
            std::string::npos);
  c = rl_preset(LossKind::dapo, 8);
  c.verifier.partial_credit = 1.0;
  c.verifier.format_penalty = -0.5;
  c.advantage.std_eps = 0;
  EXPECT_EQ(keys(c), (std::vector<std::string>{"std_eps", "partial_credit", "format_penalty"}));
}
