# Control plane: snapshot / restore of actor state, stop, status queries and
# error reports. Sent by supervisors, the launcher and the actors themselves.
@0xcb854dba779090ee;

$import "/capnp/c++.capnp".namespace("troupe::schemas");

# Ask an actor for a snapshot of its state at a step boundary; the actor
# answers with the same message with `state` filled in.
struct Snapshot {
  snapshotId @0 :UInt64;   # chosen by the requester; echoed in the answer
  step @1 :UInt64;         # step boundary the snapshot describes (completed steps)
  actor @2 :Text;          # name of the actor the state belongs to
  state @3 :Data;          # empty in the request; the actor's serialized state in the answer
}

# Replace an actor's state with an earlier snapshot (after a restart).
struct Restore {
  snapshotId @0 :UInt64;   # which snapshot this is (for logs and dedupe)
  step @1 :UInt64;         # step boundary the state describes; the actor resumes at step + 1
  actor @2 :Text;          # name of the actor the state belongs to (checked by the receiver)
  state @3 :Data;          # the state bytes from the Snapshot answer
}

# Ask an actor (and the actors it owns) to stop.
struct Stop {
  reason @0 :Text;         # human-readable reason, logged by the receiver
  graceful @1 :Bool;       # true: finish the current step first; false: stop now
}

# Ask an actor how it is doing.
struct StatusRequest {
  requestId @0 :UInt64;    # echoed in the reply
}

# Life-cycle phase of an actor. Append-only.
enum ActorPhase {
  starting @0;    # spawned, not ready yet
  idle @1;        # ready, no work queued
  running @2;     # working on a step
  stopping @3;    # draining after a Stop
  failed @4;      # hit an error it reported and cannot continue
}

struct StatusReply {
  requestId @0 :UInt64;    # the request's id
  actor @1 :Text;          # name of the replying actor
  role @2 :Text;           # e.g. "stage", "expert", "optimizer", "rollout"
  phase @3 :ActorPhase;    # current life-cycle phase
  step @4 :UInt64;         # last completed step
  handled @5 :UInt64;      # messages handled since start
  dropped @6 :UInt64;      # duplicates and rejected (malformed) messages dropped since start
  lastError @7 :Text;      # last error the actor saw; empty if none
}

# Kind of a reported error. Append-only.
enum ErrorKind {
  other @0;            # anything not listed below
  malformedMessage @1; # an Envelope failed decoding or validation
  compute @2;          # a kernel/backend failure
  timeout @3;          # a peer did not answer in time
  peerDown @4;         # a peer actor or node went away
  invalidState @5;     # a message arrived that the actor's phase cannot handle
}

# An actor tells its supervisor (or a sender) that something went wrong.
struct ErrorReport {
  kind @0 :ErrorKind;      # classification
  actor @1 :Text;          # name of the reporting actor
  step @2 :UInt64;         # step in progress when it happened
  message @3 :Text;        # human-readable description
  code @4 :UInt32;         # machine-readable code within the kind (e.g. the envelope error code)
  fatal @5 :Bool;          # true if the actor cannot continue and expects a restart
}
