// A table of malformed inputs to Envelope::decode, each with the specific
// error it must produce: broken frames, broken segment tables, hostile
// pointer structures, oversized and schema-violating messages. Also checks
// the CAF path: a malformed frame inside a CAF stream is delivered as an
// invalid Envelope carrying the error; a broken CAF stream is an error.
#include <gtest/gtest.h>

#include <cstring>
#include <optional>

#include <capnp/any.h>
#include <capnp/serialize.h>
#include <zstd.h>

#include "actors/transport/envelope.hpp"
#include "tests/actors/messaging_samples.hpp"

namespace troupe {
namespace {

using Bytes = std::vector<uint8_t>;

void put_u32(uint8_t* p, uint32_t v) { std::memcpy(p, &v, 4); }  // x86-64: little endian
void put_u64(uint8_t* p, uint64_t v) { std::memcpy(p, &v, 8); }

// A frame around `body`; raw_len defaults to the body length.
Bytes frame(const Bytes& body, uint8_t flags = 0, std::optional<uint64_t> raw_len = std::nullopt) {
  Bytes f(kFrameHeaderBytes + body.size(), 0);
  std::memcpy(f.data(), kFrameMagic, 4);
  f[4] = kFrameVersion;
  f[5] = flags;
  put_u64(f.data() + 8, raw_len ? *raw_len : body.size());
  if (!body.empty()) std::memcpy(f.data() + kFrameHeaderBytes, body.data(), body.size());
  return f;
}

// Standard flat array (segment table + segments) from raw 64-bit words.
Bytes flat_from_words(const std::vector<std::vector<uint64_t>>& segs) {
  const size_t table = ((4 + 4 * segs.size()) + 7) & ~size_t{7};
  Bytes out(table, 0);
  put_u32(out.data(), static_cast<uint32_t>(segs.size() - 1));
  for (size_t i = 0; i < segs.size(); ++i) put_u32(out.data() + 4 + 4 * i, static_cast<uint32_t>(segs[i].size()));
  for (const auto& s : segs)
    for (uint64_t w : s) {
      uint8_t b[8];
      put_u64(b, w);
      out.insert(out.end(), b, b + 8);
    }
  return out;
}

Bytes flat_of(capnp::MessageBuilder& mb) {
  auto words = capnp::messageToFlatArray(mb);
  auto bytes = words.asBytes();
  return Bytes(bytes.begin(), bytes.end());
}

// Struct pointer: offset in words from the end of the pointer, sizes in words / pointers.
uint64_t struct_ptr(int32_t offset, uint16_t data_words, uint16_t ptrs) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(offset) & 0x3FFFFFFFu) << 2) |
         (static_cast<uint64_t>(data_words) << 32) | (static_cast<uint64_t>(ptrs) << 48);
}

// List pointer: element size code 7 = composite (count is then in words).
uint64_t list_ptr(int32_t offset, uint8_t size_code, uint32_t count) {
  return 1u | (static_cast<uint64_t>(static_cast<uint32_t>(offset) & 0x3FFFFFFFu) << 2) |
         (static_cast<uint64_t>(size_code) << 32) | (static_cast<uint64_t>(count) << 35);
}

Bytes body_of(const Envelope& env) {
  EncodeOptions plain;  // no CRC-32 trailer: the frames here are built by hand around the body
  plain.checksum = false;
  Bytes f = env.encode(plain);
  return Bytes(f.begin() + kFrameHeaderBytes, f.end());
}

Bytes valid_body() { return body_of(testing::make_sample(Envelope::Kind::DISPATCH, {5, 4, 8})); }

template <class S, class F>
Bytes body_built(F&& fill) {
  capnp::MallocMessageBuilder mb;
  auto m = mb.initRoot<schemas::Message>();
  fill(payload_traits<S>::init(m));
  return flat_of(mb);
}

struct Case {
  const char* name;
  Bytes frame;
  envelope_errc want;
  DecodeLimits limits = {};
};

