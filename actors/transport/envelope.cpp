// Envelope: construction, typed reads, tensor helpers and the CAF
// serialization hooks. The frame codec lives in envelope_wire.cpp, the
// validator in envelope_validate.cpp.
#include "actors/transport/envelope.hpp"

#include <algorithm>
#include <cstring>
#include <mutex>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/binary_deserializer.hpp>
#include <caf/execution_unit.hpp>
#include <caf/deserializer.hpp>
#include <caf/make_message.hpp>
#include <caf/message.hpp>
#include <caf/sec.hpp>
#include <caf/serializer.hpp>
#include <caf/settings.hpp>
#include <zstd.h>

#include "actors/transport/envelope_bulk.hpp"
#include "actors/transport/envelope_internal.hpp"
#include "actors/transport/envelope_shm.hpp"

namespace troupe {

// -- errors -------------------------------------------------------------------

const char* to_string(envelope_errc code) {
  switch (code) {
    case envelope_errc::empty_input: return "empty_input";
    case envelope_errc::checksum_mismatch: return "checksum_mismatch";
    case envelope_errc::truncated_header: return "truncated_header";
    case envelope_errc::bad_magic: return "bad_magic";
    case envelope_errc::unsupported_version: return "unsupported_version";
    case envelope_errc::unknown_flags: return "unknown_flags";
    case envelope_errc::too_large: return "too_large";
    case envelope_errc::decompress_failed: return "decompress_failed";
    case envelope_errc::length_mismatch: return "length_mismatch";
    case envelope_errc::bad_segment_count: return "bad_segment_count";
    case envelope_errc::segment_table_truncated: return "segment_table_truncated";
    case envelope_errc::segments_past_end: return "segments_past_end";
    case envelope_errc::trailing_bytes: return "trailing_bytes";
    case envelope_errc::malformed_message: return "malformed_message";
    case envelope_errc::traversal_limit: return "traversal_limit";
    case envelope_errc::nesting_limit: return "nesting_limit";
    case envelope_errc::unknown_kind: return "unknown_kind";
    case envelope_errc::schema_violation: return "schema_violation";
    case envelope_errc::empty_envelope: return "empty_envelope";
    case envelope_errc::wrong_kind: return "wrong_kind";
    case envelope_errc::bulk_unavailable: return "bulk_unavailable";
  }
  return "unknown_envelope_error";
}

caf::error make_error(envelope_errc code, std::string context) {
  return caf::error{static_cast<uint8_t>(code), envelope_error_category,
                    caf::make_message(std::move(context))};
}

std::optional<envelope_errc> envelope_error_code(const caf::error& err) {
  if (!err || err.category() != envelope_error_category) return std::nullopt;
  return static_cast<envelope_errc>(err.code());
}

bool damaged_in_flight(const caf::error& err) {
  const auto code = envelope_error_code(err);
  if (!code) return false;
  switch (*code) {
    case envelope_errc::empty_input:
    case envelope_errc::truncated_header:
    case envelope_errc::bad_magic:
    case envelope_errc::unsupported_version:
    case envelope_errc::unknown_flags:
    case envelope_errc::decompress_failed:
    case envelope_errc::length_mismatch:
    case envelope_errc::trailing_bytes:
    case envelope_errc::checksum_mismatch: return true;
    default: return false;
  }
}

// -- the envelope -------------------------------------------------------------------

std::unique_ptr<capnp::MallocMessageBuilder> Envelope::new_builder(unsigned first_segment_words) {
  if (first_segment_words == 0) return std::make_unique<capnp::MallocMessageBuilder>();
  return std::make_unique<capnp::MallocMessageBuilder>(first_segment_words);
}

namespace {
// Words zeroed at the start of a blob envelope's first segment: every struct
// and list before the blob must fit (a ParamSlice or RlWeights header takes
// under 40); finish_blob checks it.
constexpr size_t kBlobHeadWords = 256;

// The first segments of dropped blob envelopes, kept for the next blob
// envelope of the same size (newest first). Bounded: at most kCacheSegments
// segments and kCacheBytes bytes; a larger segment is freed at once. Shared
// by every thread of the process (a mutex; a few takes and gives per step).
class BlobSegmentCache {
 public:
  static constexpr size_t kCacheSegments = 8;
  static constexpr size_t kCacheBytes = size_t{256} << 20;

