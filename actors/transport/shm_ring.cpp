// Shared-memory SPSC ring with a futex doorbell (see shm_ring.hpp).
#include "actors/transport/shm_ring.hpp"

#include <fcntl.h>
#include <linux/futex.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <climits>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <stdexcept>
#include <thread>
#include <utility>

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define TROUPE_PAUSE() _mm_pause()
#else
#define TROUPE_PAUSE() ((void)0)
#endif

namespace troupe::ring {

constexpr char kMagic[8] = {'T', 'R', 'R', 'I', 'N', 'G', '0', '1'};
constexpr uint32_t kVersion = 1;

struct Shared {
  char magic[8];
  uint32_t version;
  uint32_t reserved;
  uint64_t capacity;
  std::atomic<int32_t> reader_pid;
  std::atomic<int32_t> writer_pid;
  char pad0[64 - 32];
  std::atomic<uint64_t> tail;
  char pad1[56];
  std::atomic<uint64_t> head;
  std::atomic<uint64_t> done;  // the head as of the last frame the reader finished with (mark_done)
  char pad2[48];
  std::atomic<uint32_t> doorbell;
  std::atomic<uint32_t> reader_sleeping;
  char pad3[56];
  std::atomic<uint32_t> space_bell;
  std::atomic<uint32_t> writer_waiting;
  char pad4[56];
};
static_assert(sizeof(Shared) == kHeaderBytes);
static_assert(offsetof(Shared, tail) == 64 && offsetof(Shared, head) == 128 && offsetof(Shared, doorbell) == 192 &&
              offsetof(Shared, space_bell) == 256);
static_assert(std::atomic<uint64_t>::is_always_lock_free && std::atomic<uint32_t>::is_always_lock_free);

namespace {

const std::string kPrefix = "/troupe-ring-";

bool valid_name(const std::string& n) {
  if (n.size() <= kPrefix.size() || n.size() > 200 || n.compare(0, kPrefix.size(), kPrefix) != 0) return false;
  for (size_t i = kPrefix.size(); i < n.size(); ++i)
    if (!(n[i] >= '0' && n[i] <= '9') && n[i] != '-') return false;
  return true;
}

// Shared (not private) futexes: the two sides are different processes.
void futex_wait(std::atomic<uint32_t>* word, uint32_t expected, int ms) {
  timespec ts{ms / 1000, static_cast<long>(ms % 1000) * 1000000L};
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAIT, expected, &ts, nullptr, 0);
}
void futex_wake(std::atomic<uint32_t>* word) {
  ::syscall(SYS_futex, reinterpret_cast<uint32_t*>(word), FUTEX_WAKE, INT_MAX, nullptr, nullptr, 0);
}

uint8_t* map_fd(int fd, size_t bytes) {
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
  return p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
}

// Copies `n` bytes from ring offset `at` (wrapping) to `dst`.
void copy_out(const uint8_t* ring, size_t cap, uint64_t at, uint8_t* dst, size_t n) {
  const size_t off = static_cast<size_t>(at & (cap - 1));
  const size_t first = std::min(n, cap - off);
  std::memcpy(dst, ring + off, first);
  if (n > first) std::memcpy(dst + first, ring, n - first);
}
void copy_in(uint8_t* ring, size_t cap, uint64_t at, const uint8_t* src, size_t n) {
  const size_t off = static_cast<size_t>(at & (cap - 1));
  const size_t first = std::min(n, cap - off);
  std::memcpy(ring + off, src, first);
  if (n > first) std::memcpy(ring, src + first, n - first);
}

}  // namespace

Mapping::Mapping(Mapping&& o) noexcept { *this = std::move(o); }
Mapping& Mapping::operator=(Mapping&& o) noexcept {
  if (this != &o) {
    if (base_) ::munmap(base_, bytes_);
    name_ = std::move(o.name_);
    base_ = std::exchange(o.base_, nullptr);
    bytes_ = std::exchange(o.bytes_, 0);
    capacity_ = std::exchange(o.capacity_, 0);
  }
  return *this;
}
Mapping::~Mapping() {
  if (base_) ::munmap(base_, bytes_);
}

