// Measured pipeline bubble vs the published formulas (ZB paper table 2;
// DualPipe README table), for PP in {2, 4, 8, 16, 32} and several chunk
// counts, with costs chosen so that the terms are distinguishable.
//
// What is measured (actors/schedule/pipeline_sim.hpp): every rank starts at 0; the
// bubble of rank r is makespan - (sum of r's op costs); the bubble of a
// schedule is the largest over ranks (the idle time of the least busy rank).
// Notation as in the DualPipe README: F forward chunk, B FULL backward chunk,
// W its weight part (a split input-only backward costs B-W), FB an overlapped
// forward + backward pair. Zero p2p latency, as the formulas assume.
//
// Conditions under which each formula is exact (found by sweeping costs; the
// formulas come from figures where all cells have one width):
//   1F1B   (PP-1)(F+B)            any costs, any C >= 1; every rank idles the same.
//   ZB-H1  (PP-1)(F+B-2W)         W <= F and W <= B-W, C >= PP; every rank the same.
//   DualPipe (PP/2-1)(FB+B-3W)    F == B-W (a forward takes as long as an
//          input-only backward, as in the reference figure), W <= F,
//          B <= FB <= F+B; PP even, C even and >= 2PP. The largest bubble is
//          on the two middle ranks (they run one pair fewer overlapped); rank
//          h = min(r, PP-1-r) < PP/2-1 idles (PP/2-2-h)(F+B-FB) less. When
//          F != B-W the measured bubble differs from the formula (see the
//          sweep in bench/pipeline_sim and bench/RESULTS.md).
//   DualPipeV: the README's PP is the number of STAGES, on PP/2 devices. On R
//          ranks (2R stages) the bubble is (2R/2-1)(FB+B-3W) = (R-1)(FB+B-3W),
//          under the same conditions, C >= 2R. It equals DualPipe on 2R ranks.
#include <gtest/gtest.h>

#include <string>

#include "actors/schedule/pipeline_sim.hpp"
#include "actors/schedule/schedule.hpp"

