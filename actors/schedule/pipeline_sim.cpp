// Discrete-event simulator of pipeline op lists (see pipeline_sim.hpp).
//
// There is no contention other than a rank's own serial order, so the
// simulation needs no global event queue: a rank runs ops until one depends
// on something that has not happened yet, then parks on that chunk; whatever
// makes it happen wakes the rank. Processing ranks in any order gives the
// same times, because an op's start depends only on its rank's previous op
// and on events whose times are already final.
#include "actors/schedule/pipeline_sim.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

namespace troupe::sched {

double OpCosts::cost(OpType type) const {
  switch (type) {
    case OpType::F: return f;
    case OpType::B: return b - w;
    case OpType::W: return w;
    case OpType::BW: return b;
    case OpType::FB: return fb;
  }
  return 0;
}

double SimResult::max_bubble() const {
  double m = 0;
  for (size_t r = 0; r < busy.size(); ++r) m = std::max(m, bubble(int(r)));
  return m;
}

double SimResult::min_bubble() const {
  double m = std::numeric_limits<double>::infinity();
  for (size_t r = 0; r < busy.size(); ++r) m = std::min(m, bubble(int(r)));
  return busy.empty() ? 0 : m;
}

namespace {

constexpr double kNotYet = std::numeric_limits<double>::quiet_NaN();

// Everything that can happen to one chunk, and the one rank parked on it.
struct ChunkEvents {
  double activation = kNotYet;  // arrival time of its input activation
  double gradient = kNotYet;    // arrival time of its output gradient
  double forward = kNotYet;     // end of its F (on its own rank)
  double input_bwd = kNotYet;   // end of its B / BW / FB backward part
  int32_t waiter = -1;
  int32_t owner = -1;           // the rank that runs its ops
};

// Dense numbering of the chunks that appear in the op lists: per (dir, stage)
// the range of micro-batch ids seen, laid out one after another.
class ChunkIndex {
 public:
  std::string build(const std::vector<std::vector<Op>>& ranks) {
    int dirs = 0, stages = 0;
    auto visit_dims = [&](const Chunk& c) {
      dirs = std::max(dirs, int(c.dir) + 1);
      stages = std::max(stages, c.stage + 1);
    };
    std::string bad;
    for_each_chunk(ranks, [&](const Chunk& c, int r, size_t i) {
      if (c.mb < 0 || c.stage < 0 || c.dir < 0) {
        if (bad.empty())
          bad = "rank " + std::to_string(r) + " op " + std::to_string(i) + ": negative chunk field";
        return;
      }
      visit_dims(c);
    });
    if (!bad.empty()) return bad;
    stages_ = stages;
    lo_.assign(size_t(dirs) * stages, std::numeric_limits<int>::max());
    hi_.assign(size_t(dirs) * stages, -1);
    for_each_chunk(ranks, [&](const Chunk& c, int, size_t) {
      const size_t k = size_t(c.dir) * stages + c.stage;
      lo_[k] = std::min(lo_[k], c.mb);
      hi_[k] = std::max(hi_[k], c.mb);
    });
    offset_.assign(lo_.size() + 1, 0);
    for (size_t k = 0; k < lo_.size(); ++k)
      offset_[k + 1] = offset_[k] + (hi_[k] >= lo_[k] ? size_t(hi_[k] - lo_[k] + 1) : 0);
    return "";
  }
  size_t size() const { return offset_.empty() ? 0 : offset_.back(); }
  size_t operator()(const Chunk& c) const {
    const size_t k = size_t(c.dir) * stages_ + c.stage;
    return offset_[k] + size_t(c.mb - lo_[k]);
  }

