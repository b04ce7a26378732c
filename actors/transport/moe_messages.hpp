// Dispatch / Combine codec (schemas/moe.capnp): builds the MoE all-to-all
// messages from plain spans and checks received ones against what the
// receiver knows. The envelope validator (actors/transport/envelope_validate.cpp) only
// checks what a message says about itself (tensor bytes = shape, list
// lengths = numRows); these checks add what only the receiver can know: the
// shard owns the experts named, the width is d_model, token indices fit the
// microbatch, rows are grouped by expert as the grouped GEMM needs, and a
// Combine echoes the Dispatch it answers. Every violation is a caf::error
// (category "envelope", code schema_violation) whose context says what and
// where; nothing here throws.
//
// Semantics of the rows (the contract with the stage side):
//   forward   Dispatch.rows[i] = x[tokenIndex[i]] (the MoE layer input of the
//             row's token); Combine.rows[i] = expert output of row i,
//             UNWEIGHTED (the stage multiplies by its combine weight and adds
//             into the token's output, as moe::MoeLayer's combine_forward).
//   backward  Dispatch.rows[i] = dOut[tokenIndex[i]] (gradient of the layer
//             output at the row's token, unweighted), with the same expertIds,
//             tokenIndex and combineWeights as the forward dispatch of that
//             (step, attempt, chunk, microbatch); Combine.rows[i] = gradient
//             w.r.t. the row's input x (the stage sums a token's rows, as
//             sum_slots), Combine.weightGrads[i] = dot(dOut row, expert output
//             row) = dLoss/dCombineWeight.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include <caf/error.hpp>
#include <caf/expected.hpp>

#include "actors/transport/envelope.hpp"

namespace troupe::runtime {

// Plain copy of schemas::MoeId (the identity echoed by a Combine).
struct MoeKey {
  uint64_t step = 0;
  uint32_t microbatch = 0;
  uint32_t layer = 0;
  uint32_t shard = 0;
  uint32_t stage = 0;
  bool backward = false;
  uint32_t chunk = 0;
  uint32_t replica = 0;
  uint32_t attempt = 0;
  uint64_t dispatch_id = 0;

  bool operator==(const MoeKey&) const = default;
};

MoeKey read_moe_key(schemas::MoeId::Reader id);
void write_moe_key(schemas::MoeId::Builder id, const MoeKey& k);
std::string to_string(const MoeKey& k);

// A Dispatch of rows [n, width] (row-major). The spans must all be n long
// (rows n * width); the envelope validator rejects the result otherwise.
Envelope make_dispatch(const MoeKey& id, uint32_t width, std::span<const float> rows,
                       std::span<const uint32_t> expert_ids, std::span<const float> combine_weights,
                       std::span<const uint32_t> token_index);

// A Combine of rows [n, width]; weight_grads is empty in forward, n long in backward.
Envelope make_combine(const MoeKey& id, uint32_t width, std::span<const float> rows,
                      std::span<const uint32_t> token_index, std::span<const float> weight_grads);

// What an expert shard knows about the dispatches it may receive.
struct ShardView {
  uint32_t replica = 0;
  uint32_t layer = 0;
  uint32_t shard = 0;
  uint32_t expert_begin = 0, expert_end = 0;  // owned global expert ids [begin, end)
  std::vector<uint32_t> copies;               // and sorted copies of other experts (replicas)
  uint32_t width = 0;                         // d_model
  uint32_t tokens = 0;                        // tokens per microbatch
  uint32_t top_k = 1;                         // choices per token
};

// A dispatch that passed check_dispatch.
struct CheckedDispatch {
  Read<schemas::Dispatch> msg;
  MoeKey id;
  std::vector<int64_t> counts;  // rows per owned expert, in id order ([begin, end) and the copies merged)
};

// Checks `e` as a Dispatch addressed to the shard `v`: a readable Dispatch
// (envelope validation: tensor shape [numRows, width], every list numRows
// long), id.replica/layer/shard equal to v's, width == v.width, numRows at
// most tokens * min(top_k, owned experts), every expert id owned by the shard
// and non-decreasing (rows grouped by expert), within one expert token
// indices strictly increasing (a token reaches an expert once) and < tokens,
// every combine weight finite.
caf::expected<CheckedDispatch> check_dispatch(const Envelope& e, const ShardView& v);

// Checks `e` as the Combine answering the dispatch `sent` (id equal field by
// field, numRows, width, tokenIndex echoed; weightGrads numRows long and
// finite in backward).
caf::expected<Read<schemas::Combine>> check_combine(const Envelope& e, const MoeKey& sent, uint32_t width,
                                                    std::span<const uint32_t> token_index);

}  // namespace troupe::runtime
