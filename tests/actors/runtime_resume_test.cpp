// Resume on the actor runtime: a run stopped after N/2 steps, checkpointed
// and continued by a new Runtime from that checkpoint ends with the same
// parameters and AdamW moments, bit for bit, as the run that never stopped
// (shards' state, ranks' and expert shards' copies, supervisor snapshot, step
// counters, LR schedule and bias correction all resumed). A checkpoint of the
// single-process model::Trainer resumes on the runtime and the other way
// round, within the runtime's equivalence rule (bitwise in its bitwise case).
// Bad checkpoints (other model, missing directory) are clear errors.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <string>
#include <unistd.h>
#include <vector>

#include <gtest/gtest.h>

#include "actors/runtime.hpp"
#include "tests/actors/runtime_test_options.hpp"
#include "model/checkpoint.hpp"
#include "model/params.hpp"
#include "model/trainer.hpp"

namespace troupe::test {
namespace {

runtime::RuntimeOptions base_options() {
  runtime::RuntimeOptions o = tiny_moe_options(13, 4);
  o.train.model.tie_embeddings = false;
  return o;
}

std::string temp_dir(const std::string& name) {
  const auto p = std::filesystem::temp_directory_path() /
                 ("troupe_rt_resume_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(p);
  return p.string();
}

struct Case {
  std::string name, schedule;
  int stages, devices, optimizer_shards, expert_shards;
  std::string balance = "aux_loss";
};

void PrintTo(const Case& c, std::ostream* os) { *os << c.name; }

void expect_bitwise(const model::TrainingState& a, const model::TrainingState& b) {
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.data_cursor, b.data_cursor);
  EXPECT_EQ(a.seed, b.seed);
  const std::vector<float>* xa[3] = {&a.params, &a.adam_m, &a.adam_v};
  const std::vector<float>* xb[3] = {&b.params, &b.adam_m, &b.adam_v};
  const char* what[3] = {"params", "adam_m", "adam_v"};
  for (int i = 0; i < 3; ++i) {
    ASSERT_EQ(xa[i]->size(), xb[i]->size()) << what[i];
    size_t differ = 0;
    for (size_t k = 0; k < xa[i]->size(); ++k)
      differ += std::memcmp(&(*xa[i])[k], &(*xb[i])[k], sizeof(float)) != 0;
    EXPECT_EQ(differ, 0u) << what[i] << ": elements that differ";
  }
}

void expect_close(const std::vector<float>& a, const std::vector<float>& b, const char* what) {
  ASSERT_EQ(a.size(), b.size());
  double diff = 0.0, norm = 0.0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = static_cast<double>(a[i]) - b[i];
    diff += d * d;
    norm += static_cast<double>(a[i]) * a[i];
  }
  EXPECT_LE(std::sqrt(diff / norm), 1e-5) << what;
}

class RuntimeResume : public ::testing::TestWithParam<Case> {};

TEST_P(RuntimeResume, HalfCheckpointHalfEqualsStraight) {
  const Case c = GetParam();
  runtime::RuntimeOptions o = base_options();
  o.schedule = troupe::sched::parse_kind(c.schedule);
  o.stages = c.stages;
  o.devices = c.devices;
  o.optimizer_shards = c.optimizer_shards;
  o.expert_shards = c.expert_shards;
  o.train.model.balance = troupe::moe::parse_balance(c.balance);
  o.train.model.bias_update_rate = 0.01;
  const int64_t N = o.train.steps;

  std::vector<double> straight_loss;
  model::TrainingState straight;
  {
    runtime::Runtime rt(o);
    for (int64_t s = 0; s < N; ++s) straight_loss.push_back(rt.step().loss);
    straight = rt.state();
  }
  const std::string dir = temp_dir(c.name);
  const model::ParamLayout layout = model::build_param_layout(o.train.model);
  std::vector<double> resumed_loss;
  std::vector<double> resumed_lr, straight_lr;
  {
    runtime::Runtime rt(o);
    for (int64_t s = 0; s < N / 2; ++s) resumed_loss.push_back(rt.step().loss);
    model::save_checkpoint(dir, rt.state(), layout);
  }
  runtime::RuntimeOptions r = o;
  r.train.resume_from = dir;
  r.train.seed = 999;  // the checkpoint's seed wins, as in model::Trainer
  model::TrainingState resumed;
  {
    runtime::Runtime rt(r);
    EXPECT_EQ(rt.steps_done(), N / 2);
    while (rt.steps_done() < N) {
      const model::StepMetrics m = rt.step();
      resumed_loss.push_back(m.loss);
      EXPECT_EQ(m.step, static_cast<int64_t>(resumed_loss.size()));
      EXPECT_EQ(m.lr, model::learning_rate(o.train.optim, m.step - 1, N));
    }
    resumed = rt.state();
  }
  EXPECT_EQ(straight_loss, resumed_loss);
  expect_bitwise(straight, resumed);
  // The run really moved after the resume (not a copy of the checkpoint).
  const model::TrainingState half = model::load_checkpoint(dir, layout);
  size_t moved = 0;
  for (size_t i = 0; i < half.params.size(); ++i) moved += half.params[i] != resumed.params[i];
  EXPECT_GT(moved, half.params.size() / 2);
  std::filesystem::remove_all(dir);
}

INSTANTIATE_TEST_SUITE_P(Topologies, RuntimeResume,
                         ::testing::Values(Case{"onef1b_pp2_zero2", "1f1b", 2, 2, 2, 0},
                                           Case{"dualpipe_pp2_ep4", "dualpipe", 2, 2, 2, 4},
                                           Case{"onef1b_pp2_ep2_bias", "1f1b", 2, 2, 1, 2, "bias"}),
                         [](const auto& info) { return info.param.name; });

// Trainer checkpoint -> runtime, runtime checkpoint -> Trainer. In the
// runtime's bitwise case (1f1b, one optimizer shard, untied) the result is
// the uninterrupted Trainer's bit for bit; with DualPipe and expert shards
// within 1e-5 relative.
struct CrossCase {
  std::string name, schedule;
  int expert_shards;
  bool bitwise;
};

class RuntimeResumeCross : public ::testing::TestWithParam<CrossCase> {};

TEST_P(RuntimeResumeCross, TrainerAndRuntimeResumeEachOther) {
  const CrossCase c = GetParam();
  runtime::RuntimeOptions o = base_options();
  o.schedule = troupe::sched::parse_kind(c.schedule);
  o.stages = 2;
  o.devices = 2;
  o.expert_shards = c.expert_shards;
  const int64_t N = o.train.steps;
  const model::ParamLayout layout = model::build_param_layout(o.train.model);

  model::TrainingState ref;
  {
    model::Trainer tr(o.train);
    while (tr.steps_done() < N) tr.step();
    const std::string d = temp_dir(c.name + "_ref");
    tr.save(d);
    ref = model::load_checkpoint(d, layout);
    std::filesystem::remove_all(d);
  }
  // Trainer N/2 -> runtime the rest.
  const std::string d1 = temp_dir(c.name + "_trainer_half");
  {
    model::Trainer tr(o.train);
    while (tr.steps_done() < N / 2) tr.step();
    tr.save(d1);
  }
  runtime::RuntimeOptions r = o;
  r.train.resume_from = d1;
  model::TrainingState a;
  {
    runtime::Runtime rt(r);
    while (rt.steps_done() < N) rt.step();
    a = rt.state();
  }
  // Runtime N/2 -> Trainer the rest.
  const std::string d2 = temp_dir(c.name + "_runtime_half");
  {
    runtime::Runtime rt(o);
    while (rt.steps_done() < N / 2) rt.step();
    model::save_checkpoint(d2, rt.state(), layout);
  }
  model::TrainOptions t = o.train;
  t.resume_from = d2;
  const std::string d3 = temp_dir(c.name + "_trainer_rest");
  model::TrainingState b;
  {
    model::Trainer tr(t);
    while (tr.steps_done() < N) tr.step();
    tr.save(d3);
    b = model::load_checkpoint(d3, layout);
  }
  if (c.bitwise) {
    expect_bitwise(ref, a);
    expect_bitwise(ref, b);
  } else {
    EXPECT_EQ(a.step, N);
    EXPECT_EQ(b.step, N);
    expect_close(ref.params, a.params, "trainer -> runtime: params");
    expect_close(ref.adam_m, a.adam_m, "trainer -> runtime: adam_m");
    expect_close(ref.params, b.params, "runtime -> trainer: params");
    expect_close(ref.adam_m, b.adam_m, "runtime -> trainer: adam_m");
  }
  for (const auto& d : {d1, d2, d3}) std::filesystem::remove_all(d);
}

INSTANTIATE_TEST_SUITE_P(Topologies, RuntimeResumeCross,
                         ::testing::Values(CrossCase{"onef1b_pp2", "1f1b", 0, true},
                                           CrossCase{"dualpipe_pp2_ep4", "dualpipe", 4, false}),
                         [](const auto& info) { return info.param.name; });

TEST(RuntimeResumeErrors, OtherModelAndMissingCheckpoint) {
  runtime::RuntimeOptions o = base_options();
  o.stages = 2;
  o.devices = 2;
  o.train.steps = 1;
  const std::string dir = temp_dir("errors");
  {
    runtime::Runtime rt(o);
    rt.step();
    model::save_checkpoint(dir, rt.state(), model::build_param_layout(o.train.model));
  }
  runtime::RuntimeOptions r = o;
  r.train.resume_from = dir;
  r.train.model.expert_hidden = 16;  // another model: the saved tensors do not fit
  EXPECT_THROW(runtime::Runtime{r}, model::CheckpointError);
  r = o;
  r.train.resume_from = dir;
  r.train.model.bias_update_rate = 0.5;  // same tensors, another config
  try {
    runtime::Runtime rt(r);
    FAIL() << "a checkpoint of another model config must be refused";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("differs from the configured one"), std::string::npos) << e.what();
  }
  r = o;
  r.train.resume_from = dir + "_nowhere";
  EXPECT_THROW(runtime::Runtime{r}, model::CheckpointError);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace troupe::test
