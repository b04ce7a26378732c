// The discrete-event pipeline simulator (actors/schedule/pipeline_sim.hpp): exact
// hand-computed timelines, latency, per-rank speed, deadlock reports, bad
// input, and an independent re-check of every op's start time.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <string>
#include <tuple>

#include "actors/schedule/pipeline_sim.hpp"
#include "actors/schedule/schedule.hpp"

namespace troupe::sched {
namespace {

OpCosts costs(double f, double b, double w, double fb, double latency = 0) {
  OpCosts c;
  c.f = f;
  c.b = b;
  c.w = w;
  c.fb = fb;
  c.latency = latency;
  return c;
}

// 1F1B, 2 ranks, 2 micro-batches, F=2, B=3, worked out by hand:
//   rank 0: F0 [0,2] F1 [2,4]            BW0 [7,10]      BW1 [12,15]
//   rank 1:          F0 [2,4] BW0 [4,7] F1 [7,9] BW1 [9,12]
TEST(PipelineSim, TwoRankOneFOneBByHand) {
  SimOptions opt;
  opt.record_timeline = true;
  const auto ranks = make_all_schedules(Kind::one_f_one_b, 2, 2);
  const SimResult res = simulate(ranks, costs(2, 3, 1, 4), opt);
  ASSERT_TRUE(res.completed) << res.error << res.deadlock;
  const std::vector<std::pair<double, double>> r0 = {{0, 2}, {2, 4}, {7, 10}, {12, 15}};
  const std::vector<std::pair<double, double>> r1 = {{2, 4}, {4, 7}, {7, 9}, {9, 12}};
  ASSERT_EQ(res.timeline[0].size(), r0.size());
  ASSERT_EQ(res.timeline[1].size(), r1.size());
  for (size_t i = 0; i < r0.size(); ++i) {
    EXPECT_EQ(res.timeline[0][i].start, r0[i].first) << i;
    EXPECT_EQ(res.timeline[0][i].end, r0[i].second) << i;
    EXPECT_EQ(res.timeline[1][i].start, r1[i].first) << i;
    EXPECT_EQ(res.timeline[1][i].end, r1[i].second) << i;
  }
  EXPECT_EQ(res.makespan, 15);
  EXPECT_EQ(res.busy[0], 10);
  EXPECT_EQ(res.bubble(1), 5);
  EXPECT_EQ(res.messages, 4u);  // 2 activations, 2 gradients
}

// Same pipeline with latency 1 on every message between ranks:
//   rank 1: F0 [3,5] BW0 [5,8] F1 [8,10] BW1 [10,13]; rank 0: BW0 [9,12] BW1 [14,17]
TEST(PipelineSim, LatencyDelaysEveryHop) {
  const auto ranks = make_all_schedules(Kind::one_f_one_b, 2, 2);
  const SimResult res = simulate(ranks, costs(2, 3, 1, 4, 1));
  ASSERT_TRUE(res.completed);
  EXPECT_EQ(res.makespan, 17);
  EXPECT_EQ(res.finish[1], 13);
}

// Sequential: each micro-batch crosses PP-1 hops each way before the next
// starts, so bubble = C * ((PP-1)(F+B) + 2(PP-1) latency) on every rank.
TEST(PipelineSim, SequentialWithLatencyMatchesClosedForm) {
  for (int pp : {1, 2, 4, 8})
    for (int chunks : {1, 3, 8}) {
      const OpCosts c = costs(2, 3, 1, 4, 0.5);
      const SimResult res = simulate(make_all_schedules(Kind::sequential, pp, chunks), c);
      ASSERT_TRUE(res.completed);
      const double expect = chunks * ((pp - 1) * (c.f + c.b) + 2 * (pp - 1) * c.latency);
      for (int r = 0; r < pp; ++r) EXPECT_DOUBLE_EQ(res.bubble(r), expect) << pp << " " << chunks;
    }
}

TEST(PipelineSim, LatencyNeverShortensAStep) {
  for (Kind kind : {Kind::sequential, Kind::one_f_one_b, Kind::zb1p, Kind::dualpipe, Kind::dualpipev}) {
    const auto ranks = make_all_schedules(kind, 8, 32);
    double last = 0;
    for (double lat : {0.0, 0.25, 1.0, 4.0}) {
      const SimResult res = simulate(ranks, costs(2, 3, 1, 4, lat));
      ASSERT_TRUE(res.completed);
      EXPECT_GE(res.makespan, last) << to_string(kind) << " latency " << lat;
      last = res.makespan;
    }
  }
}

TEST(PipelineSim, SlowRankScalesItsOps) {
  const auto ranks = make_all_schedules(Kind::one_f_one_b, 4, 8);
  const OpCosts c = costs(2, 3, 1, 4);
  const SimResult base = simulate(ranks, c);
  SimOptions opt;
  opt.rank_scale = {1, 1, 2, 1};
  const SimResult slow = simulate(ranks, c, opt);
  ASSERT_TRUE(slow.completed);
  EXPECT_EQ(slow.busy[2], 2 * base.busy[2]);
  EXPECT_EQ(slow.busy[1], base.busy[1]);
  // The slow rank is busy for 8*(2+3)*2 = 80 and cannot start before F
  // reaches it (2 hops of F=2), so the step takes at least 84.
  EXPECT_GE(slow.makespan, 84);
  EXPECT_GT(slow.makespan, base.makespan);
}

// Rank 0 runs micro-batch 0 to the end before starting 1; rank 1 wants 1
// first. Neither can move: the report names both and what they wait for.
TEST(PipelineSim, ReportsDeadlockWithWhoWaitsOnWhat) {
  auto ranks = make_all_schedules(Kind::sequential, 2, 2);
  std::swap(ranks[1][0], ranks[1][2]);  // rank 1: F1, BW0, F0, BW1
  std::swap(ranks[1][1], ranks[1][3]);  // rank 1: F1, BW1, F0, BW0
  const SimResult res = simulate(ranks, costs(1, 2, 1, 3));
  EXPECT_FALSE(res.completed);
  EXPECT_TRUE(res.error.empty()) << res.error;
  EXPECT_NE(res.deadlock.find("rank 0 blocked at op 1 BW(mb0 d0 s0) waiting for gradient of mb0 d0 s0"),
            std::string::npos)
      << res.deadlock;
  EXPECT_NE(res.deadlock.find("rank 1 blocked at op 0 F(mb1 d0 s1) waiting for activation of mb1 d0 s1"),
            std::string::npos)
      << res.deadlock;
}

TEST(PipelineSim, WBeforeItsBIsADeadlockNotACrash) {
  auto ranks = make_all_schedules(Kind::zb1p, 2, 2);
  // Rank 1 (lag 1) ends with W(mb1); put it first.
  std::rotate(ranks[1].begin(), ranks[1].end() - 1, ranks[1].end());
  const SimResult res = simulate(ranks, costs(2, 3, 1, 4));
  EXPECT_FALSE(res.completed);
  EXPECT_NE(res.deadlock.find("rank 1 blocked at op 0 W(mb1 d0 s1) waiting for its B of mb1 d0 s1"),
            std::string::npos)
      << res.deadlock;
}

TEST(PipelineSim, RejectsBadInputWithAClearError) {
  const auto good = make_all_schedules(Kind::one_f_one_b, 2, 2);
  auto neg = good;
  neg[0][0].f.mb = -3;
  EXPECT_NE(simulate(neg, costs(1, 2, 1, 3)).error.find("negative chunk field"), std::string::npos);

  auto twice = good;
  twice[0].insert(twice[0].begin() + 1, twice[0][0]);  // F0 twice
  EXPECT_NE(simulate(twice, costs(1, 2, 1, 3)).error.find("repeats work"), std::string::npos);

  auto two_ranks = good;
  two_ranks[1].insert(two_ranks[1].begin(), good[0][0]);  // rank 1 runs stage 0's F0
  const SimResult r2 = simulate(two_ranks, costs(1, 2, 1, 3));
  EXPECT_FALSE(r2.completed);
  EXPECT_NE(r2.error.find("another rank"), std::string::npos) << r2.error;

  EXPECT_NE(simulate(good, costs(1, 1, 2, 3)).error.find("W cost exceeds"), std::string::npos);
  EXPECT_NE(simulate(good, costs(-1, 1, 0, 3)).error.find(">= 0"), std::string::npos);
  SimOptions opt;
  opt.rank_scale = {1};
  EXPECT_NE(simulate(good, costs(1, 2, 1, 3), opt).error.find("rank_scale has 1 entries"),
            std::string::npos);
}

// Recomputes every op's start from the recorded timeline alone: it must be the
// later of the rank's previous op end and each dependency's ready time.
TEST(PipelineSim, EveryOpStartsExactlyWhenItsDependenciesAllowIt) {
  for (Kind kind : {Kind::one_f_one_b, Kind::zb1p, Kind::dualpipe, Kind::dualpipev}) {
    const int pp = 8, chunks = 24;
    const auto ranks = make_all_schedules(kind, pp, chunks);
    const OpCosts c = costs(2, 3, 1, 4, 0.5);
    SimOptions opt;
    opt.record_timeline = true;
    const SimResult res = simulate(ranks, c, opt);
    ASSERT_TRUE(res.completed);
    using Key = std::tuple<int, int, int>;  // mb, dir, stage
    std::map<Key, double> f_end, b_end;
    std::map<Key, int> f_rank, b_rank;
    auto key = [](const Chunk& ch) { return Key{ch.mb, ch.dir, ch.stage}; };
    for (int r = 0; r < pp; ++r)
      for (size_t i = 0; i < ranks[r].size(); ++i) {
        const Op& op = ranks[r][i];
        if (op.type == OpType::F || op.type == OpType::FB) {
          f_end[key(op.f)] = res.timeline[r][i].end;
          f_rank[key(op.f)] = r;
        }
        if (op.type == OpType::B || op.type == OpType::BW || op.type == OpType::FB) {
          b_end[key(op.b)] = res.timeline[r][i].end;
          b_rank[key(op.b)] = r;
        }
      }
    const Layout l = make_layout(kind, pp, chunks);
    for (int r = 0; r < pp; ++r)
      for (size_t i = 0; i < ranks[r].size(); ++i) {
        const Op& op = ranks[r][i];
        double ready = i ? res.timeline[r][i - 1].end : 0.0;
        auto hop = [&](int from) { return from == r ? 0.0 : c.latency; };
        if ((op.type == OpType::F || op.type == OpType::FB) && op.f.stage > 0) {
          const Key prev{op.f.mb, op.f.dir, op.f.stage - 1};
          ready = std::max(ready, f_end.at(prev) + hop(f_rank.at(prev)));
        }
        if (op.type == OpType::B || op.type == OpType::BW || op.type == OpType::FB) {
          ready = std::max(ready, f_end.at(key(op.b)));
          if (op.b.stage + 1 < l.num_stages) {
            const Key next{op.b.mb, op.b.dir, op.b.stage + 1};
            ready = std::max(ready, b_end.at(next) + hop(b_rank.at(next)));
          }
        }
        if (op.type == OpType::W) ready = std::max(ready, b_end.at(key(op.b)));
        EXPECT_DOUBLE_EQ(res.timeline[r][i].start, ready) << to_string(kind) << " rank " << r << " op " << i;
        EXPECT_DOUBLE_EQ(res.timeline[r][i].end - res.timeline[r][i].start, c.cost(op.type));
      }
  }
}

}  // namespace
}  // namespace troupe::sched
