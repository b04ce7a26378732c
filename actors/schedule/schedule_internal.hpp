// Internal to the schedule generators (actors/schedule*.cpp): an op builder
// that attaches to each op exactly the messages the layout implies, so every
// generator only decides the ORDER of work.
#pragma once

#include "actors/schedule/schedule.hpp"

namespace troupe::sched::detail {

class OpSink {
 public:
  OpSink(const Layout& layout, int rank) : layout_(layout), rank_(rank) {}

  void forward(const Chunk& c);                  // F
  void backward(const Chunk& c, bool split);     // BW, or B when split
  void weight(const Chunk& c);                   // W of an earlier B
  void overlapped(const Chunk& f, const Chunk& b);  // FB

  void reserve(size_t n) { ops_.reserve(n); }
  int rank() const { return rank_; }
  std::vector<Op> take() { return std::move(ops_); }

 private:
  void forward_msgs(const Chunk& c, Op& op) const;
  void backward_msgs(const Chunk& c, Op& op) const;

  const Layout& layout_;
  int rank_;
  std::vector<Op> ops_;
};

// The op with type/chunks of `op` and the messages the layout implies
// (used by check_schedules to compare against what a list carries).
Op with_expected_messages(const Layout& layout, const Op& op);

// DualPipe and DualPipeV (both follow the same eight phases).
std::vector<Op> make_dualpipe_family(const Layout& layout, int rank);

}  // namespace troupe::sched::detail
