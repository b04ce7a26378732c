// Deferred weight-gradient ops (see weight_grads.hpp).
#include "moe/weight_grads.hpp"

#include <stdexcept>
#include <string>
#include <utility>

namespace troupe::moe {

using kernels::Tensor;

void WeightGrads::begin() {
  if (pending())
    throw std::logic_error("WeightGrads: a backward starts while " + std::to_string(ops_.size()) +
                           " weight-gradient ops of the previous one have not run (run W first)");
  next_held_ = 0;
}

Tensor WeightGrads::hold(const Tensor& like) {
  // The same request sequence as the previous B reuses its storage in
  // place; a different one (another path through the layers) takes a free
  // buffer of the shape, or a new one.
  for (size_t i = next_held_; i < held_.size(); ++i)
    if (held_[i].shape() == like.shape()) {
      std::swap(held_[i], held_[next_held_]);
      return held_[next_held_++];
    }
  held_.push_back(arena_.f32(like.shape()));
  std::swap(held_.back(), held_[next_held_]);
  return held_[next_held_++];
}

Tensor WeightGrads::keep(kernels::Backend& be, const Tensor& t) {
  Tensor h = hold(t);
  be.copy(h, t);
  return h;
}

void WeightGrads::gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const Tensor& a,
                       const Tensor& b, float beta, const Tensor& c) {
  ops_.push_back(Op{Kind::gemm, ta, tb, m, n, k, alpha, beta, a, b, c, {}});
}

void WeightGrads::gemm_grouped(bool ta, bool tb, float alpha, const Tensor& a, const Tensor& b, float beta,
                               const Tensor& c, std::vector<kernels::GemmGroup> groups) {
  ops_.push_back(Op{Kind::grouped, ta, tb, 0, 0, 0, alpha, beta, a, b, c, std::move(groups)});
}

void WeightGrads::embedding_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids) {
  Op op;
  op.kind = Kind::embedding;
  op.a = dout;
  op.b = ids;
  op.c = dtable;
  ops_.push_back(std::move(op));
}

void WeightGrads::run(kernels::Backend& be) {
  for (const Op& op : ops_) {
    switch (op.kind) {
      case Kind::gemm: be.gemm(op.ta, op.tb, op.m, op.n, op.k, op.alpha, op.a, op.b, op.beta, op.c); break;
      case Kind::grouped: be.gemm_grouped(op.ta, op.tb, op.alpha, op.a, op.b, op.beta, op.c, op.groups); break;
      case Kind::embedding: be.embedding_backward(op.c, op.a, op.b); break;
    }
  }
  ops_.clear();
}

void weight_gemm(kernels::Backend& be, WeightGrads* wg, bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                 float alpha, const Tensor& a, const Tensor& b, float beta, const Tensor& c) {
  if (wg) wg->gemm(ta, tb, m, n, k, alpha, a, b, beta, c);
  else be.gemm(ta, tb, m, n, k, alpha, a, b, beta, c);
}

void weight_gemm_grouped(kernels::Backend& be, WeightGrads* wg, bool ta, bool tb, float alpha, const Tensor& a,
                         const Tensor& b, float beta, const Tensor& c, std::vector<kernels::GemmGroup> groups) {
  if (wg) wg->gemm_grouped(ta, tb, alpha, a, b, beta, c, std::move(groups));
  else be.gemm_grouped(ta, tb, alpha, a, b, beta, c, groups);
}

}  // namespace troupe::moe
