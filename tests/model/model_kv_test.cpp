// KV-cache decoding (model/kv_decoder.hpp, model/kv_generate.hpp) on host and
// OpenCL: the logits of every prefill and decode chunk equal a full recompute
// by the training Decoder within 1e-5 (relative to max(1, |logit|)), for a
// batch of sequences of different lengths, dense and MoE (shared experts,
// selection bias), tied and untied; a sequence's sampled tokens do not depend
// on its batch mates; the recorded log-probs equal the policy head's
// recompute; stop reasons; bad input.
#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/decoder.hpp"
#include "model/generate.hpp"
#include "model/kv_decoder.hpp"
#include "model/kv_generate.hpp"
#include "model/params.hpp"
#include "model/policy_head.hpp"
#include "model/weights.hpp"
#include "tests/model/model_test_util.hpp"

namespace troupe::test {
namespace {

using model::ModelConfig;

// Small but not trivial: contexts long enough for several decode steps.
ModelConfig kv_config(const std::string& ffn) {
  ModelConfig c = tiny_config(ffn);
  c.vocab_size = 24;
  c.d_model = 16;
  c.n_heads = 2;
  c.seq_len = 20;
  c.capacity_factor = 1.0;  // ignored by generation (dropless); the recompute below is dropless too
  return c;
}

struct Case {
  std::string name;
  ModelConfig cfg;
};

std::vector<Case> cases() {
  std::vector<Case> cs;
  cs.push_back({"dense_tied", kv_config("dense")});
  Case m{"moe_shared_untied", kv_config("moe")};
  m.cfg.shared_experts = 1;
  m.cfg.tie_embeddings = false;
  cs.push_back(m);
  Case b{"moe_bias_top1", kv_config("moe")};
  b.cfg.balance = troupe::moe::Balance::bias;
  b.cfg.top_k = 1;
  cs.push_back(b);
  return cs;
}

// Model weights on a backend, with a non-zero selection bias for "bias".
struct Model {
  Model(kernels::Backend& be, const ModelConfig& c, uint64_t seed)
      : layout(model::build_param_layout(c)) {
    std::vector<float> host = model::init_params(layout, c, seed);
    std::mt19937_64 rng(seed + 99);
    std::uniform_real_distribution<float> u(-0.3f, 0.3f);
    for (const auto& e : layout.entries())
      if (!e.trainable)
        for (int64_t i = 0; i < e.numel; ++i) host[e.offset + i] = u(rng);
    flat = be.from_f32({layout.total()}, host);
    w = model::bind_weights(layout, c, flat);
  }
  model::ParamLayout layout;
  kernels::Tensor flat;
  model::ModelWeights w;
};

// Logits [len, V] of a full forward over `seq` (one row, dropless).
std::vector<float> recompute(kernels::Backend& be, model::Decoder& dec, const model::ModelWeights& w,
                             const std::vector<int32_t>& seq) {
  const int64_t S = dec.tokens(), V = dec.config().vocab_size;
  std::vector<int32_t> in(seq), tg(static_cast<size_t>(S), -1);
  in.resize(static_cast<size_t>(S), 0);
  dec.forward(w, in, tg);
  std::vector<float> out(seq.size() * static_cast<size_t>(V));
  be.download(out.data(), dec.logits().rows(0, static_cast<int64_t>(seq.size())), out.size() * sizeof(float));
  return out;
}

double max_rel_diff(const float* a, const float* b, int64_t n) {
  double worst = 0.0;
  for (int64_t i = 0; i < n; ++i)
    worst = std::max(worst, std::fabs(double(a[i]) - double(b[i])) / std::max(1.0, std::fabs(double(b[i]))));
  return worst;
}

class KvTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string why;
    be_ = try_backend(GetParam(), &why);
    if (!be_) GTEST_SKIP() << "no " << GetParam() << " backend: " << why;
  }
  std::unique_ptr<kernels::Backend> be_;
};

