// Fuzz-style decoding: thousands of random buffers and mutations of valid
// frames (bit flips, byte overwrites, truncations, splices, header fix-ups so
// mutations reach the segment and pointer checks) go into the decoder. Each
// must give either a valid envelope, whose every field can then be read
// without an exception, or an "envelope" error; never a crash. Seeded: the
// same inputs every run.
#include <gtest/gtest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <random>

#include <kj/exception.h>

#include "actors/transport/envelope.hpp"
#include "tests/actors/messaging_samples.hpp"

namespace troupe {
namespace {

using Bytes = std::vector<uint8_t>;

struct Tally {
  size_t ok = 0, rejected = 0;
  std::map<std::string, size_t> by_code;
};

// Decodes `f` and checks the outcome is one of the two allowed ones.
void probe(const Bytes& f, Tally& t) {
  auto r = Envelope::decode(f.data(), f.size());
  if (!r) {
    auto code = envelope_error_code(r.error());
    ASSERT_TRUE(code.has_value()) << "non-envelope error: " << caf::to_string(r.error());
    ++t.rejected;
    ++t.by_code[to_string(*code)];
    return;
  }
  ++t.ok;
  if (r->empty()) return;
  auto kind = r->kind();
  ASSERT_TRUE(kind);
  // A message that passed validation must be readable end to end: the sample
  // checker touches every field (it reports differences, it must not throw).
  try {
    (void)testing::check_sample(*r, *kind, {});
  } catch (const kj::Exception& e) {
    FAIL() << "validated " << kind_name(*kind) << " message threw on read: " << e.getDescription().cStr();
  }
  // And it must survive another trip through the encoder.
  auto again = r->encode();
  auto back = Envelope::decode(again.data(), again.size());
  ASSERT_TRUE(back) << caf::to_string(back.error());
}

void fix_raw_len(Bytes& f) {
  if (f.size() < kFrameHeaderBytes) return;
  uint64_t n = f.size() - kFrameHeaderBytes;
  std::memcpy(f.data() + 8, &n, 8);
}

std::vector<Bytes> seeds() {
  std::vector<Bytes> out;
  uint64_t seed = 100;
  // Without the CRC-32 trailer, so that mutations reach the decoder and the
  // validator instead of stopping at the checksum (tested on its own in
  // messaging_malformed_test); a few with it, as sent by default.
  EncodeOptions plain;
  plain.checksum = false;
  for (auto kind : testing::all_kinds()) {
    out.push_back(testing::make_sample(kind, {seed++, 3, 5}).encode(plain));
    out.push_back(testing::make_sample(kind, {seed++, 0, 2}).encode(plain));
  }
  for (auto kind : {Envelope::Kind::ACTIVATIONS, Envelope::Kind::COMBINE})
    out.push_back(testing::make_sample(kind, {seed++, 3, 5}).encode());
  // Compressed frames too (threshold lowered so small samples compress).
  EncodeOptions eager;
  eager.compress_threshold = 16;
  eager.checksum = false;
  for (auto kind : {Envelope::Kind::DISPATCH, Envelope::Kind::COMBINE, Envelope::Kind::SNAPSHOT})
    out.push_back(testing::make_sample(kind, {seed++, 16, 8, true}).encode(eager));
  return out;
}

// Fixed by default; TROUPE_FUZZ_SEED=<n> explores other inputs and
// TROUPE_FUZZ_ITERATIONS=<n> runs longer (bench/fuzz_long.sh: 1,000,000 per seed).
uint64_t fuzz_seed(uint64_t fallback) {
  const char* s = std::getenv("TROUPE_FUZZ_SEED");
  return s ? std::strtoull(s, nullptr, 10) : fallback;
}
int fuzz_iterations(int fallback) {
  const char* s = std::getenv("TROUPE_FUZZ_ITERATIONS");
  return s ? static_cast<int>(std::strtol(s, nullptr, 10)) : fallback;
}

TEST(EnvelopeFuzz, RandomAndMutatedBuffersNeverCrash) {
  std::mt19937_64 rng(fuzz_seed(20240607));
  const auto base = seeds();
  Tally t;
  auto pick = [&](size_t n) { return static_cast<size_t>(rng() % n); };
  const int kIterations = fuzz_iterations(40000);
  for (int it = 0; it < kIterations; ++it) {
    Bytes f;
    const int mode = static_cast<int>(rng() % 8);
    if (mode == 0) {
      // Pure noise, sometimes long.
      f.resize(pick(600));
      for (auto& b : f) b = static_cast<uint8_t>(rng());
    } else if (mode == 1) {
      // Noise behind a valid header, so it reaches the segment table.
      f.resize(kFrameHeaderBytes + 8 * pick(40));
      for (auto& b : f) b = static_cast<uint8_t>(rng());
      std::memcpy(f.data(), kFrameMagic, 4);
      f[4] = kFrameVersion;
      f[5] = 0;
      f[6] = f[7] = 0;
      fix_raw_len(f);
      // A plausible segment table: one segment covering the rest.
      if (f.size() >= kFrameHeaderBytes + 16) {
        uint32_t zero = 0, words = static_cast<uint32_t>((f.size() - kFrameHeaderBytes - 8) / 8);
        std::memcpy(f.data() + 16, &zero, 4);
        std::memcpy(f.data() + 20, &words, 4);
      }
    } else {
      f = base[pick(base.size())];
      const bool compressed = f[5] != 0;
      switch (mode) {
        case 2:  // bit flips in the body
        case 3: {
          const int flips = 1 + static_cast<int>(rng() % 8);
          for (int i = 0; i < flips; ++i) {
            size_t pos = kFrameHeaderBytes + pick(f.size() - kFrameHeaderBytes);
            f[pos] ^= static_cast<uint8_t>(1u << (rng() % 8));
          }
          break;
        }
        case 4: {  // overwrite a word with a random (often pointer-like) value
          size_t pos = kFrameHeaderBytes + 8 * pick((f.size() - kFrameHeaderBytes) / 8);
          uint64_t w = rng();
          std::memcpy(f.data() + pos, &w, std::min<size_t>(8, f.size() - pos));
          break;
        }
        case 5:  // truncation, with or without fixing the header
          f.resize(pick(f.size()));
          if (rng() % 2) fix_raw_len(f);
          break;
        case 6: {  // splice: prefix of one frame + suffix of another
          const Bytes& g = base[pick(base.size())];
          size_t a = pick(f.size()), b = pick(g.size());
          f.resize(a);
          f.insert(f.end(), g.begin() + static_cast<ptrdiff_t>(b), g.end());
          if (rng() % 2) fix_raw_len(f);
          break;
        }
        case 7: {  // header damage: flags, length, version
          f[4 + pick(12)] ^= static_cast<uint8_t>(rng());
          break;
        }
      }
      (void)compressed;
    }
    probe(f, t);
    if (::testing::Test::HasFatalFailure()) {
      ADD_FAILURE() << "iteration " << it << " mode " << mode << " size " << f.size();
      return;
    }
  }
  EXPECT_EQ(t.ok + t.rejected, static_cast<size_t>(kIterations));
  // The mutations must exercise both outcomes and several distinct checks.
  EXPECT_GT(t.ok, 0u);
  EXPECT_GT(t.rejected, 0u);
  EXPECT_GE(t.by_code.size(), 8u);
  std::string summary;
  for (const auto& [code, n] : t.by_code) summary += code + "=" + std::to_string(n) + " ";
  std::printf("fuzz: %zu decoded, %zu rejected: %s\n", t.ok, t.rejected, summary.c_str());
}

TEST(EnvelopeFuzz, CafDeserializerSurvivesMutations) {
  std::mt19937_64 rng(fuzz_seed(77));
  const auto base = seeds();
  size_t stream_errors = 0, invalid = 0, valid = 0;
  const int iterations = fuzz_iterations(40000) * 3 / 80;  // 1,500 by default
  for (int it = 0; it < iterations; ++it) {
    auto bytes = testing::caf_serialize(
        testing::make_sample(testing::all_kinds()[it % testing::all_kinds().size()], {uint64_t(it), 2, 3}));
    const int flips = 1 + static_cast<int>(rng() % 6);
    for (int i = 0; i < flips; ++i) bytes[rng() % bytes.size()] ^= static_cast<char>(1u << (rng() % 8));
    if (rng() % 4 == 0) bytes.resize(rng() % bytes.size());
    Envelope out;
    if (testing::caf_deserialize(bytes, out)) {
      ++stream_errors;
    } else if (!out.ok()) {
      ++invalid;
      EXPECT_TRUE(out.empty() || envelope_error_code(out.error()).has_value());
    } else {
      ++valid;
      auto kind = out.kind();
      ASSERT_TRUE(kind);
      (void)testing::check_sample(out, *kind, {});
    }
  }
  EXPECT_GT(invalid, 0u);
  EXPECT_GT(stream_errors + valid, 0u);
  std::printf("fuzz: %zu decoded, %zu rejected (CAF deserializer: %zu stream errors, %zu invalid)\n", valid,
              stream_errors + invalid, stream_errors, invalid);
}

}  // namespace
}  // namespace troupe
