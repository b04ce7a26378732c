// A single-producer single-consumer byte ring in POSIX shared memory, with a
// futex doorbell, for small and mid-size messages between two processes on
// one host (ring_transport.hpp puts CAF messages on it). No CAF here.
//
// Why single-producer across processes: the only state the two processes
// share is the ring's bytes and two counters, each written by one side, so a
// process that dies (even mid-frame) holds no lock the survivor could wait
// on. Several threads of the writing process take a lock of that process
// (ShmRing::Writer is not thread-safe; RingTransport serializes it).
//
// Layout (all little-endian, offsets in bytes):
//   0      header line: magic "TRRING01", u32 version, u32 reserved,
//          u64 capacity (a power of two), i32 reader pid, i32 writer pid
//   64     u64 tail  (bytes ever written; written by the writer only)
//   128    u64 head  (bytes ever read; written by the reader only),
//          u64 done  (the head once the reader has finished with those frames)
//   192    u32 doorbell (bumped by the writer to wake a sleeping reader),
//          u32 reader_sleeping
//   256    u32 space_bell (bumped by the reader to wake a waiting writer),
//          u32 writer_waiting
//   320    the ring, `capacity` bytes
// A frame: u32 length n, u32 magic "TRFM", then n bytes, padded to 8. The
// 8-byte frame header never wraps (everything is 8-aligned); the body may.
// The writer publishes a frame by storing tail after every byte of it: a
// frame is visible whole or not at all. The reader checks every header
// against the bounds it knows (its own capacity, the bytes published), so a
// hostile or broken writer can make it give up on the ring, never read out
// of bounds.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace troupe::ring {

inline constexpr size_t kHeaderBytes = 320;
inline constexpr size_t kFrameHeaderBytes = 8;
inline constexpr uint32_t kFrameMagic = 0x4D465254;  // "TRFM"

// Frame bytes a body of `n` takes in the ring (header + body, padded to 8).
inline size_t frame_bytes(size_t n) { return kFrameHeaderBytes + ((n + 7) & ~size_t{7}); }

struct Shared;  // the header in the mapping (shm_ring.cpp)

// One mapping of a ring segment (either side). Move-only; unmaps on
// destruction. Never unlinks by itself (see unlink()).
class Mapping {
 public:
  Mapping() = default;
  Mapping(Mapping&& o) noexcept;
  Mapping& operator=(Mapping&& o) noexcept;
  Mapping(const Mapping&) = delete;
  Mapping& operator=(const Mapping&) = delete;
  ~Mapping();
  bool valid() const { return base_ != nullptr; }
  const std::string& name() const { return name_; }
  size_t capacity() const { return capacity_; }

 protected:
  friend class Reader;
  friend class Writer;
  Shared* shared() const { return reinterpret_cast<Shared*>(base_); }
  uint8_t* data() const { return base_ + kHeaderBytes; }
  std::string name_;
  uint8_t* base_ = nullptr;
  size_t bytes_ = 0, capacity_ = 0;
};

// The reading end. Creates the segment (0600, O_EXCL) under `name`, which
// must be "/troupe-ring-<digits and '-'>"; throws std::runtime_error with the
// reason when it cannot.
class Reader : public Mapping {
 public:
  Reader() = default;
  Reader(const std::string& name, size_t capacity);

  enum class Got { frame, empty, corrupt };
  // Copies the next frame's body into `out` (resized) and consumes it.
  // corrupt: a header breaks the ring's bounds; `why` says how. After that
  // the ring is never read again (every later call returns corrupt).
  Got next(std::vector<uint8_t>& out, std::string* why = nullptr);
  // Waits for a frame: spins (pausing, then yielding) up to `spin_ns`, then
  // sleeps on the doorbell up to `sleep_ms`. False when none came.
  bool wait(int64_t spin_ns, int sleep_ms);
  // Tells the writer every frame read so far has been handled (Writer::done).
  void mark_done();
  // The pid the writer wrote on attach (0 before that).
  pid_t writer_pid() const;
  // Removes the name (the mapping stays valid); idempotent.
  void unlink();

 private:
  uint64_t head_ = 0;
  bool corrupt_ = false;
  std::string why_;
};

// The writing end: opens a segment a Reader made. Throws std::runtime_error
// when it cannot (missing, wrong size, not a ring).
class Writer : public Mapping {
 public:
  Writer() = default;
  explicit Writer(const std::string& name);

  // The largest body a frame may have (a frame must fit the ring).
  size_t max_body() const { return capacity_ - kFrameHeaderBytes; }
  // Writes one frame made of `parts` (concatenated); false when the ring has
  // no room for it now (nothing written). Wakes the reader if it sleeps.
  struct Part {
    const void* data;
    size_t size;
  };
  bool try_put(const Part* parts, size_t count);
  // Waits (futex, up to `ms`) until the reader has freed space since the
  // last failed try_put. Returns at once if it already has.
  void wait_space(int ms);
  pid_t reader_pid() const;
  // Bytes written so far, and how many of them the reader has handled:
  // every frame put before tail() was taken is handled once done() >= it.
  uint64_t tail() const { return tail_; }
  uint64_t done() const;

 private:
  uint64_t tail_ = 0;
  uint64_t full_head_ = 0;  // the reader's head when try_put last found no room
};

// Removes ring segments in /dev/shm whose creating process no longer exists
// (a run killed before it could unlink them); never those of a live process.
// Returns how many it removed.
int remove_stale_rings();

}  // namespace troupe::ring