TEST_P(KvTest, EveryStepsLogitsEqualFullRecompute) {
  for (const Case& cs : cases()) {
    SCOPED_TRACE(cs.name);
    kernels::Backend& be = *be_;
    const ModelConfig& cfg = cs.cfg;
    const int64_t V = cfg.vocab_size, C = cfg.seq_len;
    Model m(be, cfg, 4);
    ModelConfig full_cfg = cfg;
    full_cfg.capacity_factor = 0.0;
    model::Decoder full(be, full_cfg, 1);

    // Four sequences of different prompt lengths; each then feeds tokens one
    // at a time until its context is full (the short ones decode longest).
    const std::vector<int64_t> prompt_len{3, 9, 1, 6};
    const int64_t B = static_cast<int64_t>(prompt_len.size());
    std::mt19937_64 rng(17);
    std::vector<std::vector<int32_t>> seqs(static_cast<size_t>(B));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t i = 0; i < prompt_len[b]; ++i) seqs[b].push_back(static_cast<int32_t>(rng() % V));
    model::KvDecoder kv(be, cfg, B);

    const int64_t width = 16;  // > the longest prompt: padding is exercised
    std::vector<int32_t> tokens(static_cast<size_t>(B * width), 0), pos(static_cast<size_t>(B), 0);
    for (int64_t b = 0; b < B; ++b) std::copy(seqs[b].begin(), seqs[b].end(), tokens.begin() + b * width);
    std::vector<float> got = be.download_f32(kv.forward(m.w, tokens, width, pos));
    double worst = 0.0;
    for (int64_t b = 0; b < B; ++b) {
      const std::vector<float> want = recompute(be, full, m.w, seqs[b]);
      const double d = max_rel_diff(got.data() + b * width * V, want.data(), prompt_len[b] * V);
      EXPECT_LE(d, 1e-5) << "prefill, sequence " << b;
      worst = std::max(worst, d);
    }
    int64_t steps = 0;
    for (;;) {
      // Every sequence with room feeds one new token; the full ones idle at
      // position 0 (as the generator does).
      std::vector<char> live(static_cast<size_t>(B), 0);
      bool any = false;
      tokens.assign(static_cast<size_t>(B), 0);
      for (int64_t b = 0; b < B; ++b) {
        if (static_cast<int64_t>(seqs[b].size()) >= C) { pos[b] = 0; continue; }
        seqs[b].push_back(static_cast<int32_t>(rng() % V));
        tokens[b] = seqs[b].back();
        pos[b] = static_cast<int32_t>(seqs[b].size() - 1);
        live[b] = 1;
        any = true;
      }
      if (!any) break;
      got = be.download_f32(kv.forward(m.w, tokens, 1, pos));
      ++steps;
      for (int64_t b = 0; b < B; ++b) {
        if (!live[b]) continue;
        const std::vector<float> want = recompute(be, full, m.w, seqs[b]);
        const double d = max_rel_diff(got.data() + b * V, want.data() + (seqs[b].size() - 1) * V, V);
        EXPECT_LE(d, 1e-5) << "decode step " << steps << ", sequence " << b << " at length " << seqs[b].size();
        worst = std::max(worst, d);
      }
    }
    EXPECT_EQ(steps, C - 1);  // the 1-token prompt decodes to the end
    std::printf("[kv %s/%s] %lld decode steps, worst |kv - recompute| / max(1,|logit|) = %.2e\n",
                GetParam().c_str(), cs.name.c_str(), static_cast<long long>(steps), worst);
  }
}

std::vector<model::SamplerRng> rngs_for(const std::vector<uint64_t>& seeds) {
  std::vector<model::SamplerRng> r;
  for (uint64_t s : seeds) r.emplace_back(s);
  return r;
}

