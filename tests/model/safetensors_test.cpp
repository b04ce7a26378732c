// safetensors export/import (model/safetensors.cpp): round trip, a golden
// byte-level file written out by hand, a table of malformed files, and checks
// with Python (its json module always; the reference `safetensors` package when
// installed).
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "model/safetensors.hpp"

using namespace troupe::model;
namespace fs = std::filesystem;

namespace {

std::string slurp(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::ostringstream os;
  os << in.rdbuf();
  return os.str();
}

// a: [2], b: [1, 1]
ParamLayout tiny_layout() {
  ParamLayout l;
  l.add("a", {2});
  l.add("b", {1, 1});
  return l;
}

std::string u64le(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[static_cast<size_t>(i)] = static_cast<char>((v >> (8 * i)) & 0xff);
  return s;
}

class Safetensors : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() / ("troupe_st_" + std::to_string(::getpid()) + "_" +
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

  fs::path dir_;
};

}  // namespace

TEST_F(Safetensors, RoundTrip) {
  ParamLayout l;
  l.add("model.embed_tokens.weight", {14, 8});
  l.add("model.layers.0.mlp.experts.0.gate_proj.weight", {16, 8});
  l.add("model.norm.weight", {8}, true, false);
  std::vector<float> p(static_cast<size_t>(l.total()));
  for (size_t i = 0; i < p.size(); ++i) p[i] = std::cos(static_cast<float>(i) * 1.7f) * 3.0f;
  p[5] = -0.0f;
  const std::string path = (dir_ / "m.safetensors").string();
  export_safetensors(path, l, p, {{"format", "pt"}, {"troupe.step", "42"}, {"quote\"d", "line\nbreak"}});
  const std::string bytes = slurp(path);
  uint64_t n = 0;
  std::memcpy(&n, bytes.data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u) << "the data area starts 8-byte aligned";
  EXPECT_EQ(bytes.size(), 8 + n + p.size() * 4);
  std::map<std::string, std::string> meta;
  const std::vector<float> back = import_safetensors(path, l, &meta);
  ASSERT_EQ(back.size(), p.size());
  EXPECT_EQ(std::memcmp(back.data(), p.data(), p.size() * 4), 0);
  EXPECT_EQ(meta.at("troupe.step"), "42");
  EXPECT_EQ(meta.at("quote\"d"), "line\nbreak");
  for (const auto& e : fs::directory_iterator(dir_))
    EXPECT_EQ(e.path().filename(), "m.safetensors") << "temporary file left behind";
}

TEST_F(Safetensors, NonFiniteValuesAreRejectedNamingTheTensor) {
  const ParamLayout l = tiny_layout();
  for (float bad : {std::nanf(""), INFINITY, -INFINITY}) {
    std::vector<float> p = {0.5f, -1.0f, 2.0f};
    p[2] = bad;  // element 0 of tensor "b"
    const std::string path = (dir_ / "bad.safetensors").string();
    export_safetensors(path, l, p, {});
    try {
      import_safetensors(path, l);
      ADD_FAILURE() << "accepted a tensor holding " << bad;
    } catch (const SafetensorsError& e) {
      const std::string m = e.what();
      EXPECT_NE(m.find("tensor 'b' holds a non-finite value"), std::string::npos) << m;
      EXPECT_NE(m.find("at element 0"), std::string::npos) << m;
    }
  }
  std::vector<float> ok = {0.5f, -1.0f, 2.0f};
  const std::string path = (dir_ / "ok.safetensors").string();
  export_safetensors(path, l, ok, {});
  EXPECT_EQ(import_safetensors(path, l), ok);
}

TEST_F(Safetensors, GoldenBytes) {
  const ParamLayout l = tiny_layout();
  const std::string path = (dir_ / "g.safetensors").string();
  export_safetensors(path, l, {1.0f, -2.0f, 0.5f});
  // Written out by hand: header length 141 padded with 3 spaces to 144 (0x90),
  // then 1.0f, -2.0f, 0.5f as little-endian IEEE-754.
  const std::string header =
      "{\"__metadata__\":{\"format\":\"pt\"},"
      "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "\"b\":{\"dtype\":\"F32\",\"shape\":[1,1],\"data_offsets\":[8,12]}}   ";
  const std::string expected = std::string("\x90\0\0\0\0\0\0\0", 8) + header +
                               std::string("\x00\x00\x80\x3f\x00\x00\x00\xc0\x00\x00\x00\x3f", 12);
  ASSERT_EQ(header.size(), 144u);
  EXPECT_EQ(slurp(path), expected);
  EXPECT_EQ(import_safetensors(path, l), (std::vector<float>{1.0f, -2.0f, 0.5f}));
}

