// Envelope: the ONE CAF message type that carries a Cap'n Proto message
// (schemas/envelope.capnp `Message`) between actors.
//
// In-process an Envelope is a shared_ptr to immutable segments: copying it
// (which is what CAF does when it puts it into a mailbox) bumps a reference
// count, never copies or re-encodes the segments. Across processes the CAF
// `inspect` overload writes a frame:
//
//   bytes 0..3   magic "TRPE"
//   byte  4      frame version (1)
//   byte  5      flags: bit 0 = body is one zstd frame; bit 1 = a CRC-32
//                trailer follows the body; other bits must be 0
//   bytes 6..7   reserved, must be 0
//   bytes 8..15  little-endian u64: length of the uncompressed body (0 = empty envelope)
//   body         the standard Cap'n Proto flat array (segment table + segments),
//                zstd-compressed when longer than the compress threshold and a
//                sample of it compresses (see EncodeOptions)
//   trailer      (flag bit 1) little-endian u32: zlib's CRC-32 of every byte
//                before it (header and body as sent). Checked before anything
//                else is trusted, so a flipped bit anywhere in the frame is
//                rejected (checksum_mismatch; a flip of bit 1 itself leaves 4
//                bytes the body does not account for) instead of decoding
//                into a valid message with wrong values. Frames without it
//                still decode.
//
// Error contract: nothing in here throws into the caller. Decoding untrusted
// bytes returns `caf::expected<Envelope>`; on the CAF transport path a frame
// that fails to decode becomes an *invalid* Envelope that carries the error,
// so the receiving actor sees it and can answer with it. `read<S>()` returns
// `caf::expected<Read<S>>`: the stored decode error, `empty_envelope`, or
// `wrong_kind`. All errors are caf::error values in category "envelope" with
// an `envelope_errc` code and a human-readable context string; kj::Exception
// and std::bad_alloc are caught at the decode boundary.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

#include <caf/atom.hpp>
#include <caf/error.hpp>
#include <caf/expected.hpp>
#include <caf/fwd.hpp>
#include <caf/meta/type_name.hpp>
#include <capnp/message.h>

#include "schemas/envelope.capnp.h"

