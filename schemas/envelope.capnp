# The top-level message: exactly one of these travels in every troupe::Envelope
# (actors/transport/envelope.hpp). The union's discriminant is the message kind. Add new
# kinds only by appending union members with new ordinals; a receiver that sees
# a kind it does not know rejects the message with `unknown_kind`.
@0xc6aa4e8c0f4b0db5;

$import "/capnp/c++.capnp".namespace("troupe::schemas");

using Pipeline = import "pipeline.capnp";
using Moe = import "moe.capnp";
using Optimizer = import "optimizer.capnp";
using Control = import "control.capnp";
using Rl = import "rl.capnp";

# Who sent a message and in what order (for logs, tracing and dedupe).
struct Header {
  sender @0 :UInt64;       # sender id (rank << 32 | actor index, or 0 if unknown)
  seq @1 :UInt64;          # per-sender sequence number, starting at 1 (0 = not set)
  sentNs @2 :UInt64;       # sender's steady-clock time in ns at build time (0 = not set); only for latency metrics
}

struct Message {
  header @0 :Header;       # provenance of this message
  union {                  # the message kind; Message::which() in C++
    activations @1 :Pipeline.Activations;      # stage -> next stage
    gradients @2 :Pipeline.Gradients;          # stage -> previous stage
    dispatch @3 :Moe.Dispatch;                 # stage -> expert shard
    combine @4 :Moe.Combine;                   # expert shard -> stage
    gradSlice @5 :Optimizer.GradSlice;         # stage -> optimizer shard
    paramSlice @6 :Optimizer.ParamSlice;       # optimizer shard -> stage
    snapshot @7 :Control.Snapshot;             # supervisor <-> actor
    restore @8 :Control.Restore;               # supervisor -> actor
    stop @9 :Control.Stop;                     # supervisor/launcher -> actor
    statusRequest @10 :Control.StatusRequest;  # anyone -> actor
    statusReply @11 :Control.StatusReply;      # actor -> requester
    errorReport @12 :Control.ErrorReport;      # actor -> supervisor/sender
    rlWeights @13 :Rl.RlWeights;               # RL coordinator -> generator on another process
    rlRollout @14 :Rl.RlRollout;               # generator on another process -> RL coordinator
  }
}
