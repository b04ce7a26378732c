// Checkpoint round trips, replacement, layout/config checks and crash safety
// (model/checkpoint.cpp). Corrupted files are covered in checkpoint_corruption_test.cpp.
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <limits>

#include "model/checkpoint.hpp"

using namespace troupe::model;
namespace fs = std::filesystem;

namespace {

ParamLayout small_layout() {
  ParamLayout l;
  l.add("model.embed_tokens.weight", {10, 4});
  l.add("model.layers.0.self_attn.q_proj.weight", {4, 4});
  l.add("model.layers.0.input_layernorm.weight", {4}, true, false);
  l.add("model.layers.0.mlp.gate.e_score_correction_bias", {3}, false, false);
  l.add("model.norm.weight", {4}, true, false);
  return l;
}

std::vector<float> pattern(int64_t n, uint32_t seed) {
  std::vector<float> v(static_cast<size_t>(n));
  uint32_t x = seed * 2654435761u + 1;
  for (float& f : v) {
    x = x * 1664525u + 1013904223u;
    f = static_cast<float>(static_cast<int32_t>(x)) * 1e-9f;
  }
  return v;
}

TrainingState make_state(const ParamLayout& layout, uint32_t seed, bool adam = true) {
  TrainingState s;
  s.config.d_model = 4;
  s.config.n_layers = 1;
  s.config.ffn = troupe::model::Ffn::dense;
  s.config.aux_loss_alpha = 0.0123;
  s.seed = 0xdeadbeefcafef00dull + seed;
  s.step = 1234 + seed;
  s.data_cursor = 99 + seed;
  s.rng_state = std::string("\x00\x01\xff rng state", 14) + std::to_string(seed);
  s.params = pattern(layout.total(), seed);
  if (adam) {
    s.adam_m = pattern(layout.total(), seed + 100);
    s.adam_v = pattern(layout.total(), seed + 200);
  }
  return s;
}

bool bitwise_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

void expect_same(const TrainingState& a, const TrainingState& b) {
  EXPECT_EQ(config_difference(a.config, b.config), "");
  EXPECT_EQ(a.seed, b.seed);
  EXPECT_EQ(a.step, b.step);
  EXPECT_EQ(a.data_cursor, b.data_cursor);
  EXPECT_EQ(a.rng_state, b.rng_state);
  EXPECT_TRUE(bitwise_equal(a.params, b.params));
  EXPECT_TRUE(bitwise_equal(a.adam_m, b.adam_m));
  EXPECT_TRUE(bitwise_equal(a.adam_v, b.adam_v));
}

class Checkpoint : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("troupe_ckpt_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    fs::create_directories(root_);
  }
  void TearDown() override { fs::remove_all(root_); }

  std::vector<std::string> siblings() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(root_)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }

  void kill_during_saves(int trials);

  fs::path root_;
};

}  // namespace

TEST_F(Checkpoint, RoundTripIsBitwise) {
  const ParamLayout layout = small_layout();
  TrainingState s = make_state(layout, 1);
  // Values that a lossy path would disturb.
  s.params[0] = -0.0f;
  s.params[1] = std::numeric_limits<float>::denorm_min();
  s.params[2] = std::numeric_limits<float>::infinity();
  uint32_t nan_bits = 0x7fc12345u;
  std::memcpy(&s.params[3], &nan_bits, 4);
  const std::string dir = (root_ / "ckpt").string();
  save_checkpoint(dir, s, layout);
  EXPECT_TRUE(checkpoint_exists(dir));
  EXPECT_TRUE(fs::exists(root_ / "ckpt" / "manifest.bin"));
  EXPECT_TRUE(fs::exists(root_ / "ckpt" / "params.f32.zst"));
  expect_same(load_checkpoint(dir, layout), s);
  EXPECT_EQ(siblings(), std::vector<std::string>{"ckpt"}) << "no temporary directory may remain";
}