 private:
  template <class Fn>
  static void for_each_chunk(const std::vector<std::vector<Op>>& ranks, Fn&& fn) {
    for (size_t r = 0; r < ranks.size(); ++r)
      for (size_t i = 0; i < ranks[r].size(); ++i) {
        const Op& op = ranks[r][i];
        if (op.type == OpType::F || op.type == OpType::FB) fn(op.f, int(r), i);
        if (op.type != OpType::F) fn(op.b, int(r), i);
        for (const Msg& m : op.recv) fn(m.to, int(r), i);
        for (const Msg& m : op.send) fn(m.to, int(r), i);
      }
  }
  int stages_ = 0;
  std::vector<int> lo_, hi_;
  std::vector<size_t> offset_;
};

struct Need {
  const char* what;  // for the deadlock report
  Chunk chunk;
  double ChunkEvents::*field;
};

// The events `op` needs before it can start (at most three: two messages and
// the local forward, or the local B for a W).
int needs_of(const Op& op, Need out[4]) {
  int n = 0;
  for (const Msg& m : op.recv)
    out[n++] = m.kind == MsgKind::activation
                   ? Need{"activation", m.to, &ChunkEvents::activation}
                   : Need{"gradient", m.to, &ChunkEvents::gradient};
  if (op.type == OpType::W) {
    out[n++] = Need{"its B", op.b, &ChunkEvents::input_bwd};
  } else if (op.type != OpType::F) {
    out[n++] = Need{"its forward", op.b, &ChunkEvents::forward};
  }
  return n;
}

}  // namespace

SimResult simulate(const std::vector<std::vector<Op>>& ranks, const OpCosts& costs,
                   const SimOptions& options) {
  SimResult res;
  const int R = int(ranks.size());
  for (double c : {costs.f, costs.b, costs.w, costs.fb, costs.latency})
    if (!(c >= 0) || !std::isfinite(c)) res.error = "op costs must be finite and >= 0";
  if (costs.w > costs.b) res.error = "W cost exceeds the full backward cost B";
  if (!options.rank_scale.empty() && int(options.rank_scale.size()) != R)
    res.error = "rank_scale has " + std::to_string(options.rank_scale.size()) +
                " entries for " + std::to_string(R) + " ranks";
  for (double s : options.rank_scale)
    if (!(s > 0) || !std::isfinite(s)) res.error = "rank_scale entries must be finite and > 0";
  ChunkIndex index;
  if (res.error.empty()) res.error = index.build(ranks);
  if (!res.error.empty()) return res;

  std::vector<ChunkEvents> ev(index.size());
  std::vector<size_t> pc(R, 0);
  std::vector<double> free_at(R, 0.0);
  res.busy.assign(R, 0.0);
  res.finish.assign(R, 0.0);
  if (options.record_timeline) {
    res.timeline.resize(R);
    for (int r = 0; r < R; ++r) res.timeline[r].resize(ranks[r].size());
  }
  std::vector<int> ready(R);
  for (int r = 0; r < R; ++r) ready[r] = R - 1 - r;  // pop rank 0 first (any order works)

  auto fail = [&](int r, size_t i, const std::string& why) {
    res.error = "rank " + std::to_string(r) + " op " + std::to_string(i) + " " +
                to_string(ranks[r][i]) + ": " + why;
  };
  // Records that rank r runs ops on chunk c; two ranks on one chunk is bad input.
  auto claim = [&](int r, const Chunk& c) {
    ChunkEvents& e = ev[index(c)];
    if (e.owner == -1) e.owner = r;
    return e.owner == r;
  };

  while (!ready.empty() && res.error.empty()) {
    const int r = ready.back();
    ready.pop_back();
    const double scale = options.rank_scale.empty() ? 1.0 : options.rank_scale[r];
    while (pc[r] < ranks[r].size()) {
      const size_t i = pc[r];
      const Op& op = ranks[r][i];
      Need need[4];
      const int n = needs_of(op, need);
      double start = free_at[r];
      bool blocked = false;
      for (int k = 0; k < n; ++k) {
        ChunkEvents& e = ev[index(need[k].chunk)];
        const double t = e.*need[k].field;
        if (std::isnan(t)) {
          if (e.waiter != -1 && e.waiter != r) {
            fail(r, i, "chunk " + to_string(need[k].chunk) + " is awaited by two ranks");
            break;
          }
          e.waiter = r;
          blocked = true;
          break;
        }
        start = std::max(start, t);
      }
      if (blocked || !res.error.empty()) break;
      if ((op.type == OpType::F || op.type == OpType::FB) && !claim(r, op.f)) {
        fail(r, i, "chunk " + to_string(op.f) + " also runs on another rank");
        break;
      }
      if (op.type != OpType::F && !claim(r, op.b)) {
        fail(r, i, "chunk " + to_string(op.b) + " also runs on another rank");
        break;
      }
      const double cost = costs.cost(op.type) * scale;
      const double end = start + cost;
      free_at[r] = end;
      res.busy[r] += cost;
      if (options.record_timeline) res.timeline[r][i] = {start, end};
      ++res.ops_run;

      auto happen = [&](const Chunk& c, double ChunkEvents::*field, double t) {
        ChunkEvents& e = ev[index(c)];
        if (!std::isnan(e.*field)) return false;
        e.*field = t;
        if (e.waiter != -1) {
          ready.push_back(e.waiter);
          e.waiter = -1;
        }
        return true;
      };
      bool dup = false;
      if (op.type == OpType::F || op.type == OpType::FB)
        dup |= !happen(op.f, &ChunkEvents::forward, end);
      if (op.type == OpType::B || op.type == OpType::BW || op.type == OpType::FB)
        dup |= !happen(op.b, &ChunkEvents::input_bwd, end);
      for (const Msg& m : op.send) {
        const bool remote = m.peer != r;
        res.messages += remote ? 1 : 0;
        auto field = m.kind == MsgKind::activation ? &ChunkEvents::activation : &ChunkEvents::gradient;
        dup |= !happen(m.to, field, end + (remote ? costs.latency : 0.0));
      }
      if (dup) {
        fail(r, i, "repeats work or a message that already happened");
        break;
      }
      res.finish[r] = end;
      res.makespan = std::max(res.makespan, end);
      ++pc[r];
    }
  }
  if (!res.error.empty()) return res;

  int stuck = 0;
  for (int r = 0; r < R; ++r) {
    if (pc[r] == ranks[r].size()) continue;
    if (++stuck > 16) continue;  // the first few tell the story
    const Op& op = ranks[r][pc[r]];
    Need need[4];
    const int n = needs_of(op, need);
    std::string waits;
    for (int k = 0; k < n; ++k)
      if (std::isnan(ev[index(need[k].chunk)].*need[k].field))
        waits += std::string(waits.empty() ? "" : ", ") + need[k].what + " of " +
                 to_string(need[k].chunk);
    res.deadlock += "rank " + std::to_string(r) + " blocked at op " + std::to_string(pc[r]) +
                    " " + to_string(op) + " waiting for " + waits + "\n";
  }
  if (stuck > 16) res.deadlock += "... and " + std::to_string(stuck - 16) + " more ranks\n";
  res.completed = stuck == 0;
  return res;
}

}  // namespace troupe::sched
