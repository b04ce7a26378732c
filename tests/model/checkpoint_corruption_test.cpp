// A corpus of damaged checkpoints: every file deleted, truncated, bit-flipped
// or extended, garbage and forged manifests, and a forged tensor file. Each
// must be rejected with a CheckpointError naming the right file.
#include <gtest/gtest.h>
#include <unistd.h>
#include <zstd.h>

#include <capnp/message.h>
#include <capnp/serialize.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>

#include "model/checkpoint.hpp"
#include "schemas/checkpoint.capnp.h"

using namespace troupe::model;
namespace fs = std::filesystem;

namespace {

const char* const kFiles[] = {"manifest.bin", "params.f32.zst", "adam_m.f32.zst", "adam_v.f32.zst"};

ParamLayout layout_for_test() {
  ParamLayout l;
  l.add("model.embed_tokens.weight", {16, 8});
  l.add("model.layers.0.self_attn.q_proj.weight", {8, 8});
  l.add("model.layers.0.input_layernorm.weight", {8}, true, false);
  l.add("model.norm.weight", {8}, true, false);
  return l;
}

TrainingState state_for_test(const ParamLayout& layout) {
  TrainingState s;
  s.seed = 77;
  s.step = 10;
  s.data_cursor = 10;
  s.rng_state = "12345678";
  for (int k = 0; k < 3; ++k) {
    std::vector<float> v(static_cast<size_t>(layout.total()));
    for (size_t i = 0; i < v.size(); ++i) v[i] = std::sin(static_cast<float>(i * (k + 1)) * 0.37f);
    (k == 0 ? s.params : k == 1 ? s.adam_m : s.adam_v) = std::move(v);
  }
  return s;
}

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

void spit(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary | std::ios::trunc) << bytes;
}

class Corruption : public ::testing::Test {
 protected:
  void SetUp() override {
    root_ = fs::temp_directory_path() / ("troupe_corrupt_" + std::to_string(::getpid()) + "_" +
                                         ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(root_);
    good_ = root_ / "good";
    save_checkpoint(good_.string(), state_for_test(layout_), layout_);
  }
  void TearDown() override { fs::remove_all(root_); }

  // A fresh copy of the good checkpoint to damage.
  fs::path copy() {
    const fs::path d = root_ / ("case" + std::to_string(n_++));
    fs::copy(good_, d);
    return d;
  }

  // Loads `dir` and checks the error names `file` (and contains `fragment`).
  void expect_rejected(const fs::path& dir, const std::string& file, const std::string& fragment,
                       const std::string& what_was_done) {
    SCOPED_TRACE(what_was_done);
    try {
      load_checkpoint(dir.string(), layout_);
      ADD_FAILURE() << "damaged checkpoint was accepted";
    } catch (const CheckpointError& e) {
      EXPECT_EQ(fs::path(e.file()), dir / file) << e.what();
      EXPECT_NE(std::string(e.what()).find(file), std::string::npos) << e.what();
      if (!fragment.empty()) {
        EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
      }
    }
  }

  // Rewrites the manifest through Cap'n Proto (with a valid trailer).
  void edit_manifest(const fs::path& dir,
                     const std::function<void(troupe::schemas::CheckpointManifest::Builder)>& edit) {
    const std::string bytes = slurp(dir / "manifest.bin");
    const size_t body = bytes.size() - 16;
    kj::Array<capnp::word> words = kj::heapArray<capnp::word>(body / 8);
    std::memcpy(words.begin(), bytes.data(), body);
    capnp::FlatArrayMessageReader reader(words.asPtr());
    capnp::MallocMessageBuilder builder;
    builder.setRoot(reader.getRoot<troupe::schemas::CheckpointManifest>());
    edit(builder.getRoot<troupe::schemas::CheckpointManifest>());
    write_manifest(dir, builder);
  }

  static void write_manifest(const fs::path& dir, capnp::MessageBuilder& builder) {
    const auto flat = capnp::messageToFlatArray(builder);
    const auto b = flat.asBytes();
    std::string out(reinterpret_cast<const char*>(b.begin()), b.size());
    const uint64_t h = checkpoint_hash(out.data(), out.size());
    out += "TRPCKPT1";
    out.append(reinterpret_cast<const char*>(&h), 8);
    spit(dir / "manifest.bin", out);
  }

  ParamLayout layout_ = layout_for_test();
  fs::path root_, good_;
  int n_ = 0;
};

}  // namespace