TEST_F(Checkpoint, WithoutOptimizerState) {
  const ParamLayout layout = small_layout();
  const TrainingState s = make_state(layout, 2, false);
  const std::string dir = (root_ / "ckpt/").string();  // a trailing slash is fine
  save_checkpoint(dir, s, layout);
  EXPECT_FALSE(fs::exists(root_ / "ckpt" / "adam_m.f32.zst"));
  const TrainingState back = load_checkpoint(dir, layout);
  expect_same(back, s);
  EXPECT_TRUE(back.adam_m.empty());
}

TEST_F(Checkpoint, ReplacesAnExistingCheckpoint) {
  const ParamLayout layout = small_layout();
  const std::string dir = (root_ / "nested" / "ckpt").string();
  save_checkpoint(dir, make_state(layout, 3), layout);
  const TrainingState newer = make_state(layout, 4, false);
  save_checkpoint(dir, newer, layout);
  expect_same(load_checkpoint(dir, layout), newer);
  EXPECT_FALSE(fs::exists(fs::path(dir) / "adam_m.f32.zst")) << "files of the old checkpoint must go";
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(root_ / "nested")) names.push_back(e.path().filename().string());
  EXPECT_EQ(names, std::vector<std::string>{"ckpt"});
}

TEST_F(Checkpoint, RefusesToClobberOtherThings) {
  const ParamLayout layout = small_layout();
  const TrainingState s = make_state(layout, 5);
  fs::create_directories(root_ / "notes");
  std::ofstream(root_ / "notes" / "todo.txt") << "keep me";
  EXPECT_THROW(save_checkpoint((root_ / "notes").string(), s, layout), CheckpointError);
  EXPECT_TRUE(fs::exists(root_ / "notes" / "todo.txt"));
  std::ofstream(root_ / "file") << "x";
  EXPECT_THROW(save_checkpoint((root_ / "file").string(), s, layout), CheckpointError);
  // An empty directory is fine to fill.
  fs::create_directories(root_ / "empty");
  EXPECT_NO_THROW(save_checkpoint((root_ / "empty").string(), s, layout));
}

TEST_F(Checkpoint, SaveRejectsStateThatDoesNotMatchTheLayout) {
  const ParamLayout layout = small_layout();
  TrainingState s = make_state(layout, 6);
  s.params.pop_back();
  EXPECT_THROW(save_checkpoint((root_ / "a").string(), s, layout), CheckpointError);
  s = make_state(layout, 6);
  s.adam_v.clear();
  EXPECT_THROW(save_checkpoint((root_ / "a").string(), s, layout), CheckpointError);
  EXPECT_TRUE(siblings().empty()) << "a failed save leaves nothing behind";
}

TEST_F(Checkpoint, LayoutMismatchIsRejected) {
  const ParamLayout layout = small_layout();
  const std::string dir = (root_ / "ckpt").string();
  save_checkpoint(dir, make_state(layout, 7), layout);
  ParamLayout renamed;
  for (const ParamEntry& e : layout.entries())
    renamed.add(e.name == "model.norm.weight" ? "model.final_norm.weight" : e.name, e.shape, e.trainable, e.decay);
  ParamLayout reshaped;
  for (const ParamEntry& e : layout.entries())
    reshaped.add(e.name, e.name == "model.embed_tokens.weight" ? troupe::kernels::Shape{4, 10} : e.shape,
                 e.trainable, e.decay);
  ParamLayout longer = small_layout();
  longer.add("lm_head.weight", {10, 4});
  for (const ParamLayout* other : {&renamed, &reshaped, &longer}) {
    try {
      load_checkpoint(dir, *other);
      ADD_FAILURE() << "a different layout was accepted";
    } catch (const CheckpointError& e) {
      EXPECT_EQ(fs::path(e.file()).filename(), "manifest.bin");
      EXPECT_NE(std::string(e.what()).find("layout mismatch"), std::string::npos) << e.what();
    }
  }
  try {
    load_checkpoint(dir, reshaped);
  } catch (const CheckpointError& e) {
    EXPECT_NE(std::string(e.what()).find("model.embed_tokens.weight"), std::string::npos) << e.what();
  }
}

