// Training loop: LR schedule, learning on the addition task, determinism,
// microbatch equivalence, bitwise resume, router-bias balancing, bad options,
// generation and evaluation from a checkpoint.
#include <cmath>
#include <filesystem>
#include <unistd.h>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/data.hpp"
#include "model/decoder.hpp"
#include "model/generate.hpp"
#include "model/params.hpp"
#include "model/trainer.hpp"
#include "tests/model/model_test_util.hpp"

namespace troupe::test {
namespace {

using model::TrainOptions;

TrainOptions small_options(const std::string& ffn) {
  TrainOptions o;
  o.model = tiny_config(ffn);
  o.model.vocab_size = 16;  // the addition task needs 14
  o.model.d_model = 32;
  o.model.n_heads = 4;
  o.model.seq_len = 24;
  o.model.expert_hidden = 32;
  o.model.dense_hidden = 64;
  o.model.init_std = 0.02;
  o.model.aux_loss_alpha = 0.01;
  o.optim.lr = 3e-3;
  o.optim.warmup_steps = 3;
  o.data.source = troupe::model::DataKind::addition;
  o.data.digits = 2;
  o.data.batch_size = 8;
  o.data.eval_problems = 20;
  o.steps = 12;
  o.eval_every = 0;
  o.eval_batches = 2;
  o.seed = 5;
  return o;
}

std::string temp_dir(const std::string& name) {
  const auto p = std::filesystem::temp_directory_path() /
                 ("troupe_model_test_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(p);
  return p.string();
}

TEST(LearningRate, WarmupThenCosineToTheFloor) {
  model::OptimConfig o;
  o.lr = 1.0;
  o.min_lr_ratio = 0.1;
  o.warmup_steps = 4;
  EXPECT_DOUBLE_EQ(model::learning_rate(o, 0, 20), 0.25);
  EXPECT_DOUBLE_EQ(model::learning_rate(o, 3, 20), 1.0);
  EXPECT_DOUBLE_EQ(model::learning_rate(o, 4, 20), 1.0);
  EXPECT_NEAR(model::learning_rate(o, 19, 20), 0.1, 1e-12);
  const double mid = model::learning_rate(o, 4 + 15 / 2, 20);
  EXPECT_GT(mid, 0.1);
  EXPECT_LT(mid, 1.0);
  o.schedule = troupe::model::LrSchedule::constant;
  EXPECT_DOUBLE_EQ(model::learning_rate(o, 19, 20), 1.0);
}

TEST(Trainer, LossFallsOnTheAdditionTask) {
  TrainOptions o = small_options("moe");
  o.steps = 40;
  model::Trainer tr(o);
  double first = 0.0, last = 0.0;
  for (int64_t i = 0; i < o.steps; ++i) {
    const model::StepMetrics m = tr.step();
    ASSERT_TRUE(std::isfinite(m.loss));
    ASSERT_EQ(m.expert_load.size(), static_cast<size_t>(o.model.n_layers));
    int64_t total = 0;
    for (int64_t l : m.expert_load[0]) total += l;
    ASSERT_EQ(total, o.data.batch_size * o.model.seq_len * o.model.top_k);
    if (i == 0) first = m.loss;
    last = m.loss;
  }
  // From ~ln(16) = 2.77 at init; the digits are not yet learned, but the
  // format tokens and padding are.
  EXPECT_LT(last, first - 0.5) << "first " << first << " last " << last;
  const model::EvalMetrics e = tr.evaluate(true);
  std::printf("[trainer] loss %.4f -> %.4f, val %.4f, accuracy %.3f on %lld problems\n", first,
              last, e.val_loss, e.accuracy, static_cast<long long>(e.problems));
  EXPECT_TRUE(std::isfinite(e.val_loss));
  EXPECT_EQ(e.problems, o.data.eval_problems);
  EXPECT_GE(e.accuracy, 0.0);
  EXPECT_LE(e.accuracy, 1.0);
  // 2-digit operands: 3 answer digits; a 24-token row holds 2 problems, so
  // questions are scored after 0 and after 1 earlier problem, 10 each.
  ASSERT_EQ(e.digit_accuracy.size(), 3u);
  for (double d : e.digit_accuracy) {
    EXPECT_GE(d, e.accuracy) << "an exact match gets every digit right";
    EXPECT_LE(d, 1.0);
  }
  ASSERT_EQ(e.context_accuracy.size(), 2u);
  EXPECT_NEAR((e.context_accuracy[0] + e.context_accuracy[1]) / 2.0, e.accuracy, 1e-12);
}

TEST(Trainer, SameSeedSameRunBitwise) {
  const TrainOptions o = small_options("moe");
  model::Trainer a(o), b(o);
  for (int i = 0; i < 4; ++i) EXPECT_EQ(a.step().loss, b.step().loss);
  EXPECT_EQ(a.parameters(), b.parameters());
  TrainOptions o2 = o;
  o2.seed = 6;
  model::Trainer c(o2);
  c.step();
  EXPECT_NE(a.parameters(), c.parameters());
}

TEST(Trainer, MicrobatchesMatchOneBatch) {
  // Dense model: the loss is a mean over all counted tokens of the batch, so
  // splitting it changes only the float summation order.
  TrainOptions o = small_options("dense");
  o.optim.grad_clip = 0.0;
  TrainOptions o2 = o;
  o2.microbatches = 4;
  model::Trainer a(o), b(o2);
  for (int i = 0; i < 3; ++i) {
    const auto ma = a.step(), mb = b.step();
    EXPECT_NEAR(ma.loss, mb.loss, 1e-5 * ma.loss);
    EXPECT_NEAR(ma.grad_norm, mb.grad_norm, 1e-4 * ma.grad_norm);
  }
  const auto pa = a.parameters(), pb = b.parameters();
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < pa.size(); ++i) {
    diff = std::max(diff, static_cast<double>(std::fabs(pa[i] - pb[i])));
    norm = std::max(norm, static_cast<double>(std::fabs(pa[i])));
  }
  EXPECT_LT(diff, 1e-4 * norm);
}

class Resume : public ::testing::TestWithParam<std::string> {};

TEST_P(Resume, HalfSaveLoadHalfIsBitwiseTheStraightRun) {
  TrainOptions o = small_options("moe");
  o.model.balance = troupe::moe::parse_balance(GetParam());
  o.model.bias_update_rate = 0.01;
  o.model.capacity_factor = GetParam() == "bias" ? 1.0 : 0.0;
  o.steps = 8;
  std::vector<double> straight;
  model::Trainer a(o);
  for (int i = 0; i < 8; ++i) {
    const model::StepMetrics m = a.step();
    straight.push_back(m.loss);
    ASSERT_EQ(m.dropped.size(), static_cast<size_t>(o.model.n_layers));
    if (o.model.capacity_factor == 0.0) {
      EXPECT_EQ(m.dropped[0], 0);
    }
  }

  const std::string dir = temp_dir("resume_" + GetParam());
  std::vector<double> resumed;
  {
    model::Trainer b(o);
    for (int i = 0; i < 4; ++i) resumed.push_back(b.step().loss);
    b.save(dir);
  }
  TrainOptions o2 = o;
  o2.resume_from = dir;
  o2.seed = 999;  // ignored: the checkpoint's seed wins
  model::Trainer c(o2);
  EXPECT_EQ(c.steps_done(), 4);
  for (int i = 0; i < 4; ++i) resumed.push_back(c.step().loss);
  EXPECT_EQ(straight, resumed);
  EXPECT_EQ(a.parameters(), c.parameters());
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Balance, Resume, ::testing::Values("aux_loss", "bias"));

TEST(Trainer, RouterBiasFollowsTheLoad) {
  TrainOptions o = small_options("moe");
  o.model.balance = troupe::moe::Balance::bias;
  o.model.bias_update_rate = 0.05;
  model::Trainer tr(o);
  const model::ParamLayout L = model::build_param_layout(o.model);
  const auto& be = L.at("model.layers.0.mlp.gate.e_score_correction_bias");
  const auto before = tr.parameters();
  const model::StepMetrics m = tr.step();
  const auto after = tr.parameters();
  const auto& load = m.expert_load[0];
  double mean = 0.0;
  for (int64_t l : load) mean += static_cast<double>(l) / static_cast<double>(load.size());
  for (int64_t e = 0; e < o.model.n_experts; ++e) {
    const double d = mean - static_cast<double>(load[e]);
    const double expect = before[be.offset + e] + 0.05 * (d > 0 ? 1 : (d < 0 ? -1 : 0));
    EXPECT_NEAR(after[be.offset + e], expect, 1e-7) << "expert " << e;
  }
}

TEST(Trainer, BadOptionsAreClearErrors) {
  TrainOptions o = small_options("moe");
  o.microbatches = 3;  // 8 sequences do not split in 3
  EXPECT_THROW(model::Trainer{o}, std::invalid_argument);
  o = small_options("moe");
  o.model.vocab_size = 8;  // addition needs 14
  EXPECT_THROW(model::Trainer{o}, std::invalid_argument);
  o = small_options("moe");
  o.resume_from = temp_dir("missing");
  EXPECT_ANY_THROW(model::Trainer{o});
}

TEST(Trainer, ResumeRefusesAnotherArchitecture) {
  TrainOptions o = small_options("moe");
  const std::string dir = temp_dir("arch");
  {
    model::Trainer t(o);
    t.step();
    t.save(dir);
  }
  o.resume_from = dir;
  o.model.n_experts = 8;
  EXPECT_ANY_THROW(model::Trainer{o});
  std::filesystem::remove_all(dir);
}

TEST(Trainer, TrainWritesCheckpointsAndSampleEvaluateReadThem) {
  TrainOptions o = small_options("moe");
  o.steps = 6;
  o.eval_every = 3;
  o.checkpoint_every = 4;
  o.checkpoint_dir = temp_dir("train");
  struct Obs : model::TrainObserver {
    std::vector<int64_t> steps, evals, ckpts;
    void on_step(const model::StepMetrics& m) override { steps.push_back(m.step); }
    void on_eval(const model::EvalMetrics& e) override { evals.push_back(e.step); }
    void on_checkpoint(int64_t s, const std::string&) override { ckpts.push_back(s); }
  } obs;
  const model::TrainSummary s = model::train(o, obs);
  EXPECT_EQ(s.steps_done, 6);
  EXPECT_EQ(obs.steps, (std::vector<int64_t>{1, 2, 3, 4, 5, 6}));
  EXPECT_EQ(obs.evals, (std::vector<int64_t>{3, 6}));
  EXPECT_EQ(obs.ckpts, (std::vector<int64_t>{4, 6}));
  EXPECT_TRUE(std::isfinite(s.final_val_loss));

  const model::EvalMetrics e = model::evaluate(o.checkpoint_dir, o.data, o.eval_batches, {});
  EXPECT_EQ(e.step, 6);
  EXPECT_DOUBLE_EQ(e.val_loss, s.final_val_loss);
  EXPECT_DOUBLE_EQ(e.accuracy, s.accuracy);
  EXPECT_EQ(e.digit_accuracy.size(), 3u);

  model::SampleOptions so;
  so.checkpoint_dir = o.checkpoint_dir;
  so.data = o.data;
  so.prompt = "12+34=";
  so.max_new_tokens = 5;
  so.sampling.temperature = 0.0;
  const model::SampleResult r1 = model::sample(so), r2 = model::sample(so);
  EXPECT_FALSE(r1.tokens.empty());
  EXPECT_LE(r1.tokens.size(), 5u);
  EXPECT_EQ(r1.tokens, r2.tokens);
  so.sampling.temperature = 1.0;
  so.seed = 3;
  EXPECT_EQ(model::sample(so).tokens, model::sample(so).tokens);
  std::filesystem::remove_all(o.checkpoint_dir);
}

TEST(Generator, ShortBucketsGiveTheSameLogitsAsTheFullContext) {
  // Greedy generation with a short prompt runs in an 8-token bucket; the same
  // prompt padded into the full sequence must pick the same tokens.
  TrainOptions o = small_options("moe");
  model::Trainer tr(o);
  for (int i = 0; i < 5; ++i) tr.step();
  const auto params = tr.parameters();
  auto& be = tr.backend();
  const model::ParamLayout L = model::build_param_layout(o.model);
  const auto p = be.from_f32({L.total()}, params);
  const model::ModelWeights w = model::bind_weights(L, o.model, p);
  model::Generator gen(be, o.model);
  model::SamplingOptions greedy;
  greedy.temperature = 0.0;
  model::SamplerRng rng(1);
  const std::vector<int32_t> prompt = {12, 1, 2, 10, 3, 4, 11};
  const auto out = gen.generate(w, prompt, 10, greedy, rng);
  ASSERT_EQ(out.size(), 10u);  // no eos given: runs to max_new, crossing buckets 8 -> 16 -> 24
  // Reference: every step in a full seq_len decoder.
  model::Decoder full(be, o.model, 1);
  std::vector<int32_t> seq = prompt;
  for (int i = 0; i < 10; ++i) {
    std::vector<int32_t> in = seq, tg(static_cast<size_t>(o.model.seq_len), -1);
    in.resize(static_cast<size_t>(o.model.seq_len), 0);
    full.forward(w, in, tg);
    const auto row = be.download_f32(full.logits().rows(seq.size() - 1, seq.size()));
    const int32_t next = model::sample_greedy(row.data(), o.model.vocab_size);
    EXPECT_EQ(next, out[i]) << "token " << i;
    seq.push_back(next);
  }
  EXPECT_THROW(gen.generate(w, {}, 3, greedy, rng), std::invalid_argument);
  EXPECT_THROW(gen.generate(w, {99}, 3, greedy, rng), std::invalid_argument);
}

}  // namespace
}  // namespace troupe::test