TEST_F(Corruption, TheGoodCheckpointLoads) { EXPECT_NO_THROW(load_checkpoint(good_.string(), layout_)); }

TEST_F(Corruption, DeletedFiles) {
  for (const char* f : kFiles) {
    const fs::path d = copy();
    fs::remove(d / f);
    expect_rejected(d, f, "missing", std::string("deleted ") + f);
  }
  const fs::path gone = root_ / "nothing_here";
  try {
    load_checkpoint(gone.string(), layout_);
    ADD_FAILURE();
  } catch (const CheckpointError& e) {
    EXPECT_EQ(fs::path(e.file()), gone);
    EXPECT_NE(std::string(e.what()).find("does not exist"), std::string::npos);
  }
}

TEST_F(Corruption, TruncatedFiles) {
  for (const char* f : kFiles) {
    const size_t size = fs::file_size(good_ / f);
    for (size_t keep : {size_t{0}, size_t{1}, size / 2, size - 1}) {
      const fs::path d = copy();
      fs::resize_file(d / f, keep);
      expect_rejected(d, f, "", std::string("truncated ") + f + " to " + std::to_string(keep));
    }
  }
}

TEST_F(Corruption, FlippedBytes) {
  for (const char* f : kFiles) {
    const std::string bytes = slurp(good_ / f);
    // Every byte of small files would be slow to copy dirs for; take a spread.
    for (size_t pos = 0; pos < bytes.size(); pos += 1 + bytes.size() / 23) {
      for (unsigned char mask : {0x01, 0x80}) {
        const fs::path d = copy();
        std::string bad = bytes;
        bad[pos] = static_cast<char>(bad[pos] ^ mask);
        spit(d / f, bad);
        expect_rejected(d, f, "", std::string("flipped byte ") + std::to_string(pos) + " of " + f);
      }
    }
    const fs::path d = copy();
    std::string bad = bytes;
    bad.back() = static_cast<char>(bad.back() ^ 0x40);
    spit(d / f, bad);
    expect_rejected(d, f, "", std::string("flipped last byte of ") + f);
  }
}

TEST_F(Corruption, AppendedBytes) {
  for (const char* f : kFiles) {
    const fs::path d = copy();
    spit(d / f, slurp(good_ / f) + std::string(8, '\0'));
    expect_rejected(d, f, "", std::string("appended to ") + f);
  }
}

// A file grown huge (sparse: no disk used) is refused by its size, naming
// it, before anything is allocated for it (it used to end in std::bad_alloc).
TEST_F(Corruption, HugeFilesAreRefusedBeforeReading) {
  for (const char* f : kFiles) {
    const fs::path d = copy();
    fs::resize_file(d / f, uint64_t{40} << 30);  // 40 GiB
    expect_rejected(d, f, "has 42949672960 bytes", std::string("40 GiB ") + f);
  }
}

TEST_F(Corruption, GarbageManifest) {
  fs::path d = copy();
  spit(d / "manifest.bin", "this is not a manifest at all, just text...");
  expect_rejected(d, "manifest.bin", "", "text manifest");
  d = copy();
  std::string noise(4096, '\0');
  for (size_t i = 0; i < noise.size(); ++i) noise[i] = static_cast<char>((i * 2654435761u) >> 13);
  spit(d / "manifest.bin", noise);
  expect_rejected(d, "manifest.bin", "", "noise manifest");
  // Noise with a valid trailer: it passes the checksum and must fail in parsing
  // or validation, never crash.
  d = copy();
  const uint64_t h = checkpoint_hash(noise.data(), noise.size());
  spit(d / "manifest.bin", noise + "TRPCKPT1" + std::string(reinterpret_cast<const char*>(&h), 8));
  expect_rejected(d, "manifest.bin", "", "noise with a valid trailer");
}

