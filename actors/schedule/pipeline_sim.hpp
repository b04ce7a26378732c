// Discrete-event simulation of pipeline op lists (actors/schedule/schedule.hpp) with
// per-op costs: each rank runs its ops strictly in list order, an op starts
// when its rank is free and everything it depends on has happened, and lasts
// its cost. It detects deadlock and reports which ranks wait on what.
//
// Dependencies of an op (what the runtime enforces with messages):
//   F of (mb,d,s)      the activation of (mb,d,s-1), if s > 0 (a message)
//   B / BW of (mb,d,s) the gradient from (mb,d,s+1), if s < S-1 (a message),
//                      and the F of (mb,d,s) (local: it ran earlier on this rank)
//   W of (mb,d,s)      the B of (mb,d,s) (local)
//   FB                 both of the above for its F part and its B part
// A message sent to another rank arrives `latency` after the op that sends it
// ends; a hand-off to the same rank arrives at once.
//
// What is measured. Every rank starts the step at time 0. makespan = the end
// of the last op on any rank. busy(r) = the sum of rank r's op costs.
// bubble(r) = makespan - busy(r): the time rank r is idle within the step.
// This is the quantity of the published bubble formulas (ZB paper, table 2;
// DualPipe README): with equal per-stage costs, 1F1B idles (PP-1)(F+B) on
// every rank, ZB-H1 (PP-1)(F+B-2W) (B = full backward), and DualPipe's
// figure is (PP/2-1)(F&B+B-3W). Ranks whose op mix differs (DualPipe runs
// more overlapped pairs on some ranks) have different busy times, so the
// result keeps bubble per rank; see tests/actors/schedule_bubble_test.cpp for which
// rank each formula describes.
#pragma once

#include <string>
#include <vector>

#include "actors/schedule/schedule.hpp"

namespace troupe::sched {

// Costs of one op, in any time unit. Names follow the DualPipe README: `b` is
// the FULL backward of a chunk, `w` its weight part, so a split B (inputs
// only) costs b - w, and `fb` is an overlapped forward + full backward.
struct OpCosts {
  double f = 1;
  double b = 2;
  double w = 1;
  double fb = 3;
  double latency = 0;  // point-to-point message latency between ranks
  double cost(OpType type) const;
};

struct SimOptions {
  // Per-rank multiplier of op costs (a slow or fast device); empty means 1.
  std::vector<double> rank_scale;
  // Keep the start/end of every op (for traces and tests).
  bool record_timeline = false;
};

struct OpSpan {
  double start = 0;
  double end = 0;
};

struct SimResult {
  bool completed = false;
  // Bad input (an op with an out-of-range chunk, a message sent twice, a
  // chunk touched by two ranks, costs that make no sense): what and where.
  std::string error;
  // When every rank is stuck: each blocked rank, its next op and what it is
  // waiting for. Empty when the run completed or failed with `error`.
  std::string deadlock;
  double makespan = 0;
  std::vector<double> busy;    // per rank: sum of its op costs
  std::vector<double> finish;  // per rank: end of its last op
  std::vector<std::vector<OpSpan>> timeline;  // per rank, per op, if recorded
  size_t ops_run = 0;
  size_t messages = 0;  // messages between different ranks

  double bubble(int rank) const { return makespan - busy[rank]; }
  double max_bubble() const;
  double min_bubble() const;
};

SimResult simulate(const std::vector<std::vector<Op>>& ranks, const OpCosts& costs,
                   const SimOptions& options = {});

}  // namespace troupe::sched
