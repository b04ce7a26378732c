// Weight-gradient ops of a backward pass, run at once or deferred: the B/W
// split of zero-bubble pipeline schedules (ZB-H1, DualPipe). A backward asks
// a WeightGrads* for every op that only produces a parameter gradient
// (dW += X^T dY of a projection, the embedding scatter). With nullptr the op
// runs at once (the unsplit backward); with a WeightGrads it is recorded, and
// run() replays the recorded ops later, in the order they were recorded: the
// same calls on the same operands, so every gradient gets bitwise what the
// unsplit backward gives it.
//
// Operands that the B pass overwrites later (shared scratch: the residual
// gradient, the per-layer dY) must outlive B: hold() gives B a tensor it
// writes instead of the scratch, keep() copies a tensor B is about to
// overwrite. Both are carved from the arena on first use and reused by every
// later B of the same WeightGrads (a backward asks for the same shapes in the
// same order each time), so the steady state allocates nothing.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/backend.hpp"
#include "moe/arena.hpp"

namespace troupe::moe {

class WeightGrads {
 public:
  explicit WeightGrads(Arena& arena) : arena_(arena) {}
  WeightGrads(const WeightGrads&) = delete;
  WeightGrads& operator=(const WeightGrads&) = delete;

  // A B pass starts recording (throws std::logic_error while ops of the
  // previous one are still pending: their operands would be overwritten).
  void begin();
  // Ops recorded and not yet run.
  bool pending() const { return !ops_.empty(); }
  size_t recorded() const { return ops_.size(); }
  // Storage of `like`'s shape that stays valid until run() (f32).
  kernels::Tensor hold(const kernels::Tensor& like);
  // hold(t) holding a copy of t now.
  kernels::Tensor keep(kernels::Backend& be, const kernels::Tensor& t);
  // Replays the recorded ops in order, then forgets them.
  void run(kernels::Backend& be);
  // Forgets the recorded ops without running them (an abandoned step).
  void drop() { ops_.clear(); }

  // The deferrable ops (arguments as in kernels::Backend).
  void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha, const kernels::Tensor& a,
            const kernels::Tensor& b, float beta, const kernels::Tensor& c);
  void gemm_grouped(bool trans_a, bool trans_b, float alpha, const kernels::Tensor& a, const kernels::Tensor& b,
                    float beta, const kernels::Tensor& c, std::vector<kernels::GemmGroup> groups);
  void embedding_backward(const kernels::Tensor& dtable, const kernels::Tensor& dout, const kernels::Tensor& ids);

 private:
  enum class Kind : uint8_t { gemm, grouped, embedding };
  struct Op {
    Kind kind = Kind::gemm;
    bool ta = false, tb = false;
    int64_t m = 0, n = 0, k = 0;
    float alpha = 1.0f, beta = 1.0f;
    kernels::Tensor a, b, c;
    std::vector<kernels::GemmGroup> groups;
  };
  Arena& arena_;
  std::vector<Op> ops_;
  std::vector<kernels::Tensor> held_;  // hold()/keep() storage, in request order
  size_t next_held_ = 0;
};

// The op at once (wg == nullptr) or recorded into *wg.
void weight_gemm(kernels::Backend& be, WeightGrads* wg, bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                 float alpha, const kernels::Tensor& a, const kernels::Tensor& b, float beta, const kernels::Tensor& c);
void weight_gemm_grouped(kernels::Backend& be, WeightGrads* wg, bool trans_a, bool trans_b, float alpha,
                         const kernels::Tensor& a, const kernels::Tensor& b, float beta, const kernels::Tensor& c,
                         std::vector<kernels::GemmGroup> groups);
// `scratch` itself (wg == nullptr) or wg->hold(scratch).
inline kernels::Tensor held(WeightGrads* wg, const kernels::Tensor& scratch) {
  return wg ? wg->hold(scratch) : scratch;
}
// `t` itself (wg == nullptr) or wg->keep(be, t).
inline kernels::Tensor kept(kernels::Backend& be, WeightGrads* wg, const kernels::Tensor& t) {
  return wg ? wg->keep(be, t) : t;
}

}  // namespace troupe::moe
