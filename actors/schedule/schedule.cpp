// Schedule layouts, op text, the op builder, the single-direction schedules
// (sequential, 1F1B, ZB-H1) and the structural checker. DualPipe and
// DualPipeV are in schedule_dualpipe.cpp.
#include "actors/schedule/schedule.hpp"

#include <algorithm>
#include <sstream>
#include <stdexcept>

#include "actors/schedule/schedule_internal.hpp"

namespace troupe::sched {

namespace {

struct KindName {
  Kind kind;
  std::string_view name;
};
constexpr KindName kKindNames[] = {
    {Kind::sequential, "sequential"}, {Kind::one_f_one_b, "1f1b"}, {Kind::zb1p, "zb1p"},
    {Kind::dualpipe, "dualpipe"},     {Kind::dualpipev, "dualpipev"},
};

[[noreturn]] void invalid(const std::string& what) { throw std::invalid_argument(what); }

}  // namespace

std::string_view to_string(Kind kind) {
  for (const auto& k : kKindNames)
    if (k.kind == kind) return k.name;
  return "?";
}

Kind parse_kind(std::string_view name) {
  for (const auto& k : kKindNames)
    if (k.name == name) return k.kind;
  std::string valid;
  for (const auto& k : kKindNames) valid += (valid.empty() ? "" : ", ") + std::string(k.name);
  invalid("unknown pipeline schedule '" + std::string(name) + "' (valid: " + valid + ")");
}

std::string_view to_string(OpType type) {
  switch (type) {
    case OpType::F: return "F";
    case OpType::B: return "B";
    case OpType::W: return "W";
    case OpType::BW: return "BW";
    case OpType::FB: return "FB";
  }
  return "?";
}

void MsgList::push(const Msg& m) {
  // A logic error in a generator, not bad input: never write past the array.
  if (count >= 2) throw std::logic_error("an op carries at most two messages each way");
  items[count++] = m;
}

std::string to_string(const Chunk& c) {
  std::ostringstream s;
  s << "mb" << c.mb << " d" << int(c.dir) << " s" << c.stage;
  return s.str();
}

std::string to_string(const Msg& m) {
  return std::string(m.kind == MsgKind::activation ? "act" : "grad") + "[" + to_string(m.to) +
         "] peer " + std::to_string(m.peer);
}

std::string to_string(const Op& op) {
  std::string s(to_string(op.type));
  switch (op.type) {
    case OpType::F: return s + "(" + to_string(op.f) + ")";
    case OpType::FB: return s + "(F " + to_string(op.f) + " | B " + to_string(op.b) + ")";
    default: return s + "(" + to_string(op.b) + ")";
  }
}

Layout make_layout(Kind kind, int num_ranks, int num_chunks) {
  const std::string who = std::string(to_string(kind)) + " with " + std::to_string(num_ranks) +
                          " ranks and " + std::to_string(num_chunks) + " chunks: ";
  if (num_ranks < 1) invalid(who + "needs at least 1 rank");
  if (num_chunks < 1) invalid(who + "needs at least 1 chunk (micro-batch)");
  Layout l;
  l.kind = kind;
  l.num_ranks = num_ranks;
  l.num_chunks = num_chunks;
  l.num_dirs = 1;
  l.num_stages = num_ranks;
  l.mbs_per_dir = num_chunks;
  if (kind == Kind::dualpipe) {
    if (num_ranks % 2 != 0) invalid(who + "dualpipe needs an even number of ranks");
    if (num_chunks % 2 != 0 || num_chunks < 2 * num_ranks)
      invalid(who + "dualpipe needs an even number of chunks >= 2 * ranks (" +
              std::to_string(2 * num_ranks) + "), half of them in each direction");
    l.num_dirs = 2;
    l.mbs_per_dir = num_chunks / 2;
  } else if (kind == Kind::dualpipev) {
    if (num_chunks < 2 * num_ranks)
      invalid(who + "dualpipev needs chunks >= 2 * ranks (" + std::to_string(2 * num_ranks) + ")");
    l.num_stages = 2 * num_ranks;
  }
  return l;
}

int stage_rank(const Layout& l, int dir, int stage) {
  switch (l.kind) {
    case Kind::dualpipe: return dir == 0 ? stage : l.num_ranks - 1 - stage;
    case Kind::dualpipev: return stage < l.num_ranks ? stage : 2 * l.num_ranks - 1 - stage;
    default: return stage;
  }
}

int first_mb(const Layout& l, int dir) { return dir * l.mbs_per_dir; }

namespace detail {

void OpSink::forward_msgs(const Chunk& c, Op& op) const {
  if (c.stage > 0)
    op.recv.push({MsgKind::activation, stage_rank(layout_, c.dir, c.stage - 1), c});
  if (c.stage + 1 < layout_.num_stages) {
    Chunk next{c.mb, c.stage + 1, c.dir};
    op.send.push({MsgKind::activation, stage_rank(layout_, c.dir, c.stage + 1), next});
  }
}

void OpSink::backward_msgs(const Chunk& c, Op& op) const {
  if (c.stage + 1 < layout_.num_stages)
    op.recv.push({MsgKind::gradient, stage_rank(layout_, c.dir, c.stage + 1), c});
  if (c.stage > 0) {
    Chunk prev{c.mb, c.stage - 1, c.dir};
    op.send.push({MsgKind::gradient, stage_rank(layout_, c.dir, c.stage - 1), prev});
  }
}

void OpSink::forward(const Chunk& c) {
  Op op;
  op.type = OpType::F;
  op.f = c;
  forward_msgs(c, op);
  ops_.push_back(op);
}

void OpSink::backward(const Chunk& c, bool split) {
  Op op;
  op.type = split ? OpType::B : OpType::BW;
  op.b = c;
  backward_msgs(c, op);
  ops_.push_back(op);
}

void OpSink::weight(const Chunk& c) {
  Op op;
  op.type = OpType::W;
  op.b = c;
  ops_.push_back(op);
}

void OpSink::overlapped(const Chunk& f, const Chunk& b) {
  Op op;
  op.type = OpType::FB;
  op.f = f;
  op.b = b;
  forward_msgs(f, op);
  backward_msgs(b, op);
  ops_.push_back(op);
}

Op with_expected_messages(const Layout& layout, const Op& op) {
  OpSink sink(layout, 0);
  switch (op.type) {
    case OpType::F: sink.forward(op.f); break;
    case OpType::B: sink.backward(op.b, true); break;
    case OpType::BW: sink.backward(op.b, false); break;
    case OpType::W: sink.weight(op.b); break;
    case OpType::FB: sink.overlapped(op.f, op.b); break;
  }
  return sink.take().front();
}

}  // namespace detail

namespace {

// Reference: strictly one micro-batch in flight. Rank r runs F then BW of each
// micro-batch in turn; the F of micro-batch m+1 on rank 0 follows the BW of m,
// so the whole pipeline is serial (with PP = 1 this is plain training).
std::vector<Op> make_sequential(const Layout& l, int rank) {
  detail::OpSink sink(l, rank);
  sink.reserve(2 * size_t(l.num_chunks));
  for (int m = 0; m < l.num_chunks; ++m) {
    sink.forward({m, rank, 0});
    sink.backward({m, rank, 0}, false);
  }
  return sink.take();
}

// 1F1B: PP-1-r warm-up forwards, then one forward and one backward in turn,
// then the remaining backwards. With `split` (ZB-H1) each backward is B, and
// the W of micro-batch j runs after the B of micro-batch j+r: rank r keeps r
// weight passes back to fill the cool-down, the same number of activations in
// flight as 1F1B (ZB paper, section 2.1, figure 3 top).
std::vector<Op> make_1f1b(const Layout& l, int rank, bool split) {
  detail::OpSink sink(l, rank);
  const int C = l.num_chunks;
  const int warm = std::min(l.num_ranks - 1 - rank, C);
  const int lag = rank;
  sink.reserve((split ? 3 : 2) * size_t(C));
  for (int i = 0; i < warm; ++i) sink.forward({i, rank, 0});
  for (int j = 0; j < C; ++j) {
    if (j + warm < C) sink.forward({j + warm, rank, 0});
    sink.backward({j, rank, 0}, split);
    if (split && j - lag >= 0) sink.weight({j - lag, rank, 0});
  }
  if (split)
    for (int j = std::max(0, C - lag); j < C; ++j) sink.weight({j, rank, 0});
  return sink.take();
}

}  // namespace

std::vector<Op> make_schedule(Kind kind, int rank, int num_ranks, int num_chunks) {
  const Layout l = make_layout(kind, num_ranks, num_chunks);
  if (rank < 0 || rank >= num_ranks)
    invalid("rank " + std::to_string(rank) + " out of range [0, " + std::to_string(num_ranks) + ")");
  switch (kind) {
    case Kind::sequential: return make_sequential(l, rank);
    case Kind::one_f_one_b: return make_1f1b(l, rank, false);
    case Kind::zb1p: return make_1f1b(l, rank, true);
    case Kind::dualpipe:
    case Kind::dualpipev: return detail::make_dualpipe_family(l, rank);
  }
  invalid("unknown schedule kind");
}

std::vector<std::vector<Op>> make_all_schedules(Kind kind, int num_ranks, int num_chunks) {
  std::vector<std::vector<Op>> all;
  all.reserve(num_ranks > 0 ? num_ranks : 0);
  for (int r = 0; r < num_ranks; ++r) all.push_back(make_schedule(kind, r, num_ranks, num_chunks));
  return all;
}

namespace {

bool same_messages(const MsgList& a, const MsgList& b) {
  if (a.size() != b.size()) return false;
  for (const Msg& m : a)
    if (std::find(b.begin(), b.end(), m) == b.end()) return false;
  return true;
}

// What has happened to one chunk so far (in the order of its rank's list).
struct ChunkState {
  uint8_t fwd = 0, input_bwd = 0, weight = 0, full_bwd = 0;
};

}  // namespace

std::string check_schedules(const Layout& l, const std::vector<std::vector<Op>>& ranks) {
  if (static_cast<int>(ranks.size()) != l.num_ranks)
    return "expected " + std::to_string(l.num_ranks) + " op lists, got " +
           std::to_string(ranks.size());
  const size_t per_dir = size_t(l.mbs_per_dir) * l.num_stages;
  std::vector<ChunkState> state(per_dir * l.num_dirs);
  auto index = [&](const Chunk& c) {
    return size_t(c.dir) * per_dir + size_t(c.mb - first_mb(l, c.dir)) * l.num_stages + c.stage;
  };
  for (int r = 0; r < l.num_ranks; ++r) {
    for (size_t i = 0; i < ranks[r].size(); ++i) {
      const Op& op = ranks[r][i];
      auto where = [&] {
        return "rank " + std::to_string(r) + " op " + std::to_string(i) + " " + to_string(op) + ": ";
      };
      const bool has_f = op.type == OpType::F || op.type == OpType::FB;
      const bool has_b = op.type != OpType::F;
      for (int part = 0; part < 2; ++part) {
        if ((part == 0 && !has_f) || (part == 1 && !has_b)) continue;
        const Chunk& c = part == 0 ? op.f : op.b;
        if (c.dir < 0 || c.dir >= l.num_dirs || c.stage < 0 || c.stage >= l.num_stages ||
            c.mb < first_mb(l, c.dir) || c.mb >= first_mb(l, c.dir) + l.mbs_per_dir)
          return where() + "chunk out of range for this layout";
        if (stage_rank(l, c.dir, c.stage) != r)
          return where() + "stage is held by rank " + std::to_string(stage_rank(l, c.dir, c.stage));
      }
      if (has_f) {
        ChunkState& s = state[index(op.f)];
        if (s.fwd++) return where() + "second forward of this chunk";
      }
      if (has_b) {
        ChunkState& s = state[index(op.b)];
        if (!s.fwd) return where() + "backward before the forward of this chunk";
        switch (op.type) {
          case OpType::B:
            if (s.input_bwd++ || s.full_bwd) return where() + "second backward of this chunk";
            break;
          case OpType::W:
            if (!s.input_bwd) return where() + "W before the B of this chunk";
            if (s.weight++) return where() + "second W of this chunk";
            break;
          default:
            if (s.full_bwd++ || s.input_bwd) return where() + "second backward of this chunk";
        }
      }
      const Op expected = detail::with_expected_messages(l, op);
      if (!same_messages(op.recv, expected.recv))
        return where() + "receives do not match the layout";
      if (!same_messages(op.send, expected.send)) return where() + "sends do not match the layout";
    }
  }
  for (int d = 0; d < l.num_dirs; ++d)
    for (int m = first_mb(l, d); m < first_mb(l, d) + l.mbs_per_dir; ++m)
      for (int s = 0; s < l.num_stages; ++s) {
        const Chunk c{m, s, int8_t(d)};
        const ChunkState& st = state[index(c)];
        const bool complete =
            st.fwd == 1 && ((st.full_bwd == 1 && !st.input_bwd && !st.weight) ||
                            (!st.full_bwd && st.input_bwd == 1 && st.weight == 1));
        if (!complete)
          return "chunk " + to_string(c) + " (rank " + std::to_string(stage_rank(l, d, s)) +
                 ") does not run exactly one forward and one complete backward";
      }
  return "";
}

}  // namespace troupe::sched
