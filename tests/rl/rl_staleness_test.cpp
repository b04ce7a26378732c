// Tests of the staleness rules (rl/staleness.hpp: the admission windows of
// fixed_lag and latest, closed form), the step-wise PolicyCopy that
// rl.sync = "latest" decodes with (no load in between: the same bits as
// sample(); a load between two decode steps: the tokens after it carry the
// new version and log-probs of the new weights), and the version store a
// fixed_lag checkpoint resumes from (round trip, missing version).
#include <gtest/gtest.h>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <vector>

#include "model/checkpoint.hpp"
#include "model/params.hpp"
#include "model/weights.hpp"
#include "rl/rollout_step.hpp"
#include "rl/staleness.hpp"
#include "rl/version_store.hpp"
#include "tests/rl/rl_test_util.hpp"

namespace troupe::test {
namespace {

using rl::SyncMode;

TEST(RlStaleness, AdmissionWindowsOfBothModes) {
  // fixed_lag pins step s to version max(0, s - eta); latest admits
  // [s - eta, s] (clamped at 0).
  EXPECT_EQ(rl::admissible_versions(SyncMode::fixed_lag, 5, 2).lo, 3);
  EXPECT_EQ(rl::admissible_versions(SyncMode::fixed_lag, 5, 2).hi, 3);
  EXPECT_EQ(rl::admissible_versions(SyncMode::fixed_lag, 1, 2).lo, 0);
  EXPECT_EQ(rl::admissible_versions(SyncMode::fixed_lag, 1, 2).hi, 0);
  EXPECT_EQ(rl::admissible_versions(SyncMode::latest, 5, 2).lo, 3);
  EXPECT_EQ(rl::admissible_versions(SyncMode::latest, 5, 2).hi, 5);
  EXPECT_EQ(rl::admissible_versions(SyncMode::latest, 1, 2).lo, 0);
  EXPECT_EQ(rl::admissible_versions(SyncMode::latest, 1, 2).hi, 1);
  EXPECT_EQ(rl::admissible_versions(SyncMode::latest, 4, 0).lo, 4) << "eta 0: on-policy only";
  EXPECT_EQ(rl::admissible_versions(SyncMode::latest, 4, 0).hi, 4);
  EXPECT_EQ(rl::first_version_for(7, 3), 4);
  EXPECT_EQ(rl::first_version_for(2, 3), 0);
}

TEST(RlStaleness, WithinLagsAndDistinctVersions) {
  const std::vector<int64_t> ok{3, 4, 5, 5}, old{2, 5}, none;
  EXPECT_TRUE(rl::within(ok, {3, 5}));
  EXPECT_FALSE(rl::within(old, {3, 5})) << "a token older than s - eta";
  EXPECT_FALSE(rl::within(ok, {3, 4})) << "a token newer than the trainer";
  EXPECT_TRUE(rl::within(none, {3, 3}));
  std::map<int64_t, int64_t> h;
  rl::add_version_lags(h, ok, 5);
  EXPECT_EQ(h, (std::map<int64_t, int64_t>{{0, 2}, {1, 1}, {2, 1}}));
  EXPECT_EQ(rl::distinct_versions(ok), 3);
  EXPECT_EQ(rl::distinct_versions(none), 0);
}

struct CopyFixture {
  rl::RlTrainOptions o = tiny_options("moe");
  FirstTokenTask task;
  model::ParamLayout layout = model::build_param_layout(o.model);
  std::vector<float> p0 = model::init_params(layout, o.model, 11);
  std::vector<float> p1 = model::init_params(layout, o.model, 12);  // another policy: "version 1"
  CopyFixture() {
    o.rl.prompts_per_step = 3;
    o.rl.group_size = 4;
    o.rl.max_new_tokens = 3;
  }
};

TEST(RlStaleness, StepwiseDecodingEqualsSampleWithoutALoad) {
  CopyFixture f;
  rl::PolicyCopy a(f.o.model, f.o.backend, rl::generation_slots(f.o.rl)), b(f.o.model, f.o.backend, rl::generation_slots(f.o.rl));
  a.load(f.p0, 0);
  b.load(f.p0, 0);
  const rl::StepRollouts whole = a.sample(f.task, f.o.rl, 9, 2);
  b.begin(f.task, f.o.rl, 9, 2);
  EXPECT_TRUE(b.generating());
  while (b.decode()) {
  }
  auto finished = b.take_finished();
  ASSERT_TRUE(finished.has_value());
  const rl::StepRollouts steps = std::move(finished->rollouts);
  EXPECT_FALSE(b.generating());
  ASSERT_EQ(whole.completions.size(), steps.completions.size());
  for (size_t i = 0; i < whole.completions.size(); ++i) {
    EXPECT_EQ(whole.completions[i].tokens, steps.completions[i].tokens);
    EXPECT_EQ(whole.completions[i].logprobs, steps.completions[i].logprobs);
    EXPECT_EQ(whole.completions[i].versions, steps.completions[i].versions);
  }
  EXPECT_EQ(whole.ids, steps.ids);
}

TEST(RlStaleness, LoadBetweenDecodeStepsSwitchesTheRestOfTheRollout) {
  CopyFixture f;
  rl::PolicyCopy old_only(f.o.model, f.o.backend, rl::generation_slots(f.o.rl)), mixed(f.o.model, f.o.backend, rl::generation_slots(f.o.rl));
  old_only.load(f.p0, 0);
  const rl::StepRollouts ref = old_only.sample(f.task, f.o.rl, 9, 1);
  mixed.load(f.p0, 0);
  mixed.begin(f.task, f.o.rl, 9, 1);
  // Each decode step feeds one prompt token (chunked prefill, chunk 1): the
  // step that feeds the last one samples every sequence's first token, by version 0.
  const size_t prompt = f.task.train_prompt(0).tokens.size();
  for (size_t i = 0; i < prompt; ++i) ASSERT_TRUE(mixed.decode());
  mixed.load(f.p1, 1);  // the fence: version 1 for the rest
  EXPECT_EQ(mixed.adopt_newest(false), 1);
  while (mixed.decode()) {
  }
  auto finished = mixed.take_finished();
  ASSERT_TRUE(finished.has_value());
  const rl::StepRollouts r = std::move(finished->rollouts);
  EXPECT_EQ(r.version, 0) << "the version the step started with";
  int64_t spanning = 0;
  bool other_logp = false;
  for (size_t i = 0; i < r.completions.size(); ++i) {
    const model::Completion& c = r.completions[i];
    ASSERT_EQ(c.versions.size(), c.tokens.size());
    ASSERT_FALSE(c.tokens.empty());
    EXPECT_EQ(c.versions[0], 0);
    EXPECT_EQ(c.tokens[0], ref.completions[i].tokens[0]) << "same weights, same seed: same first token";
    EXPECT_EQ(c.logprobs[0], ref.completions[i].logprobs[0]);
    for (size_t t = 1; t < c.versions.size(); ++t) EXPECT_EQ(c.versions[t], 1) << "completion " << i << " token " << t;
    spanning += rl::distinct_versions(c.versions) == 2;
    // A token after the switch is scored by the new weights.
    if (c.tokens.size() > 1 && ref.completions[i].tokens.size() > 1 && c.tokens[1] == ref.completions[i].tokens[1] &&
        c.logprobs[1] != ref.completions[i].logprobs[1])
      other_logp = true;
  }
  EXPECT_GT(spanning, 0) << "some rollout spans the publication";
  EXPECT_TRUE(other_logp) << "the behaviour log-prob after the switch is the new policy's";
}

// A generator's copy runs two steps side by side in its slots, each with its
// own version's weights (fixed_lag: step 2 by version 1 while step 1 by
// version 0 finishes): each step's rollouts are the same bits as the step
// sampled alone with all the slots it wants, and the second step began
// before the first one ended.
TEST(RlStaleness, TwoStepsSideBySideEqualEachAlone) {
  CopyFixture f;
  f.o.rl.max_new_tokens = 6;  // lengths differ: the first step's tail frees slots
  rl::PolicyCopy alone(f.o.model, f.o.backend, rl::generation_slots(f.o.rl));
  alone.load(f.p0, 0);
  const rl::StepRollouts want1 = alone.sample(f.task, f.o.rl, 9, 1);
  alone.load(f.p1, 1);
  const rl::StepRollouts want2 = alone.sample(f.task, f.o.rl, 9, 2);

  rl::PolicyCopy shared(f.o.model, f.o.backend, 3);
  shared.load(f.p0, 0);
  const int64_t t1 = shared.begin(f.task, f.o.rl, 9, 1);
  while (!shared.can_begin()) ASSERT_TRUE(shared.decode());
  shared.load(f.p1, 1);  // the running step keeps version 0
  const int64_t t2 = shared.begin(f.task, f.o.rl, 9, 2);
  EXPECT_EQ(shared.running_steps(), 2);
  std::map<int64_t, rl::StepRollouts> got;
  bool overlapped = false;
  for (int guard = 0; got.size() < 2; ++guard) {
    ASSERT_LT(guard, 1000) << "the steps never finished";
    shared.decode();
    while (auto done = shared.take_finished()) got.emplace(done->ticket, std::move(done->rollouts));
    overlapped = overlapped || (got.empty() && shared.running_steps() == 2);
  }
  EXPECT_TRUE(overlapped);
  for (const auto& [want, ticket] : {std::pair{&want1, t1}, std::pair{&want2, t2}}) {
    const rl::StepRollouts& r = got.at(ticket);
    EXPECT_EQ(r.step, want->step);
    EXPECT_EQ(r.version, want->version);
    ASSERT_EQ(r.completions.size(), want->completions.size());
    for (size_t i = 0; i < r.completions.size(); ++i) {
      EXPECT_EQ(r.completions[i].tokens, want->completions[i].tokens) << "step " << r.step << ", completion " << i;
      EXPECT_EQ(r.completions[i].logprobs, want->completions[i].logprobs);
      EXPECT_EQ(r.completions[i].versions, want->completions[i].versions);
    }
  }
}

TEST(RlStaleness, VersionStoreRoundTripsAndNamesAMissingVersion) {
  CopyFixture f;
  const auto dir = std::filesystem::temp_directory_path() / ("troupe_rl_versions_" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  EXPECT_EQ(rl::versions_to_keep(5, 2).first, 3);
  EXPECT_EQ(rl::versions_to_keep(5, 2).end, 5);
  EXPECT_EQ(rl::versions_to_keep(1, 3).first, 0);
  EXPECT_EQ(rl::versions_to_keep(4, 0).first, 4) << "eta 0 keeps nothing";
  std::map<int64_t, std::shared_ptr<const std::vector<float>>> kept;
  kept[3] = std::make_shared<const std::vector<float>>(f.p0);
  kept[4] = std::make_shared<const std::vector<float>>(f.p1);
  rl::save_versions(dir.string(), f.o.model, 5, {3, 5}, kept);
  const auto back = rl::load_versions(dir.string(), f.o.model, {3, 5});
  ASSERT_EQ(back.size(), 2u);
  EXPECT_EQ(back.at(3), f.p0);
  EXPECT_EQ(back.at(4), f.p1);
  EXPECT_THROW(rl::save_versions(dir.string(), f.o.model, 5, {2, 5}, kept), std::invalid_argument)
      << "version 2 was not kept";
  try {
    rl::load_versions(dir.string(), f.o.model, {2, 5});
    ADD_FAILURE() << "a missing version must be an error";
  } catch (const model::CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("rl_versions/v2"), std::string::npos) << e.what();
  }
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace troupe::test