// Against build_param_layout: a real decoder config, loaded with the layout
// derived from the config in the manifest; and a manifest from another config.
TEST_F(Checkpoint, ConfigDerivedLayout) {
  ModelConfig a;
  a.vocab_size = 14;
  a.d_model = 8;
  a.n_layers = 1;
  a.n_heads = 2;
  a.n_experts = 2;
  a.top_k = 1;
  a.expert_hidden = 4;
  ModelConfig b = a;
  b.d_model = 16;
  const ParamLayout la = build_param_layout(a), lb = build_param_layout(b);
  TrainingState sa = make_state(la, 8);
  sa.config = a;
  TrainingState sb = make_state(lb, 9);
  sb.config = b;
  const fs::path da = root_ / "a", db = root_ / "b";
  save_checkpoint(da.string(), sa, la);
  save_checkpoint(db.string(), sb, lb);
  expect_same(load_checkpoint(da.string()), sa);
  EXPECT_EQ(config_difference(load_checkpoint(db.string()).config, a), "d_model: 16 vs 8");

  // b's manifest in a's directory: every check that can see it fires.
  fs::copy_file(db / "manifest.bin", da / "manifest.bin", fs::copy_options::overwrite_existing);
  try {
    load_checkpoint(da.string(), la);
    ADD_FAILURE();
  } catch (const CheckpointError& e) {
    EXPECT_EQ(fs::path(e.file()).filename(), "manifest.bin") << e.what();
    EXPECT_NE(std::string(e.what()).find("layout mismatch"), std::string::npos) << e.what();
  }
  try {
    load_checkpoint(da.string());  // consistent manifest, but the data files are a's
    ADD_FAILURE();
  } catch (const CheckpointError& e) {
    EXPECT_EQ(fs::path(e.file()).filename(), "params.f32.zst") << e.what();
  }
}

TEST_F(Checkpoint, LeftoversOfACrashedSaveAreHarmless) {
  const ParamLayout layout = small_layout();
  const std::string dir = (root_ / "ckpt").string();
  const TrainingState first = make_state(layout, 10);
  save_checkpoint(dir, first, layout);
  // What a save killed half-way leaves behind: a partial temporary directory
  // (no manifest, truncated tensor file) and a moved-away old checkpoint, both
  // named after a process that no longer exists.
  const fs::path tmp = root_ / "ckpt.tmp-999999999-0";
  fs::create_directories(tmp);
  std::ofstream(tmp / "params.f32.zst") << "partial";
  const fs::path old = root_ / "ckpt.old-999999999-3";
  fs::create_directories(old);
  // One of a live process (this test's parent) must be left alone.
  const fs::path live = root_ / ("ckpt.tmp-" + std::to_string(::getppid()) + "-0");
  fs::create_directories(live);
  expect_same(load_checkpoint(dir, layout), first);
  const TrainingState second = make_state(layout, 11);
  save_checkpoint(dir, second, layout);
  expect_same(load_checkpoint(dir, layout), second);
  EXPECT_FALSE(fs::exists(tmp));
  EXPECT_FALSE(fs::exists(old));
  EXPECT_TRUE(fs::exists(live));
  // A first save can also find only leftovers and no checkpoint.
  fs::remove_all(dir);
  fs::create_directories(tmp);
  EXPECT_THROW(load_checkpoint(dir, layout), CheckpointError);
  save_checkpoint(dir, first, layout);
  expect_same(load_checkpoint(dir, layout), first);
}

