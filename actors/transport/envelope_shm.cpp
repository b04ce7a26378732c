// Shared-memory bulk path of the Envelope transport (see envelope_shm.hpp).
//
// Segments are pooled: mapping and unmapping per message costs more than the
// copy it saves (each munmap is a TLB shootdown across the process's threads).
// A sender keeps its segments ("slots") mapped and reuses a slot once the
// receiver has released it; a receiver maps each slot once. Slot layout:
//   bytes 0..63   header: u32 busy (1 while a message in it is unreleased),
//                 u64 seq (bumped at every use), padding
//   bytes 64..    the frame
// The record that travels through CAF in place of the frame (kBulkRecordBytes):
//   bytes 0..3    magic "TRPS"
//   byte  4       record version (2)
//   bytes 5..7    reserved, 0
//   bytes 8..15   little-endian u64: frame length
//   bytes 16..23  little-endian u64: the slot's seq for this message
//   bytes 24..63  NUL-padded slot name "/troupe-bulk-<pid>-<n>"
// A receiver accepts a record only while the slot is busy with that seq, so a
// replayed or stale record is rejected. Peers are trusted processes of one
// job: a sender could still change a frame after the receiver validated it.
#include <fcntl.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include <caf/sec.hpp>

#include "actors/transport/envelope_bulk.hpp"
#include "actors/transport/envelope_shm.hpp"

