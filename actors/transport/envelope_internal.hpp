// Private to the envelope implementation (envelope*.cpp): the shared,
// immutable payload behind an Envelope, and the functions the wire codec and
// the validator export to envelope.cpp. Not for use by other code.
#pragma once

#include <memory>
#include <vector>

#include <kj/array.h>

#include "actors/transport/envelope.hpp"

namespace troupe::detail {

// Never modified after construction; shared by every copy of an Envelope in
// a process and read concurrently.
struct EnvelopeData {
  EnvelopeData() = default;
  EnvelopeData(const EnvelopeData&) = delete;
  EnvelopeData& operator=(const EnvelopeData&) = delete;
  // Hands a build_blob segment to the blob segment cache (envelope.cpp).
  ~EnvelopeData();

  // Exactly one of these owns the segment memory (or neither: invalid with no body).
  std::unique_ptr<capnp::word[]> first_segment;          // build_blob: the builder's first segment (outlives it)
  size_t first_segment_words = 0;                        // its length
  std::unique_ptr<capnp::MessageBuilder> builder;        // built in this process
  kj::Array<capnp::word> words;                          // received: frame or decompressed body
  std::vector<kj::ArrayPtr<const capnp::word>> segments; // views into the owner
  size_t flat_bytes = 0;                                 // segment table + segments
  caf::error error;                                      // set iff invalid
  bool wire_compressed = false;                          // decoded from a zstd body
  Envelope::Kind kind = Envelope::Kind::ACTIVATIONS;     // meaningful only when valid
};

// Bytes of the segment table for `n` segments (padded to a word).
inline size_t segment_table_bytes(size_t n) { return ((4 + 4 * n) + 7) & ~size_t{7}; }

// Checks a message held in `segments`: when `structural`, follows every
// pointer under the limits (catches out-of-bounds pointers, loops, deep
// nesting); then the schema-level invariants of its kind. Writes the kind.
caf::error validate_message(const std::vector<kj::ArrayPtr<const capnp::word>>& segments,
                            const DecodeLimits& limits, bool structural, Envelope::Kind* kind);

// Decodes a frame of `size` bytes that starts at `frame[0]` (word aligned,
// owned). Uncompressed bodies are used in place (no copy).
caf::expected<Envelope> decode_frame(kj::Array<capnp::word> frame, size_t size,
                                     const DecodeLimits& limits);

// Receives the frame produced by encode_frame in pieces.
class FrameWriter {
 public:
  virtual ~FrameWriter() = default;
  virtual caf::error begin(size_t total_bytes) = 0;
  virtual caf::error write(const void* data, size_t n) = 0;
  virtual caf::error end() = 0;
};

// Writes the frame of `d` (may be null: empty envelope) to `out`.
caf::error encode_frame(const EnvelopeData* d, const EncodeOptions& opts, FrameWriter& out);

}  // namespace troupe::detail
