# ZeRO-1 optimizer traffic: gradient slices from stages (and data-parallel
# replicas) to the optimizer shard that owns a range of the flat parameter
# buffer (model/params.hpp), and updated parameter slices back.
@0xec0320b6ddcc6ccd;

$import "/capnp/c++.capnp".namespace("troupe::schemas");

using import "tensor.capnp".Tensor;

# A contiguous range of the flat float32 parameter buffer, in elements.
struct ParamRange {
  offset @0 :UInt64;   # first element
  count @1 :UInt64;    # number of elements; offset + count must not overflow
}

# Gradients for one range, accumulated over the microbatches of one step.
struct GradSlice {
  step @0 :UInt64;       # optimizer step the gradients belong to
  replica @1 :UInt32;    # data-parallel replica that computed them
  shard @2 :UInt32;      # optimizer shard the slice is addressed to
  stage @3 :UInt32;      # pipeline stage that sent it
  range @4 :ParamRange;  # which elements of the flat buffer
  grads @5 :Tensor;      # f32 [range.count]
  microbatches @6 :UInt32;  # microbatches summed into `grads` (for averaging)
  attempt @7 :UInt32;    # replay generation of the step (dedupe)
}

# Parameters of one range after the update of `step`.
struct ParamSlice {
  step @0 :UInt64;       # the parameters are the result of this step's update (version)
  replica @1 :UInt32;    # replica the slice is sent to (all replicas get the same values)
  shard @2 :UInt32;      # optimizer shard that owns the range
  range @3 :ParamRange;  # which elements of the flat buffer
  params @4 :Tensor;     # f32 [range.count]
  attempt @5 :UInt32;    # replay generation of the step (dedupe)
}