TEST_P(KvTest, SequenceOutputDoesNotDependOnBatchMates) {
  kernels::Backend& be = *be_;
  ModelConfig cfg = kv_config("moe");
  cfg.shared_experts = 1;
  Model m(be, cfg, 8);
  const std::vector<std::vector<int32_t>> prompts{{1, 2, 3}, {4, 5, 6, 7, 8, 9, 10}, {11}, {3, 3}};
  const std::vector<uint64_t> seeds{101, 202, 303, 404};
  model::GenerateOptions o;
  o.max_new_tokens = 12;
  o.sampling.temperature = 1.3;  // spread-out distributions: many distinct draws
  o.sampling.top_p = 0.95;
  o.eos = 0;
  model::BatchGenerator gen(be, cfg);
  auto r_all = rngs_for(seeds);
  const auto all = gen.generate(m.w, prompts, r_all, o);
  // Each alone, and two in another order with another mate.
  for (size_t i = 0; i < prompts.size(); ++i) {
    auto r = rngs_for({seeds[i]});
    const auto one = gen.generate(m.w, {prompts[i]}, r, o);
    EXPECT_EQ(one[0].tokens, all[i].tokens) << "sequence " << i << " alone";
    EXPECT_EQ(one[0].stop, all[i].stop);
    ASSERT_EQ(one[0].logprobs.size(), all[i].logprobs.size());
    for (size_t t = 0; t < one[0].logprobs.size(); ++t)
      EXPECT_NEAR(one[0].logprobs[t], all[i].logprobs[t], 1e-5);
    // The RNG advanced by exactly one draw per token.
    model::SamplerRng probe(seeds[i]);
    for (size_t t = 0; t < one[0].tokens.size(); ++t) probe.next_double();
    EXPECT_EQ(r[0].state(), probe.state());
  }
  auto r2 = rngs_for({seeds[3], 999, seeds[1]});
  const auto mix = gen.generate(m.w, {prompts[3], {7, 7, 7, 7, 7}, prompts[1]}, r2, o);
  EXPECT_EQ(mix[0].tokens, all[3].tokens);
  EXPECT_EQ(mix[2].tokens, all[1].tokens);
  // Same seeds, same result (determinism), and different seeds differ somewhere.
  auto r3 = rngs_for(seeds);
  const auto again = gen.generate(m.w, prompts, r3, o);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(again[i].tokens, all[i].tokens);
  auto r4 = rngs_for({1, 2, 3, 4});
  const auto other = gen.generate(m.w, prompts, r4, o);
  bool differs = false;
  for (size_t i = 0; i < prompts.size(); ++i) differs |= other[i].tokens != all[i].tokens;
  EXPECT_TRUE(differs);
}

// The log-prob recorded at sampling equals the policy head's recompute at
// the same temperature: on-policy importance ratios are 1.
TEST_P(KvTest, RecordedLogprobsEqualPolicyHeadRecompute) {
  kernels::Backend& be = *be_;
  for (const Case& cs : cases()) {
    SCOPED_TRACE(cs.name);
    const ModelConfig& cfg = cs.cfg;
    Model m(be, cfg, 12);
    const std::vector<std::vector<int32_t>> prompts{{5, 6}, {1, 2, 3, 4, 5, 6, 7, 8}, {9}};
    model::GenerateOptions o;
    o.max_new_tokens = 30;  // more than fits: the long prompt stops on context_full
    o.sampling.temperature = 0.7;
    auto rngs = rngs_for({7, 8, 9});
    model::BatchGenerator gen(be, cfg);
    const auto out = gen.generate(m.w, prompts, rngs, o);
    const int64_t S = cfg.seq_len, B = 3;
    std::vector<int32_t> in(static_cast<size_t>(B * S), 0), tg(in.size(), -1);
    for (int64_t b = 0; b < B; ++b) {
      EXPECT_EQ(out[b].stop, model::StopReason::context_full);
      EXPECT_EQ(static_cast<int64_t>(prompts[b].size() + out[b].tokens.size()), S);
      std::vector<int32_t> row = prompts[b];
      row.insert(row.end(), out[b].tokens.begin(), out[b].tokens.end());
      std::copy(row.begin(), row.end(), in.begin() + b * S);
      for (size_t t = prompts[b].size(); t < row.size(); ++t) tg[b * S + t - 1] = row[t];
    }
    ModelConfig dropless = cfg;  // generation is dropless; so must the recompute be
    dropless.capacity_factor = 0.0;
    model::PolicyHead head(be, dropless, B);
    const model::PolicyForward& f = head.forward(m.w, in, tg, 0.7);
    for (int64_t b = 0; b < B; ++b)
      for (size_t i = 0; i < out[b].tokens.size(); ++i) {
        const size_t t = b * S + prompts[b].size() - 1 + i;
        EXPECT_NEAR(out[b].logprobs[i], f.logprobs[t], 2e-5 * (1.0 + std::fabs(f.logprobs[t])))
            << "sequence " << b << " token " << i;
      }
  }
}