namespace troupe {

// -- errors -------------------------------------------------------------------

// Why an envelope was rejected. Append-only: codes cross process boundaries.
enum class envelope_errc : uint8_t {
  empty_input = 1,          // zero bytes where a frame was expected
  truncated_header,         // fewer than kFrameHeaderBytes bytes
  bad_magic,                // the frame does not start with "TRPE"
  unsupported_version,      // frame version this build does not know
  unknown_flags,            // flag or reserved bits this build does not know
  too_large,                // declared or actual size above DecodeLimits::max_message_bytes
  decompress_failed,        // the zstd body is corrupt
  length_mismatch,          // body length disagrees with the header / zstd frame size
  bad_segment_count,        // zero or more than DecodeLimits::max_segments segments
  segment_table_truncated,  // the segment table runs past the end of the body
  segments_past_end,        // the segment sizes add up to more than the body holds
  trailing_bytes,           // bytes after the last segment
  malformed_message,        // Cap'n Proto structural error (bad or out-of-bounds pointer, ...)
  traversal_limit,          // traversal limit exceeded (pointer loops / amplification)
  nesting_limit,            // nesting deeper than DecodeLimits::nesting_limit
  unknown_kind,             // Message union discriminant this build does not know
  schema_violation,         // a schema-level invariant failed (shape/data size, row counts, ...)
  empty_envelope,           // read from a default-constructed (empty) envelope
  wrong_kind,               // read<S>() on an envelope holding another kind
  bulk_unavailable,         // the shared-memory segment a bulk record names is missing or invalid
  checksum_mismatch,        // the frame's CRC-32 trailer disagrees with its bytes (corrupted in flight)
};

// True for errors that say the bytes were damaged on the way (the frame does
// not decode as it was sent: checksum, header, lengths, compression), as
// opposed to a well-framed message that fails validation (a buggy or hostile
// sender). Receivers treat the first as a lost message.
bool damaged_in_flight(const caf::error& err);

const char* to_string(envelope_errc code);

// The CAF error category of envelope errors.
constexpr caf::atom_value envelope_error_category = caf::atom("envelope");

// Makes a caf::error of category "envelope"; `context` says what exactly failed.
caf::error make_error(envelope_errc code, std::string context = {});

// The envelope_errc of `err`, or nullopt if it is not an envelope error.
std::optional<envelope_errc> envelope_error_code(const caf::error& err);

// -- limits and options ---------------------------------------------------------

// Bounds applied to every decoded (untrusted) message.
struct DecodeLimits {
  uint64_t max_message_bytes = 256ull << 20;  // uncompressed body, and the compressed body
  uint32_t max_segments = 1024;
  int nesting_limit = 32;  // our schemas nest at most 5 deep
  // The validation pass may read at most 2 * (message words) + this many
  // words: a legal message is read once, pointer loops are cut off here.
  uint64_t traversal_slack_words = 1024;
};

inline constexpr char kFrameMagic[4] = {'T', 'R', 'P', 'E'};
inline constexpr uint8_t kFrameVersion = 1;
inline constexpr size_t kFrameHeaderBytes = 16;
inline constexpr uint8_t kFlagZstd = 1;
inline constexpr uint8_t kFlagCrc32 = 2;
inline constexpr size_t kFrameTrailerBytes = 4;
inline constexpr size_t kCompressThreshold = 64 * 1024;

// How frames are written. On the CAF path they come from the sending actor
// system's config entries "troupe.envelope.compress-threshold" (bytes;
// default 64 KiB; negative = never compress: on loopback zstd costs more than
// it saves, see bench/results/messaging.md) and "troupe.envelope.zstd-level" (default
// 1), written by set_encode_options().
struct EncodeOptions {
  size_t compress_threshold = kCompressThreshold;  // compress bodies longer than this...
  int zstd_level = 1;                              // ...if a 64 KiB sample shrinks by >= 10%
  bool checksum = true;                            // append the CRC-32 trailer (flag bit 1)
};

// Reads / writes those config entries (set before the actor system starts).
EncodeOptions encode_options(const caf::actor_system_config& cfg);
void set_encode_options(caf::actor_system_config& cfg, const EncodeOptions& opts);

// -- the envelope -----------------------------------------------------------------

class Envelope;
namespace detail {
struct EnvelopeData;
struct Opened {
  std::shared_ptr<const void> keep;  // keeps segments and the MessageReader alive
  schemas::Message::Reader root;
};
}  // namespace detail

// Maps a payload struct to its member of the Message union.
template <class S>
struct payload_traits;

// A typed, validated view of an envelope's payload. Copyable and cheap; it
// keeps the envelope's segments alive on its own.
template <class S>
class Read {
 public:
  Read(std::shared_ptr<const void> keep, schemas::Message::Reader msg, typename S::Reader root)
      : keep_(std::move(keep)), msg_(msg), root_(root) {}
  typename S::Reader get() const { return root_; }
  typename S::Reader operator*() const { return root_; }
  const typename S::Reader* operator->() const { return &root_; }
  schemas::Header::Reader header() const { return msg_.getHeader(); }

 private:
  std::shared_ptr<const void> keep_;
  schemas::Message::Reader msg_;
  typename S::Reader root_;
};

class Envelope {
 public:
  using Kind = schemas::Message::Which;

  // An empty envelope: reading it gives `empty_envelope`.
  Envelope() = default;

  // Builds an envelope from `fill(schemas::Message::Builder)`. The result is
  // validated like a decoded message; a violation makes it invalid (ok() is
  // false and read() returns the error), it never throws.
  template <class F>
  static Envelope build_message(F&& fill, unsigned first_segment_words = 0) {
    auto mb = new_builder(first_segment_words);
    fill(mb->initRoot<schemas::Message>());
    return finish(std::move(mb));
  }

  // Builds an envelope of payload kind S from `fill(typename S::Builder)`.
  template <class S, class F>
  static Envelope build(F&& fill, unsigned first_segment_words = 0) {
    auto mb = new_builder(first_segment_words);
    fill(payload_traits<S>::init(mb->initRoot<schemas::Message>()));
    return finish(std::move(mb));
  }

