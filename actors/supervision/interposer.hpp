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

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <utility>
#include <vector>

#include <caf/all.hpp>

#include "actors/test_hooks.hpp"

namespace troupe::runtime {

struct RuntimeOptions;

// A message's place on its link (LossDetector below): the messages to one
// receiver, numbered from 1; epoch: the step attempt it was sent in, and
// prev_epoch the one number seq - 1 was sent in. All zero: not numbered.
struct Link {
  uint64_t seq = 0, epoch = 0, prev_epoch = 0;
};

class Interposer {
 public:
  virtual ~Interposer() = default;
  // Called on the sender's thread (an actor or a device closure), possibly
  // from several threads at once. `from_device`: the plan index of the
  // sender's device (-1: the coordinator, which has none). `link`: passed on
  // unchanged with the message (a duplicate keeps it).
  virtual void send(int from_device, const caf::actor& to, caf::message msg, Link link) = 0;
};

// Finds a lost message by the gap it leaves, as a transport's receiver does
// with sequence numbers (TCP's), instead of waiting for a deadline. The
// link to each receiver numbers the messages entering it (numbering(), the
// sending end, placed just before the lossy hop: in one process the
// FaultInjector, the only place a message can be lost), and the detector at
// the receiving end of the chain checks the numbers and delivers. Numbering
// holds its lock while it hands a message on, and the injector never lets a
// later message to a receiver overtake a held one, so each receiver's
// messages arrive in numbering order: a number that skips ahead means the
// ones between were lost, and on_gap is called with the step attempt
// (epoch) the last lost one was sent in (the coordinator replays that
// attempt at once if it is still running). A repeated or older number (a duplicate, stale traffic)
// is delivered as it is: the receivers drop those themselves. A loss with
// no later message behind it in the same attempt leaves no gap: the message
// deadline finds it (coordinator.cpp).
class LossDetector final : public Interposer {
 public:
  explicit LossDetector(std::function<void(uint64_t epoch)> on_gap) : on_gap_(std::move(on_gap)) {}
  // The step attempt messages are now sent in (the coordinator, as it starts one).
  void set_epoch(uint64_t epoch) { epoch_.store(epoch, std::memory_order_relaxed); }
  static uint64_t epoch_of(uint64_t step, uint32_t attempt) { return (step << 24) | (attempt & 0xFFFFFFu); }
  // The sending end: numbers each message per receiver and hands it to `lossy`.
  std::shared_ptr<Interposer> numbering(std::shared_ptr<Interposer> lossy);
  // The receiving end: checks the number, delivers.
  void send(int from_device, const caf::actor& to, caf::message msg, Link link) override;
  uint64_t gaps() const;

 private:
  class Numbering;
  std::function<void(uint64_t)> on_gap_;
  std::atomic<uint64_t> epoch_{0};
  mutable std::mutex mu_;
  std::map<caf::actor_addr, uint64_t> seen_;  // per receiver: the highest number delivered
  uint64_t gaps_ = 0;
};

// Sends every message twice: every receiver's duplicate dropping is exercised
// on every step.
std::shared_ptr<Interposer> duplicate_sends(std::shared_ptr<Interposer> next = nullptr);
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
  void send(int from_device, const caf::actor& to, caf::message msg, Link link) override;
  uint32_t replay();
  void forget();

 private:
  void forward(int from_device, const caf::actor& to, caf::message msg, Link link);
  std::shared_ptr<Interposer> next_;
  std::mutex mu_;
  struct Kept {
    int from_device;
    caf::actor to;
    caf::message msg;
    Link link;
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
  std::shared_ptr<LossDetector> loss;       // at the chain's end when it has an injector (one process)
};
// `on_gap`: the loss detector's report (LossDetector).
Interposers make_interposer(const RuntimeOptions& o, const TestHooks* hooks, int first_moe_layer,
                            std::function<void(uint64_t epoch)> on_gap = {});

}  // namespace troupe::runtime
