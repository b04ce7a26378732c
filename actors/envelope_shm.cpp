// Shared-memory bulk path of the Envelope transport (see envelope_shm.hpp).
// The record that travels through CAF in place of the frame (kRecordBytes):
//   bytes 0..3   magic "TRPS"
//   byte  4      record version (1)
//   bytes 5..7   reserved, 0
//   bytes 8..15  little-endian u64: frame length in the segment
//   bytes 16..63 NUL-padded segment name "/troupe-bulk-<pid>-<n>"
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <mutex>
#include <set>
#include <string>

#include <caf/sec.hpp>

#include "actors/envelope_bulk.hpp"
#include "actors/envelope_shm.hpp"

namespace troupe {
namespace {

std::atomic<size_t> g_threshold{0};
std::atomic<uint64_t> g_sent{0}, g_received{0}, g_counter{0};
constexpr char kRecordMagic[4] = {'T', 'R', 'P', 'S'};
constexpr size_t kNameOffset = 16;
constexpr size_t kNameBytes = detail::kBulkRecordBytes - kNameOffset;

// Names this process created; the receiver unlinks a consumed one.
std::mutex g_mutex;
std::set<std::string> g_created;

void remember(const std::string& name) {
  std::lock_guard<std::mutex> g(g_mutex);
  if (g_created.size() >= 4096) {  // forget the ones receivers have consumed
    for (auto it = g_created.begin(); it != g_created.end();) {
      const int fd = ::shm_open(it->c_str(), O_RDONLY, 0);
      if (fd < 0) {
        it = g_created.erase(it);
      } else {
        ::close(fd);
        ++it;
      }
    }
  }
  g_created.insert(name);
}

// Only names this code makes are opened: "/troupe-bulk-" then digits and '-'.
bool valid_name(const std::string& n) {
  static const std::string prefix = "/troupe-bulk-";
  if (n.size() <= prefix.size() || n.compare(0, prefix.size(), prefix) != 0) return false;
  for (size_t i = prefix.size(); i < n.size(); ++i)
    if (!(n[i] >= '0' && n[i] <= '9') && n[i] != '-') return false;
  return true;
}

void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

// Writes the frame into a fresh segment.
class ShmWriter final : public detail::FrameWriter {
 public:
  std::string name;
  size_t size = 0, at = 0;
  uint8_t* map = nullptr;
  bool failed = false;

  caf::error begin(size_t total) override {
    size = total;
    name = "/troupe-bulk-" + std::to_string(::getpid()) + "-" + std::to_string(g_counter++);
    const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) return fail();
    // posix_fallocate: a full /dev/shm is an error here, not a SIGBUS later.
    const bool sized = ::ftruncate(fd, static_cast<off_t>(total)) == 0 &&
                       ::posix_fallocate(fd, 0, static_cast<off_t>(total)) == 0;
    // MAP_POPULATE: one call maps every page instead of a fault per page.
    void* p = sized ? ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0) : MAP_FAILED;
    ::close(fd);
    if (p == MAP_FAILED) {
      ::shm_unlink(name.c_str());
      return fail();
    }
    map = static_cast<uint8_t*>(p);
    return caf::none;
  }
  caf::error write(const void* data, size_t n) override {
    if (failed || at + n > size) return fail();
    std::memcpy(map + at, data, n);
    at += n;
    return caf::none;
  }
  caf::error end() override { return at == size ? caf::none : fail(); }
  ~ShmWriter() override {
    if (map) ::munmap(map, size);
  }

 private:
  caf::error fail() {
    failed = true;
    return caf::make_error(caf::sec::runtime_error, "shared-memory segment");
  }
};

// Owns a mapped received segment for the Envelope that decodes in place.
class MunmapDisposer final : public kj::ArrayDisposer {
 public:
  size_t bytes = 0;
  explicit MunmapDisposer(size_t b) : bytes(b) {}
  void disposeImpl(void* first, size_t, size_t, size_t, void (*)(void*)) const override {
    ::munmap(first, bytes);
    delete this;
  }
};

}  // namespace

void set_bulk_shm_threshold(size_t bytes) { g_threshold = bytes; }
size_t bulk_shm_threshold() { return g_threshold; }

void bulk_shm_cleanup() {
  std::lock_guard<std::mutex> g(g_mutex);
  for (const auto& n : g_created) ::shm_unlink(n.c_str());  // ENOENT: consumed
  g_created.clear();
}

BulkShmStats bulk_shm_stats() { return {g_sent, g_received}; }

namespace detail {

bool bulk_wanted(const EnvelopeData* d) {
  const size_t t = g_threshold;
  return t > 0 && d != nullptr && !d->error && d->flat_bytes >= t;
}

std::optional<caf::error> save_bulk(const EnvelopeData* d, const EncodeOptions&, FrameWriter& out) {
  ShmWriter w;
  // Memory to memory: compressing (or probing a sample for it) only costs time.
  EncodeOptions raw;
  raw.compress_threshold = SIZE_MAX;
  if (encode_frame(d, raw, w) || w.failed) {
    if (!w.name.empty()) ::shm_unlink(w.name.c_str());
    return std::nullopt;  // the caller sends the frame through CAF instead
  }
  remember(w.name);
  uint8_t rec[kBulkRecordBytes] = {};
  std::memcpy(rec, kRecordMagic, 4);
  rec[4] = 1;
  put_u64(rec + 8, w.size);
  std::memcpy(rec + kNameOffset, w.name.data(), std::min(w.name.size(), kNameBytes - 1));
  ++g_sent;
  if (auto err = out.begin(kBulkRecordBytes)) return err;
  if (auto err = out.write(rec, kBulkRecordBytes)) return err;
  return out.end();
}

bool is_bulk_record(const void* data, size_t n) {
  return n == kBulkRecordBytes && std::memcmp(data, kRecordMagic, 4) == 0;
}

caf::expected<Envelope> load_bulk(const uint8_t* rec, size_t max_frame, const DecodeLimits& limits) {
  auto bad = [](const std::string& why) { return make_error(envelope_errc::bulk_unavailable, why); };
  if (rec[4] != 1 || rec[5] != 0 || rec[6] != 0 || rec[7] != 0) return bad("unknown record version or flags");
  const uint64_t size = get_u64(rec + 8);
  const std::string name(reinterpret_cast<const char*>(rec + kNameOffset),
                         strnlen(reinterpret_cast<const char*>(rec + kNameOffset), kNameBytes));
  if (!valid_name(name)) return bad("bad segment name");
  const int fd = ::shm_open(name.c_str(), O_RDONLY, 0);
  if (fd < 0) return bad("segment " + name + ": " + std::strerror(errno));
  ::shm_unlink(name.c_str());  // consumed: the mapping outlives the name
  struct stat st {};
  if (::fstat(fd, &st) != 0 || size == 0 || size > max_frame || static_cast<uint64_t>(st.st_size) != size) {
    ::close(fd);
    return bad("segment " + name + " does not hold the " + std::to_string(size) + " bytes announced");
  }
  // Private copy-on-write mapping: decoding reads in place, nothing leaks back.
  void* p = ::mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_POPULATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return bad("cannot map segment " + name);
  ++g_received;
  const size_t words = (size + sizeof(capnp::word) - 1) / sizeof(capnp::word);
  kj::Array<capnp::word> arr(static_cast<capnp::word*>(p), words, *new MunmapDisposer(size));
  return decode_frame(std::move(arr), size, limits);
}

}  // namespace detail
}  // namespace troupe
