// The run's activity clock: when something last happened in a one-process
// run (a step message posted, a device closure finished) and whether any
// device has work, so the coordinator can tell a silent run (a lost
// message, a frozen actor: nothing queued, nothing sent) from a busy one (a
// long or slowed computation). The longest silent interval since the last
// reset is the sample the adaptive message deadline learns from
// (actors/supervision/suspicion.hpp). Lock-free: posts come from every actor
// thread, closures from every device thread; the races between them only
// blur an estimate by a few hundred ns.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>

namespace troupe::runtime {

class ActivityClock {
 public:
  static int64_t now_ns() {
    return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
        .count();
  }
  // A step message was posted, or work was queued: ends a silent interval.
  void event(int64_t now = now_ns()) {
    if (busy_.load(std::memory_order_acquire) == 0) {
      const int64_t gap = now - last_.load(std::memory_order_relaxed);
      int64_t seen = longest_.load(std::memory_order_relaxed);
      while (gap > seen && !longest_.compare_exchange_weak(seen, gap, std::memory_order_relaxed)) {
      }
    }
    last_.store(now, std::memory_order_relaxed);
  }
  void work_queued() {
    event();
    busy_.fetch_add(1, std::memory_order_acq_rel);
  }
  // The time first, then the count: a reader that sees no work also sees
  // when it ended.
  void work_done() {
    last_.store(now_ns(), std::memory_order_relaxed);
    busy_.fetch_sub(1, std::memory_order_acq_rel);
  }
  // Starts a new interval of observation (a step attempt begins).
  void reset(int64_t now = now_ns()) {
    last_.store(now, std::memory_order_relaxed);
    longest_.store(0, std::memory_order_relaxed);
  }
  // Nanoseconds the run has been silent (0 while a device has work).
  int64_t silent_ns(int64_t now = now_ns()) const {
    if (busy_.load(std::memory_order_acquire) > 0) return 0;
    return std::max<int64_t>(0, now - last_.load(std::memory_order_relaxed));
  }
  // The longest silent interval that ended since reset().
  int64_t longest_silence_ns() const { return longest_.load(std::memory_order_relaxed); }

 private:
  std::atomic<int64_t> last_{now_ns()};
  std::atomic<int64_t> longest_{0};
  std::atomic<int> busy_{0};
};

}  // namespace troupe::runtime