  std::unique_ptr<capnp::word[]> take(size_t words) {
    std::lock_guard<std::mutex> lock(mu_);
    for (size_t i = free_.size(); i-- > 0;)
      if (free_[i].words == words) {
        std::unique_ptr<capnp::word[]> p = std::move(free_[i].memory);
        bytes_ -= words * sizeof(capnp::word);
        free_.erase(free_.begin() + static_cast<std::ptrdiff_t>(i));
        return p;
      }
    return nullptr;
  }
  void give(std::unique_ptr<capnp::word[]> p, size_t words) {
    if (!p || words * sizeof(capnp::word) > kCacheBytes) return;
    std::lock_guard<std::mutex> lock(mu_);
    free_.push_back({std::move(p), words});
    bytes_ += words * sizeof(capnp::word);
    while (free_.size() > kCacheSegments || bytes_ > kCacheBytes) {  // the oldest go
      bytes_ -= free_.front().words * sizeof(capnp::word);
      free_.erase(free_.begin());
    }
  }

 private:
  struct Free {
    std::unique_ptr<capnp::word[]> memory;
    size_t words = 0;
  };
  std::mutex mu_;
  std::vector<Free> free_;
  size_t bytes_ = 0;
};

// Never destroyed: envelopes may be dropped during static destruction.
BlobSegmentCache& blob_segments() {
  static auto* cache = new BlobSegmentCache;
  return *cache;
}

// The builder of a blob envelope. It hands out the caller's first segment
// (its head zeroed, the blob written by the caller), like MallocMessageBuilder
// given a first segment, but does not zero that segment again when it is
// destroyed: MallocMessageBuilder does, so that the memory can be reused for
// another message, which costs a blob envelope one more pass over its tensor
// (14 MB per parameter slice of the quickstart model) when it is dropped.
// Any further segment (a message that outgrew the first; finish_blob refuses
// it) is zeroed and freed here.
class BlobMessageBuilder final : public capnp::MessageBuilder {
 public:
  explicit BlobMessageBuilder(kj::ArrayPtr<capnp::word> first) : first_(first) {}
  kj::ArrayPtr<capnp::word> allocateSegment(capnp::uint minimum_size) override {
    if (!gave_first_ && minimum_size <= first_.size()) {
      gave_first_ = true;
      return first_;
    }
    gave_first_ = true;
    more_.push_back(kj::heapArray<capnp::word>(std::max<size_t>(minimum_size, 1024)));
    std::memset(more_.back().begin(), 0, more_.back().size() * sizeof(capnp::word));
    return more_.back();
  }

