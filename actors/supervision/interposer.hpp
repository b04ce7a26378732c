// The one test seam on the actors' step messages. Every step message an actor
// sends goes through post() (actors/context.hpp); when the run has an
// interposer, post() hands the message to it instead of sending it, and the
// interposer decides what reaches the receiver: the message, the message
// twice, nothing, or a changed message. Production runs have none (post() is
// a plain send), so no actor carries a test branch. The test hooks
// TestHooks::duplicate_sends, corrupt_combine and replay_stale install
// the interposers below (make_interposer), and so do the [[faults]] kinds on
// messages (drop, duplicate, delay, pause, corrupt: fault_injector.hpp).
// Include only from actors/ and tests (CAF).
#pragma once

#include <cstdint>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <caf/all.hpp>

#include "actors/test_hooks.hpp"

namespace troupe::runtime {

struct RuntimeOptions;

class Interposer {
 public:
  virtual ~Interposer() = default;
  // Called on the sender's thread (an actor or a device closure), possibly
  // from several threads at once. `from_device`: the plan index of the
  // sender's device (-1: the coordinator, which has none).
  virtual void send(int from_device, const caf::actor& to, caf::message msg) = 0;
};

// Sends every message twice: every receiver's duplicate dropping is exercised
// on every step.
std::shared_ptr<Interposer> duplicate_sends();
// Changes the first forward Combine sent by expert shard `shard` of MoE layer
// `layer` in replica 0 so that its id no longer echoes the Dispatch it
// answers (dispatch_id + 1); the stage must reject it.
// Everything else (and the changed message) goes on through `next` (null: a
// plain send).
std::shared_ptr<Interposer> corrupt_first_combine(uint32_t layer, uint32_t shard,
                                                  std::shared_ptr<Interposer> next = nullptr);

// Passes every message on and keeps it: replay() sends the kept ones again,
// to the same receivers, as stale traffic of a finished step that every
// receiver must drop and count (testing::inject_stale_messages); forget()
// drops what was kept (the runtime calls it when a step starts, so what is
// kept is the last step's messages).
class StaleReplay final : public Interposer {
 public:
  explicit StaleReplay(std::shared_ptr<Interposer> next = nullptr) : next_(std::move(next)) {}
  void send(int from_device, const caf::actor& to, caf::message msg) override;
  uint32_t replay();
  void forget();

 private:
  void forward(int from_device, const caf::actor& to, caf::message msg);
  std::shared_ptr<Interposer> next_;
  std::mutex mu_;
  struct Kept {
    int from_device;
    caf::actor to;
    caf::message msg;
  };
  std::vector<Kept> kept_;
};

// The interposers the options ask for (test switches, and [[faults]] kinds
// that act on messages); `chain` is null when none, `stale` / `injector` the
// StaleReplay / FaultInjector in it (null when not asked for).
// `first_moe_layer`: the layer of expert producer 0.
class FaultInjector;  // fault_injector.hpp
struct Interposers {
  std::shared_ptr<Interposer> chain;
  std::shared_ptr<StaleReplay> stale;
  std::shared_ptr<FaultInjector> injector;  // [[faults]] on messages in flight; null without any
};
Interposers make_interposer(const RuntimeOptions& o, const TestHooks* hooks, int first_moe_layer);

}  // namespace troupe::runtime