  // Like build, for a payload that ends in one large blob: `fill` returns the
  // capnp::Data::Builder of `blob_bytes` it allocated LAST and wrote
  // completely (a tensor's bytes). The blob's memory is not zeroed first,
  // which saves a pass over it (Cap'n Proto zeroes new segments, then the
  // blob would be overwritten anyway). The contract is checked: a blob that
  // is not the message's last allocation, or starts past the zeroed head,
  // gives an invalid envelope (schema_violation), never a corrupt one.
  //
  // The memory comes from the blob segment cache when a blob envelope of
  // the same size was dropped lately (envelope.cpp): the optimizer's slices
  // and snapshots have the same sizes every step, and memory that was in use
  // a moment ago is still in the CPU's caches and mapped, a fresh block
  // usually is neither.
  template <class S, class F>
  static Envelope build_blob(size_t blob_bytes, F&& fill) {
    BlobBuilder b = new_blob_builder(blob_bytes);
    capnp::Data::Builder blob = fill(payload_traits<S>::init(b.mb->initRoot<schemas::Message>()));
    return finish_blob(std::move(b), blob);
  }

  // An invalid envelope that carries `err` (what a failed decode delivers).
  static Envelope invalid(caf::error err);

  // Decodes a frame (untrusted bytes). Copies the bytes once (into aligned
  // memory); the CAF transport path reads straight into aligned memory instead.
  static caf::expected<Envelope> decode(const void* frame, size_t size,
                                        const DecodeLimits& limits = {});
  // The frame for this envelope (what crosses a process boundary).
  std::vector<uint8_t> encode(const EncodeOptions& opts = {}) const;

  bool empty() const { return d_ == nullptr; }
  // True if the envelope holds a message that passed validation.
  bool ok() const;
  // The validation / decode error; none for ok and empty envelopes.
  caf::error error() const;
  caf::expected<Kind> kind() const;

  // The payload as S, validated. Errors: the stored error, empty_envelope, wrong_kind.
  template <class S>
  caf::expected<Read<S>> read() const {
    auto opened = open(payload_traits<S>::kind);
    if (!opened) return std::move(opened.error());
    auto root = opened->root;
    return Read<S>{std::move(opened->keep), root, payload_traits<S>::get(root)};
  }
  // The whole Message (header + union), validated.
  caf::expected<Read<schemas::Message>> message() const;

  // The shared, immutable segments (for zero-copy checks and for writers).
  size_t segment_count() const;
  kj::ArrayPtr<const capnp::word> segment(size_t i) const;
  // Length of the uncompressed flat array (segment table + segments) in bytes.
  size_t flat_size() const;
  // True if this envelope was decoded from a zstd-compressed frame.
  bool arrived_compressed() const;

  // How many Envelope copies share these segments (1 = unshared, 0 = empty).
  long use_count() const { return d_ ? d_.use_count() : 0; }

  std::shared_ptr<const detail::EnvelopeData> data() const { return d_; }
  explicit Envelope(std::shared_ptr<const detail::EnvelopeData> d) : d_(std::move(d)) {}

 private:
  static std::unique_ptr<capnp::MallocMessageBuilder> new_builder(unsigned first_segment_words);
  struct BlobBuilder {
    std::unique_ptr<capnp::word[]> first;  // the first segment (head zeroed, blob area not)
    size_t words = 0;
    std::unique_ptr<capnp::MessageBuilder> mb;  // a builder that never re-zeroes `first` (envelope.cpp)
  };
  static BlobBuilder new_blob_builder(size_t blob_bytes);
  static Envelope finish_blob(BlobBuilder b, capnp::Data::Builder blob);
  static Envelope finish(std::unique_ptr<capnp::MessageBuilder> mb, std::unique_ptr<capnp::word[]> first = nullptr,
                         size_t first_words = 0);
  // Checks state and kind; kind == nullopt accepts every kind.
  caf::expected<detail::Opened> open(std::optional<Kind> kind) const;

