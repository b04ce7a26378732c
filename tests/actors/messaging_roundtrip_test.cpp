// Round trips of every Envelope kind through the bytes CAF would send between
// processes, with every field checked; compression on and off; empty and
// multi-segment envelopes; typed reads.
#include <cstring>
#include <vector>

#include <gtest/gtest.h>

#include <caf/binary_serializer.hpp>
#include <caf/deep_to_string.hpp>
#include <caf/make_message.hpp>
#include <caf/message.hpp>

#include "actors/transport/envelope.hpp"
#include "tests/actors/messaging_samples.hpp"

namespace troupe {
namespace {

using testing::all_kinds;
using testing::caf_deserialize;
using testing::caf_serialize;
using testing::check_sample;
using testing::make_sample;
using testing::SampleSpec;

std::string err_str(const caf::error& e) { return caf::to_string(e); }

TEST(EnvelopeRoundTrip, EveryKindThroughCafBytes) {
  for (auto kind : all_kinds()) {
    for (SampleSpec spec : {SampleSpec{11, 4, 8}, SampleSpec{12, 1, 1}, SampleSpec{13, 0, 16}, SampleSpec{14, 33, 7}}) {
      SCOPED_TRACE(std::string(kind_name(kind)) + " rows=" + std::to_string(spec.rows));
      Envelope env = make_sample(kind, spec);
      ASSERT_TRUE(env.ok()) << err_str(env.error());
      EXPECT_EQ(*env.kind(), kind);
      EXPECT_EQ(check_sample(env, kind, spec), "");

      auto bytes = caf_serialize(env);
      ASSERT_FALSE(bytes.empty());
      Envelope back;
      ASSERT_FALSE(caf_deserialize(bytes, back));
      ASSERT_TRUE(back.ok()) << err_str(back.error());
      EXPECT_EQ(*back.kind(), kind);
      EXPECT_EQ(check_sample(back, kind, spec), "");
      // The checker really compares: another seed must not match.
      SampleSpec other = spec;
      other.seed += 1000;
      EXPECT_NE(check_sample(back, kind, other), "");
    }
  }
}

TEST(EnvelopeRoundTrip, CafStreamHoldsExactlyTheFrame) {
  Envelope env = make_sample(Envelope::Kind::DISPATCH, SampleSpec{3, 16, 16});
  auto frame = env.encode();
  auto bytes = caf_serialize(env);
  ASSERT_GT(bytes.size(), frame.size());
  // CAF writes a varint length prefix, then the frame bytes unchanged.
  std::vector<uint8_t> tail(bytes.end() - static_cast<ptrdiff_t>(frame.size()), bytes.end());
  EXPECT_EQ(tail, frame);
  // Same envelope, same bytes.
  EXPECT_EQ(env.encode(), frame);
}

TEST(EnvelopeRoundTrip, LargeCompressiblePayloadTravelsCompressed) {
  SampleSpec spec{21, 1024, 512, /*compressible=*/true};  // 2 MiB of floats
  Envelope env = make_sample(Envelope::Kind::ACTIVATIONS, spec);
  ASSERT_TRUE(env.ok());
  auto frame = env.encode();
  ASSERT_GE(frame.size(), kFrameHeaderBytes);
  EXPECT_EQ(frame[5], kFlagZstd | kFlagCrc32);
  EXPECT_LT(frame.size(), env.flat_size() / 2);
  auto back = Envelope::decode(frame.data(), frame.size());
  ASSERT_TRUE(back) << err_str(back.error());
  EXPECT_TRUE(back->arrived_compressed());
  EXPECT_EQ(check_sample(*back, Envelope::Kind::ACTIVATIONS, spec), "");

  Envelope via_caf;
  ASSERT_FALSE(caf_deserialize(caf_serialize(env), via_caf));
  EXPECT_TRUE(via_caf.arrived_compressed());
  EXPECT_EQ(check_sample(via_caf, Envelope::Kind::ACTIVATIONS, spec), "");
}

TEST(EnvelopeRoundTrip, IncompressiblePayloadTravelsRaw) {
  SampleSpec spec{22, 512, 512};  // 256 KiB of random state bytes
  Envelope env = make_sample(Envelope::Kind::SNAPSHOT, spec);
  auto frame = env.encode();
  EXPECT_EQ(frame[5], kFlagCrc32);  // zstd could not shrink it, so it was sent raw
  EXPECT_EQ(frame.size(), kFrameHeaderBytes + env.flat_size() + kFrameTrailerBytes);
  auto back = Envelope::decode(frame.data(), frame.size());
  ASSERT_TRUE(back);
  EXPECT_FALSE(back->arrived_compressed());
  EXPECT_EQ(check_sample(*back, Envelope::Kind::SNAPSHOT, spec), "");
}

TEST(EnvelopeRoundTrip, SmallPayloadIsNeverCompressed) {
  SampleSpec spec{23, 8, 8, true};
  Envelope env = make_sample(Envelope::Kind::GRAD_SLICE, spec);
  ASSERT_LT(env.flat_size(), kCompressThreshold);
  EXPECT_EQ(env.encode()[5], kFlagCrc32);
  // A lower threshold compresses the same message.
  EncodeOptions eager;
  eager.compress_threshold = 64;
  auto frame = env.encode(eager);
  EXPECT_EQ(frame[5], kFlagZstd | kFlagCrc32);
  auto back = Envelope::decode(frame.data(), frame.size());
  ASSERT_TRUE(back);
  EXPECT_EQ(check_sample(*back, Envelope::Kind::GRAD_SLICE, spec), "");
}

TEST(EnvelopeRoundTrip, MultiSegmentMessage) {
  // A tiny first segment forces the builder to spread the message out.
  Envelope env = Envelope::build<schemas::ParamSlice>(
      [](schemas::ParamSlice::Builder p) {
        p.setStep(7);
        p.initRange().setCount(3000);
        std::vector<float> v(3000);
        for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i) * 0.5f;
        set_tensor_f32(p.initParams(), std::vector<int64_t>{3000}, v);
      },
      /*first_segment_words=*/16);
  ASSERT_TRUE(env.ok()) << err_str(env.error());
  ASSERT_GT(env.segment_count(), 1u);
  Envelope back;
  ASSERT_FALSE(caf_deserialize(caf_serialize(env), back));
  ASSERT_TRUE(back.ok()) << err_str(back.error());
  EXPECT_EQ(back.segment_count(), env.segment_count());
  auto p = back.read<schemas::ParamSlice>();
  ASSERT_TRUE(p);
  EXPECT_EQ((*p)->getStep(), 7u);
  auto v = tensor_f32((*p)->getParams());
  ASSERT_EQ(v.size(), 3000u);
  for (size_t i = 0; i < v.size(); ++i) ASSERT_EQ(v[i], static_cast<float>(i) * 0.5f);
}

TEST(EnvelopeRoundTrip, EmptyEnvelope) {
  Envelope empty;
  EXPECT_TRUE(empty.empty());
  EXPECT_FALSE(empty.ok());
  auto r = empty.read<schemas::Stop>();
  ASSERT_FALSE(r);
  EXPECT_EQ(envelope_error_code(r.error()), envelope_errc::empty_envelope);
  auto frame = empty.encode();
  EXPECT_EQ(frame.size(), kFrameHeaderBytes + kFrameTrailerBytes);
  Envelope back = make_sample(Envelope::Kind::STOP, {});
  ASSERT_FALSE(caf_deserialize(caf_serialize(empty), back));
  EXPECT_TRUE(back.empty());
}

TEST(EnvelopeRoundTrip, TypedReadsCheckTheKind) {
  Envelope env = Envelope::build<schemas::StatusRequest>(
      [](schemas::StatusRequest::Builder b) { b.setRequestId(42); });
  auto ok = env.read<schemas::StatusRequest>();
  ASSERT_TRUE(ok);
  EXPECT_EQ((*ok)->getRequestId(), 42u);
  auto wrong = env.read<schemas::Dispatch>();
  ASSERT_FALSE(wrong);
  EXPECT_EQ(envelope_error_code(wrong.error()), envelope_errc::wrong_kind);
  // A Read keeps the segments alive after the envelope is gone.
  auto keep = Envelope::build<schemas::Stop>([](schemas::Stop::Builder s) { s.setReason("done"); })
                  .read<schemas::Stop>();
  ASSERT_TRUE(keep);
  EXPECT_STREQ((*keep)->getReason().cStr(), "done");
}

TEST(EnvelopeRoundTrip, StringificationShowsASummary) {
  Envelope env = testing::make_sample(Envelope::Kind::COMBINE, {});
  auto text = caf::deep_to_string(env);
  EXPECT_NE(text.find("combine"), std::string::npos) << text;
  auto msg = caf::to_string(caf::make_message(env));
  EXPECT_NE(msg.find("combine"), std::string::npos) << msg;
  EXPECT_NE(to_string(Envelope{}).find("empty"), std::string::npos);
  EXPECT_NE(to_string(Envelope::invalid(make_error(envelope_errc::bad_magic))).find("bad_magic"), std::string::npos);
}

TEST(EnvelopeRoundTrip, BuildRejectsSchemaViolations) {
  Envelope env = Envelope::build<schemas::Dispatch>([](schemas::Dispatch::Builder d) {
    d.setNumRows(3);
    d.setWidth(4);
    std::vector<float> v(12, 1.0f);
    set_tensor_f32(d.initRows(), std::vector<int64_t>{3, 4}, v);
    d.initExpertIds(2);  // one short
    d.initCombineWeights(3);
    d.initTokenIndex(3);
  });
  EXPECT_FALSE(env.ok());
  EXPECT_EQ(envelope_error_code(env.error()), envelope_errc::schema_violation);
  auto r = env.read<schemas::Dispatch>();
  ASSERT_FALSE(r);
  EXPECT_EQ(envelope_error_code(r.error()), envelope_errc::schema_violation);
}

}  // namespace
}  // namespace troupe