Reader::Reader(const std::string& name, size_t capacity) {
  if (!valid_name(name)) throw std::runtime_error("ring: bad segment name \"" + name + "\"");
  if (capacity < 4096 || (capacity & (capacity - 1)) != 0 || capacity > (size_t{1} << 32))
    throw std::runtime_error("ring: capacity must be a power of two in [4 KiB, 4 GiB], got " + std::to_string(capacity));
  const int fd = ::shm_open(name.c_str(), O_CREAT | O_EXCL | O_RDWR, 0600);
  if (fd < 0) throw std::runtime_error("ring: cannot create " + name + ": " + std::strerror(errno));
  const size_t total = kHeaderBytes + capacity;
  // posix_fallocate: a full /dev/shm is an error now, not a SIGBUS later.
  const bool sized = ::fchmod(fd, 0600) == 0 && ::ftruncate(fd, static_cast<off_t>(total)) == 0 &&
                     ::posix_fallocate(fd, 0, static_cast<off_t>(total)) == 0;
  uint8_t* p = sized ? map_fd(fd, total) : nullptr;
  const int err = errno;
  ::close(fd);
  if (!p) {
    ::shm_unlink(name.c_str());
    throw std::runtime_error("ring: cannot size or map " + name + " (" + std::to_string(total) +
                             " bytes): " + std::strerror(err));
  }
  name_ = name;
  base_ = p;
  bytes_ = total;
  capacity_ = capacity;
  Shared* s = shared();
  std::memcpy(s->magic, kMagic, 8);
  s->version = kVersion;
  s->capacity = capacity;
  s->reader_pid.store(static_cast<int32_t>(::getpid()), std::memory_order_release);
}

void Reader::mark_done() { shared()->done.store(head_, std::memory_order_release); }

pid_t Reader::writer_pid() const { return shared()->writer_pid.load(std::memory_order_acquire); }

void Reader::unlink() {
  if (!name_.empty()) ::shm_unlink(name_.c_str());
}

Reader::Got Reader::next(std::vector<uint8_t>& out, std::string* why) {
  if (corrupt_) {
    if (why) *why = why_;
    return Got::corrupt;
  }
  Shared* s = shared();
  const uint64_t tail = s->tail.load(std::memory_order_acquire);
  if (tail == head_) return Got::empty;
  auto broken = [&](std::string w) {
    corrupt_ = true;
    why_ = std::move(w);
    if (why) *why = why_;
    return Got::corrupt;
  };
  const uint64_t avail = tail - head_;
  if (avail > capacity_ || avail < kFrameHeaderBytes || (avail & 7) != 0)
    return broken("published " + std::to_string(avail) + " bytes in a ring of " + std::to_string(capacity_));
  uint8_t hdr[kFrameHeaderBytes];
  copy_out(data(), capacity_, head_, hdr, kFrameHeaderBytes);
  uint32_t n = 0, magic = 0;
  std::memcpy(&n, hdr, 4);
  std::memcpy(&magic, hdr + 4, 4);
  if (magic != kFrameMagic) return broken("frame without its magic at offset " + std::to_string(head_));
  if (frame_bytes(n) > avail)
    return broken("frame of " + std::to_string(n) + " bytes runs past the " + std::to_string(avail) + " published");
  out.resize(n);
  copy_out(data(), capacity_, head_ + kFrameHeaderBytes, out.data(), n);
  head_ += frame_bytes(n);
  s->head.store(head_, std::memory_order_release);
  // A writer waiting for room: wake it (it set the flag before sleeping).
  std::atomic_thread_fence(std::memory_order_seq_cst);
  if (s->writer_waiting.load(std::memory_order_relaxed) != 0) {
    s->space_bell.fetch_add(1, std::memory_order_release);
    futex_wake(&s->space_bell);
  }
  return Got::frame;
}

bool Reader::wait(int64_t spin_ns, int sleep_ms) {
  Shared* s = shared();
  auto ready = [&] { return corrupt_ || s->tail.load(std::memory_order_acquire) != head_; };
  if (ready()) return true;
  // Spin: a reply or the next message of a burst usually comes within
  // microseconds, and a futex sleep and wake costs several.
  if (spin_ns > 0) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::nanoseconds(spin_ns);
    for (int i = 0;; ++i) {
      for (int k = 0; k < 16; ++k) {
        if (ready()) return true;
        TROUPE_PAUSE();
      }
      if (std::chrono::steady_clock::now() >= until) break;
      if (i >= 8) std::this_thread::yield();  // on 2 shared cores the sender may need this one
    }
  }
  const uint32_t bell = s->doorbell.load(std::memory_order_acquire);
  s->reader_sleeping.store(1, std::memory_order_seq_cst);
  // Dekker with the writer: it stores tail then reads reader_sleeping; we
  // store reader_sleeping then read tail. One of us sees the other.
  if (!ready()) futex_wait(&s->doorbell, bell, sleep_ms);
  s->reader_sleeping.store(0, std::memory_order_relaxed);
  return ready();
}

