// Test-only hooks: the one place where tests reach into a run to break it in
// ways no spec can (a message sent twice, a Combine that lies, a shard dying
// while it loads, a process killing itself). Production code never builds a
// TestHooks; it asks current_test_hooks(), which is null unless a test
// installed one. A Runtime or an RL run takes a snapshot of the hooks when it
// is built, so installing new ones never changes a run in flight.
// No CAF in this header.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

namespace troupe::runtime {

class Runtime;

// A process that kills or stops itself as a training step starts (under
// mpirun: the recovery paths that need a lost process 0, or a loss with
// process_loss = "fail", which [[faults]] refuses to inject).
struct ProcessFault {
  std::string kind;  // "kill" (SIGKILL) or "hang" (SIGSTOP); empty: none
  int process = -1;
  int64_t step = -1;
};

struct TestHooks {
  // Through the runtime's one seam on step messages (interposer.hpp), never
  // inside an actor:
  bool duplicate_sends = false;  // send every step message twice (receivers must drop the copies)
  bool corrupt_combine = false;  // expert shard 0 of replica 0's first forward Combine does not echo its Dispatch
  bool replay_stale = false;     // keep each step's messages for inject_stale_messages()
  // A new expert shard of a placement change (event, rebalance) named
  // kill_while_loading ("expert:L/S") dies when asked for its loaded
  // weights, the first kill_while_loading_times times it is spawned for that
  // change (respawns included): the retry path of a failed migration.
  std::string kill_while_loading;
  int kill_while_loading_times = 0;
  ProcessFault process_fault;
};

// The hooks installed now, or null (always null outside tests).
std::shared_ptr<const TestHooks> current_test_hooks();

// Installs `hooks` for the runs built while it lives; the previous ones
// (usually none) come back when it goes.
class ScopedTestHooks {
 public:
  explicit ScopedTestHooks(TestHooks hooks);
  ~ScopedTestHooks();
  ScopedTestHooks(const ScopedTestHooks&) = delete;
  ScopedTestHooks& operator=(const ScopedTestHooks&) = delete;

 private:
  std::shared_ptr<const TestHooks> previous_;
};

// Test views of a Runtime built under hooks.
namespace testing {
// Messages dropped as duplicates, stale or damaged, over all actors.
uint64_t dropped_messages(Runtime& rt);
// Between steps (after at least one; needs TestHooks::replay_stale): sends
// every step message of the finished step again, through the seam, to its
// receiver, which must drop and count it; returns how many were sent. Each
// receiver has handled them once the next step() returned.
uint32_t inject_stale_messages(Runtime& rt);
}  // namespace testing

}  // namespace troupe::runtime
