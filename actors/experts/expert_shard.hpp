// Expert-shard actor: owns experts [begin, end) of ONE MoE layer for ONE
// data-parallel replica and serves every dispatching stage of that layer (both
// DualPipe copies). Include only from actors/*.cpp and tests (CAF).
//
// What it owns: the experts' weights (gate/up/down: three contiguous ranges
// of the flat parameter buffer, model/params.cpp) and their weight
// gradients. With replicas it also holds second copies of hot experts of
// other shards (spec.copies): its weights are then [gate | up | down] of
// the sorted union, each part a run of ranges (plan.hpp's
// expert_set_ranges), and it gets only its block of such an expert's rows
// (moe::copy_rows); the optimizer shards sum the copies' gradients in
// producer (= shard) order, like any two producers of one element. Their AdamW state is NOT here: like every other parameter it
// lives in the ZeRO-1 optimizer shards (actors/optimizer/optimizer_actor.cpp), which
// take this actor's GradSlices and send ParamSlices back. So an expert shard
// is a "gradient producer" exactly like a pipeline rank.
//
// Protocol of step s (the rest is context.hpp's):
//   stage -> shard   Envelope(Dispatch forward): validate (moe_messages.hpp),
//                    run moe::experts_forward on the device, keep xs/acts/y
//                    keyed by (chunk, microbatch) of (s, attempt), answer
//                    Envelope(Combine) with the unweighted expert outputs.
//   stage -> shard   Envelope(Dispatch backward): validate, check it matches
//                    the forward (rows, expert ids, token indices), compute
//                    dy = w * dOut and dLoss/dw (Backend::combine_backward on
//                    the rows, as the single-process layer does), run
//                    moe::experts_backward accumulating into the accumulator
//                    of the dispatch's chunk, answer Combine(dInput rows,
//                    weightGrads); the saved activations are freed.
//   shard -> optimizer shards   after `microbatches` backward dispatches: the
//                    chunk accumulators summed in chunk order (fixed: one
//                    chunk's dispatches all come from one rank, in its
//                    schedule order; the two DualPipe copies are summed
//                    0 then 1, never interleaved by arrival), then one
//                    GradSlice per (owned range ∩ optimizer shard range),
//                    stage = kExpertProducerBase + producer.
//   optimizer -> shard          ParamSlice: the intersection with the owned
//                    ranges is loaded; when every optimizer shard whose range
//                    meets ours has answered, (stepok, s, attempt, replica,
//                    kExpertProducerBase + producer) goes to the coordinator
//                    and the shard moves to step s+1.
//   supervisor -> shard         (arm, s, k): die on the k-th message (fault
//                    injection); (restore, s, attempt) then one
//                    (restore, ParamSlice) per optimizer shard: abort to the
//                    start of step s (the failed attempt's activations and
//                    gradients dropped, late device work's sends carry the
//                    old attempt) and load the owned part of the slices.
// Combines go to the Dispatch's CAF sender when it has one, else to the rank
// holding (id.chunk, id.stage) of the replica (peers.ranks); a dispatch with
// neither is rejected like a malformed one.
//
// Robustness: a Dispatch that fails the checks (wrong width, token count or
// index, foreign expert id, truncated/invalid envelope, backward without its
// forward or not matching it) is rejected BEFORE any state changes: the
// shard sends (fail, "expert:...: rejected dispatch: <why>") to the
// coordinator, counts it as dropped and keeps serving. The coordinator's
// (fail) handler stops the run with that message (a clean stop). Duplicates
// (same step/attempt/direction/chunk/microbatch) and stale steps or attempts
// are dropped silently (counted). A dispatch of a higher attempt of the
// current step discards that step's activations and gradients (replay). A
// dispatch for step s+1 that arrives before s's parameters are loaded waits.
#pragma once

#include <array>
#include <cstdint>
#include <memory>

#include <caf/all.hpp>

#include "actors/context.hpp"

namespace troupe::runtime {

// GradSlice.stage and stepok's rank of expert shards: producer ids above the
// pipeline ranks', so the optimizer shards' (replica, stage, offset) keys and
// the coordinator's (replica, rank) set never collide.
inline constexpr uint32_t kExpertProducerBase = 0x40000000u;

// ExpertRange, expert_split, expert_owner and expert_param_ranges: actors/plan.hpp.

struct ExpertShardSpec {
  int replica = 0;       // data-parallel replica served
  int layer = 0;         // global layer index (a MoE layer)
  int shard = 0;         // this shard within the layer
  int shards = 1;        // expert shards of the layer
  ExpertRange experts;   // the experts it holds; empty: expert_split(n_experts, shards, shard)
  std::vector<int64_t> copies;  // second copies of other shards' experts it holds (sorted; Plan::copies_of)
  int producer = 0;      // unique per (replica, layer, shard): GradSlice.stage / stepok rank offset
  int microbatches = 0;  // backward dispatches per step; 0: sh->plan.chunks
  // Start elsewhere than step 0 with sh->init: the step to resume at and the
  // weights to hold, {gate | up | down} of the owned experts as (params)
  // returns them. Null: sh->init at step 0. (The runtime's supervisor
  // respawns with the defaults and then sends (restore ...).)
  uint64_t start_step = 0;
  std::shared_ptr<const std::vector<float>> weights;
  // The weights come from (restore ...) messages right after the spawn (a
  // scale event): start from zeros instead of copying sh->init.
  bool await_restore = false;
};

// Spawns the actor; its initial weights are spec.weights, else sh->init at
// its ranges. Throws std::invalid_argument (bad shard split, spec.weights of
// the wrong size) or std::out_of_range (spec.layer has no routed experts).
// Messages besides Envelopes: (done, ticket) internal; (dropped) -> uint64_t;
// (params) -> three ParamSlice Envelopes {gate, up, down} of its current
// weights (tests; an error for a shard holding copies, whose parts are not
// contiguous); (rescale) -> uint64_t, the bytes of its
// weights, answered once the device work queued before it (the restore
// loads of a scale event) has run.
caf::actor spawn_expert_shard(caf::actor_system& sys, std::shared_ptr<const Shared> sh, Device& dev,
                              const ExpertShardSpec& spec);

}  // namespace troupe::runtime
