// Device: a serial executor. One thread owns one backend (host or OpenCL) and
// runs the work submitted to it strictly in submission order, so everything a
// device computes is deterministic whatever the actors around it do. Actors
// placed on a device never block: they submit a closure, and the closure ends
// by sending the actor a completion message (see actors/context.hpp).
// No CAF here: the header is light enough for launch/ and tests.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "actors/device/activity.hpp"
#include "kernels/backend.hpp"

namespace troupe::runtime {

// What a traced closure was, kept as plain numbers so tagging a submission
// costs no allocation; actors/device/trace.cpp turns it into a name.
struct TraceLabel {
  // Snapshot: an optimizer shard's copy of m and v for kill-and-replay.
  // Weight: the W pass of a split backward (Backward is then its B).
  enum Kind : uint8_t { None, Forward, Backward, GradSend, ParamLoad, RankInit, Reduce, Update, ParamRead, ShardInit,
                        Snapshot, Weight };
  Kind kind = None;
  int16_t mb = -1, stage = -1, chunk = -1;  // -1: not applicable
  int16_t owner = -1;                      // rank or shard index
};

// One closure's run on the device thread (steady_clock nanoseconds).
struct TraceEvent {
  TraceLabel label;
  int64_t start_ns = 0, end_ns = 0;
};

class Device {
 public:
  // thread: the device's own thread runs the closures as they come (every
  // run). manual: no thread; a closure runs only when run_one() is called,
  // on the caller's thread (runtime::testing::DeterministicRuntime, where the
  // test chooses every interleaving of messages and device work).
  enum class Stepping { thread, manual };
  // Creates the backend on the device's own thread (an OpenCL context is then
  // used by one thread only), or on the caller's when manual. Throws what
  // make_backend throws.
  Device(int id, const kernels::BackendOptions& options, Stepping stepping = Stepping::thread);
  // Runs what was already submitted, then joins the thread. Manual: what
  // the test never ran is dropped (the actors it would answer are gone).
  ~Device();
  Device(const Device&) = delete;
  Device& operator=(const Device&) = delete;

  int id() const { return id_; }
  kernels::BackendKind kind() const { return kind_; }

  // Queues `work`; it runs on the device thread after everything submitted
  // before it. An exception escaping `work` is caught and passed to `on_error`
  // (on the device thread); the device lives on.
  using Work = std::function<void(kernels::Backend&)>;
  using OnError = std::function<void(const std::string& what)>;
  // `label` names the work in the trace; unlabelled closures (bookkeeping
  // no-ops) are never recorded.
  void submit(Work work, OnError on_error = {}, TraceLabel label = {});

  // Starts recording a TraceEvent per labelled closure (off by default; call
  // before submitting). `reserve` preallocates that many events.
  void enable_trace(size_t reserve);
  // The events recorded so far, in run order (call after drain()).
  std::vector<TraceEvent> trace() const;

  // A straggler ([[faults]] kind "slow"): from now until `until`, every
  // closure is followed by an idle wait of (factor - 1) x its own run time,
  // so the device runs `factor` times slower; the results are unchanged.
  // factor <= 1 ends it.
  void slow_down(double factor, std::chrono::steady_clock::time_point until = std::chrono::steady_clock::time_point::max());
  // Closures run slowed, and the seconds added to them, so far.
  uint64_t slowed() const;
  double slowed_seconds() const;

  // Reports queued and finished closures to `clock` (the run's activity
  // clock, actors/device/activity.hpp). Call before the first submit.
  void watch_activity(std::shared_ptr<ActivityClock> clock);

  // Blocks until every closure submitted so far has run (tests, shutdown);
  // manual: runs them.
  void drain();
  // Manual stepping: runs the oldest queued closure; false when none is queued.
  bool run_one();
  // Closures run since start.
  uint64_t completed() const;

 private:
  void loop();

  int id_;
  kernels::BackendKind kind_;
  std::unique_ptr<kernels::Backend> backend_;
  mutable std::mutex mu_;
  std::condition_variable cv_, idle_cv_;
  struct Item {
    Work work;
    OnError on_error;
    TraceLabel label;
  };
  std::deque<Item> queue_;
  // A closure taken off the queue, with whether to trace it and its
  // straggler factor, read under the same lock (pop_locked: mu_ held).
  struct Popped {
    Item item;
    bool record = false;
    double factor = 1.0;
  };
  Popped pop_locked();
  // Runs a popped closure with the trace, straggler and activity bookkeeping.
  void run_item(Popped& p);
  bool tracing_ = false;
  std::vector<TraceEvent> events_;
  bool stop_ = false, running_ = false;
  bool manual_ = false;
  uint64_t completed_ = 0;
  double slow_factor_ = 1.0;
  std::shared_ptr<ActivityClock> activity_;
  std::chrono::steady_clock::time_point slow_until_{};
  uint64_t slowed_ = 0;
  double slowed_seconds_ = 0.0;
  std::exception_ptr init_error_;
  std::thread thread_;
};

}  // namespace troupe::runtime