TEST_F(Corruption, ForgedManifests) {
  struct Case {
    const char* what;
    const char* fragment;
    std::function<void(troupe::schemas::CheckpointManifest::Builder)> edit;
  };
  const std::vector<Case> cases = {
      {"future version", "format version 2", [](auto m) { m.setFormatVersion(2); }},
      {"path escape", "should be named", [](auto m) { m.getFiles()[1].setFileName("../../etc/passwd"); }},
      {"paramCount", "paramCount", [](auto m) { m.setParamCount(m.getParamCount() + 1); }},
      {"numel vs shape", "numel", [](auto m) { m.getTensors()[0].setNumel(3); }},
      {"offset gap", "offset", [](auto m) { m.getTensors()[1].setOffset(m.getTensors()[1].getOffset() + 1); }},
      {"duplicate name", "twice", [](auto m) { m.getTensors()[1].setName(m.getTensors()[0].getName()); }},
      {"negative dim", "bad shape", [](auto m) { m.getTensors()[0].getShape().set(0, -16); }},
      {"hash count", "tensor hashes", [](auto m) { m.getFiles()[0].initTensorHashes(1); }},
      {"two adam_m files", "two files hold", [](auto m) {
         m.getFiles()[2].setRole(troupe::schemas::TensorRole::ADAM_M);
       }},
      {"adam_m without adam_v", "together", [](auto m) {
         auto old = m.disownFiles();
         auto files = m.initFiles(2);
         files.setWithCaveats(0, old.getReader()[0]);
         files.setWithCaveats(1, old.getReader()[1]);
       }},
      {"renamed tensor", "layout mismatch", [](auto m) { m.getTensors()[3].setName("model.other.weight"); }},
  };
  for (const Case& c : cases) {
    const fs::path d = copy();
    edit_manifest(d, c.edit);
    expect_rejected(d, "manifest.bin", c.fragment, c.what);
  }
  // Dropping the params file from the list.
  const fs::path d = copy();
  edit_manifest(d, [](auto m) {
    auto files = m.getFiles();
    files[0].setRole(troupe::schemas::TensorRole::ADAM_M);
  });
  expect_rejected(d, "manifest.bin", "", "params not listed");
}

// A tensor file that is a valid zstd frame with the right size and a file hash
// that matches (the manifest was forged to match), but one tensor's data
// changed: only the per-tensor checksum can see it, and it names the tensor.
TEST_F(Corruption, PerTensorChecksumNamesTheTensor) {
  const fs::path d = copy();
  TrainingState s = state_for_test(layout_);
  const ParamEntry& q = layout_.at("model.layers.0.self_attn.q_proj.weight");
  s.adam_m[static_cast<size_t>(q.offset + 5)] += 1.0f;
  std::string frame(ZSTD_compressBound(s.adam_m.size() * 4), '\0');
  frame.resize(ZSTD_compress(frame.data(), frame.size(), s.adam_m.data(), s.adam_m.size() * 4, 3));
  spit(d / "adam_m.f32.zst", frame);
  edit_manifest(d, [&](auto m) {
    auto f = m.getFiles()[1];
    ASSERT_EQ(f.getRole(), troupe::schemas::TensorRole::ADAM_M);
    f.setCompressedBytes(frame.size());
    f.setFileHash(checkpoint_hash(frame.data(), frame.size()));
  });
  expect_rejected(d, "adam_m.f32.zst", "checksum mismatch for tensor 'model.layers.0.self_attn.q_proj.weight'",
                  "forged tensor data");
}

TEST_F(Corruption, NotZstd) {
  const fs::path d = copy();
  const size_t size = fs::file_size(good_ / "params.f32.zst");
  spit(d / "params.f32.zst", std::string(size, 'z'));
  expect_rejected(d, "params.f32.zst", "bad zstd frame", "params replaced by text");
}

TEST_F(Corruption, FailedLoadLeavesTheCallersStateAlone) {
  const fs::path d = copy();
  fs::remove(d / "adam_v.f32.zst");
  TrainingState mine = load_checkpoint(good_.string(), layout_);
  const std::vector<float> before = mine.params;
  EXPECT_THROW(mine = load_checkpoint(d.string(), layout_), CheckpointError);
  EXPECT_EQ(mine.params, before);
}