// Greedy KV generation reproduces the full-recompute Generator (troupe sample
// and the exact-match evaluation used it before), and Generator's default
// (KV) path gives the same tokens.
TEST_P(KvTest, GreedyMatchesFullRecomputeGeneratorAndStops) {
  kernels::Backend& be = *be_;
  ModelConfig cfg = kv_config("moe");
  Model m(be, cfg, 21);
  const std::vector<int32_t> prompt{3, 1, 4, 1, 5};
  model::SamplingOptions greedy;
  greedy.temperature = 0.0;
  model::Generator old(be, cfg, /*kv_cache=*/false);
  model::SamplerRng r0(1);
  const std::vector<int32_t> want = old.generate(m.w, prompt, 10, greedy, r0);
  model::BatchGenerator gen(be, cfg);
  model::GenerateOptions o;
  o.max_new_tokens = 10;
  o.sampling = greedy;
  auto rngs = rngs_for({1});
  const auto got = gen.generate(m.w, {prompt}, rngs, o);
  EXPECT_EQ(got[0].tokens, want);
  EXPECT_EQ(got[0].stop, model::StopReason::max_new_tokens);
  model::Generator with_kv(be, cfg);
  EXPECT_EQ(with_kv.generate(m.w, prompt, 10, greedy, r0), want);
  // Past seq_len it slides the window like the recompute generator.
  EXPECT_EQ(with_kv.generate(m.w, prompt, cfg.seq_len + 4, greedy, r0),
            old.generate(m.w, prompt, cfg.seq_len + 4, greedy, r0));
  // eos: stop right after the first greedy token.
  o.eos = want[0];
  const auto e = gen.generate(m.w, {prompt}, rngs, o);
  ASSERT_EQ(e[0].tokens.size(), 1u);
  EXPECT_EQ(e[0].stop, model::StopReason::eos);
}

// The step-wise API (a generator switching weights at a fence between
// steps): with one set of weights it equals generate(); each token carries
// the version of the step that sampled it; a switch is deterministic.
TEST_P(KvTest, StepwiseRecordsVersionsAndEqualsGenerate) {
  kernels::Backend& be = *be_;
  ModelConfig cfg = kv_config("moe");
  Model m1(be, cfg, 31), m2(be, cfg, 32);
  const std::vector<std::vector<int32_t>> prompts{{1, 2}, {3, 4, 5, 6}};
  model::GenerateOptions o;
  o.max_new_tokens = 8;
  model::BatchGenerator gen(be, cfg);
  auto r1 = rngs_for({5, 6});
  const auto whole = gen.generate(m1.w, prompts, r1, o);
  auto r2 = rngs_for({5, 6});
  gen.start(prompts, r2, o);
  int64_t steps = 0;
  while (gen.step(m1.w, 7)) ++steps;
  EXPECT_EQ(steps + 1, o.max_new_tokens);
  const auto stepped = gen.finish();
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(stepped[i].tokens, whole[i].tokens);
    EXPECT_EQ(stepped[i].versions, std::vector<int64_t>(whole[i].tokens.size(), 7));
  }
  // Switch to other weights after 3 tokens, twice: same result both times.
  std::vector<std::vector<model::Completion>> runs;
  for (int rep = 0; rep < 2; ++rep) {
    auto r = rngs_for({5, 6});
    gen.start(prompts, r, o);
    for (int64_t k = 0; gen.step(k < 3 ? m1.w : m2.w, k < 3 ? 0 : 1); ++k) {
    }
    runs.push_back(gen.finish());
  }
  const std::vector<int64_t> want_versions{0, 0, 0, 1, 1, 1, 1, 1};
  for (size_t i = 0; i < prompts.size(); ++i) {
    EXPECT_EQ(runs[0][i].versions, want_versions);
    EXPECT_EQ(runs[0][i].tokens, runs[1][i].tokens);
    EXPECT_EQ(std::vector<int32_t>(runs[0][i].tokens.begin(), runs[0][i].tokens.begin() + 3),
              std::vector<int32_t>(whole[i].tokens.begin(), whole[i].tokens.begin() + 3));
  }
}

