// The one test seam on the actors' step messages. Every step message an actor
// sends goes through post() (actors/context.hpp); when the run has an
// interposer, post() hands the message to it instead of sending it, and the
// interposer decides what reaches the receiver: the message, the message
// twice, nothing, or a changed message. Production runs have none (post() is
// a plain send), so no actor carries a test branch. The test switches
// RuntimeOptions::duplicate_sends and corrupt_combine install the interposers
// below (make_interposer); [[faults]] kinds beyond "kill" (drop, delay,
// corrupt) can be built the same way. Include only from actors/ and tests (CAF).
#pragma once

#include <memory>

#include <caf/all.hpp>

namespace troupe::runtime {

struct RuntimeOptions;

class Interposer {
 public:
  virtual ~Interposer() = default;
  // Called on the sender's thread (an actor or a device closure), possibly
  // from several threads at once.
  virtual void send(const caf::actor& to, caf::message msg) = 0;
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

// The interposer the options' test switches ask for; null when none.
// `first_moe_layer`: the layer of expert producer 0.
std::shared_ptr<Interposer> make_interposer(const RuntimeOptions& o, int first_moe_layer);

}  // namespace troupe::runtime