TEST_F(Safetensors, AcceptsValidVariants) {
  const ParamLayout l = tiny_layout();
  const std::string data("\x00\x00\x80\x3f\x00\x00\x00\xc0\x00\x00\x00\x3f", 12);
  // Unpadded header, whitespace, escapes, no metadata, tensors listed out of order.
  const std::string header =
      "{ \"b\" : {\"data_offsets\":[8,12], \"shape\":[1,1], \"dtype\":\"F32\"},\n"
      "  \"\\u0061\": {\"dtype\":\"F\\u0033\\u0032\",\"shape\":[2],\"data_offsets\":[0,8]},"
      "  \"__metadata__\": {\"n\\u00e9\": \"\\ud83d\\ude00\"}}";
  std::map<std::string, std::string> meta;
  EXPECT_EQ(import_safetensors(write("v.st", u64le(header.size()) + header + data), l, &meta),
            (std::vector<float>{1.0f, -2.0f, 0.5f}));
  EXPECT_EQ(meta.at("n\xc3\xa9"), "\xf0\x9f\x98\x80");
}

TEST_F(Safetensors, RejectsMalformedFiles) {
  const ParamLayout l = tiny_layout();
  const std::string data12(12, '\0');
  const std::string a = "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}";
  const std::string b = "\"b\":{\"dtype\":\"F32\",\"shape\":[1,1],\"data_offsets\":[8,12]}";
  auto file = [](const std::string& header, const std::string& data) {
    return u64le(header.size()) + header + data;
  };
  struct Case {
    const char* what;
    std::string bytes;
    const char* fragment;
  };
  const std::vector<Case> cases = {
      {"shorter than 8 bytes", "abc", "too short"},
      {"huge header length", u64le(uint64_t{1} << 62) + "{}", "exceeds"},
      {"header past the end", u64le(1000) + "{}", "runs past the end"},
      {"not an object", file("[]", ""), "does not start with '{'"},
      {"unterminated object", file("{" + a + "," + b, data12), "unexpected end"},
      {"trailing characters", file("{" + a + "," + b + "}x", data12), "unexpected characters"},
      {"duplicate key", file("{" + a + "," + a + "," + b + "}", data12), "duplicate key"},
      {"F16 dtype", file("{\"a\":{\"dtype\":\"F16\",\"shape\":[2],\"data_offsets\":[0,8]}," + b + "}", data12),
       "dtype F16"},
      {"missing tensor", file("{" + a + "}", std::string(8, '\0')), "tensor 'b' is missing"},
      {"extra tensor",
       file("{" + a + "," + b + ",\"c\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[12,16]}}",
            std::string(16, '\0')),
       "'c' is not in the model's layout"},
      {"shape mismatch", file("{" + a + ",\"b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[8,12]}}", data12),
       "tensor 'b' has shape [1]"},
      {"offsets out of bounds",
       file("{" + a + ",\"b\":{\"dtype\":\"F32\",\"shape\":[1,1],\"data_offsets\":[8,16]}}", data12),
       "out of bounds"},
      {"begin after end", file("{" + a + ",\"b\":{\"dtype\":\"F32\",\"shape\":[1,1],\"data_offsets\":[12,8]}}", data12),
       "out of bounds"},
      {"overlap", file("{" + a + ",\"b\":{\"dtype\":\"F32\",\"shape\":[1,1],\"data_offsets\":[4,8]}}", data12),
       "overlaps"},
      {"gap", file("{" + a + ",\"b\":{\"dtype\":\"F32\",\"shape\":[1,1],\"data_offsets\":[9,13]}}", std::string(13, '\0')),
       "gap of 1 bytes"},
      {"trailing data", file("{" + a + "," + b + "}", std::string(16, '\0')), "data area is 16"},
      {"span vs shape", file("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}," + b + "}", data12),
       "shape needs 12"},
      {"negative dim", file("{\"a\":{\"dtype\":\"F32\",\"shape\":[-2],\"data_offsets\":[0,8]}," + b + "}", data12),
       "negative"},
      {"float dim", file("{\"a\":{\"dtype\":\"F32\",\"shape\":[2.0],\"data_offsets\":[0,8]}," + b + "}", data12),
       "expected an integer"},
      {"leading zero", file("{\"a\":{\"dtype\":\"F32\",\"shape\":[02],\"data_offsets\":[0,8]}," + b + "}", data12),
       "leading zero"},
      {"literal", file("{\"a\":{\"dtype\":true,\"shape\":[2],\"data_offsets\":[0,8]}," + b + "}", data12),
       "unsupported JSON value"},
      {"invalid UTF-8", file("{\"\xff\":1}", ""), "not valid UTF-8"},
      {"non-string metadata", file("{\"__metadata__\":{\"x\":1}," + a + "," + b + "}", data12), "must be a string"},
      {"unknown field", file("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8],\"x\":1}," + b + "}", data12),
       "unknown field"},
      {"missing field", file("{\"a\":{\"dtype\":\"F32\",\"shape\":[2]}," + b + "}", data12), "needs dtype"},
      {"three offsets", file("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8,9]}," + b + "}", data12),
       "[begin, end]"},
      {"unterminated string", file("{\"a", ""), "unterminated string"},
      {"control character", file("{\"a\tb\":1}", ""), "control character"},
      {"lone surrogate", file("{\"\\ud800\":1}", ""), "unpaired surrogate"},
      {"bad escape", file("{\"\\q\":1}", ""), "bad escape"},
      {"deep nesting", file("{\"__metadata__\":[[[[[[[[[[1]]]]]]]]]]}", ""), "nesting too deep"},
      {"huge integer", file("{\"a\":{\"dtype\":\"F32\",\"shape\":[99999999999999999999],\"data_offsets\":[0,8]}}", ""),
       "integer too large"},
      {"huge shape", file("{\"a\":{\"dtype\":\"F32\",\"shape\":[1099511627776,1099511627776],\"data_offsets\":[0,8]}}", std::string(8, '\0')),
       "too large"},
  };
  for (const Case& c : cases) {
    const std::string path = write("bad.st", c.bytes);
    try {
      import_safetensors(path, l);
      ADD_FAILURE() << c.what << ": accepted";
    } catch (const SafetensorsError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(c.fragment), std::string::npos) << c.what << ": " << msg;
      EXPECT_NE(msg.find(path), std::string::npos) << c.what << ": the message names the file";
    }
  }
  EXPECT_THROW(import_safetensors((dir_ / "missing.st").string(), l), SafetensorsError);
  EXPECT_THROW(import_safetensors(dir_.string(), l), SafetensorsError);
  EXPECT_THROW(export_safetensors((dir_ / "x.st").string(), l, {1.0f}), SafetensorsError);
}

