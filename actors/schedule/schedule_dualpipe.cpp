// DualPipe and DualPipeV op lists.
//
// Both run the same eight phases per rank (the order of DeepSeek's reference
// schedule; the code is ours). A rank has two "phases", i.e. two stages it
// holds:
//   dualpipe   PP ranks, N = PP/2 "half ranks"; rank r has half-rank
//              h = min(r, PP-1-r). Phase 0 is the direction that enters on
//              r's side of the pipeline (direction 0 for r < N, direction 1
//              for r >= N), phase 1 the other. Each direction carries C/2
//              micro-batches: c = C/2.
//   dualpipev  PP ranks, N = PP, h = r. Phase 0 is stage r (the way down the
//              V), phase 1 is stage 2PP-1-r (the way back). All C micro-batches
//              go through both: c = C. DualPipeV on PP ranks is DualPipe on 2PP
//              ranks folded in half, which is why the phases are identical.
// The phases (n = the count of repetitions):
//   1  nF0      2(N-h-1) forwards of phase 0
//   2  nF0F1    h+1 times: F phase 0, F phase 1
//   3  nB1W1F1  N-h-1 times: B phase 1 (split), its W, F phase 1
//   4  main     c-2N+h+1 times: FB(F0 & B1), FB(F1 & B0); the middle rank
//               (h = N-1) runs its first pair as F0 then BW1, not overlapped
//   5  nB1F1B0  N-h-1 times: BW phase 1, FB(F1 & B0)
//   6  nB1B0    h+1 times: backward phase 1, backward phase 0; from the middle
//               of this phase on the backwards are split (B now, W later)
//   7  nWB0     N-h-1 times: a deferred W, B phase 0 (split)
//   8  nW       the h+1 remaining W's
// W's run in the order their B's ran (a FIFO).
#include <algorithm>
#include <deque>
#include <stdexcept>

#include "actors/schedule/schedule_internal.hpp"

namespace troupe::sched::detail {

namespace {

class DualPipeBuilder {
 public:
  DualPipeBuilder(const Layout& l, int rank) : l_(l), sink_(l, rank) {
    const int pp = l.num_ranks;
    if (l.kind == Kind::dualpipe) {
      n_ = pp / 2;
      h_ = std::min(rank, pp - 1 - rank);
      const int second_half = rank >= n_ ? 1 : 0;
      for (int p = 0; p < 2; ++p) {
        dir_[p] = p ^ second_half;
        stage_[p] = dir_[p] == 0 ? rank : pp - 1 - rank;
      }
    } else {
      n_ = pp;
      h_ = rank;
      dir_[0] = dir_[1] = 0;
      stage_[0] = rank;
      stage_[1] = 2 * pp - 1 - rank;
    }
    c_ = l.mbs_per_dir;
  }

  std::vector<Op> build() {
    const int n = n_, h = h_;
    const bool middle = h == n - 1;
    sink_.reserve(4 * size_t(c_) + 2 * size_t(n));  // F and B per phase, plus W's
    for (int i = 0; i < 2 * (n - h - 1); ++i) f(0);
    for (int i = 0; i < h + 1; ++i) {
      f(0);
      f(1);
    }
    for (int i = 0; i < n - h - 1; ++i) {
      b(1, true);
      w();
      f(1);
    }
    const int main_steps = c_ - 2 * n + h + 1;
    if (main_steps < 1) throw std::logic_error("dualpipe: too few chunks (make_layout checks this)");
    for (int i = 0; i < main_steps; ++i) {
      if (i == 0 && middle) {
        // Not overlapped: the forward's output is what the other middle rank
        // (or, in DualPipeV, this rank's phase 1) waits for.
        f(0);
        b(1, false);
      } else {
        fb(0, 1);
      }
      fb(1, 0);
    }
    for (int i = 0; i < n - h - 1; ++i) {
      b(1, false);
      fb(1, 0);
    }
    // Phase 6 turns to split backwards halfway through, so that the W's fill
    // the cool-down; which of the pair switches first alternates with h.
    const int steps6 = h + 1;
    bool split = false;
    for (int i = 0; i < steps6; ++i) {
      if (i == steps6 / 2 && h % 2 == 1) split = true;
      b(1, split);
      if (i == steps6 / 2 && h % 2 == 0) split = true;
      b(0, split);
    }
    for (int i = 0; i < n - h - 1; ++i) {
      w();
      b(0, true);
    }
    while (!pending_w_.empty()) w();
    return sink_.take();
  }

 private:
  Chunk chunk(int phase, int index) const {
    return Chunk{first_mb(l_, dir_[phase]) + index, stage_[phase], int8_t(dir_[phase])};
  }
  void f(int phase) { sink_.forward(chunk(phase, next_f_[phase]++)); }
  void b(int phase, bool split) {
    const Chunk c = chunk(phase, next_b_[phase]++);
    sink_.backward(c, split);
    if (split) pending_w_.push_back(c);
  }
  void w() {
    if (pending_w_.empty()) throw std::logic_error("dualpipe: W with no pending B");
    sink_.weight(pending_w_.front());
    pending_w_.pop_front();
  }
  void fb(int f_phase, int b_phase) {
    sink_.overlapped(chunk(f_phase, next_f_[f_phase]++), chunk(b_phase, next_b_[b_phase]++));
  }

  const Layout& l_;
  OpSink sink_;
  int n_ = 0, h_ = 0, c_ = 0;
  int dir_[2] = {0, 0};
  int stage_[2] = {0, 0};
  int next_f_[2] = {0, 0};
  int next_b_[2] = {0, 0};
  std::deque<Chunk> pending_w_;
};

}  // namespace

std::vector<Op> make_dualpipe_family(const Layout& layout, int rank) {
  return DualPipeBuilder(layout, rank).build();
}

}  // namespace troupe::sched::detail