std::vector<Case> cases() {
  std::vector<Case> c;
  const Bytes good = valid_body();
  c.push_back({"zero_length", {}, envelope_errc::empty_input});
  {
    Bytes f = frame(good);
    f.resize(10);
    c.push_back({"truncated_header", f, envelope_errc::truncated_header});
  }
  {
    Bytes f = frame(good);
    f[0] = 'X';
    c.push_back({"bad_magic", f, envelope_errc::bad_magic});
  }
  {
    Bytes f = frame(good);
    f[4] = 2;
    c.push_back({"future_version", f, envelope_errc::unsupported_version});
  }
  c.push_back({"unknown_flag", frame(good, 0x80), envelope_errc::unknown_flags});
  {
    Bytes f = frame(good);
    f[6] = 1;
    c.push_back({"reserved_bits", f, envelope_errc::unknown_flags});
  }
  {
    Bytes f = frame(good);
    f.resize(f.size() - 8);  // header still claims the full body
    c.push_back({"truncated_body", f, envelope_errc::length_mismatch});
  }
  {
    Bytes b(good.begin(), good.end() - 8);  // header agrees, segment table does not
    c.push_back({"truncated_segment", frame(b), envelope_errc::segments_past_end});
  }
  c.push_back({"body_not_whole_words", frame(Bytes(good.begin(), good.end() - 3)), envelope_errc::length_mismatch});
  {
    Bytes f = frame(good);
    f.insert(f.end(), 8, 0);
    c.push_back({"bytes_after_body", f, envelope_errc::trailing_bytes});
    Bytes b = good;
    b.insert(b.end(), 8, 0);
    c.push_back({"bytes_after_segments", frame(b), envelope_errc::trailing_bytes});
  }
  {
    Bytes b = good;
    put_u32(b.data(), 1999);  // 2000 segments
    c.push_back({"too_many_segments", frame(b), envelope_errc::bad_segment_count});
    put_u32(b.data(), 0xFFFFFFFFu);  // 2^32 segments: must not wrap to 0
    c.push_back({"segment_count_wraps", frame(b), envelope_errc::bad_segment_count});
  }
  {
    Bytes b(8, 0);
    put_u32(b.data(), 2);  // 3 segments need a 16-byte table
    c.push_back({"segment_table_truncated", frame(b), envelope_errc::segment_table_truncated});
  }
  {
    Bytes b = good;
    uint32_t words;
    std::memcpy(&words, b.data() + 4, 4);
    put_u32(b.data() + 4, words + 100);
    c.push_back({"segment_size_past_end", frame(b), envelope_errc::segments_past_end});
  }
  {
    // Two segments whose sizes add up past the end.
    Bytes b = flat_from_words({{struct_ptr(0, 0, 0)}, {0, 0}});
    put_u32(b.data() + 8, 50);
    c.push_back({"second_segment_past_end", frame(b), envelope_errc::segments_past_end});
  }
  c.push_back({"empty_first_segment", frame(flat_from_words({{}})), envelope_errc::malformed_message});
  c.push_back({"pointer_out_of_bounds", frame(flat_from_words({{struct_ptr(100, 1, 0)}})),
               envelope_errc::malformed_message});
  c.push_back({"far_pointer_to_missing_segment",
               frame(flat_from_words({{(uint64_t{7} << 32) | 2u}})), envelope_errc::malformed_message});
  // A struct whose only pointer points at itself: an endless chain.
  c.push_back({"pointer_self_loop", frame(flat_from_words({{struct_ptr(0, 0, 1), struct_ptr(-1, 0, 1)}})),
               envelope_errc::nesting_limit});
  // Two pointers back to their own struct: 2^depth reads from 3 words; the
  // depth-first walk hits the nesting limit first.
  c.push_back({"pointer_fork_loop",
               frame(flat_from_words({{struct_ptr(0, 0, 2), struct_ptr(-1, 0, 2), struct_ptr(-2, 0, 2)}})),
               envelope_errc::nesting_limit});
  {
    // Aliasing: 64 list elements all point at the same 64-word struct, so
    // 131 words on the wire read as 4,000+: cut off by the traversal limit.
    const uint32_t n = 64, blob = 64;
    std::vector<uint64_t> w{struct_ptr(0, 0, 1), list_ptr(0, 7, n), struct_ptr(static_cast<int32_t>(n), 0, 1)};
    for (uint32_t i = 0; i < n; ++i) w.push_back(struct_ptr(static_cast<int32_t>(n - 1 - i), blob, 0));
    w.resize(w.size() + blob, 0);
    c.push_back({"pointer_aliasing", frame(flat_from_words({w})), envelope_errc::traversal_limit});
  }
  {
    // A chain of 40 one-pointer structs, deeper than nesting_limit (32).
    std::vector<uint64_t> w{struct_ptr(0, 0, 1)};
    for (int i = 0; i < 40; ++i) w.push_back(i < 39 ? struct_ptr(0, 0, 1) : 0);
    c.push_back({"deep_nesting", frame(flat_from_words({w})), envelope_errc::nesting_limit});
  }
  {
    Envelope big = testing::make_sample(Envelope::Kind::ACTIVATIONS, {6, 64, 64});  // ~17 KiB
    DecodeLimits small;
    small.max_message_bytes = 4096;
    c.push_back({"oversized_body", frame(body_of(big)), envelope_errc::too_large, small});
    c.push_back({"oversized_declared", frame(good, 0, uint64_t{1} << 40), envelope_errc::too_large});
  }
  c.push_back({"zstd_garbage", frame(Bytes(64, 0xAB), kFlagZstd, 4096), envelope_errc::decompress_failed});
  {
    Bytes comp(ZSTD_compressBound(good.size()));
    comp.resize(ZSTD_compress(comp.data(), comp.size(), good.data(), good.size(), 1));
    c.push_back({"zstd_size_disagrees", frame(comp, kFlagZstd, good.size() + 8), envelope_errc::length_mismatch});
    Bytes tail = comp;
    tail.insert(tail.end(), 5, 0);
    c.push_back({"zstd_trailing", frame(tail, kFlagZstd, good.size()), envelope_errc::trailing_bytes});
    Bytes cut(comp.begin(), comp.end() - 4);
    c.push_back({"zstd_truncated", frame(cut, kFlagZstd, good.size()), envelope_errc::decompress_failed});
  }
  {
    capnp::MallocMessageBuilder mb;
    mb.initRoot<schemas::Message>().initStatusRequest().setRequestId(1);
    auto data = mb.getRoot<capnp::AnyStruct>().getDataSection();
    uint16_t which = 99;
    std::memcpy(data.begin(), &which, 2);  // the union discriminant is the first data field
    c.push_back({"unknown_kind", frame(flat_of(mb)), envelope_errc::unknown_kind});
  }
  c.push_back({"shape_data_mismatch",
               frame(body_built<schemas::Activations>([](schemas::Activations::Builder a) {
                 std::vector<float> v(30, 1.0f);
                 set_tensor_f32(a.initHidden(), std::vector<int64_t>{4, 8}, v);
               })),
               envelope_errc::schema_violation});
  c.push_back({"negative_dimension",
               frame(body_built<schemas::Activations>([](schemas::Activations::Builder a) {
                 set_tensor_f32(a.initHidden(), std::vector<int64_t>{-1, 0}, {});
               })),
               envelope_errc::schema_violation});
  c.push_back({"unknown_dtype",
               frame(body_built<schemas::Gradients>([](schemas::Gradients::Builder g) {
                 g.initTag().setDirection(schemas::Direction::BACKWARD);
                 std::vector<float> v(4, 1.0f);
                 set_tensor_f32(g.initGrad(), std::vector<int64_t>{2, 2}, v);
                 g.getGrad().setDtype(static_cast<schemas::DType>(77));
               })),
               envelope_errc::schema_violation});
  c.push_back({"dispatch_rows_times_width",
               frame(body_built<schemas::Dispatch>([](schemas::Dispatch::Builder d) {
                 d.setNumRows(3);
                 d.setWidth(5);
                 std::vector<float> v(12, 1.0f);
                 set_tensor_f32(d.initRows(), std::vector<int64_t>{3, 4}, v);
                 d.initExpertIds(3);
                 d.initCombineWeights(3);
                 d.initTokenIndex(3);
               })),
               envelope_errc::schema_violation});
  c.push_back({"dispatch_missing_rows",
               frame(body_built<schemas::Dispatch>([](schemas::Dispatch::Builder d) { d.setNumRows(2); })),
               envelope_errc::schema_violation});
  c.push_back({"grad_slice_range_mismatch",
               frame(body_built<schemas::GradSlice>([](schemas::GradSlice::Builder g) {
                 g.initRange().setCount(10);
                 std::vector<float> v(9, 0.0f);
                 set_tensor_f32(g.initGrads(), std::vector<int64_t>{9}, v);
               })),
               envelope_errc::schema_violation});
  c.push_back({"param_range_overflow",
               frame(body_built<schemas::ParamSlice>([](schemas::ParamSlice::Builder p) {
                 p.initRange().setOffset(~uint64_t{0});
                 p.getRange().setCount(2);
                 std::vector<float> v(2, 0.0f);
                 set_tensor_f32(p.initParams(), std::vector<int64_t>{2}, v);
               })),
               envelope_errc::schema_violation});
  c.push_back({"activations_wrong_direction",
               frame(body_built<schemas::Activations>([](schemas::Activations::Builder a) {
                 a.initTag().setDirection(schemas::Direction::BACKWARD);
                 std::vector<float> v(4, 1.0f);
                 set_tensor_f32(a.initHidden(), std::vector<int64_t>{2, 2}, v);
               })),
               envelope_errc::schema_violation});
  {
    Bytes b = body_built<schemas::Stop>([](schemas::Stop::Builder s) { s.setReason("REASON_MARK"); });
    auto it = std::search(b.begin(), b.end(), std::begin("REASON_MARK"), std::end("REASON_MARK") - 1);
    if (it != b.end()) *(it + 11) = 'x';  // overwrite the NUL terminator
    c.push_back({"text_not_nul_terminated", frame(b), envelope_errc::malformed_message});
  }
  return c;
}

