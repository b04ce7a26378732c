# Mixture-of-Experts all-to-all traffic: a stage sends one Dispatch per expert
# shard holding the token rows routed to that shard's experts; the shard
# answers with one Combine holding the expert outputs for the same rows, in
# the same order. In backward, the Dispatch carries dOutput rows and the
# Combine carries dInput rows plus the gradient of each row's combine weight.
@0xf30844b8a8ff1fc5;

$import "/capnp/c++.capnp".namespace("troupe::schemas");

using import "tensor.capnp".Tensor;
using import "pipeline.capnp".Direction;

# Identity of one dispatch/combine exchange. The combine echoes the dispatch's
# id unchanged; receivers keep the ids they have handled and drop repeats.
struct MoeId {
  step @0 :UInt64;         # optimizer step
  microbatch @1 :UInt32;   # microbatch index within the step
  layer @2 :UInt32;        # MoE layer index (global layer number in the model)
  shard @3 :UInt32;        # expert shard the rows are sent to
  stage @4 :UInt32;        # pipeline stage that dispatched the rows (where the combine goes back)
  direction @5 :Direction; # forward: token rows; backward: gradient rows
  chunk @6 :UInt32;        # DualPipe chunk / copy id of the dispatching stage (0 if unused)
  replica @7 :UInt32;      # data-parallel replica of the dispatching stage
  attempt @8 :UInt32;      # replay generation of the step
  dispatchId @9 :UInt64;   # sender-unique sequence number of this dispatch (dedupe key together with the fields above)
}

# Token rows for one expert shard.
struct Dispatch {
  id @0 :MoeId;                    # identity, echoed in the Combine
  numRows @1 :UInt32;              # rows in this dispatch (may be 0: the shard still answers)
  width @2 :UInt32;                # values per row (dModel)
  rows @3 :Tensor;                 # f32 [numRows, width]: token hidden states (forward) or dOutput rows (backward)
  expertIds @4 :List(UInt32);      # [numRows] global expert id that row i goes to; must be owned by `id.shard`
  combineWeights @5 :List(Float32);  # [numRows] router gate weight of row i (the expert output is scaled by it)
  tokenIndex @6 :List(UInt32);     # [numRows] position of row i's token in the microbatch (where its output is added back)
}

# Expert outputs for the rows of one Dispatch, in the same order.
struct Combine {
  id @0 :MoeId;                    # the Dispatch's id, unchanged
  numRows @1 :UInt32;              # equals the Dispatch's numRows
  width @2 :UInt32;                # values per row (dModel)
  rows @3 :Tensor;                 # f32 [numRows, width]: expert outputs, unweighted (forward) or dInput rows (backward)
  tokenIndex @4 :List(UInt32);     # [numRows] echo of Dispatch.tokenIndex, so the stage can scatter without state
  weightGrads @5 :List(Float32);   # backward only: [numRows] dLoss/dCombineWeight of each row; empty in forward
}
