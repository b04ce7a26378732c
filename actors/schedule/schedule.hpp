// Pipeline schedules as pure functions: (kind, rank, ranks, chunks) -> the
// ordered list of ops that rank runs in one training step. No actors, no
// backend: the stage actors execute these lists on real devices, and
// actors/pipeline_sim executes them against a cost model.
//
// Vocabulary.
//   rank       one pipeline device, 0..num_ranks-1 (PP = num_ranks).
//   direction  a copy of the model that micro-batches flow through. Only
//              `dualpipe` has two: direction 0 enters at rank 0, direction 1
//              enters at rank PP-1 (rank r holds stage r of direction 0 and
//              stage PP-1-r of direction 1). Every other kind has direction 0.
//   stage      a contiguous slice of the model along one direction, 0..S-1.
//              S = PP, except `dualpipev` where the model is cut into 2*PP
//              stages and rank r holds stages r and 2*PP-1-r (a "V").
//   chunk      one micro-batch at one stage: (mb, dir, stage). Micro-batch ids
//              are global, 0..num_chunks-1; in `dualpipe` direction 0 takes
//              ids [0, C/2) and direction 1 takes [C/2, C).
//
// Messages: the forward of (mb, d, s) needs the activation of (mb, d, s-1),
// the backward of (mb, d, s) needs the gradient from (mb, d, s+1). Each op
// lists what it must receive before it starts and what it sends when it ends;
// `peer` is the other rank (it may be the op's own rank: a local hand-off, as
// at the tip of the V in `dualpipev`). The backward of the last stage needs
// only its own forward (the loss is computed there).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::sched {

enum class Kind : uint8_t {
  sequential,   // reference: one micro-batch at a time through all stages
  one_f_one_b,  // 1F1B (PipeDream-flush), backward not split
  zb1p,         // ZB-H1: 1F1B with B split into B (inputs) and W (weights)
  dualpipe,     // DeepSeek DualPipe: two directions, overlapped F&B pairs
  dualpipev,    // DualPipeV: V-shape, 2*PP stages, one copy of parameters
};

// Names used in specs and reports: "sequential", "1f1b", "zb1p", "dualpipe",
// "dualpipev".
std::string_view to_string(Kind kind);
// Inverse of to_string; throws std::invalid_argument listing the valid names.
Kind parse_kind(std::string_view name);

enum class OpType : uint8_t {
  F,   // forward of chunk `f`
  B,   // backward for inputs of chunk `b`; its weight gradient is a later W
  W,   // backward for weights of chunk `b` (after its B, on the same rank)
  BW,  // full backward of chunk `b` (inputs and weights in one op)
  FB,  // forward of `f` overlapped with the full backward of `b`, one op
};
std::string_view to_string(OpType type);

struct Chunk {
  int32_t mb = -1;
  int32_t stage = -1;
  int8_t dir = 0;
  friend bool operator==(const Chunk&, const Chunk&) = default;
};

enum class MsgKind : uint8_t {
  activation,  // forward output of stage s-1, consumed by the forward of `to`
  gradient,    // input gradient of stage s+1, consumed by the backward of `to`
};

struct Msg {
  MsgKind kind = MsgKind::activation;
  int32_t peer = -1;  // sender (in Op::recv) or receiver (in Op::send)
  Chunk to;           // the chunk that consumes the message
  friend bool operator==(const Msg&, const Msg&) = default;
};

// At most two messages each way (an FB op receives an activation and a
// gradient and sends both): a fixed array keeps a 10^7-op schedule compact.
struct MsgList {
  Msg items[2];
  uint8_t count = 0;
  void push(const Msg& m);  // throws std::logic_error past two
  const Msg* begin() const { return items; }
  const Msg* end() const { return items + count; }
  size_t size() const { return count; }
};

struct Op {
  OpType type = OpType::F;
  Chunk f;       // forward part (F, FB); unset otherwise
  Chunk b;       // backward part (B, W, BW, FB); unset otherwise
  MsgList recv;  // must have arrived before the op starts
  MsgList send;  // sent when the op finishes
};
// Compact text, e.g. "F(mb3 d0 s2)" or "FB(F mb5 d0 s1 | B mb9 d1 s2)".
std::string to_string(const Op& op);
std::string to_string(const Chunk& c);
std::string to_string(const Msg& m);

// The shape shared by every rank's schedule, after validation.
struct Layout {
  Kind kind = Kind::sequential;
  int num_ranks = 0;   // PP
  int num_chunks = 0;  // C: micro-batches in the step (all directions)
  int num_dirs = 1;    // 2 for dualpipe
  int num_stages = 0;  // stages per direction: PP, or 2*PP for dualpipev
  int mbs_per_dir = 0; // C, or C/2 for dualpipe
};

// Validates (kind, num_ranks, num_chunks) and throws std::invalid_argument
// with the rule that was broken. Requirements:
//   all kinds        num_ranks >= 1, num_chunks >= 1
//   dualpipe         num_ranks even, num_chunks even and >= 2*num_ranks
//   dualpipev        num_chunks >= 2*num_ranks
// (the DualPipe/DualPipeV requirements are those of DeepSeek's reference
// schedule: the steady phase needs every rank to have both directions in
// flight).
Layout make_layout(Kind kind, int num_ranks, int num_chunks);

int stage_rank(const Layout& layout, int dir, int stage);  // which rank holds it
int first_mb(const Layout& layout, int dir);               // first global mb id

// The ordered ops of `rank`. Pure: same arguments, same list. Throws
// std::invalid_argument for invalid combinations (see make_layout) or a rank
// out of range.
std::vector<Op> make_schedule(Kind kind, int rank, int num_ranks, int num_chunks);
std::vector<std::vector<Op>> make_all_schedules(Kind kind, int num_ranks, int num_chunks);

// Structural check of a full set of op lists against the layout: every chunk
// runs exactly one forward and one complete backward (BW, FB, or B then W) on
// the rank that holds its stage; W follows its B; every op's recv/send lists
// are exactly the messages the layout implies, every sent message is received
// once. Returns "" when sound, else the first problem found, in words.
std::string check_schedules(const Layout& layout, const std::vector<std::vector<Op>>& ranks);

}  // namespace troupe::sched