namespace troupe {
namespace {

// build_blob leaves the blob's memory unzeroed (it is overwritten): the
// encoded frame must equal build's byte for byte, padding included, for
// odd and even blob lengths, on memory that held garbage before.
TEST(EnvelopeBlob, EqualsTheZeroedBuildByteForByte) {
  for (size_t count : {size_t{0}, size_t{1}, size_t{3}, size_t{1000}, size_t{4097}}) {
    SCOPED_TRACE(count);
    std::vector<float> v(count);
    for (size_t i = 0; i < count; ++i) v[i] = static_cast<float>(i) * 0.5f - 7.0f;
    auto fill = [&](schemas::ParamSlice::Builder b) {
      b.setStep(9);
      b.initRange().setCount(count);
      auto t = b.initParams();
      t.setDtype(schemas::DType::F32);
      t.initShape(1).set(0, static_cast<int64_t>(count));
      return t.initData(static_cast<unsigned>(count * sizeof(float)));
    };
    // Dirty the heap the blob builder is likely to reuse.
    { std::vector<uint8_t> junk(count * 4 + 4096, 0xAB); }
    const Envelope blob = Envelope::build_blob<schemas::ParamSlice>(count * sizeof(float), [&](auto b) {
      auto d = fill(b);
      if (count > 0) std::memcpy(d.begin(), v.data(), count * sizeof(float));
      return d;
    });
    // The same one-segment layout (the head build_blob zeroes is 256 words).
    const Envelope plain = Envelope::build<schemas::ParamSlice>([&](auto b) {
      auto d = fill(b);
      if (count > 0) std::memcpy(d.begin(), v.data(), count * sizeof(float));
    }, static_cast<unsigned>(256 + (count * sizeof(float) + 7) / 8));
    ASSERT_TRUE(blob.ok()) << caf::to_string(blob.error());
    EXPECT_EQ(blob.encode(), plain.encode());
  }
}

// The contract is checked: a blob that is not the last allocation gives an
// invalid envelope, not one with unzeroed words inside.
TEST(EnvelopeBlob, ABlobThatIsNotLastIsRefused) {
  const Envelope e = Envelope::build_blob<schemas::ParamSlice>(64, [](schemas::ParamSlice::Builder b) {
    auto t = b.initParams();
    auto d = t.initData(64);
    std::memset(d.begin(), 1, 64);
    t.initShape(1).set(0, 16);  // allocated after the blob
    return d;
  });
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(envelope_error_code(e.error()), envelope_errc::schema_violation);
}

// A dropped blob envelope's memory holds the next blob envelope of the same
// size (the blob segment cache), byte for byte what a fresh build gives; an
// envelope still held anywhere keeps its memory.
TEST(EnvelopeBlob, ReusesTheMemoryOfADroppedEnvelope) {
  auto make = [](size_t count, float base) {
    return Envelope::build_blob<schemas::ParamSlice>(count * sizeof(float), [&](schemas::ParamSlice::Builder b) {
      b.setStep(3);
      b.initRange().setCount(count);
      auto t = b.initParams();
      t.setDtype(schemas::DType::F32);
      t.initShape(1).set(0, static_cast<int64_t>(count));
      auto d = t.initData(static_cast<unsigned>(count * sizeof(float)));
      for (size_t i = 0; i < count; ++i) reinterpret_cast<float*>(d.begin())[i] = base + static_cast<float>(i);
      return d;
    });
  };
  auto blob_of = [](const Envelope& e) { return tensor_f32((*e.read<schemas::ParamSlice>())->getParams()); };
  for (size_t count : {size_t{1}, size_t{1000}, size_t{4097}}) {
    SCOPED_TRACE(count);
    const std::vector<uint8_t> want = make(count, 5.0f).encode();
    Envelope old = make(count, 100.0f);
    const float* old_data = blob_of(old).data();
    old = Envelope{};  // dropped: its segment goes to the cache
    const Envelope reused = make(count, 5.0f);
    ASSERT_TRUE(reused.ok()) << caf::to_string(reused.error());
    EXPECT_EQ(blob_of(reused).data(), old_data) << "the memory was not reused";
    EXPECT_EQ(reused.encode(), want);

    // Held by a copy: its memory stays its own.
    Envelope shared = make(count, 7.0f);
    const Envelope copy = shared;
    const auto before = copy.encode();
    shared = Envelope{};
    const Envelope fresh = make(count, 5.0f);
    EXPECT_NE(blob_of(fresh).data(), blob_of(copy).data());
    EXPECT_EQ(copy.encode(), before);
    EXPECT_EQ(fresh.encode(), want);
  }
}

}  // namespace
}  // namespace troupe