// A child process saves checkpoints in a loop and is killed at an arbitrary
// moment. Whenever it dies, the checkpoint must load as one complete
// checkpoint (the old or the new one), and a later save and load must work.
void Checkpoint::kill_during_saves(int trials) {
  ParamLayout layout;
  layout.add("big.weight", {512, 1024});  // 2 MiB per buffer: a save takes a while
  layout.add("small.weight", {7});
  const std::string dir = (root_ / "ckpt").string();
  const TrainingState a = make_state(layout, 20), b = make_state(layout, 21);
  save_checkpoint(dir, a, layout);
  int interrupted = 0;  // kills that landed inside a save (a .tmp-/.old- directory was left)
  for (int trial = 0; trial < trials; ++trial) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      for (int i = 0;; ++i) {
        try {
          save_checkpoint(dir, i % 2 ? a : b, layout);
        } catch (...) {
          ::_exit(3);
        }
      }
    }
    ::usleep(static_cast<useconds_t>(2000 + trial * 7919 % 40000));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "the saving child failed on its own (status " << status << ")";
    interrupted += siblings().size() > 1;
    const TrainingState got = load_checkpoint(dir, layout);
    EXPECT_TRUE(got.step == a.step || got.step == b.step);
    expect_same(got, got.step == a.step ? a : b);
  }
  std::cout << "[ info ] " << interrupted << " of " << trials << " kills landed inside a save\n";
  save_checkpoint(dir, a, layout);
  expect_same(load_checkpoint(dir, layout), a);
  EXPECT_EQ(siblings(), std::vector<std::string>{"ckpt"}) << "leftovers of killed saves are cleaned";
}

TEST_F(Checkpoint, KilledDuringSaveLeavesACompleteCheckpoint) { kill_during_saves(12); }

// Sets an environment variable for the lifetime of the object.
struct ScopedEnv {
  explicit ScopedEnv(const char* name) : name_(name) { ::setenv(name, "1", 1); }
  ~ScopedEnv() { ::unsetenv(name_); }
  const char* name_;
};

// The same guarantees with the fallback swap (rename old away, new in).
TEST_F(Checkpoint, FallbackSwapWithoutRenameExchange) {
  ScopedEnv env("TROUPE_CHECKPOINT_NO_EXCHANGE");
  const ParamLayout layout = small_layout();
  const std::string dir = (root_ / "ckpt").string();
  save_checkpoint(dir, make_state(layout, 30), layout);
  const TrainingState newer = make_state(layout, 31);
  save_checkpoint(dir, newer, layout);
  expect_same(load_checkpoint(dir, layout), newer);
  EXPECT_EQ(siblings(), std::vector<std::string>{"ckpt"});
  // A crash between the two renames: only the moved-away old checkpoint exists.
  fs::rename(dir, root_ / "ckpt.old-999999999-0");
  expect_same(load_checkpoint(dir, layout), newer);
  const TrainingState third = make_state(layout, 32);
  save_checkpoint(dir, third, layout);
  expect_same(load_checkpoint(dir, layout), third);
  EXPECT_EQ(siblings(), std::vector<std::string>{"ckpt"});
  fs::remove_all(dir);
  kill_during_saves(8);
}

TEST_F(Checkpoint, ConfigDifference) {
  ModelConfig a, b;
  EXPECT_EQ(config_difference(a, b), "");
  b.ffn = troupe::model::Ffn::dense;
  EXPECT_EQ(config_difference(a, b), "ffn: moe vs dense");
  b = a;
  b.norm_eps = 1e-6;
  EXPECT_EQ(config_difference(a, b).rfind("norm_eps: ", 0), 0u);
}

TEST(CheckpointHash, SensitiveToEveryByteAndLength) {
  std::vector<unsigned char> data(301);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i * 37);
  const uint64_t h = checkpoint_hash(data.data(), data.size());
  EXPECT_EQ(h, checkpoint_hash(data.data(), data.size()));
  for (size_t i = 0; i < data.size(); ++i) {
    data[i] ^= 0x10;
    EXPECT_NE(checkpoint_hash(data.data(), data.size()), h) << "flip at " << i;
    data[i] ^= 0x10;
  }
  for (size_t n = 0; n < data.size(); ++n) EXPECT_NE(checkpoint_hash(data.data(), n), h);
  EXPECT_NE(checkpoint_hash(data.data(), 0), checkpoint_hash(data.data(), 0, 1));
}