Writer::Writer(const std::string& name) {
  if (!valid_name(name)) throw std::runtime_error("ring: bad segment name \"" + name + "\"");
  const int fd = ::shm_open(name.c_str(), O_RDWR, 0);
  if (fd < 0) throw std::runtime_error("ring: cannot open " + name + ": " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || static_cast<size_t>(st.st_size) < kHeaderBytes + 4096) {
    ::close(fd);
    throw std::runtime_error("ring: " + name + " is too small to be a ring");
  }
  const size_t total = static_cast<size_t>(st.st_size);
  uint8_t* p = map_fd(fd, total);
  ::close(fd);
  if (!p) throw std::runtime_error("ring: cannot map " + name + ": " + std::strerror(errno));
  name_ = name;
  base_ = p;
  bytes_ = total;
  Shared* s = shared();
  const uint64_t cap = s->capacity;
  if (std::memcmp(s->magic, kMagic, 8) != 0 || s->version != kVersion || cap < 4096 || (cap & (cap - 1)) != 0 ||
      kHeaderBytes + cap != total)
    throw std::runtime_error("ring: " + name + " is not a ring of this version");
  capacity_ = static_cast<size_t>(cap);
  tail_ = s->tail.load(std::memory_order_acquire);
  s->writer_pid.store(static_cast<int32_t>(::getpid()), std::memory_order_release);
}

uint64_t Writer::done() const { return shared()->done.load(std::memory_order_acquire); }

pid_t Writer::reader_pid() const { return shared()->reader_pid.load(std::memory_order_acquire); }

bool Writer::try_put(const Part* parts, size_t count) {
  size_t n = 0;
  for (size_t i = 0; i < count; ++i) n += parts[i].size;
  if (n > max_body() || n > UINT32_MAX) return false;
  const size_t need = frame_bytes(n);
  Shared* s = shared();
  const uint64_t head = s->head.load(std::memory_order_acquire);
  if (tail_ - head > capacity_ || capacity_ - (tail_ - head) < need) {
    full_head_ = head;
    return false;
  }
  uint8_t hdr[kFrameHeaderBytes];
  const uint32_t n32 = static_cast<uint32_t>(n);
  std::memcpy(hdr, &n32, 4);
  std::memcpy(hdr + 4, &kFrameMagic, 4);
  copy_in(data(), capacity_, tail_, hdr, kFrameHeaderBytes);
  uint64_t at = tail_ + kFrameHeaderBytes;
  for (size_t i = 0; i < count; ++i) {
    copy_in(data(), capacity_, at, static_cast<const uint8_t*>(parts[i].data), parts[i].size);
    at += parts[i].size;
  }
  tail_ += need;
  s->tail.store(tail_, std::memory_order_seq_cst);
  if (s->reader_sleeping.load(std::memory_order_seq_cst) != 0) {
    s->doorbell.fetch_add(1, std::memory_order_release);
    futex_wake(&s->doorbell);
  }
  return true;
}

void Writer::wait_space(int ms) {
  Shared* s = shared();
  const uint32_t bell = s->space_bell.load(std::memory_order_acquire);
  s->writer_waiting.store(1, std::memory_order_seq_cst);
  // Dekker with the reader (it stores head, then reads writer_waiting).
  if (s->head.load(std::memory_order_seq_cst) == full_head_) futex_wait(&s->space_bell, bell, ms);
  s->writer_waiting.store(0, std::memory_order_relaxed);
}

int remove_stale_rings() {
  int removed = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/dev/shm", ec)) {
    const std::string f = "/" + e.path().filename().string();
    if (!valid_name(f)) continue;
    const long pid = std::strtol(f.c_str() + kPrefix.size(), nullptr, 10);
    if (pid > 0 && ::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH && ::shm_unlink(f.c_str()) == 0) ++removed;
  }
  return removed;
}

}  // namespace troupe::ring
