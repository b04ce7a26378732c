# Pipeline-parallel traffic: activations flowing forward from stage s to s+1
# and gradients flowing backward from stage s to s-1. Every message carries a
# PipelineTag, the identity a receiver uses to match it to the schedule and to
# drop duplicates after a replay.
@0xd54a029d0958c522;

$import "/capnp/c++.capnp".namespace("troupe::schemas");

using import "tensor.capnp".Tensor;

# Which way a pipeline message travels. Append-only.
enum Direction {
  forward @0;   # activations, stage s -> s+1
  backward @1;  # gradients w.r.t. activations, stage s -> s-1
}

# Identity of one pipeline transfer; unique per (step, replica, microbatch,
# stage, direction, chunk, attempt).
struct PipelineTag {
  step @0 :UInt64;         # optimizer step this microbatch belongs to
  microbatch @1 :UInt32;   # microbatch index within the step, 0-based
  stage @2 :UInt32;        # pipeline stage that SENT this message
  direction @3 :Direction; # forward (activations) or backward (gradients)
  chunk @4 :UInt32;        # DualPipe model-chunk / copy id (0 for schedules with one chunk per stage)
  replica @5 :UInt32;      # data-parallel replica id (0 without data parallelism)
  attempt @6 :UInt32;      # replay generation: bumped when a failed step is replayed, so stale sends can be dropped
  simTimeNs @7 :UInt64;    # sim devices only: the sender's virtual clock (ns) when it sent this message; 0 on real devices
}

# Output of a stage's layers for one microbatch, sent to the next stage.
struct Activations {
  tag @0 :PipelineTag;     # identity; tag.direction must be forward
  hidden @1 :Tensor;       # f32 [tokens, dModel] residual stream leaving the sending stage
  tokenIds @2 :Tensor;     # i32 [tokens] input ids of the microbatch (needed by the last stage's loss); may be empty
  targets @3 :Tensor;      # i32 [tokens] next-token targets for the loss; may be empty on non-final hops
  tokenData @4 :Tensor;    # f64 [tokens, columns] per-token inputs of a custom loss head (RL's policy
                           # gradient: model/loss_head.hpp), riding to the last stage like targets; may be empty
}

# Gradient of the loss w.r.t. the activations a stage received, sent back to
# the stage that produced them.
struct Gradients {
  tag @0 :PipelineTag;     # identity; tag.direction must be backward
  grad @1 :Tensor;         # f32 [tokens, dModel] dLoss/dHidden, same shape as the matching Activations.hidden
  lossSum @2 :Float64;     # sum of token losses of this microbatch (set by the last stage, 0 elsewhere), for logging
  tokenCount @3 :UInt64;   # tokens that contributed to lossSum
}