namespace troupe {
namespace {

constexpr char kRecordMagic[4] = {'T', 'R', 'P', 'S'};
constexpr uint8_t kRecordVersion = 2;
constexpr size_t kNameOffset = 24;
constexpr size_t kNameBytes = detail::kBulkRecordBytes - kNameOffset;
constexpr size_t kHeaderBytes = 64;
constexpr size_t kMaxSlots = 64;  // per sender; when all are busy, frames go inline

struct SlotHeader {
  std::atomic<uint32_t> busy;
  uint32_t pad0;
  std::atomic<uint64_t> seq;
};
static_assert(sizeof(SlotHeader) <= kHeaderBytes);
static_assert(std::atomic<uint32_t>::is_always_lock_free && std::atomic<uint64_t>::is_always_lock_free);

struct Slot {
  std::string name;
  size_t capacity = 0;  // frame bytes it holds
  uint8_t* map = nullptr;
  SlotHeader* header() const { return reinterpret_cast<SlotHeader*>(map); }
};

std::atomic<size_t> g_threshold{0};
std::atomic<uint64_t> g_sent{0}, g_received{0}, g_counter{0};
std::mutex g_mutex;
std::vector<Slot> g_slots;                    // this process's slots (sender side), never unmapped
std::map<std::string, Slot> g_mapped;         // other processes' slots (receiver side)

void put_u64(uint8_t* p, uint64_t v) {
  for (int i = 0; i < 8; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t get_u64(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 0; i < 8; ++i) v |= static_cast<uint64_t>(p[i]) << (8 * i);
  return v;
}

// Only names this code makes are opened: "/troupe-bulk-" then digits and '-'.
const std::string kPrefix = "/troupe-bulk-";
bool valid_name(const std::string& n) {
  if (n.size() <= kPrefix.size() || n.compare(0, kPrefix.size(), kPrefix) != 0) return false;
  for (size_t i = kPrefix.size(); i < n.size(); ++i)
    if (!(n[i] >= '0' && n[i] <= '9') && n[i] != '-') return false;
  return true;
}

// Removes slots left in /dev/shm by processes that no longer exist (a killed
// run cannot clean up after itself).
void remove_stale_slots() {
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string f = e.path().filename().string();
    if (!valid_name("/" + f)) continue;
    const std::string rest = f.substr(kPrefix.size() - 1);
    const long pid = std::strtol(rest.c_str(), nullptr, 10);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH) ::shm_unlink(("/" + f).c_str());
  }
}

// A free slot of at least `bytes`, marked busy with a new seq; nullptr when
// none can be had. Caller holds g_mutex.
Slot* acquire_slot(size_t bytes, uint64_t& seq) {
  Slot* best = nullptr;
  for (Slot& s : g_slots)
    if (s.capacity >= bytes && s.header()->busy.load(std::memory_order_acquire) == 0 &&
        (!best || s.capacity < best->capacity))
      best = &s;
  if (!best) {
    if (g_slots.size() >= kMaxSlots) return nullptr;
    size_t cap = 1 << 16;
    while (cap < bytes) cap <<= 1;
    Slot s;
    s.name = kPrefix + std::to_string(::getpid()) + "-" + std::to_string(g_counter++);
    s.capacity = cap;
    const size_t total = kHeaderBytes + cap;
    const int fd = ::shm_open(s.name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
    if (fd < 0) return nullptr;
    // posix_fallocate: a full /dev/shm is an error here, not a SIGBUS later.
    const bool sized = ::ftruncate(fd, static_cast<off_t>(total)) == 0 &&
                       ::posix_fallocate(fd, 0, static_cast<off_t>(total)) == 0;
    void* p = sized ? ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0) : MAP_FAILED;
    ::close(fd);
    if (p == MAP_FAILED) {
      ::shm_unlink(s.name.c_str());
      return nullptr;
    }
    s.map = static_cast<uint8_t*>(p);
    g_slots.push_back(std::move(s));
    best = &g_slots.back();
  }
  seq = best->header()->seq.load(std::memory_order_relaxed) + 1;
  best->header()->seq.store(seq, std::memory_order_relaxed);
  best->header()->busy.store(1, std::memory_order_release);
  return best;
}

// Writes the frame into a slot's data area.
class SlotWriter final : public detail::FrameWriter {
 public:
  uint8_t* dst = nullptr;
  size_t capacity = 0, size = 0, at = 0;
  caf::error begin(size_t total) override {
    size = total;
    return total <= capacity ? caf::none : caf::make_error(caf::sec::runtime_error, "slot too small");
  }
  caf::error write(const void* data, size_t n) override {
    if (at + n > size) return caf::make_error(caf::sec::runtime_error, "frame longer than announced");
    std::memcpy(dst + at, data, n);
    at += n;
    return caf::none;
  }
  caf::error end() override { return at == size ? caf::none : caf::make_error(caf::sec::runtime_error, "short frame"); }
};

// Releases a received slot back to its sender when the Envelope is gone.
class ReleaseDisposer final : public kj::ArrayDisposer {
 public:
  explicit ReleaseDisposer(SlotHeader* h) : h_(h) {}
  void disposeImpl(void*, size_t, size_t, size_t, void (*)(void*)) const override {
    h_->busy.store(0, std::memory_order_release);
    delete this;
  }

 private:
  SlotHeader* h_;
};

// Maps another process's slot (once). Caller holds g_mutex.
caf::expected<Slot*> map_slot(const std::string& name) {
  auto it = g_mapped.find(name);
  if (it != g_mapped.end()) return &it->second;
  const int fd = ::shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) return make_error(envelope_errc::bulk_unavailable, "slot " + name + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) <= kHeaderBytes) {
    ::close(fd);
    return make_error(envelope_errc::bulk_unavailable, "slot " + name + " is too small");
  }
  const size_t total = static_cast<size_t>(st.st_size);
  void* p = ::mmap(nullptr, total, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  ::close(fd);
  if (p == MAP_FAILED) return make_error(envelope_errc::bulk_unavailable, "cannot map slot " + name);
  Slot s;
  s.name = name;
  s.capacity = total - kHeaderBytes;
  s.map = static_cast<uint8_t*>(p);
  return &g_mapped.emplace(name, std::move(s)).first->second;
}

}  // namespace

void set_bulk_shm_threshold(size_t bytes) {
  if (bytes > 0 && g_threshold == 0) remove_stale_slots();
  g_threshold = bytes;
}
size_t bulk_shm_threshold() { return g_threshold; }

