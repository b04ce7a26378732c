// Bulk path for large Envelopes between processes on one host: instead of
// streaming the frame through CAF's TCP connection, the sender writes it into
// a pooled POSIX shared-memory slot and CAF carries only a 64-byte record
// naming it; the receiver decodes the frame in place (the same validation as
// any received frame) and hands the slot back when the Envelope is gone.
// Actor semantics do not change: the record is an ordinary message on the
// same connection, so ordering, monitors and failure detection are CAF's.
// Measured in bench_messaging (bench/results/messaging.md).
//
// Off unless set_bulk_shm_threshold() gave a threshold (the multi-process
// runtime does when every process is on one host). Not for use outside the
// envelope implementation and the runtime.
#pragma once

#include <cstddef>
#include <cstdint>

namespace troupe {

// Envelopes whose encoded message is at least `bytes` long take the
// shared-memory path when serialized for another process; 0 turns it off.
// Process-wide.
void set_bulk_shm_threshold(size_t bytes);
size_t bulk_shm_threshold();

// Unlinks this process's slots, and the slots of processes that no longer
// exist (a peer killed during the run). Called when a run ends; later sends
// make new slots.
void bulk_shm_cleanup();

// While one is alive on a thread, Envelopes serialized on that thread are
// written as the bulk path writes them: no compression, no CRC-32 trailer
// (memory to memory, no wire in between; the shared-memory ring,
// ring_transport.hpp). The frame is still validated when decoded.
class MemoryFrames {
 public:
  MemoryFrames();
  ~MemoryFrames();
  MemoryFrames(const MemoryFrames&) = delete;
  MemoryFrames& operator=(const MemoryFrames&) = delete;
  static bool active();
};

// Segments created and consumed by this process so far (tests, bench).
struct BulkShmStats {
  uint64_t sent = 0, received = 0;
};
BulkShmStats bulk_shm_stats();

}  // namespace troupe
