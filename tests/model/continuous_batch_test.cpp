// Continuous batching (model/continuous_batch.hpp) on the host backend: a
// sequence's tokens, log-probs and versions are the same bits whatever slot
// it lands in, whoever shares its steps, however many slots there are and
// when it starts; freed slots go to queued sequences in order, at once;
// a recompute under the same weights changes nothing; the tokens equal the
// whole-batch generator's; bad input.
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/continuous_batch.hpp"
#include "model/kv_generate.hpp"
#include "model/params.hpp"
#include "model/weights.hpp"
#include "tests/model/model_test_util.hpp"

namespace troupe::test {
namespace {

using model::ModelConfig;

ModelConfig config(const std::string& ffn) {
  ModelConfig c = tiny_config(ffn);
  c.vocab_size = 24;
  c.d_model = 16;
  c.n_heads = 2;
  c.seq_len = 24;
  return c;
}

struct Model {
  Model(kernels::Backend& be, const ModelConfig& c, uint64_t seed) : layout(model::build_param_layout(c)) {
    flat = be.from_f32({layout.total()}, model::init_params(layout, c, seed));
    w = model::bind_weights(layout, c, flat);
  }
  model::ParamLayout layout;
  kernels::Tensor flat;
  model::ModelWeights w;
};

const std::vector<std::vector<int32_t>> kPrompts{{1, 2, 3}, {4, 5, 6, 7, 8, 9, 10}, {11}, {3, 3}, {9, 8, 7, 6}, {2}, {5, 5, 5}};
const std::vector<uint64_t> kSeeds{101, 202, 303, 404, 505, 606, 707};

model::GenerateOptions options() {
  model::GenerateOptions o;
  o.max_new_tokens = 14;
  o.sampling.temperature = 1.3;  // spread-out distributions: many distinct draws and lengths
  o.eos = 0;
  return o;
}

// Runs the prompts `order` (indices into kPrompts) as one job; `max_live`
// gives each step's cap (cycled). The completions come back in kPrompts order.
std::vector<model::Completion> run(kernels::Backend& be, const ModelConfig& c, const Model& m, int64_t slots,
                                   const std::vector<size_t>& order, const std::vector<int64_t>& max_live = {}) {
  std::vector<std::vector<int32_t>> prompts;
  std::vector<model::SamplerRng> rngs;
  for (size_t i : order) {
    prompts.push_back(kPrompts[i]);
    rngs.emplace_back(kSeeds[i]);
  }
  model::ContinuousBatch cb(be, c, slots);
  cb.start(prompts, rngs, options());
  int64_t step = 0;
  while (cb.step(m.w, /*version=*/step, max_live.empty() ? slots : max_live[static_cast<size_t>(step) % max_live.size()]))
    ++step;
  const auto got = cb.finish();
  std::vector<model::Completion> out(kPrompts.size());
  for (size_t j = 0; j < order.size(); ++j) out[order[j]] = got[j];
  return out;
}

void expect_same_bits(const model::Completion& a, const model::Completion& b, const std::string& what) {
  EXPECT_EQ(a.tokens, b.tokens) << what;
  EXPECT_EQ(a.stop, b.stop) << what;
  ASSERT_EQ(a.logprobs.size(), b.logprobs.size()) << what;
  EXPECT_EQ(0, std::memcmp(a.logprobs.data(), b.logprobs.data(), a.logprobs.size() * sizeof(float))) << what;
}

class ContinuousBatchTest : public ::testing::TestWithParam<std::string> {};

TEST_P(ContinuousBatchTest, ASequenceIsTheSameBitsInAnySlotWithAnyMates) {
  auto be = kernels::make_backend({});
  const ModelConfig c = config(GetParam());
  const Model m(*be, c, 5);
  const std::vector<size_t> all{0, 1, 2, 3, 4, 5, 6};
  const auto alone_each = [&] {
    std::vector<model::Completion> out(kPrompts.size());
    for (size_t i = 0; i < kPrompts.size(); ++i) out[i] = run(*be, c, m, 1, {i})[i];
    return out;
  }();
  struct Schedule {
    std::string name;
    int64_t slots;
    std::vector<size_t> order;
    std::vector<int64_t> max_live;
  };
  const std::vector<Schedule> schedules{{"one slot", 1, all, {}},
                                        {"two slots", 2, all, {}},
                                        {"three slots, reversed", 3, {6, 5, 4, 3, 2, 1, 0}, {}},
                                        {"all at once", 7, all, {}},
                                        {"caps that vary by step", 4, {3, 0, 6, 1, 5, 2, 4}, {1, 3, 2, 4, 4}}};
  bool lengths_differ = false;
  for (const Schedule& s : schedules) {
    const auto got = run(*be, c, m, s.slots, s.order, s.max_live);
    for (size_t i = 0; i < kPrompts.size(); ++i) {
      expect_same_bits(alone_each[i], got[i], s.name + ", sequence " + std::to_string(i));
      lengths_differ |= got[i].tokens.size() != got[0].tokens.size();
    }
  }
  EXPECT_TRUE(lengths_differ) << "the test needs sequences that finish at different steps";
  // The tokens are the whole-batch generator's (its GEMMs are BLAS: the
  // log-probs agree to rounding, the draws here all the same).
  model::BatchGenerator gen(*be, c);
  std::vector<model::SamplerRng> rngs;
  for (uint64_t s : kSeeds) rngs.emplace_back(s);
  const auto batch = gen.generate(m.w, kPrompts, rngs, options());
  for (size_t i = 0; i < kPrompts.size(); ++i) {
    EXPECT_EQ(batch[i].tokens, alone_each[i].tokens) << i;
    for (size_t t = 0; t < batch[i].logprobs.size() && t < alone_each[i].logprobs.size(); ++t)
      EXPECT_NEAR(batch[i].logprobs[t], alone_each[i].logprobs[t], 1e-4);
  }
}

// Freed slots go to the queue's head at the next step: with every sequence's
// length known (they do not depend on the schedule), a FIFO simulation says
// at which step each one samples its first token, and the recorded version
// (the step index here) must say the same.
TEST_P(ContinuousBatchTest, FreedSlotsGoToQueuedSequencesInOrderAtOnce) {
  auto be = kernels::make_backend({});
  const ModelConfig c = config(GetParam());
  const Model m(*be, c, 7);
  const std::vector<size_t> all{0, 1, 2, 3, 4, 5, 6};
  for (int64_t slots : {1, 2, 3}) {
    const auto got = run(*be, c, m, slots, all);
    // Simulate: a sequence admitted at step a feeds its prompt at steps
    // a .. a+P-1, samples its first token at a+P-1 and its last at a+P-1+L-1;
    // its slot is free from the next step.
    std::vector<int64_t> free_at(static_cast<size_t>(slots), 0);
    for (size_t i = 0; i < kPrompts.size(); ++i) {
      auto slot = std::min_element(free_at.begin(), free_at.end());
      const int64_t admitted = *slot;
      const int64_t first = admitted + static_cast<int64_t>(kPrompts[i].size()) - 1;
      ASSERT_FALSE(got[i].versions.empty());
      EXPECT_EQ(got[i].versions.front(), first) << "slots " << slots << ", sequence " << i;
      EXPECT_EQ(got[i].versions.back(), first + static_cast<int64_t>(got[i].tokens.size()) - 1);
      *slot = first + static_cast<int64_t>(got[i].tokens.size());
    }
  }
}

// Recomputing the cache under the same weights mid-generation changes no bit
// (the recompute's chunk computes each position as the steps did).
TEST_P(ContinuousBatchTest, RecomputeUnderTheSameWeightsChangesNothing) {
  auto be = kernels::make_backend({});
  const ModelConfig c = config(GetParam());
  const Model m(*be, c, 9);
  const auto want = run(*be, c, m, 3, {0, 1, 2, 3, 4, 5, 6});
  std::vector<model::SamplerRng> rngs;
  for (uint64_t s : kSeeds) rngs.emplace_back(s);
  model::ContinuousBatch cb(*be, c, 3);
  cb.start(kPrompts, rngs, options());
  int64_t step = 0;
  while (cb.step(m.w, step)) {
    if (step % 4 == 2) cb.recompute(m.w);
    ++step;
  }
  const auto got = cb.finish();
  for (size_t i = 0; i < kPrompts.size(); ++i) expect_same_bits(want[i], got[i], "sequence " + std::to_string(i));
}

INSTANTIATE_TEST_SUITE_P(Ffn, ContinuousBatchTest, ::testing::Values("dense", "moe"));

TEST(ContinuousBatch, RejectsBadInput) {
  auto be = kernels::make_backend({});
  const ModelConfig c = config("dense");
  EXPECT_THROW(model::ContinuousBatch(*be, c, 0), std::invalid_argument);
  model::ContinuousBatch cb(*be, c, 2);
  std::vector<model::SamplerRng> rngs(2, model::SamplerRng(1));
  EXPECT_THROW(cb.start({{1, 2}, std::vector<int32_t>(24, 1)}, rngs, options()), std::invalid_argument);
  EXPECT_THROW(cb.start({{1, 2}, {}}, rngs, options()), std::invalid_argument);
  EXPECT_THROW(cb.start({{1, 2}, {99}}, rngs, options()), std::invalid_argument);
  EXPECT_THROW(cb.start({{1, 2}}, rngs, options()), std::invalid_argument);
}

}  // namespace
}  // namespace troupe::test