// Python's json and struct modules read our file on their own: an independent
// check of the header and data layout. Then the reference package, if present.
TEST_F(Safetensors, ReadableByPythonJsonAndStruct) {
#ifndef TROUPE_PYTHON3
  GTEST_SKIP() << "python3 was not found at configure time";
#else
  ParamLayout l;
  l.add("x.weight", {3, 2});
  l.add("y", {5});
  std::vector<float> p = {0.5f, -1.25f, 3.0f, 4.5f, -0.0f, 1e-3f, 7.0f, 8.0f, 9.0f, 10.0f, 11.0f};
  const std::string path = (dir_ / "py.safetensors").string();
  export_safetensors(path, l, p);
  const std::string script = write("check.py", R"(import json, struct, sys
path = sys.argv[1]
raw = open(path, 'rb').read()
(n,) = struct.unpack('<Q', raw[:8])
assert (8 + n) % 8 == 0, 'data not aligned'
header = json.loads(raw[8:8 + n].decode('utf-8'))
assert header['__metadata__'] == {'format': 'pt'}, header
data = raw[8 + n:]
x, y = header['x.weight'], header['y']
assert x['dtype'] == 'F32' and x['shape'] == [3, 2] and x['data_offsets'] == [0, 24], x
assert y['dtype'] == 'F32' and y['shape'] == [5] and y['data_offsets'] == [24, 44], y
vals = struct.unpack('<11f', data)
assert len(data) == 44
want = [0.5, -1.25, 3.0, 4.5, -0.0, 1e-3, 7.0, 8.0, 9.0, 10.0, 11.0]
assert all(abs(a - b) < 1e-7 for a, b in zip(vals, want)), vals
print('stdlib ok')
)");
  const std::string py = TROUPE_PYTHON3;
  EXPECT_EQ(std::system((py + " " + script + " " + path).c_str()), 0);
#endif
}

// The reference implementation (pip package `safetensors`, numpy backend).
TEST_F(Safetensors, ReadableByTheReferencePackage) {
#ifndef TROUPE_PYTHON3
  GTEST_SKIP() << "python3 was not found at configure time";
#else
  ParamLayout l;
  l.add("x.weight", {3, 2});
  l.add("y", {5});
  std::vector<float> p = {0.5f, -1.25f, 3.0f, 4.5f, -0.0f, 1e-3f, 7.0f, 8.0f, 9.0f, 10.0f, 11.0f};
  const std::string path = (dir_ / "py.safetensors").string();
  export_safetensors(path, l, p);
  const std::string py = TROUPE_PYTHON3;
  if (std::system((py + " -c 'import safetensors, numpy' 2>/dev/null").c_str()) != 0) {
    GTEST_SKIP() << "the Python safetensors package (with numpy) is not installed";
  }
  const std::string ref = write("ref.py", R"(import sys
from safetensors.numpy import load_file
t = load_file(sys.argv[1])
assert t['x.weight'].shape == (3, 2) and str(t['x.weight'].dtype) == 'float32'
assert t['y'].tolist()[0] == 7.0
print('safetensors ok')
)");
  EXPECT_EQ(std::system((py + " " + ref + " " + path).c_str()), 0);
#endif
}