  std::shared_ptr<const detail::EnvelopeData> d_;
};

const char* kind_name(Envelope::Kind k);
std::string to_string(const Envelope& x);

// -- payload kinds ------------------------------------------------------------------

template <>
struct payload_traits<schemas::Message> {
  static schemas::Message::Reader get(schemas::Message::Reader m) { return m; }
};

#define TROUPE_ENVELOPE_PAYLOAD(Type, KIND)                                                \
  template <>                                                                              \
  struct payload_traits<schemas::Type> {                                                   \
    static constexpr Envelope::Kind kind = schemas::Message::KIND;                         \
    static schemas::Type::Reader get(schemas::Message::Reader m) { return m.get##Type(); } \
    static schemas::Type::Builder init(schemas::Message::Builder m) { return m.init##Type(); } \
  };
TROUPE_ENVELOPE_PAYLOAD(Activations, ACTIVATIONS)
TROUPE_ENVELOPE_PAYLOAD(Gradients, GRADIENTS)
TROUPE_ENVELOPE_PAYLOAD(Dispatch, DISPATCH)
TROUPE_ENVELOPE_PAYLOAD(Combine, COMBINE)
TROUPE_ENVELOPE_PAYLOAD(GradSlice, GRAD_SLICE)
TROUPE_ENVELOPE_PAYLOAD(ParamSlice, PARAM_SLICE)
TROUPE_ENVELOPE_PAYLOAD(Snapshot, SNAPSHOT)
TROUPE_ENVELOPE_PAYLOAD(Restore, RESTORE)
TROUPE_ENVELOPE_PAYLOAD(Stop, STOP)
TROUPE_ENVELOPE_PAYLOAD(StatusRequest, STATUS_REQUEST)
TROUPE_ENVELOPE_PAYLOAD(StatusReply, STATUS_REPLY)
TROUPE_ENVELOPE_PAYLOAD(ErrorReport, ERROR_REPORT)
TROUPE_ENVELOPE_PAYLOAD(RlWeights, RL_WEIGHTS)
TROUPE_ENVELOPE_PAYLOAD(RlRollout, RL_ROLLOUT)
#undef TROUPE_ENVELOPE_PAYLOAD

// The last kind this build knows (receivers reject larger discriminants).
inline constexpr Envelope::Kind kLastKnownKind = schemas::Message::RL_ROLLOUT;

// -- tensor helpers ---------------------------------------------------------------------

// Bytes per element of `dt`, or 0 for a dtype this build does not know.
size_t dtype_size(schemas::DType dt);

// Fills `t` with a copy of `bytes` (outputs first, then inputs). `bytes.size()`
// must equal product(shape) * dtype_size(dt); a mismatch is stored as given and
// caught by validation.
void set_tensor(schemas::Tensor::Builder t, schemas::DType dt, std::span<const int64_t> shape,
                std::span<const uint8_t> bytes);
void set_tensor_f32(schemas::Tensor::Builder t, std::span<const int64_t> shape,
                    std::span<const float> values);
void set_tensor_i32(schemas::Tensor::Builder t, std::span<const int64_t> shape,
                    std::span<const int32_t> values);
void set_tensor_f64(schemas::Tensor::Builder t, std::span<const int64_t> shape,
                    std::span<const double> values);
// Makes `t` an f32 tensor of shape [n] and returns its data blob (n * 4
// bytes, unwritten) for the caller to fill: the last allocation of a
// build_blob message.
capnp::Data::Builder init_tensor_f32_blob(schemas::Tensor::Builder t, int64_t n);
// Zero-copy views of a validated tensor's elements (data is word-aligned in
// the segment). Empty if the dtype does not match.
std::span<const float> tensor_f32(schemas::Tensor::Reader t);
std::span<const int32_t> tensor_i32(schemas::Tensor::Reader t);
std::span<const double> tensor_f64(schemas::Tensor::Reader t);
std::vector<int64_t> tensor_shape(schemas::Tensor::Reader t);

// -- CAF serialization ----------------------------------------------------------------------

caf::error save_envelope(caf::serializer& f, const Envelope& x);
caf::error load_envelope(caf::deserializer& f, Envelope& x);

// CAF 0.17 inspect overload. Serializers write one byte sequence holding the
// frame; deserializers read it and decode it with the default DecodeLimits
// (a malformed frame becomes an invalid Envelope, see the contract above; only
// a broken CAF byte stream is an error here). Other inspectors (to_string)
// see a one-line summary.
template <class Inspector>
typename Inspector::result_type inspect(Inspector& f, Envelope& x) {
  if constexpr (std::is_same_v<typename Inspector::result_type, caf::error>) {
    if constexpr (Inspector::reads_state)
      return save_envelope(f, x);
    else
      return load_envelope(f, x);
  } else {
    auto summary = to_string(x);
    return f(caf::meta::type_name("troupe::Envelope"), summary);
  }
}

}  // namespace troupe
