// ProfilingBackend (bench_train_step only): wraps a backend and adds up the
// wall time and call count of every op, to show where a training step goes.
// Host backends run ops synchronously, so per-call wall time is the op's cost.
// GEMM calls also add up their FLOPs (2mnk per product), so the profile can
// say how fast the GEMMs themselves ran against the sgemm peak.
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>

#include "kernels/backend.hpp"

namespace troupe::bench {

struct OpStat {
  double calls = 0;
  double seconds = 0;
  double flops = 0;  // GEMM ops only
};

class ProfilingBackend final : public kernels::Backend {
 public:
  explicit ProfilingBackend(std::unique_ptr<kernels::Backend> inner) : in_(std::move(inner)) {}
  std::string name() const override { return in_->name(); }
  const std::map<std::string, OpStat>& stats() const { return stats_; }
  void reset() { stats_.clear(); }

  using T = kernels::Tensor;
  T empty(kernels::Shape s, kernels::DType d) override { return in_->empty(std::move(s), d); }
  void upload(const T& dst, const void* src, size_t n) override { time("upload", [&] { in_->upload(dst, src, n); }); }
  void download(void* dst, const T& src, size_t n) override { time("download", [&] { in_->download(dst, src, n); }); }
  void synchronize() override { in_->synchronize(); }
  // Batch-invariant GEMMs pass through, unless `invariant` was turned off
  // (bench_rollouts: the same continuous batch with BLAS's GEMMs).
  bool supports_batch_invariant() const override { return invariant_ && in_->supports_batch_invariant(); }
  bool set_batch_invariant(bool on) override { return in_->set_batch_invariant(on); }
  void allow_batch_invariant(bool yes) { invariant_ = yes; }
  void fill(const T& x, float v) override { time("fill", [&] { in_->fill(x, v); }); }
  void copy(const T& d, const T& s) override { time("copy", [&] { in_->copy(d, s); }); }
  void add(const T& o, const T& a, const T& b) override { time("add", [&] { in_->add(o, a, b); }); }
  void axpy(const T& y, float a, const T& x) override { time("axpy", [&] { in_->axpy(y, a, x); }); }
  void scale(const T& x, float a) override { time("scale", [&] { in_->scale(x, a); }); }
  void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float al, const T& a, const T& b,
            float be, const T& c) override {
    static const char* const names[] = {"gemm_NN", "gemm_NT", "gemm_TN", "gemm_TT"};
    time(names[ta * 2 + tb],
         [&] { in_->gemm(ta, tb, m, n, k, al, a, b, be, c); }, 2.0 * m * n * k);
  }
  void gemm_strided_batched(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float al, const T& a,
                            int64_t sa, const T& b, int64_t sb, float be, const T& c, int64_t sc,
                            int64_t batch) override {
    time("gemm_strided_batched",
         [&] { in_->gemm_strided_batched(ta, tb, m, n, k, al, a, sa, b, sb, be, c, sc, batch); },
         2.0 * m * n * k * batch);
  }
  void gemm_grouped(bool ta, bool tb, float al, const T& a, const T& b, float be, const T& c,
                    std::span<const kernels::GemmGroup> g) override {
    static const char* const names[] = {"gemm_grouped_NN", "gemm_grouped_NT", "gemm_grouped_TN",
                                        "gemm_grouped_TT"};
    double flops = 0;
    for (const kernels::GemmGroup& x : g) flops += 2.0 * x.m * x.n * x.k;
    time(names[ta * 2 + tb],
         [&] { in_->gemm_grouped(ta, tb, al, a, b, be, c, g); }, flops);
  }
  void embedding_forward(const T& o, const T& t, const T& i) override { time("embedding_fwd", [&] { in_->embedding_forward(o, t, i); }); }
  void embedding_backward(const T& dt, const T& d, const T& i) override { time("embedding_bwd", [&] { in_->embedding_backward(dt, d, i); }); }
  void rmsnorm_forward(const T& o, const T& r, const T& x, const T& w, float e) override { time("rmsnorm_fwd", [&] { in_->rmsnorm_forward(o, r, x, w, e); }); }
  void rmsnorm_backward(const T& dx, const T& dw, const T& d, const T& x, const T& w, const T& r) override {
    time("rmsnorm_bwd", [&] { in_->rmsnorm_backward(dx, dw, d, x, w, r); });
  }
  void rope_forward(const T& o, const T& x, int64_t p, float th) override { time("rope_fwd", [&] { in_->rope_forward(o, x, p, th); }); }
  void rope_backward(const T& dx, const T& d, int64_t p, float th) override { time("rope_bwd", [&] { in_->rope_backward(dx, d, p, th); }); }
  void attention_forward(const T& o, const T& l, const T& q, const T& k, const T& v, float s) override {
    time("attention_fwd", [&] { in_->attention_forward(o, l, q, k, v, s); });
  }
  void attention_cached(const T& o, const T& q, const T& kc, const T& vc, std::span<const int32_t> pos,
                        float s) override {
    time("attention_cached", [&] { in_->attention_cached(o, q, kc, vc, pos, s); });
  }
  void rope_kv_append(const T& q, const T& k, const T& v, const T& kc, const T& vc,
                      std::span<const int32_t> pos, float th) override {
    time("rope_kv_append", [&] { in_->rope_kv_append(q, k, v, kc, vc, pos, th); });
  }
  void attention_backward(const T& dq, const T& dk, const T& dv, const T& d, const T& q, const T& k,
                          const T& v, const T& o, const T& l, float s) override {
    time("attention_bwd", [&] { in_->attention_backward(dq, dk, dv, d, q, k, v, o, l, s); });
  }
  void silu_forward(const T& o, const T& x) override { time("silu_fwd", [&] { in_->silu_forward(o, x); }); }
  void silu_backward(const T& dx, const T& d, const T& x) override { time("silu_bwd", [&] { in_->silu_backward(dx, d, x); }); }
  void swiglu_forward(const T& o, const T& g, const T& u) override { time("swiglu_fwd", [&] { in_->swiglu_forward(o, g, u); }); }
  void swiglu_backward(const T& dg, const T& du, const T& d, const T& g, const T& u) override {
    time("swiglu_bwd", [&] { in_->swiglu_backward(dg, du, d, g, u); });
  }
  void cross_entropy_forward(const T& l, const T& lg, const T& t, int32_t ig) override {
    time("cross_entropy_fwd", [&] { in_->cross_entropy_forward(l, lg, t, ig); });
  }
  void cross_entropy_backward(const T& dl, const T& lg, const T& t, int32_t ig, float s) override {
    time("cross_entropy_bwd", [&] { in_->cross_entropy_backward(dl, lg, t, ig, s); });
  }
  // The overwrite variants count under the same names: the profile compares op for op.
  void rmsnorm_backward_overwrite(const T& dx, const T& dw, const T& d, const T& x, const T& w, const T& r) override {
    time("rmsnorm_bwd", [&] { in_->rmsnorm_backward_overwrite(dx, dw, d, x, w, r); });
  }
  void rope_backward_overwrite(const T& dx, const T& d, int64_t p, float th) override {
    time("rope_bwd", [&] { in_->rope_backward_overwrite(dx, d, p, th); });
  }
  void attention_backward_overwrite(const T& dq, const T& dk, const T& dv, const T& d, const T& q, const T& k,
                                    const T& v, const T& o, const T& l, float s) override {
    time("attention_bwd", [&] { in_->attention_backward_overwrite(dq, dk, dv, d, q, k, v, o, l, s); });
  }
  void swiglu_backward_overwrite(const T& dg, const T& du, const T& d, const T& g, const T& u) override {
    time("swiglu_bwd", [&] { in_->swiglu_backward_overwrite(dg, du, d, g, u); });
  }
  void cross_entropy_backward_overwrite(const T& dl, const T& lg, const T& t, int32_t ig, float s) override {
    time("cross_entropy_bwd", [&] { in_->cross_entropy_backward_overwrite(dl, lg, t, ig, s); });
  }
  void softmax_backward_overwrite(const T& dx, const T& d, const T& o) override {
    time("softmax_bwd", [&] { in_->softmax_backward_overwrite(dx, d, o); });
  }
  void softmax_forward(const T& o, const T& x) override { time("softmax_fwd", [&] { in_->softmax_forward(o, x); }); }
  void softmax_backward(const T& dx, const T& d, const T& o) override { time("softmax_bwd", [&] { in_->softmax_backward(dx, d, o); }); }
  void topk_forward(const T& w, const T& i, const T& s, const T& b, bool r) override { time("topk_fwd", [&] { in_->topk_forward(w, i, s, b, r); }); }
  void topk_backward(const T& ds, const T& dw, const T& w, const T& i, const T& s, bool r) override {
    time("topk_bwd", [&] { in_->topk_backward(ds, dw, w, i, s, r); });
  }
  void sum_rows(const T& o, const T& x) override { time("sum_rows", [&] { in_->sum_rows(o, x); }); }
  void add_row(const T& x, const T& r, float a) override { time("add_row", [&] { in_->add_row(x, r, a); }); }
  void gather_rows(const T& o, const T& s, const T& i) override { time("gather_rows", [&] { in_->gather_rows(o, s, i); }); }
  void sum_slots(const T& d, const T& s, const T& sl) override { time("sum_slots", [&] { in_->sum_slots(d, s, sl); }); }
  void combine_forward(const T& o, const T& y, const T& s, const T& w) override { time("combine_fwd", [&] { in_->combine_forward(o, y, s, w); }); }
  void combine_backward(const T& dy, const T& dw, const T& d, const T& y, const T& s, const T& w) override {
    time("combine_bwd", [&] { in_->combine_backward(dy, dw, d, y, s, w); });
  }
  double squared_norm(const T& x) override {
    double r = 0;
    time("squared_norm", [&] { r = in_->squared_norm(x); });
    return r;
  }
  void adamw(const T& p, const T& g, const T& m, const T& v, const kernels::AdamWParams& hp) override {
    time("adamw", [&] { in_->adamw(p, g, m, v, hp); });
  }

 private:
  template <class F>
  void time(const char* op, F&& f, double flops = 0) {
    const auto t0 = std::chrono::steady_clock::now();
    f();
    OpStat& s = stats_[op];
    s.calls += 1;
    s.flops += flops;
    s.seconds += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  }
  std::unique_ptr<kernels::Backend> in_;
  std::map<std::string, OpStat> stats_;
  bool invariant_ = true;
};

}  // namespace troupe::bench