// A switch with recompute: after 3 tokens under m1, recompute(m2) rebuilds
// the cache, so every later token's recorded log-prob is m2's full
// recompute of the whole sequence (the policy head) within 2e-5; without
// recompute the cache still holds m1's keys and values and the log-probs
// are off by more than 1e-3 somewhere (what the recompute is for).
TEST_P(KvTest, RecomputeAfterASwitchEqualsFullRecomputeUnderNewWeights) {
  kernels::Backend& be = *be_;
  for (const Case& cs : cases()) {
    SCOPED_TRACE(cs.name);
    const ModelConfig& cfg = cs.cfg;
    Model m1(be, cfg, 41), m2(be, cfg, 42);
    const std::vector<std::vector<int32_t>> prompts{{5, 6}, {1, 2, 3, 4, 5, 6, 7}, {9}};
    model::GenerateOptions o;
    o.max_new_tokens = 10;
    o.sampling.temperature = 0.8;
    const int64_t S = cfg.seq_len, B = 3;
    ModelConfig dropless = cfg;
    dropless.capacity_factor = 0.0;
    model::PolicyHead head(be, dropless, B);
    double worst_with = 0.0, worst_without = 0.0;
    for (bool with : {true, false}) {
      model::BatchGenerator gen(be, cfg);
      auto r = rngs_for({3, 4, 5});
      gen.start(prompts, r, o);
      for (int64_t k = 0;; ++k) {
        if (k == 3 && with) gen.recompute(m2.w);
        if (!gen.step(k < 3 ? m1.w : m2.w, k < 3 ? 0 : 1)) break;
      }
      const auto out = gen.finish();
      std::vector<int32_t> in(static_cast<size_t>(B * S), 0), tg(in.size(), -1);
      for (int64_t b = 0; b < B; ++b) {
        std::vector<int32_t> row = prompts[b];
        row.insert(row.end(), out[b].tokens.begin(), out[b].tokens.end());
        std::copy(row.begin(), row.end(), in.begin() + b * S);
        for (size_t t = prompts[b].size(); t < row.size(); ++t) tg[b * S + t - 1] = row[t];
      }
      const model::PolicyForward& f = head.forward(m2.w, in, tg, 0.8);
      for (int64_t b = 0; b < B; ++b)
        for (size_t i = 3; i < out[b].tokens.size(); ++i) {
          ASSERT_EQ(out[b].versions[i], 1);
          const size_t t = b * S + prompts[b].size() - 1 + i;
          const double d = std::fabs(out[b].logprobs[i] - f.logprobs[t]) / (1.0 + std::fabs(f.logprobs[t]));
          (with ? worst_with : worst_without) = std::max(with ? worst_with : worst_without, d);
        }
    }
    EXPECT_LT(worst_with, 2e-5);
    EXPECT_GT(worst_without, 1e-3);
  }
}

TEST_P(KvTest, RejectsBadInput) {
  kernels::Backend& be = *be_;
  const ModelConfig cfg = kv_config("dense");
  Model m(be, cfg, 1);
  model::BatchGenerator gen(be, cfg);
  model::GenerateOptions o;
  auto one = rngs_for({1});
  auto two = rngs_for({1, 2});
  using Prompts = std::vector<std::vector<int32_t>>;
  EXPECT_THROW(gen.generate(m.w, Prompts{std::vector<int32_t>{}}, one, o), std::invalid_argument);
  EXPECT_THROW(gen.generate(m.w, Prompts{{1, 99}}, one, o), std::invalid_argument);
  EXPECT_THROW(gen.generate(m.w, Prompts{std::vector<int32_t>(cfg.seq_len, 1)}, one, o), std::invalid_argument);
  EXPECT_THROW(gen.generate(m.w, Prompts{{1}}, two, o), std::invalid_argument);
  model::KvDecoder kv(be, cfg, 2);
  const std::vector<int32_t> tok{1, 2}, bad_pos{0, static_cast<int32_t>(cfg.seq_len)};
  EXPECT_THROW(kv.forward(m.w, tok, 1, bad_pos), std::invalid_argument);
  EXPECT_THROW(kv.forward(m.w, std::vector<int32_t>{1}, 1, std::vector<int32_t>{0, 0}), std::invalid_argument);
}

INSTANTIATE_TEST_SUITE_P(Backends, KvTest, ::testing::Values("host", "opencl"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace troupe::test