TEST(EnvelopeMalformed, EachInputGivesItsSpecificError) {
  for (const Case& c : cases()) {
    SCOPED_TRACE(c.name);
    auto r = Envelope::decode(c.frame.data(), c.frame.size(), c.limits);
    ASSERT_FALSE(r) << c.name << " decoded as " << to_string(*r);
    auto code = envelope_error_code(r.error());
    ASSERT_TRUE(code.has_value()) << caf::to_string(r.error());
    EXPECT_EQ(to_string(*code), std::string(to_string(c.want))) << caf::to_string(r.error());
  }
}

TEST(EnvelopeMalformed, TheValidBodyDecodes) {
  // Guards the table: the frames above differ from a decodable one only by the stated defect.
  Bytes f = frame(valid_body());
  auto r = Envelope::decode(f.data(), f.size());
  ASSERT_TRUE(r) << caf::to_string(r.error());
  EXPECT_EQ(testing::check_sample(*r, Envelope::Kind::DISPATCH, {5, 4, 8}), "");
}

// The CRC-32 trailer (sent by default): every single-bit flip anywhere in a
// frame, raw or zstd-compressed, is rejected as damage in flight; without
// the trailer, some flips (in tensor data) would decode into a valid message
// with wrong values. A frame whose trailer is intact still decodes.
TEST(EnvelopeMalformed, EveryFlippedBitIsCaughtByTheChecksum) {
  EncodeOptions eager;
  eager.compress_threshold = 16;
  for (const bool compressed : {false, true}) {
    const Envelope env = testing::make_sample(Envelope::Kind::DISPATCH, {5, 4, 8, compressed});
    const Bytes good = compressed ? env.encode(eager) : env.encode();
    ASSERT_EQ((good[5] & kFlagZstd) != 0, compressed);
    ASSERT_TRUE(Envelope::decode(good.data(), good.size()));
    size_t accepted_without = 0;
    for (size_t bit = 0; bit < good.size() * 8; ++bit) {
      Bytes f = good;
      f[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
      auto r = Envelope::decode(f.data(), f.size());
      ASSERT_FALSE(r) << "bit " << bit << " of " << good.size() * 8 << (compressed ? " (zstd)" : "");
      EXPECT_TRUE(damaged_in_flight(r.error())) << "bit " << bit << ": " << caf::to_string(r.error());
      // The same flip without the trailer check (flag cleared, trailer cut).
      if (bit / 8 >= kFrameHeaderBytes && bit / 8 < good.size() - kFrameTrailerBytes) {
        Bytes g(f.begin(), f.end() - kFrameTrailerBytes);
        g[5] &= static_cast<uint8_t>(~kFlagCrc32);
        accepted_without += static_cast<bool>(Envelope::decode(g.data(), g.size()));
      }
    }
    // The checksum is what catches them: without it, flips go through.
    if (!compressed) EXPECT_GT(accepted_without, 0u);
  }
}

TEST(EnvelopeMalformed, CafPathDeliversInvalidEnvelope) {
  auto bytes = testing::caf_serialize(testing::make_sample(Envelope::Kind::STOP, {}));
  // The frame sits at the end of the CAF bytes; break its magic.
  const size_t frame_start = bytes.size() - testing::make_sample(Envelope::Kind::STOP, {}).encode().size();
  bytes[frame_start] = 'Z';
  Envelope out;
  EXPECT_FALSE(testing::caf_deserialize(bytes, out));  // the CAF stream itself is fine
  EXPECT_FALSE(out.ok());
  EXPECT_EQ(envelope_error_code(out.error()), envelope_errc::bad_magic);
  auto r = out.read<schemas::Stop>();
  ASSERT_FALSE(r);
  EXPECT_EQ(envelope_error_code(r.error()), envelope_errc::bad_magic);
}

TEST(EnvelopeMalformed, BrokenCafStreamIsAnError) {
  auto bytes = testing::caf_serialize(testing::make_sample(Envelope::Kind::STOP, {}));
  bytes.resize(bytes.size() / 2);  // the length prefix now points past the end
  Envelope out;
  EXPECT_TRUE(testing::caf_deserialize(bytes, out));
  std::vector<char> none;
  EXPECT_TRUE(testing::caf_deserialize(none, out));
}

}  // namespace
}  // namespace troupe