void bulk_shm_cleanup() {
  // Names only: mappings stay (an Envelope may still point into one; the
  // memory goes when the process ends). Later sends make new slots.
  {
    std::lock_guard<std::mutex> g(g_mutex);
    for (const Slot& s : g_slots) ::shm_unlink(s.name.c_str());
    g_slots.clear();
  }
  remove_stale_slots();  // a peer killed during the run left its slots behind
}

BulkShmStats bulk_shm_stats() { return {g_sent, g_received}; }

namespace {
thread_local int t_memory_frames = 0;
}
MemoryFrames::MemoryFrames() { ++t_memory_frames; }
MemoryFrames::~MemoryFrames() { --t_memory_frames; }
bool MemoryFrames::active() { return t_memory_frames > 0; }

namespace detail {

bool bulk_wanted(const EnvelopeData* d) {
  const size_t t = g_threshold;
  return t > 0 && d != nullptr && !d->error && d->flat_bytes >= t;
}

std::optional<caf::error> save_bulk(const EnvelopeData* d, const EncodeOptions&, FrameWriter& out) {
  // Memory to memory: compressing (or probing a sample for it) only costs time.
  EncodeOptions raw;
  raw.compress_threshold = SIZE_MAX;
  raw.checksum = false;  // no wire in between: the bytes are the sender's own
  uint8_t rec[kBulkRecordBytes] = {};
  {
    std::lock_guard<std::mutex> g(g_mutex);
    uint64_t seq = 0;
    Slot* slot = acquire_slot(kFrameHeaderBytes + d->flat_bytes, seq);
    if (!slot) return std::nullopt;  // the caller sends the frame inline
    SlotWriter w;
    w.dst = slot->map + kHeaderBytes;
    w.capacity = slot->capacity;
    if (encode_frame(d, raw, w)) {
      slot->header()->busy.store(0, std::memory_order_release);
      return std::nullopt;
    }
    std::memcpy(rec, kRecordMagic, 4);
    rec[4] = kRecordVersion;
    put_u64(rec + 8, w.size);
    put_u64(rec + 16, seq);
    std::memcpy(rec + kNameOffset, slot->name.data(), std::min(slot->name.size(), kNameBytes - 1));
  }
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
  if (rec[4] != kRecordVersion || rec[5] != 0 || rec[6] != 0 || rec[7] != 0)
    return bad("unknown record version or flags");
  const uint64_t size = get_u64(rec + 8), seq = get_u64(rec + 16);
  const std::string name(reinterpret_cast<const char*>(rec + kNameOffset),
                         strnlen(reinterpret_cast<const char*>(rec + kNameOffset), kNameBytes));
  if (!valid_name(name)) return bad("bad segment name");
  Slot* slot = nullptr;
  {
    std::lock_guard<std::mutex> g(g_mutex);
    auto m = map_slot(name);
    if (!m) return std::move(m.error());
    slot = *m;
  }
  if (size == 0 || size > max_frame || size > slot->capacity)
    return bad("slot " + name + " cannot hold the " + std::to_string(size) + " bytes announced");
  SlotHeader* h = slot->header();
  if (h->busy.load(std::memory_order_acquire) != 1 || h->seq.load(std::memory_order_relaxed) != seq)
    return bad("slot " + name + " holds no message with seq " + std::to_string(seq) + " (replayed or stale record)");
  ++g_received;
  // In place: the frame is decoded where the sender wrote it; the slot goes
  // back to the sender when the Envelope (and every copy) is gone.
  const size_t words = (size + sizeof(capnp::word) - 1) / sizeof(capnp::word);
  kj::Array<capnp::word> arr(reinterpret_cast<capnp::word*>(slot->map + kHeaderBytes), words, *new ReleaseDisposer(h));
  return decode_frame(std::move(arr), size, limits);
}

}  // namespace detail
}  // namespace troupe
