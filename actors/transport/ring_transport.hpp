// Step messages between processes on one host through shared-memory rings
// (shm_ring.hpp) instead of CAF's middleman: the sender serializes the CAF
// message into the ring to the receiver's process, a thread there wakes on
// the ring's futex doorbell, decodes the message (Envelopes are validated as
// any wire frame; large ones still take the bulk path, envelope_shm.hpp,
// whose 64-byte record then travels in the ring) and enqueues it to the
// receiving actor, found by id in its actor system's registry.
//
// What travels: anonymous messages sent with send_anon() — every step message
// (post(), actors/context.hpp) and the coordinator's step-control messages
// to the same actors (kill-switch arming, restores), so that all of them
// keep one order per pair of processes. Messages with a sender
// (request/response, the directories, RL's remote generators), monitors,
// down and exit messages and failure detection stay on CAF's TCP connection,
// unchanged.
//
// Not for use outside actors/ and the benches (CAF).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/actor_system.hpp>
#include <caf/message.hpp>
#include <caf/node_id.hpp>

namespace troupe {

struct RingOptions {
  size_t capacity = size_t{1} << 22;  // bytes per ring (a power of two); one ring per ordered pair of processes
  int64_t spin_ns = 50'000;           // a receiver that found the ring empty spins this long before it sleeps
};

struct RingStats {
  uint64_t sent = 0;        // messages this process put on its rings
  uint64_t queued = 0;      // of those, held in the sender's queue while a ring was full
  uint64_t received = 0;    // messages taken off this process's rings and delivered
  uint64_t no_actor = 0;    // received for an actor that no longer exists (dropped, as CAF would)
  uint64_t bad_frames = 0;  // frames that did not decode as a message (dropped and counted)
  uint64_t lost_peer = 0;   // messages for a process that died before taking them
  uint64_t sleeps = 0;      // times a receiver slept on its doorbell
};

class RingTransport {
 public:
  // Creates this process's inbound rings, one from each other process of
  // `processes`, named "/troupe-ring-<pid>-<run>-<from>-<to>" (`run`: digits
  // that name the run, the same on every process). Throws
  // std::runtime_error when a segment cannot be made.
  RingTransport(caf::actor_system& sys, int me, int processes, const std::string& run, RingOptions opt = {});
  ~RingTransport();
  RingTransport(const RingTransport&) = delete;
  RingTransport& operator=(const RingTransport&) = delete;

  // Opens the ring to every other process (their inbound rings must exist:
  // call after a barrier), starts the receivers and makes send_anon() use
  // the rings for actors of those nodes. `nodes[p]`: process p's CAF node.
  void connect(const std::vector<caf::node_id>& nodes);
  // Removes the segments' names once every process has opened its rings:
  // nothing is left in /dev/shm, however the run ends.
  void unlink_names();

  // Puts `msg` for `to` on the ring to to's process; false when there is
  // none (the caller sends through CAF).
  bool send(const caf::actor& to, const caf::message& msg);

  // Waits until every message put on to's ring so far is in its receiver's
  // mailbox (a message sent through CAF after this comes after them); false
  // when that took longer than `max` or the peer died.
  bool fence(const caf::actor& to, std::chrono::milliseconds max);

  RingStats stats() const;

  // Decodes one ring message body ([u64 actor id][CAF-serialized message]);
  // the receivers' decoder, exposed for the fuzz tests.
  static bool decode(caf::actor_system& sys, const uint8_t* data, size_t n, uint64_t& actor_id, caf::message& out);

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
};

// The one way step messages leave an actor: through the ring of to's actor
// system when it has one to to's process, else CAF's anon_send.
void send_anon(const caf::actor& to, caf::message msg);

// Before a message to `to` through CAF that must come after the ring's
// (a request after a restore): RingTransport::fence, when to's actor
// system has a ring to to's process; true otherwise.
bool fence_ring(const caf::actor& to, std::chrono::milliseconds max);

}  // namespace troupe
