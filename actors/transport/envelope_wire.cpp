// The envelope frame codec (format documented in actors/transport/envelope.hpp):
// encoding writes the header, the segment table and the segments in pieces
// (zstd-compressing large bodies), decoding checks every length before it is
// trusted and hands the flat array to the validator.
#include <cstring>
#include <new>
#include <string>

#include <zlib.h>
#include <zstd.h>

#include "actors/transport/envelope_internal.hpp"

namespace troupe::detail {
namespace {

void put_u32(uint8_t* p, uint32_t v) {
  for (int i = 0; i < 4; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint32_t get_u32(const uint8_t* p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; ++i) v |= static_cast<uint32_t>(p[i]) << (8 * i);
  return v;
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

struct CctxDeleter {
  void operator()(ZSTD_CCtx* c) const { ZSTD_freeCCtx(c); }
};
struct DctxDeleter {
  void operator()(ZSTD_DCtx* c) const { ZSTD_freeDCtx(c); }
};

// One compression context per thread: contexts are not thread-safe, and
// creating one per message would dominate small-message cost.
ZSTD_CCtx* thread_cctx() {
  thread_local std::unique_ptr<ZSTD_CCtx, CctxDeleter> ctx(ZSTD_createCCtx());
  return ctx.get();
}
ZSTD_DCtx* thread_dctx() {
  thread_local std::unique_ptr<ZSTD_DCtx, DctxDeleter> ctx(ZSTD_createDCtx());
  return ctx.get();
}

struct Piece {
  const void* data;
  size_t size;
};

// Compresses the pieces into one zstd frame that records its content size.
// Returns false on any zstd failure (the caller then sends the raw body).
bool compress(const std::vector<Piece>& pieces, size_t raw, int level,
              std::unique_ptr<uint8_t[]>& out, size_t& out_size) {
  ZSTD_CCtx* c = thread_cctx();
  if (c == nullptr) return false;
  ZSTD_CCtx_reset(c, ZSTD_reset_session_and_parameters);
  if (ZSTD_isError(ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, level))) return false;
  if (ZSTD_isError(ZSTD_CCtx_setPledgedSrcSize(c, raw))) return false;
  const size_t cap = ZSTD_compressBound(raw);
  out.reset(new (std::nothrow) uint8_t[cap]);
  if (!out) return false;
  ZSTD_outBuffer ob{out.get(), cap, 0};
  for (const auto& p : pieces) {
    ZSTD_inBuffer ib{p.data, p.size, 0};
    while (ib.pos < ib.size) {
      if (ZSTD_isError(ZSTD_compressStream2(c, &ob, &ib, ZSTD_e_continue))) return false;
    }
  }
  ZSTD_inBuffer none{nullptr, 0, 0};
  for (;;) {
    size_t left = ZSTD_compressStream2(c, &ob, &none, ZSTD_e_end);
    if (ZSTD_isError(left)) return false;
    if (left == 0) break;
  }
  out_size = ob.pos;
  return true;
}

// Compressing incompressible data (e.g. random-looking float mantissas) costs
// a full pass for nothing: try a 64 KiB sample of the largest segment first
// and send raw unless it shrinks by at least 10%.
bool worth_compressing(const EnvelopeData& d, int level) {
  const kj::ArrayPtr<const capnp::word>* largest = &d.segments[0];
  for (const auto& s : d.segments)
    if (s.size() > largest->size()) largest = &s;
  const size_t sample = std::min<size_t>(largest->size() * sizeof(capnp::word), 64 * 1024);
  if (sample < 4096) return true;  // too little to judge: let the real pass decide
  ZSTD_CCtx* c = thread_cctx();
  if (c == nullptr) return false;
  std::unique_ptr<uint8_t[]> out(new (std::nothrow) uint8_t[ZSTD_compressBound(sample)]);
  if (!out) return false;
  const size_t n = ZSTD_compressCCtx(c, out.get(), ZSTD_compressBound(sample), largest->begin(), sample, level);
  return !ZSTD_isError(n) && n < sample - sample / 10;
}

caf::error fail(envelope_errc code, std::string ctx) { return make_error(code, std::move(ctx)); }

// zlib's crc32 takes uInt lengths: feed large pieces in chunks.
uint32_t crc_update(uint32_t crc, const void* data, size_t n) {
  const auto* p = static_cast<const Bytef*>(data);
  while (n > 0) {
    const uInt step = static_cast<uInt>(std::min<size_t>(n, 1u << 30));
    crc = static_cast<uint32_t>(::crc32(crc, p, step));
    p += step;
    n -= step;
  }
  return crc;
}

// Passes the frame on to `out` and computes the CRC-32 of what went through.
struct CrcWriter final : FrameWriter {
  FrameWriter& out;
  bool on;
  uint32_t crc = 0;
  CrcWriter(FrameWriter& o, bool checksum) : out(o), on(checksum) {}
  caf::error begin(size_t n) override { return out.begin(n + (on ? kFrameTrailerBytes : 0)); }
  caf::error write(const void* data, size_t n) override {
    if (on) crc = crc_update(crc, data, n);
    return out.write(data, n);
  }
  caf::error end() override {
    if (on) {
      uint8_t t[kFrameTrailerBytes];
      put_u32(t, crc);
      if (auto err = out.write(t, sizeof t)) return err;
    }
    return out.end();
  }
};

}  // namespace

caf::error encode_frame(const EnvelopeData* d, const EncodeOptions& opts, FrameWriter& sink) {
  CrcWriter out(sink, opts.checksum);
  uint8_t hdr[kFrameHeaderBytes] = {};
  std::memcpy(hdr, kFrameMagic, 4);
  hdr[4] = kFrameVersion;
  if (opts.checksum) hdr[5] = kFlagCrc32;
  if (d == nullptr || d->segments.empty()) {
    // Empty (or body-less invalid) envelope: header only, body length 0.
    if (auto err = out.begin(kFrameHeaderBytes)) return err;
    if (auto err = out.write(hdr, kFrameHeaderBytes)) return err;
    return out.end();
  }
  const size_t nseg = d->segments.size();
  std::vector<uint8_t> table(segment_table_bytes(nseg), 0);
  put_u32(table.data(), static_cast<uint32_t>(nseg - 1));
  for (size_t i = 0; i < nseg; ++i)
    put_u32(table.data() + 4 + 4 * i, static_cast<uint32_t>(d->segments[i].size()));
  std::vector<Piece> pieces;
  pieces.push_back({table.data(), table.size()});
  for (const auto& s : d->segments) pieces.push_back({s.begin(), s.size() * sizeof(capnp::word)});
  const size_t raw = d->flat_bytes;
  put_u64(hdr + 8, raw);

  if (raw > opts.compress_threshold && worth_compressing(*d, opts.zstd_level)) {
    std::unique_ptr<uint8_t[]> comp;
    size_t comp_size = 0;
    // Incompressible data (e.g. random floats) goes raw: the flag says which.
    if (compress(pieces, raw, opts.zstd_level, comp, comp_size) && comp_size < raw) {
      hdr[5] |= kFlagZstd;
      if (auto err = out.begin(kFrameHeaderBytes + comp_size)) return err;
      if (auto err = out.write(hdr, kFrameHeaderBytes)) return err;
      if (auto err = out.write(comp.get(), comp_size)) return err;
      return out.end();
    }
  }
  if (auto err = out.begin(kFrameHeaderBytes + raw)) return err;
  if (auto err = out.write(hdr, kFrameHeaderBytes)) return err;
  for (const auto& p : pieces)
    if (auto err = out.write(p.data, p.size)) return err;
  return out.end();
}

caf::expected<Envelope> decode_frame(kj::Array<capnp::word> frame, size_t size,
                                     const DecodeLimits& limits) {
  const auto* p = reinterpret_cast<const uint8_t*>(frame.begin());
  if (size == 0) return fail(envelope_errc::empty_input, "zero-length frame");
  if (size < kFrameHeaderBytes)
    return fail(envelope_errc::truncated_header,
                std::to_string(size) + " bytes, header needs " + std::to_string(kFrameHeaderBytes));
  if (std::memcmp(p, kFrameMagic, 4) != 0) return fail(envelope_errc::bad_magic, "not a troupe envelope frame");
  if (p[4] != kFrameVersion)
    return fail(envelope_errc::unsupported_version, "frame version " + std::to_string(p[4]));
  const uint8_t flags = p[5];
  if ((flags & ~(kFlagZstd | kFlagCrc32)) != 0 || p[6] != 0 || p[7] != 0)
    return fail(envelope_errc::unknown_flags, "flags " + std::to_string(flags));
  if (flags & kFlagCrc32) {
    // Before any length is trusted: a damaged frame is rejected as such.
    if (size < kFrameHeaderBytes + kFrameTrailerBytes)
      return fail(envelope_errc::length_mismatch, "no room for the CRC-32 trailer");
    size -= kFrameTrailerBytes;
    const uint32_t want = get_u32(p + size), got = crc_update(0, p, size);
    if (want != got) return fail(envelope_errc::checksum_mismatch, "frame CRC-32 does not match its bytes");
  }
  const uint64_t raw = get_u64(p + 8);
  const uint8_t* body = p + kFrameHeaderBytes;
  const size_t body_n = size - kFrameHeaderBytes;
  if (raw == 0) {
    if (body_n != 0) return fail(envelope_errc::trailing_bytes, "empty envelope with a body");
    return Envelope{};
  }
  if (raw > limits.max_message_bytes)
    return fail(envelope_errc::too_large, "body of " + std::to_string(raw) + " bytes, limit " +
                                              std::to_string(limits.max_message_bytes));
  if (raw % sizeof(capnp::word) != 0)
    return fail(envelope_errc::length_mismatch, "body length " + std::to_string(raw) + " is not whole words");

  kj::Array<capnp::word> owner;
  const capnp::word* flat = nullptr;
  if (flags & kFlagZstd) {
    if (body_n > limits.max_message_bytes)
      return fail(envelope_errc::too_large, "compressed body of " + std::to_string(body_n) + " bytes");
    const unsigned long long content = ZSTD_getFrameContentSize(body, body_n);
    if (content == ZSTD_CONTENTSIZE_ERROR || content == ZSTD_CONTENTSIZE_UNKNOWN)
      return fail(envelope_errc::decompress_failed, "not a zstd frame with a content size");
    if (content != raw)
      return fail(envelope_errc::length_mismatch, "zstd content size " + std::to_string(content) +
                                                      " != header length " + std::to_string(raw));
    const size_t csize = ZSTD_findFrameCompressedSize(body, body_n);
    if (ZSTD_isError(csize)) return fail(envelope_errc::decompress_failed, ZSTD_getErrorName(csize));
    if (csize != body_n) return fail(envelope_errc::trailing_bytes, "bytes after the zstd frame");
    owner = kj::heapArray<capnp::word>(raw / sizeof(capnp::word));
    ZSTD_DCtx* dctx = thread_dctx();
    if (dctx == nullptr) return fail(envelope_errc::decompress_failed, "no zstd context");
    const size_t got = ZSTD_decompressDCtx(dctx, owner.begin(), raw, body, body_n);
    if (ZSTD_isError(got)) return fail(envelope_errc::decompress_failed, ZSTD_getErrorName(got));
    if (got != raw) return fail(envelope_errc::length_mismatch, "zstd produced " + std::to_string(got) + " bytes");
    flat = owner.begin();
  } else {
    if (body_n < raw)
      return fail(envelope_errc::length_mismatch, "body has " + std::to_string(body_n) +
                                                      " bytes, header says " + std::to_string(raw));
    if (body_n > raw) return fail(envelope_errc::trailing_bytes, std::to_string(body_n - raw) + " bytes after the body");
    // The frame buffer is word-aligned and the header is two words: use the body in place.
    flat = frame.begin() + kFrameHeaderBytes / sizeof(capnp::word);
    owner = std::move(frame);
  }

  // Segment table: u32 (count - 1), then count u32 sizes in words, padded to a word.
  const auto* fb = reinterpret_cast<const uint8_t*>(flat);
  const uint64_t count = uint64_t{get_u32(fb)} + 1;
  if (count > limits.max_segments)
    return fail(envelope_errc::bad_segment_count, std::to_string(count) + " segments, limit " +
                                                       std::to_string(limits.max_segments));
  const uint64_t table = segment_table_bytes(count);
  if (table > raw)
    return fail(envelope_errc::segment_table_truncated, "table of " + std::to_string(count) +
                                                            " segments needs " + std::to_string(table) + " bytes");
  uint64_t total = table;
  for (uint64_t i = 0; i < count; ++i) total += uint64_t{get_u32(fb + 4 + 4 * i)} * sizeof(capnp::word);
  if (total > raw)
    return fail(envelope_errc::segments_past_end, "segments need " + std::to_string(total) +
                                                      " bytes, body has " + std::to_string(raw));
  if (total < raw) return fail(envelope_errc::trailing_bytes, std::to_string(raw - total) + " bytes after the segments");

  auto d = std::make_shared<EnvelopeData>();
  const capnp::word* cursor = flat + table / sizeof(capnp::word);
  d->segments.reserve(count);
  for (uint64_t i = 0; i < count; ++i) {
    const size_t words = get_u32(fb + 4 + 4 * i);
    d->segments.emplace_back(cursor, words);
    cursor += words;
  }
  d->flat_bytes = raw;
  d->wire_compressed = (flags & kFlagZstd) != 0;
  d->words = std::move(owner);
  if (auto err = validate_message(d->segments, limits, /*structural=*/true, &d->kind)) return err;
  return Envelope{std::shared_ptr<const EnvelopeData>(std::move(d))};
}

}  // namespace troupe::detail