 private:
  kj::ArrayPtr<capnp::word> first_;
  bool gave_first_ = false;
  std::vector<kj::Array<capnp::word>> more_;
};
}  // namespace

Envelope::BlobBuilder Envelope::new_blob_builder(size_t blob_bytes) {
  BlobBuilder b;
  b.words = kBlobHeadWords + (blob_bytes + 7) / 8;
  b.first = blob_segments().take(b.words);
  if (!b.first) b.first.reset(new capnp::word[b.words]);  // not zeroed: the blob overwrites it
  std::memset(b.first.get(), 0, kBlobHeadWords * sizeof(capnp::word));
  b.mb = std::make_unique<BlobMessageBuilder>(kj::arrayPtr(b.first.get(), b.words));
  return b;
}

Envelope Envelope::finish_blob(BlobBuilder b, capnp::Data::Builder blob) {
  const size_t words = b.words;
  if (blob.size() == 0) return finish(std::move(b.mb), std::move(b.first), words);  // nothing left unzeroed
  const auto* base = reinterpret_cast<const uint8_t*>(b.first.get());
  const auto* start = reinterpret_cast<const uint8_t*>(blob.begin());
  const size_t at = static_cast<size_t>(start - base), n = blob.size();
  auto segs = b.mb->getSegmentsForOutput();
  const bool in_first = start >= base && at + n <= b.words * sizeof(capnp::word);
  const size_t end_word = (at + n + 7) / 8;
  if (!in_first || at > kBlobHeadWords * sizeof(capnp::word) || segs.size() != 1 || segs[0].size() != end_word)
    return invalid(make_error(envelope_errc::schema_violation,
                              "build_blob: the blob is not the last allocation of the message's zeroed first segment"));
  // The padding after the blob, up to its word boundary, must read as zero.
  std::memset(reinterpret_cast<uint8_t*>(b.first.get()) + at + n, 0, end_word * 8 - (at + n));
  return finish(std::move(b.mb), std::move(b.first), words);
}

namespace detail {
EnvelopeData::~EnvelopeData() {
  builder.reset();  // it refers to first_segment
  blob_segments().give(std::move(first_segment), first_segment_words);
}
}  // namespace detail

Envelope Envelope::finish(std::unique_ptr<capnp::MessageBuilder> mb, std::unique_ptr<capnp::word[]> first,
                          size_t first_words) {
  auto d = std::make_shared<detail::EnvelopeData>();
  d->first_segment = std::move(first);  // outlives the builder (declared before it)
  d->first_segment_words = d->first_segment ? first_words : 0;
  auto segs = mb->getSegmentsForOutput();
  d->segments.assign(segs.begin(), segs.end());
  d->flat_bytes = detail::segment_table_bytes(segs.size());
  for (const auto& s : segs) d->flat_bytes += s.size() * sizeof(capnp::word);
  d->builder = std::move(mb);
  // Built here, so the pointer structure is sound: only the schema checks run.
  d->error = detail::validate_message(d->segments, DecodeLimits{}, /*structural=*/false, &d->kind);
  return Envelope{std::shared_ptr<const detail::EnvelopeData>(std::move(d))};
}

Envelope Envelope::invalid(caf::error err) {
  auto d = std::make_shared<detail::EnvelopeData>();
  d->error = err ? std::move(err) : make_error(envelope_errc::malformed_message, "invalid envelope");
  return Envelope{std::shared_ptr<const detail::EnvelopeData>(std::move(d))};
}

caf::expected<Envelope> Envelope::decode(const void* frame, size_t size, const DecodeLimits& limits) {
  if (size > kFrameHeaderBytes + ZSTD_compressBound(limits.max_message_bytes))
    return make_error(envelope_errc::too_large, "frame of " + std::to_string(size) + " bytes");
  try {
    auto buf = kj::heapArray<capnp::word>((size + sizeof(capnp::word) - 1) / sizeof(capnp::word));
    if (size > 0) std::memcpy(buf.begin(), frame, size);
    return detail::decode_frame(std::move(buf), size, limits);
  } catch (const std::bad_alloc&) {
    return make_error(envelope_errc::too_large, "out of memory for a " + std::to_string(size) + "-byte frame");
  }
}

namespace {
struct VectorWriter final : detail::FrameWriter {
  std::vector<uint8_t>& out;
  explicit VectorWriter(std::vector<uint8_t>& o) : out(o) {}
  caf::error begin(size_t total) override {
    out.clear();
    out.reserve(total);
    return caf::none;
  }
  caf::error write(const void* data, size_t n) override {
    const auto* p = static_cast<const uint8_t*>(data);
    out.insert(out.end(), p, p + n);
    return caf::none;
  }
  caf::error end() override { return caf::none; }
};

// Writes the frame as one CAF byte sequence (length prefix + raw bytes).
struct CafWriter final : detail::FrameWriter {
  caf::serializer& f;
  explicit CafWriter(caf::serializer& s) : f(s) {}
  caf::error begin(size_t total) override { return f.begin_sequence(total); }
  caf::error write(const void* data, size_t n) override {
    return n == 0 ? caf::none : f.apply_raw(n, const_cast<void*>(data));
  }
  caf::error end() override { return f.end_sequence(); }
};
}  // namespace

std::vector<uint8_t> Envelope::encode(const EncodeOptions& opts) const {
  std::vector<uint8_t> out;
  VectorWriter w{out};
  (void)detail::encode_frame(d_.get(), opts, w);  // VectorWriter cannot fail
  return out;
}

bool Envelope::ok() const { return d_ && !d_->error; }

caf::error Envelope::error() const { return d_ ? d_->error : caf::error{}; }

caf::expected<Envelope::Kind> Envelope::kind() const {
  if (!d_) return make_error(envelope_errc::empty_envelope, "empty envelope");
  if (d_->error) return d_->error;
  return d_->kind;
}

namespace {
// Keeps the segments alive next to the reader that points into them.
struct ReadContext {
  std::shared_ptr<const detail::EnvelopeData> data;
  capnp::SegmentArrayMessageReader reader;
  ReadContext(std::shared_ptr<const detail::EnvelopeData> d, capnp::ReaderOptions opts)
      : data(std::move(d)),
        reader(kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>>(data->segments.data(),
                                                                   data->segments.size()),
               opts) {}
};
}  // namespace

caf::expected<detail::Opened> Envelope::open(std::optional<Kind> kind) const {
  if (!d_) return make_error(envelope_errc::empty_envelope, "empty envelope");
  if (d_->error) return d_->error;
  if (kind && *kind != d_->kind)
    return make_error(envelope_errc::wrong_kind,
                      std::string("holds ") + kind_name(d_->kind) + ", asked for " + kind_name(*kind));
  // The message already passed validation under tight limits, so readers get
  // no traversal limit: re-reading a list in a loop is the reader's own cost,
  // not an amplification attack.
  capnp::ReaderOptions opts;
  opts.traversalLimitInWords = ~uint64_t{0} >> 1;
  auto ctx = std::make_shared<ReadContext>(d_, opts);
  auto root = ctx->reader.getRoot<schemas::Message>();
  return detail::Opened{std::shared_ptr<const void>(ctx, ctx.get()), root};
}

caf::expected<Read<schemas::Message>> Envelope::message() const {
  auto opened = open(std::nullopt);
  if (!opened) return std::move(opened.error());
  auto root = opened->root;
  return Read<schemas::Message>{std::move(opened->keep), root, root};
}

size_t Envelope::segment_count() const { return d_ ? d_->segments.size() : 0; }

kj::ArrayPtr<const capnp::word> Envelope::segment(size_t i) const {
  if (!d_ || i >= d_->segments.size()) return {};
  return d_->segments[i];
}

size_t Envelope::flat_size() const { return d_ ? d_->flat_bytes : 0; }

bool Envelope::arrived_compressed() const { return d_ && d_->wire_compressed; }

const char* kind_name(Envelope::Kind k) {
  switch (k) {
    case schemas::Message::ACTIVATIONS: return "activations";
    case schemas::Message::GRADIENTS: return "gradients";
    case schemas::Message::DISPATCH: return "dispatch";
    case schemas::Message::COMBINE: return "combine";
    case schemas::Message::GRAD_SLICE: return "gradSlice";
    case schemas::Message::PARAM_SLICE: return "paramSlice";
    case schemas::Message::SNAPSHOT: return "snapshot";
    case schemas::Message::RESTORE: return "restore";
    case schemas::Message::STOP: return "stop";
    case schemas::Message::STATUS_REQUEST: return "statusRequest";
    case schemas::Message::STATUS_REPLY: return "statusReply";
    case schemas::Message::ERROR_REPORT: return "errorReport";
    case schemas::Message::RL_WEIGHTS: return "rlWeights";
    case schemas::Message::RL_ROLLOUT: return "rlRollout";
  }
  return "unknown";
}

std::string to_string(const Envelope& x) {
  if (x.empty()) return "Envelope(empty)";
  if (!x.ok()) {
    auto err = x.error();
    auto code = envelope_error_code(err);
    return std::string("Envelope(invalid: ") + (code ? to_string(*code) : "error") + ")";
  }
  return std::string("Envelope(") + kind_name(*x.kind()) + ", " + std::to_string(x.flat_size()) + " bytes)";
}

// -- tensor helpers ---------------------------------------------------------------------

size_t dtype_size(schemas::DType dt) {
  switch (dt) {
    case schemas::DType::F32: return 4;
    case schemas::DType::I32: return 4;
    case schemas::DType::BF16: return 2;
    case schemas::DType::F16: return 2;
    case schemas::DType::I64: return 8;
    case schemas::DType::U8: return 1;
    case schemas::DType::F64: return 8;
  }
  return 0;
}

void set_tensor(schemas::Tensor::Builder t, schemas::DType dt, std::span<const int64_t> shape,
                std::span<const uint8_t> bytes) {
  t.setDtype(dt);
  auto s = t.initShape(static_cast<unsigned>(shape.size()));
  for (size_t i = 0; i < shape.size(); ++i) s.set(static_cast<unsigned>(i), shape[i]);
  auto data = t.initData(static_cast<unsigned>(bytes.size()));
  if (!bytes.empty()) std::memcpy(data.begin(), bytes.data(), bytes.size());
}

capnp::Data::Builder init_tensor_f32_blob(schemas::Tensor::Builder t, int64_t n) {
  t.setDtype(schemas::DType::F32);
  t.initShape(1).set(0, n);
  return t.initData(static_cast<unsigned>(static_cast<size_t>(n) * sizeof(float)));
}

void set_tensor_f32(schemas::Tensor::Builder t, std::span<const int64_t> shape, std::span<const float> v) {
  set_tensor(t, schemas::DType::F32, shape,
             {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(float)});
}

void set_tensor_i32(schemas::Tensor::Builder t, std::span<const int64_t> shape, std::span<const int32_t> v) {
  set_tensor(t, schemas::DType::I32, shape,
             {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(int32_t)});
}

void set_tensor_f64(schemas::Tensor::Builder t, std::span<const int64_t> shape, std::span<const double> v) {
  set_tensor(t, schemas::DType::F64, shape,
             {reinterpret_cast<const uint8_t*>(v.data()), v.size() * sizeof(double)});
}

std::span<const double> tensor_f64(schemas::Tensor::Reader t) {
  if (t.getDtype() != schemas::DType::F64) return {};
  auto d = t.getData();
  return {reinterpret_cast<const double*>(d.begin()), d.size() / sizeof(double)};
}

std::span<const float> tensor_f32(schemas::Tensor::Reader t) {
  if (t.getDtype() != schemas::DType::F32) return {};
  auto d = t.getData();
  return {reinterpret_cast<const float*>(d.begin()), d.size() / sizeof(float)};
}

std::span<const int32_t> tensor_i32(schemas::Tensor::Reader t) {
  if (t.getDtype() != schemas::DType::I32) return {};
  auto d = t.getData();
  return {reinterpret_cast<const int32_t*>(d.begin()), d.size() / sizeof(int32_t)};
}

std::vector<int64_t> tensor_shape(schemas::Tensor::Reader t) {
  std::vector<int64_t> out;
  for (int64_t d : t.getShape()) out.push_back(d);
  return out;
}

// -- CAF serialization ----------------------------------------------------------------------

EncodeOptions encode_options(const caf::actor_system_config& cfg) {
  EncodeOptions o;
  const auto threshold = caf::get_or(cfg, "troupe.envelope.compress-threshold",
                                     static_cast<int64_t>(kCompressThreshold));
  o.compress_threshold = threshold < 0 ? SIZE_MAX : static_cast<size_t>(threshold);
  o.zstd_level = static_cast<int>(caf::get_or(cfg, "troupe.envelope.zstd-level", int64_t{1}));
  return o;
}

void set_encode_options(caf::actor_system_config& cfg, const EncodeOptions& opts) {
  const int64_t threshold =
      opts.compress_threshold > static_cast<size_t>(INT64_MAX) ? -1 : static_cast<int64_t>(opts.compress_threshold);
  caf::put(cfg.content, "troupe.envelope.compress-threshold", threshold);
  caf::put(cfg.content, "troupe.envelope.zstd-level", static_cast<int64_t>(opts.zstd_level));
}

caf::error save_envelope(caf::serializer& f, const Envelope& x) {
  CafWriter w{f};
  // The sending actor system's settings, when the serializer knows it.
  EncodeOptions opts = f.context() ? encode_options(f.context()->system().config()) : EncodeOptions{};
  if (MemoryFrames::active()) {  // the shared-memory ring: no wire to compress for or to damage bytes
    opts.compress_threshold = SIZE_MAX;
    opts.checksum = false;
  }
  // Large envelopes to another process on this host: shared memory (envelope_shm.hpp).
  if (detail::bulk_wanted(x.data().get()))
    if (auto done = detail::save_bulk(x.data().get(), opts, w)) return *done;
  return detail::encode_frame(x.data().get(), opts, w);
}

caf::error load_envelope(caf::deserializer& f, Envelope& x) {
  const DecodeLimits limits;
  size_t n = 0;
  if (auto err = f.begin_sequence(n)) return err;
  // A length past the end of the received bytes means the CAF stream itself
  // is broken: fail before allocating anything.
  if (auto* bin = dynamic_cast<caf::binary_deserializer*>(&f); bin != nullptr && n > bin->remaining())
    return caf::sec::end_of_stream;
  const size_t max_frame = kFrameHeaderBytes + ZSTD_compressBound(limits.max_message_bytes);
  if (n > max_frame) {
    // Consume the bytes so the stream stays in sync, deliver the error to the actor.
    uint8_t scratch[4096];
    for (size_t left = n; left > 0;) {
      size_t chunk = std::min(left, sizeof(scratch));
      if (auto err = f.apply_raw(chunk, scratch)) return err;
      left -= chunk;
    }
    x = Envelope::invalid(make_error(envelope_errc::too_large, "frame of " + std::to_string(n) + " bytes"));
    return f.end_sequence();
  }
  kj::Array<capnp::word> buf;
  try {
    buf = kj::heapArray<capnp::word>((n + sizeof(capnp::word) - 1) / sizeof(capnp::word));
  } catch (const std::bad_alloc&) {
    return caf::sec::end_of_stream;  // cannot hold the bytes: treat like a broken stream
  }
  if (n > 0)
    if (auto err = f.apply_raw(n, buf.begin())) return err;
  if (auto err = f.end_sequence()) return err;
  try {
    if (detail::is_bulk_record(buf.begin(), n)) {
      auto bulk = detail::load_bulk(reinterpret_cast<const uint8_t*>(buf.begin()), max_frame, limits);
      x = bulk ? std::move(*bulk) : Envelope::invalid(std::move(bulk.error()));
      return caf::none;
    }
    auto decoded = detail::decode_frame(std::move(buf), n, limits);
    x = decoded ? std::move(*decoded) : Envelope::invalid(std::move(decoded.error()));
  } catch (const std::bad_alloc&) {
    x = Envelope::invalid(make_error(envelope_errc::too_large, "out of memory decoding a " + std::to_string(n) +
                                                                   "-byte frame"));
  }
  return caf::none;
}

}  // namespace troupe
