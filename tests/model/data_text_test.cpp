// Tests of the byte-level text source (model/data_text.cpp): windows come from
// the right split, determinism, and clear errors for unusable files.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <string>

#include "model/data.hpp"

using namespace troupe::model;
namespace fs = std::filesystem;

namespace {

class TextData : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("troupe_text_" + std::to_string(::getpid()) + "_" +
                                        ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string write(const std::string& name, const std::string& bytes) {
    const fs::path p = dir_ / name;
    std::ofstream(p, std::ios::binary) << bytes;
    return p.string();
  }

  DataConfig config(const std::string& path, double val_fraction = 0.1) {
    DataConfig c;
    c.source = troupe::model::DataKind::text;
    c.path = path;
    c.val_fraction = val_fraction;
    return c;
  }

  // Pseudo-random bytes (all 256 values) so that windows are unique in the file.
  static std::string corpus(size_t n) {
    std::string s(n, '\0');
    uint64_t x = 88172645463325252ull;
    for (char& c : s) {
      x ^= x << 13;
      x ^= x >> 7;
      x ^= x << 17;
      c = static_cast<char>(x & 0xff);
    }
    return s;
  }

  fs::path dir_;
};

// Position of the window (inputs followed by the last target) in `text`.
size_t locate(const std::string& text, const int32_t* inputs, const int32_t* targets, int64_t seq) {
  std::string w;
  for (int64_t t = 0; t < seq; ++t) {
    EXPECT_GE(inputs[t], 0);
    EXPECT_LT(inputs[t], 256);
    if (t > 0) {
      EXPECT_EQ(targets[t - 1], inputs[t]) << "targets are the next bytes";
    }
    w.push_back(static_cast<char>(inputs[t]));
  }
  w.push_back(static_cast<char>(targets[seq - 1]));
  return text.find(w);
}

}  // namespace

TEST_F(TextData, WindowsComeFromTheirSplit) {
  const std::string text = corpus(20000);
  auto src = make_data_source(config(write("c.bin", text), 0.1), 1, 32);
  EXPECT_EQ(src->vocab_size(), 256);
  EXPECT_FALSE(src->has_task());
  EXPECT_NE(src->describe().find("20000 bytes"), std::string::npos) << src->describe();
  const size_t n_train = 18000;
  std::set<size_t> starts;
  for (int64_t cursor = 0; cursor < 50; ++cursor) {
    const Batch b = src->train_batch(cursor, 8, 32);
    for (int64_t r = 0; r < 8; ++r) {
      const size_t at = locate(text, &b.inputs[r * 32], &b.targets[r * 32], 32);
      ASSERT_NE(at, std::string::npos);
      EXPECT_LE(at + 33, n_train) << "a training window reaches into the validation split";
      starts.insert(at);
    }
  }
  EXPECT_GT(starts.size(), 380u) << "training windows should be spread over the file";
  for (int64_t index = 0; index < 10; ++index) {
    const Batch b = src->val_batch(index, 4, 32);
    for (int64_t r = 0; r < 4; ++r) {
      const size_t at = locate(text, &b.inputs[r * 32], &b.targets[r * 32], 32);
      ASSERT_NE(at, std::string::npos);
      EXPECT_GE(at, n_train) << "a validation window starts in the training split";
      EXPECT_LE(at + 33, text.size());
    }
  }
}

TEST_F(TextData, DeterministicAndSeedDependent) {
  const std::string path = write("c.bin", corpus(5000));
  auto a = make_data_source(config(path), 1), b = make_data_source(config(path), 1),
       c = make_data_source(config(path), 2);
  EXPECT_EQ(a->train_batch(3, 4, 16).inputs, b->train_batch(3, 4, 16).inputs);
  EXPECT_NE(a->train_batch(3, 4, 16).inputs, c->train_batch(3, 4, 16).inputs);
  EXPECT_EQ(a->val_batch(2, 4, 16).inputs, c->val_batch(2, 4, 16).inputs) << "validation ignores the seed";
  const Batch small = a->train_batch(4, 2, 16), big = a->train_batch(2, 4, 16);
  EXPECT_TRUE(std::equal(small.inputs.begin(), small.inputs.end(), big.inputs.begin()));
}

TEST_F(TextData, TokenizerIsBytes) {
  auto src = make_data_source(config(write("c.txt", corpus(1000))), 1);
  const std::string s("h\xc3\xa9llo\n", 7);
  const auto t = src->encode(s);
  EXPECT_EQ(t.size(), 7u);
  EXPECT_EQ(t[1], 0xc3);
  EXPECT_EQ(src->decode(t), s);
  EXPECT_EQ(src->encode_prompt(s), t);
  EXPECT_EQ(src->eos_token(), -1);
  EXPECT_THROW(src->eval_problems(3), std::logic_error);
}

namespace {
void expect_error(const std::function<void()>& f, const std::string& fragment) {
  try {
    f();
    ADD_FAILURE() << "expected an error containing '" << fragment << "'";
  } catch (const std::runtime_error& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}
}  // namespace

TEST_F(TextData, ClearErrors) {
  const std::string missing = (dir_ / "nope.txt").string();
  expect_error([&] { make_data_source(config(missing), 1); }, "does not exist");
  expect_error([&] { make_data_source(config(write("empty.txt", "")), 1); }, "is empty");
  expect_error([&] { make_data_source(config(dir_.string()), 1); }, "is a directory");
  expect_error([&] { make_data_source(config(""), 1); }, "needs a file path");
  const std::string small = write("small.txt", corpus(100));
  expect_error([&] { make_data_source(config(small, 0.1), 1, 128); }, "training bytes");
  expect_error([&] { make_data_source(config(small, 0.1), 1, 40); }, "validation bytes");
  expect_error([&] { make_data_source(config(small, 1.0), 1); }, "val_fraction");
  expect_error([&] { make_data_source(config(small, -0.5), 1); }, "val_fraction");
  // No validation split at all: training works, validation says why it cannot.
  auto no_val = make_data_source(config(small, 0.0), 1, 40);
  EXPECT_NO_THROW(no_val->train_batch(0, 2, 40));
  expect_error([&] { no_val->val_batch(0, 2, 40); }, "no validation split");
  // Sequences longer than the file, asked for later.
  auto src = make_data_source(config(small, 0.1), 1);
  expect_error([&] { src->train_batch(0, 1, 500); }, "training bytes");
}
