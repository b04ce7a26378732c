// Structure of the pipeline schedules (actors/schedule/schedule.hpp): valid and
// invalid (kind, ranks, chunks) combinations, per-stage op counts, message
// lists, the checker catching broken lists, determinism, and a unit-cost
// simulation of every schedule finishing without deadlock.
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <cstdlib>
#include <map>
#include <stdexcept>
#include <string>
#include <tuple>

#include "actors/schedule/pipeline_sim.hpp"
#include "actors/schedule/schedule.hpp"

namespace troupe::sched {
namespace {

constexpr Kind kAllKinds[] = {Kind::sequential, Kind::one_f_one_b, Kind::zb1p, Kind::dualpipe,
                              Kind::dualpipev};
constexpr int kRanks[] = {2, 4, 8, 16, 32};

// Chunk counts exercised per kind: PP, 2PP, 3PP, 4PP where allowed, and for
// the DualPipe family (which needs >= 2PP, even for dualpipe) 2PP, 2PP+2,
// 3PP (rounded up to even), 4PP.
std::vector<int> chunk_counts(Kind kind, int pp) {
  if (kind == Kind::dualpipe || kind == Kind::dualpipev)
    return {2 * pp, 2 * pp + 2, (3 * pp + 1) / 2 * 2, 4 * pp};
  return {pp, 2 * pp, 3 * pp, 4 * pp};
}

std::string expect_invalid(Kind kind, int ranks, int chunks) {
  try {
    make_layout(kind, ranks, chunks);
  } catch (const std::invalid_argument& e) {
    return e.what();
  }
  ADD_FAILURE() << to_string(kind) << " " << ranks << "x" << chunks << " was accepted";
  return "";
}

TEST(ScheduleLayout, ParsesNamesAndRejectsUnknownOnes) {
  for (Kind k : kAllKinds) EXPECT_EQ(parse_kind(to_string(k)), k);
  try {
    parse_kind("gpipe");
    FAIL() << "accepted an unknown schedule";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find("dualpipev"), std::string::npos) << e.what();
  }
}

TEST(ScheduleLayout, RejectsInvalidCombinationsWithTheRule) {
  EXPECT_NE(expect_invalid(Kind::one_f_one_b, 0, 4).find("at least 1 rank"), std::string::npos);
  EXPECT_NE(expect_invalid(Kind::zb1p, 4, 0).find("at least 1 chunk"), std::string::npos);
  EXPECT_NE(expect_invalid(Kind::dualpipe, 3, 12).find("even number of ranks"), std::string::npos);
  EXPECT_NE(expect_invalid(Kind::dualpipe, 4, 7).find(">= 2 * ranks"), std::string::npos);
  EXPECT_NE(expect_invalid(Kind::dualpipe, 4, 6).find(">= 2 * ranks"), std::string::npos);
  EXPECT_NE(expect_invalid(Kind::dualpipev, 4, 7).find(">= 2 * ranks"), std::string::npos);
  EXPECT_THROW(make_schedule(Kind::one_f_one_b, 4, 4, 8), std::invalid_argument);
  EXPECT_THROW(make_schedule(Kind::one_f_one_b, -1, 4, 8), std::invalid_argument);
  // The boundary cases are accepted.
  EXPECT_NO_THROW(make_layout(Kind::dualpipe, 4, 8));
  EXPECT_NO_THROW(make_layout(Kind::dualpipev, 4, 9));  // odd is fine for the V
  EXPECT_NO_THROW(make_layout(Kind::one_f_one_b, 8, 1));
}

TEST(ScheduleLayout, StagePlacement) {
  const Layout dp = make_layout(Kind::dualpipe, 8, 16);
  EXPECT_EQ(dp.num_dirs, 2);
  EXPECT_EQ(dp.mbs_per_dir, 8);
  for (int s = 0; s < 8; ++s) {
    EXPECT_EQ(stage_rank(dp, 0, s), s);
    EXPECT_EQ(stage_rank(dp, 1, s), 7 - s);
  }
  EXPECT_EQ(first_mb(dp, 1), 8);
  const Layout v = make_layout(Kind::dualpipev, 4, 8);
  EXPECT_EQ(v.num_stages, 8);
  const int expect_v[8] = {0, 1, 2, 3, 3, 2, 1, 0};
  for (int s = 0; s < 8; ++s) EXPECT_EQ(stage_rank(v, 0, s), expect_v[s]);
}

// Per (direction, stage): C_dir forwards and C_dir complete backwards, as many
// W's as split B's, FB only in the DualPipe family, W only where B is split.
TEST(ScheduleStructure, EveryStageRunsEachMicrobatchOnceEachWay) {
  for (Kind kind : kAllKinds)
    for (int pp : kRanks)
      for (int chunks : chunk_counts(kind, pp)) {
        SCOPED_TRACE(std::string(to_string(kind)) + " pp=" + std::to_string(pp) +
                     " C=" + std::to_string(chunks));
        const Layout l = make_layout(kind, pp, chunks);
        const auto ranks = make_all_schedules(kind, pp, chunks);
        ASSERT_EQ(check_schedules(l, ranks), "");
        std::map<std::pair<int, int>, std::array<int, 4>> count;  // (dir, stage) -> F, Bfull, B, W
        for (const auto& ops : ranks)
          for (const Op& op : ops) {
            if (op.type == OpType::F || op.type == OpType::FB) ++count[{op.f.dir, op.f.stage}][0];
            if (op.type == OpType::BW || op.type == OpType::FB) ++count[{op.b.dir, op.b.stage}][1];
            if (op.type == OpType::B) ++count[{op.b.dir, op.b.stage}][2];
            if (op.type == OpType::W) ++count[{op.b.dir, op.b.stage}][3];
            const bool dual = kind == Kind::dualpipe || kind == Kind::dualpipev;
            if (op.type == OpType::FB) {
              EXPECT_TRUE(dual);
            }
            if (op.type == OpType::B || op.type == OpType::W) {
              EXPECT_TRUE(dual || kind == Kind::zb1p);
            }
            if (kind == Kind::zb1p) {
              EXPECT_NE(op.type, OpType::BW);
            }
          }
        ASSERT_EQ(count.size(), size_t(l.num_dirs * l.num_stages));
        for (const auto& [where, n] : count) {
          EXPECT_EQ(n[0], l.mbs_per_dir) << "forwards at dir " << where.first << " stage " << where.second;
          EXPECT_EQ(n[1] + n[2], l.mbs_per_dir) << "backwards at stage " << where.second;
          EXPECT_EQ(n[2], n[3]) << "W's at stage " << where.second;
        }
      }
}

// The runtime runs W as the deferred weight pass of a split B (rank_actor):
// its gradients stay bitwise those of the full backward only if, on every
// stage, the weight gradients of the micro-batches are added in the order
// their input passes ran (W's in B order, and no full backward of a later
// micro-batch overtakes a pending W).
TEST(ScheduleStructure, WeightPassesFollowTheInputPassOrderPerStage) {
  for (Kind kind : kAllKinds)
    for (int pp : kRanks)
      for (int chunks : chunk_counts(kind, pp)) {
        SCOPED_TRACE(std::string(to_string(kind)) + " pp=" + std::to_string(pp) +
                     " C=" + std::to_string(chunks));
        std::map<std::pair<int, int>, std::vector<int>> input, weight;  // (dir, stage) -> mbs in order
        for (const auto& ops : make_all_schedules(kind, pp, chunks))
          for (const Op& op : ops) {
            const std::pair<int, int> at{op.b.dir, op.b.stage};
            if (op.type == OpType::BW || op.type == OpType::FB || op.type == OpType::B) input[at].push_back(op.b.mb);
            if (op.type == OpType::BW || op.type == OpType::FB || op.type == OpType::W) weight[at].push_back(op.b.mb);
          }
        ASSERT_FALSE(input.empty());
        for (const auto& [at, mbs] : input) EXPECT_EQ(weight[at], mbs) << "dir " << at.first << " stage " << at.second;
      }
}

TEST(ScheduleStructure, UnitCostRunHasNoDeadlockAndRunsEveryOp) {
  OpCosts unit;
  unit.f = unit.b = unit.fb = 1;
  unit.w = 0.5;
  for (Kind kind : kAllKinds)
    for (int pp : kRanks)
      for (int chunks : chunk_counts(kind, pp)) {
        const auto ranks = make_all_schedules(kind, pp, chunks);
        const SimResult res = simulate(ranks, unit);
        size_t total = 0;
        for (const auto& ops : ranks) total += ops.size();
        EXPECT_TRUE(res.completed) << to_string(kind) << " pp=" << pp << " C=" << chunks << "\n"
                                   << res.error << res.deadlock;
        EXPECT_EQ(res.ops_run, total);
      }
}

TEST(ScheduleStructure, MessagesFollowTheLayout) {
  // Every op on a dualpipe rank talks only to its neighbours, and an FB op
  // carries both an activation and a gradient in each direction it can.
  const int pp = 8;
  const auto ranks = make_all_schedules(Kind::dualpipe, pp, 32);
  for (int r = 0; r < pp; ++r)
    for (const Op& op : ranks[r]) {
      for (const Msg& m : op.recv) EXPECT_EQ(std::abs(m.peer - r), 1) << to_string(op);
      for (const Msg& m : op.send) EXPECT_EQ(std::abs(m.peer - r), 1) << to_string(op);
      if (op.type == OpType::W) {
        EXPECT_EQ(op.recv.size() + op.send.size(), 0u);
      }
    }
  // DualPipeV: the tip of the V is a hand-off on the last rank itself.
  const auto v = make_all_schedules(Kind::dualpipev, 4, 8);
  bool local = false;
  for (const Op& op : v[3])
    for (const Msg& m : op.send) local |= m.peer == 3;
  EXPECT_TRUE(local);
}

TEST(ScheduleStructure, SameInputsSameOpList) {
  for (Kind kind : kAllKinds) {
    const int pp = 8, chunks = 24;
    const auto a = make_all_schedules(kind, pp, chunks);
    const auto b = make_all_schedules(kind, pp, chunks);
    ASSERT_EQ(a.size(), b.size());
    for (int r = 0; r < pp; ++r) {
      ASSERT_EQ(a[r].size(), b[r].size());
      for (size_t i = 0; i < a[r].size(); ++i) EXPECT_EQ(to_string(a[r][i]), to_string(b[r][i]));
    }
  }
}

TEST(ScheduleCheck, CatchesBrokenLists) {
  const Layout l = make_layout(Kind::zb1p, 4, 8);
  const auto good = make_all_schedules(Kind::zb1p, 4, 8);
  ASSERT_EQ(check_schedules(l, good), "");

  auto dropped = good;
  dropped[2].pop_back();  // a W goes missing
  EXPECT_NE(check_schedules(l, dropped).find("exactly one forward and one complete backward"),
            std::string::npos);

  auto early_w = good;  // move the last W to the front of rank 1
  std::rotate(early_w[1].begin(), early_w[1].end() - 1, early_w[1].end());
  EXPECT_NE(check_schedules(l, early_w).find("backward before the forward"), std::string::npos);

  auto wrong_rank = good;
  std::swap(wrong_rank[0], wrong_rank[1]);
  EXPECT_NE(check_schedules(l, wrong_rank).find("held by rank"), std::string::npos);

  auto bad_msg = good;
  bad_msg[1][0].recv.items[0].peer = 3;
  EXPECT_NE(check_schedules(l, bad_msg).find("receives do not match"), std::string::npos);

  EXPECT_NE(check_schedules(l, {good[0]}).find("expected 4 op lists"), std::string::npos);
}

}  // namespace
}  // namespace troupe::sched