namespace troupe::sched {
namespace {

struct Costs {
  double f, b, w, fb;
};
OpCosts op_costs(const Costs& c) {
  OpCosts o;
  o.f = c.f;
  o.b = c.b;
  o.w = c.w;
  o.fb = c.fb;
  return o;
}
std::string describe(const Costs& c) {
  return "F=" + std::to_string(c.f) + " B=" + std::to_string(c.b) + " W=" + std::to_string(c.w) +
         " FB=" + std::to_string(c.fb);
}

constexpr int kRanks[] = {2, 4, 8, 16, 32};

// All four terms differ in every set; across sets each term varies on its own.
constexpr Costs kGeneral[] = {{2, 3, 1, 4}, {3, 5, 1, 7}, {5, 7, 2, 11}, {4, 9, 2, 12}};
// F == B - W for the DualPipe family (the first is the example).
constexpr Costs kDualPipe[] = {{2, 3, 1, 4}, {3, 5, 2, 6}, {5, 7, 2, 10}, {4, 7, 3, 9}, {3, 4, 1, 7}};

TEST(ScheduleBubble, OneFOneB) {
  for (const Costs& c : kGeneral)
    for (int pp : kRanks)
      for (int chunks : {1, pp / 2 + 1, pp, 2 * pp, 3 * pp, 4 * pp}) {
        const SimResult res = simulate(make_all_schedules(Kind::one_f_one_b, pp, chunks), op_costs(c));
        ASSERT_TRUE(res.completed);
        const double formula = (pp - 1) * (c.f + c.b);
        for (int r = 0; r < pp; ++r)
          EXPECT_DOUBLE_EQ(res.bubble(r), formula) << describe(c) << " pp=" << pp << " C=" << chunks << " rank " << r;
      }
}

TEST(ScheduleBubble, ZeroBubbleH1) {
  for (const Costs& c : kGeneral) {
    ASSERT_LE(c.w, c.f);
    ASSERT_LE(c.w, c.b - c.w);
    for (int pp : kRanks)
      for (int chunks : {pp, 2 * pp, 3 * pp, 4 * pp}) {
        const SimResult res = simulate(make_all_schedules(Kind::zb1p, pp, chunks), op_costs(c));
        ASSERT_TRUE(res.completed);
        const double formula = (pp - 1) * (c.f + c.b - 2 * c.w);
        for (int r = 0; r < pp; ++r)
          EXPECT_DOUBLE_EQ(res.bubble(r), formula) << describe(c) << " pp=" << pp << " C=" << chunks << " rank " << r;
      }
  }
}

// Shared by DualPipe (pp ranks = pp stages) and DualPipeV on pp/2 ranks.
void expect_dualpipe_bubble(const SimResult& res, const Costs& c, int stages, int ranks,
                            const std::string& where) {
  ASSERT_TRUE(res.completed) << where;
  const int half = stages / 2;
  const double formula = (half - 1) * (c.fb + c.b - 3 * c.w);
  EXPECT_DOUBLE_EQ(res.max_bubble(), formula) << where;
  for (int r = 0; r < ranks; ++r) {
    // Half-rank of r in the DualPipe numbering (DualPipeV rank r is h = r).
    const int h = ranks == stages ? std::min(r, stages - 1 - r) : r;
    const double expect = h >= half - 2 ? formula : formula - (half - 2 - h) * (c.f + c.b - c.fb);
    EXPECT_DOUBLE_EQ(res.bubble(r), expect) << where << " rank " << r;
  }
}

TEST(ScheduleBubble, DualPipe) {
  for (const Costs& c : kDualPipe) {
    ASSERT_EQ(c.f, c.b - c.w);
    for (int pp : kRanks)
      for (int chunks : {2 * pp, 2 * pp + 2, 3 * pp, 4 * pp, 6 * pp}) {
        if (chunks % 2) continue;
        const SimResult res = simulate(make_all_schedules(Kind::dualpipe, pp, chunks), op_costs(c));
        expect_dualpipe_bubble(res, c, pp, pp,
                               describe(c) + " pp=" + std::to_string(pp) + " C=" + std::to_string(chunks));
      }
  }
}

TEST(ScheduleBubble, DualPipeV) {
  for (const Costs& c : kDualPipe)
    for (int stages : {2, 4, 8, 16, 32, 64}) {
      const int ranks = stages / 2;
      for (int chunks : {2 * ranks, 2 * ranks + 1, 3 * ranks, 4 * ranks}) {
        const SimResult res = simulate(make_all_schedules(Kind::dualpipev, ranks, chunks), op_costs(c));
        expect_dualpipe_bubble(res, c, stages, ranks,
                               describe(c) + " ranks=" + std::to_string(ranks) + " C=" + std::to_string(chunks));
      }
    }
}

// DualPipeV on R ranks is DualPipe on 2R ranks folded in half: with any costs
// (here ones where the formula does not hold) the step takes the same time.
TEST(ScheduleBubble, DualPipeVIsDualPipeFolded) {
  const OpCosts c = op_costs({3, 5, 1, 7});
  for (int ranks : {1, 2, 4, 8, 16}) {
    const int per_dir = 3 * ranks;
    const SimResult v = simulate(make_all_schedules(Kind::dualpipev, ranks, per_dir), c);
    const SimResult d = simulate(make_all_schedules(Kind::dualpipe, 2 * ranks, 2 * per_dir), c);
    ASSERT_TRUE(v.completed && d.completed);
    EXPECT_DOUBLE_EQ(v.makespan, d.makespan) << ranks;
    for (int r = 0; r < ranks; ++r) EXPECT_DOUBLE_EQ(v.busy[r], d.busy[r]) << ranks << " rank " << r;
  }
}

TEST(ScheduleBubble, SequentialReference) {
  const Costs c = kGeneral[1];
  for (int pp : {1, 2, 4, 8, 16, 32})
    for (int chunks : {1, 4, 9}) {
      const SimResult res = simulate(make_all_schedules(Kind::sequential, pp, chunks), op_costs(c));
      ASSERT_TRUE(res.completed);
      EXPECT_DOUBLE_EQ(res.makespan, chunks * pp * (c.f + c.b));
      EXPECT_DOUBLE_EQ(res.max_bubble(), chunks * (pp - 1) * (c.f + c.b));
    }
}

}  // namespace
}  // namespace troupe::sched
