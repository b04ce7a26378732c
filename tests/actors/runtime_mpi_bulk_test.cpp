// The shared-memory bulk path of the Envelope transport (actors/transport/envelope_shm.hpp),
// exercised through CAF serialization in one process: large envelopes become a
// 64-byte record naming a pooled slot; every kind decodes to the same fields; a
// slot is reused only after the receiving Envelope is gone; a forged, replayed
// or stale record is an invalid envelope carrying bulk_unavailable (never a
// crash); bulk_shm_cleanup() removes the slots.
#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "actors/transport/envelope.hpp"
#include "actors/transport/envelope_shm.hpp"
#include "tests/actors/messaging_samples.hpp"

namespace troupe {
namespace {

using testing::caf_deserialize;
using testing::caf_serialize;
using testing::check_sample;
using testing::make_sample;
using testing::SampleSpec;

size_t segments_in_dev_shm() {
  size_t n = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec))
    n += e.path().filename().string().rfind("troupe-bulk-" + std::to_string(::getpid()) + "-", 0) == 0;
  return n;
}

struct BulkOn : ::testing::Test {
  void SetUp() override { set_bulk_shm_threshold(4096); }
  void TearDown() override {
    set_bulk_shm_threshold(0);
    bulk_shm_cleanup();
  }
};

TEST_F(BulkOn, LargeEnvelopesTravelAsARecordAndDecodeEqual) {
  for (auto kind : testing::all_kinds()) {
    SCOPED_TRACE(kind_name(kind));
    const SampleSpec spec{7, 64, 64};
    Envelope env = make_sample(kind, spec);
    ASSERT_TRUE(env.ok());
    const auto before = bulk_shm_stats();
    auto bytes = caf_serialize(env);
    const bool bulk = bulk_shm_stats().sent > before.sent;
    if (bulk) {
      EXPECT_LT(bytes.size(), 128u);  // the record (plus CAF's length prefix)
      EXPECT_EQ(segments_in_dev_shm(), 1u);
    }
    {
      Envelope back;
      ASSERT_FALSE(caf_deserialize(bytes, back));
      ASSERT_TRUE(back.ok()) << caf::to_string(back.error());
      EXPECT_EQ(check_sample(back, kind, spec), "");
    }
    if (bulk) {
      EXPECT_EQ(bulk_shm_stats().received, before.received + 1);
    }
  }
  // The tensor-carrying kinds are large enough here to take the path, and the
  // released slot is reused: one slot served every message.
  EXPECT_GT(bulk_shm_stats().sent, 0u);
  EXPECT_EQ(segments_in_dev_shm(), 1u);
}

TEST_F(BulkOn, AHeldSlotIsNotReused) {
  const SampleSpec a{21, 64, 64}, b{22, 64, 64};
  auto ba = caf_serialize(make_sample(Envelope::Kind::ACTIVATIONS, a));
  Envelope held;
  ASSERT_FALSE(caf_deserialize(ba, held));
  ASSERT_TRUE(held.ok());
  auto bb = caf_serialize(make_sample(Envelope::Kind::ACTIVATIONS, b));
  EXPECT_EQ(segments_in_dev_shm(), 2u);  // the first slot is still held
  Envelope second;
  ASSERT_FALSE(caf_deserialize(bb, second));
  EXPECT_EQ(check_sample(held, Envelope::Kind::ACTIVATIONS, a), "");
  EXPECT_EQ(check_sample(second, Envelope::Kind::ACTIVATIONS, b), "");
  held = Envelope{};
  second = Envelope{};
  auto bc = caf_serialize(make_sample(Envelope::Kind::ACTIVATIONS, SampleSpec{23, 64, 64}));
  EXPECT_EQ(segments_in_dev_shm(), 2u);  // released slots are reused
}

TEST_F(BulkOn, SmallEnvelopesStayInline) {
  const auto before = bulk_shm_stats();
  auto bytes = caf_serialize(make_sample(Envelope::Kind::ACTIVATIONS, SampleSpec{3, 2, 2}));
  EXPECT_EQ(bulk_shm_stats().sent, before.sent);
  Envelope back;
  ASSERT_FALSE(caf_deserialize(bytes, back));
  EXPECT_TRUE(back.ok());
}

TEST_F(BulkOn, ReplayedOrForgedRecordsAreRejected) {
  const SampleSpec spec{9, 64, 64};
  auto bytes = caf_serialize(make_sample(Envelope::Kind::ACTIVATIONS, spec));
  ASSERT_LT(bytes.size(), 128u);
  auto forged = bytes;
  {
    Envelope back;
    ASSERT_FALSE(caf_deserialize(bytes, back));
    ASSERT_TRUE(back.ok());
  }
  // The same record again after the slot was released: rejected.
  Envelope again;
  ASSERT_FALSE(caf_deserialize(bytes, again));
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.error().code(), static_cast<uint8_t>(envelope_errc::bulk_unavailable)) << caf::to_string(again.error());
  // A name outside /troupe-bulk-*: never opened.
  const std::string needle = "/troupe-bulk-";
  auto at = std::search(forged.begin(), forged.end(), needle.begin(), needle.end());
  ASSERT_NE(at, forged.end());
  std::copy_n("/../etc/passwd", 14, at);
  Envelope bad;
  ASSERT_FALSE(caf_deserialize(forged, bad));
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.error().code(), static_cast<uint8_t>(envelope_errc::bulk_unavailable));
  EXPECT_NE(caf::to_string(bad.error()).find("bad segment name"), std::string::npos) << caf::to_string(bad.error());
}

TEST_F(BulkOn, CleanupRemovesTheSlots) {
  auto bytes = caf_serialize(make_sample(Envelope::Kind::GRADIENTS, SampleSpec{5, 64, 64}));
  EXPECT_EQ(segments_in_dev_shm(), 1u);
  bulk_shm_cleanup();
  EXPECT_EQ(segments_in_dev_shm(), 0u);
}

TEST(BulkOff, ThresholdZeroSendsInline) {
  set_bulk_shm_threshold(0);
  const auto before = bulk_shm_stats();
  auto bytes = caf_serialize(make_sample(Envelope::Kind::ACTIVATIONS, SampleSpec{4, 64, 64}));
  EXPECT_EQ(bulk_shm_stats().sent, before.sent);
  EXPECT_GT(bytes.size(), 64u * 64u * 4u);
}

}  // namespace
}  // namespace troupe