namespace troupe::test {
namespace {

// Host and OpenCL train the same tiny MoE model to the same losses. The two
// backends sum in different orders, so they agree to float32 rounding that
// Adam then carries along; tolerance: |L_host - L_cl| <= 1e-4 * L_host at
// every one of the 20 steps.
TEST(HostVsOpenCL, TwentyStepsSameLosses) {
  std::string why;
  if (!try_backend("opencl", &why)) GTEST_SKIP() << "no opencl backend: " << why;
  TrainOptions o = small_options("moe");
  o.steps = 20;
  o.model.shared_experts = 1;
  TrainOptions ocl = o;
  ocl.backend.kind = troupe::kernels::BackendKind::opencl;
  model::Trainer host(o), cl(ocl);
  double worst = 0.0;
  for (int i = 0; i < 20; ++i) {
    const model::StepMetrics a = host.step(), b = cl.step();
    worst = std::max(worst, std::fabs(a.loss - b.loss) / a.loss);
    EXPECT_NEAR(a.loss, b.loss, 1e-4 * a.loss) << "step " << i + 1;
    EXPECT_NEAR(a.grad_norm, b.grad_norm, 1e-2 * a.grad_norm) << "step " << i + 1;
    if (i == 0) {
      EXPECT_EQ(a.expert_load, b.expert_load);
    }
  }
  std::printf("[host vs opencl] worst relative loss difference over 20 steps: %.2e\n", worst);
}

}  // namespace
}  // namespace troupe::test

namespace troupe::test {
namespace {

// Same seed, same OpenCL run: bitwise (the kernels use no float atomics).
TEST(OpenCL, SameSeedSameRunBitwise) {
  std::string why;
  if (!try_backend("opencl", &why)) GTEST_SKIP() << "no opencl backend: " << why;
  TrainOptions o = small_options("moe");
  o.backend.kind = troupe::kernels::BackendKind::opencl;
  model::Trainer a(o), b(o);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(a.step().loss, b.step().loss);
  EXPECT_EQ(a.parameters(), b.parameters());
}

}  // namespace
}  // namespace troupe::test
