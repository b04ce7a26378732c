// Faults on messages in flight ([[faults]] kinds drop, duplicate, delay,
// pause, corrupt and partition): an interposer on the one seam of step
// messages (interposer.hpp). The coordinator arms an entry at the start of
// the fault's step (first attempt only, so the replayed step runs clean);
// from then on, messages sent to the target actor are dropped, doubled or
// held back as the entry says. A partition acts on the messages that cross
// between the target's device and the rest (either way) until its window
// ends: the injector knows each actor's device (place(), called as the
// runtime spawns it) and each sender's (the seam passes it). Held messages are released by the injector's own
// thread at their release time, in the order they were sent to each target
// (a later message to a target never overtakes a held one). Include only
// from actors/ and tests (CAF).
#pragma once

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>
#include <vector>

#include "actors/names.hpp"
#include "actors/supervision/interposer.hpp"

namespace troupe::runtime {

class FaultInjector final : public Interposer {
 public:
  using Clock = std::chrono::steady_clock;

  explicit FaultInjector(std::shared_ptr<Interposer> next = nullptr);
  ~FaultInjector() override;  // stops the release thread; what is still held is dropped

  // From now on, fault `f` (on_messages(f.kind)) acts on messages to
  // `target`; `seed` and `step` seed which bit a corrupt fault flips. A
  // partition cuts off `device` (the target's) instead.
  void arm(const caf::actor& target, const FaultSpec& f, uint64_t seed = 0, uint64_t step = 0, int device = -1);
  // Actor `a` runs on device `device` (its partition side); the runtime
  // calls it for every actor it spawns, respawns included.
  void place(const caf::actor& a, int device);
  void send(int from_device, const caf::actor& to, caf::message msg, Link link) override;
  // Envelopes corrupted so far (each one is a message the receiver must drop).
  uint64_t corrupted() const;
  // Messages held back because they crossed a partition, so far.
  uint64_t partitioned() const;

 private:
  struct Armed {
    caf::actor target;
    FaultKind kind;
    int64_t remaining;       // drop, duplicate, delay: messages still to hit
    Clock::duration delay;   // delay
    Clock::time_point until; // pause, partition: held until then
    uint64_t seed = 0;       // corrupt: the bit to flip is drawn from (seed, hits so far)
    int device = -1;         // partition: the device cut off
  };
  void forward(int from_device, const caf::actor& to, caf::message msg, Link link);
  void release_loop();

  std::shared_ptr<Interposer> next_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<Armed> armed_;
  // Held messages by (release time, sequence): per target, release times never
  // decrease, so this order keeps each target's messages in sending order.
  struct Held {
    int from_device;
    caf::actor to;
    caf::message msg;
    Link link;
  };
  std::map<std::pair<Clock::time_point, uint64_t>, Held> held_;
  std::map<caf::actor_addr, Clock::time_point> last_release_;  // per target: the latest release queued
  std::map<caf::actor_addr, int> unreleased_;  // per target: held messages not yet handed on (due or not)
  uint64_t seq_ = 0;
  uint64_t corrupted_ = 0;
  uint64_t partitioned_ = 0;
  std::map<caf::actor_addr, int> device_of_;  // place(): each actor's device (absent: the coordinator, -1)
  bool stop_ = false;
  std::thread worker_;
};

}  // namespace troupe::runtime
