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
#include <vector>

#include "actors/names.hpp"
#include "actors/options.hpp"

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

// The coordinator's answer to one step request.
struct StepReply {
  double loss = 0, aux_loss = 0, grad_norm = 0, lr = 0;
};

// A Runtime (one process) on CAF's deterministic test coordinator: no
// scheduler threads, and devices that run a closure only when the test says
// (Device::Stepping::manual). The test interleaves actor messages, device
// closures, kills and deadlines one at a time, so a protocol (the
// coordinator's replay after a kill or a lost message) is checked at every
// point of a step, with no sleeps. The actors are the runtime's own.
class DeterministicRuntime {
 public:
  explicit DeterministicRuntime(const RuntimeOptions& options);
  ~DeterministicRuntime();
  DeterministicRuntime(const DeterministicRuntime&) = delete;
  DeterministicRuntime& operator=(const DeterministicRuntime&) = delete;

  // Asks the coordinator for the next step, as Runtime::step does; returns at once.
  void start_step();
  // Whether the coordinator answered the last start_step (or the step failed).
  bool step_done() const;
  // Its answer; std::runtime_error with the coordinator's error when the step
  // failed, std::logic_error before it is done.
  StepReply reply() const;
  // One ready actor message; false when none is ready.
  bool run_message();
  // One queued closure of device `device`; false when none is queued.
  bool run_closure(int device);
  int devices() const;
  // Messages and closures (in device order) until neither is left; how many ran.
  size_t settle();
  // Every pending delayed message (the coordinator's deadlines, whatever
  // their length) is delivered now; returns how many. A fixed
  // run.step_deadline acts on delivery; the adaptive checks (step_deadline
  // 0) also compare the real time elapsed, so deterministic tests fix it.
  size_t fire_timeouts();
  // The actor named `target` ("stage:1", "optimizer:0", "expert:1/0") exits
  // with exit_reason::kill now, as a crash would; the supervisor sees it at
  // the next messages. Throws std::invalid_argument for an unknown name.
  void kill(const std::string& target);
  std::vector<RestartEvent> restarts() const;
  // The parameters the optimizer shards hold (settles to collect them).
  std::vector<float> parameters();

 private:
  struct State;
  std::unique_ptr<State> st_;
};

// Messages dropped as duplicates, stale or damaged, over all actors.
uint64_t dropped_messages(Runtime& rt);
// Between steps (after at least one; needs TestHooks::replay_stale): sends
// every step message of the finished step again, through the seam, to its
// receiver, which must drop and count it; returns how many were sent. Each
// receiver has handled them once the next step() returned.
uint32_t inject_stale_messages(Runtime& rt);
}  // namespace testing

}  // namespace troupe::runtime
