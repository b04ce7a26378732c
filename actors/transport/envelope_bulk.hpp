// Hooks of the shared-memory bulk path (envelope_shm.cpp) for the CAF
// serialization of Envelopes (envelope.cpp). Private to envelope*.cpp.
#pragma once

#include <optional>

#include "actors/transport/envelope_internal.hpp"

namespace troupe::detail {

inline constexpr size_t kBulkRecordBytes = 64;

// True when `d` should travel through a shared-memory segment.
bool bulk_wanted(const EnvelopeData* d);
// Writes `d`'s frame into a segment and the record naming it to `out`;
// nullopt when no segment could be made (then send the frame inline).
std::optional<caf::error> save_bulk(const EnvelopeData* d, const EncodeOptions& opts, FrameWriter& out);
// Whether received bytes are a bulk record rather than a frame.
bool is_bulk_record(const void* data, size_t n);
// Maps the segment a record names, unlinks it and decodes the frame in place.
caf::expected<Envelope> load_bulk(const uint8_t* record, size_t max_frame, const DecodeLimits& limits);

}  // namespace troupe::detail
