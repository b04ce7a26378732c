// HostBackend: the Backend for plain CPU memory. It owns 64-byte aligned
// buffers, checks every op's shapes, dtypes and index ranges (throwing
// std::invalid_argument naming the op and the shapes), then calls the raw
// kernels of kernels/host_ops.hpp. GEMM goes to OpenBLAS (single-threaded; the
// backend's own threads split it), the rest is C++.
#include "kernels/host_backend.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <stdexcept>
#include <string>
#include <utility>

#include "kernels/host_ops.hpp"
#include "kernels/host_pool.hpp"

namespace troupe::kernels {
namespace {

constexpr size_t kAlign = 64;

class HostBuffer final : public Buffer {
 public:
  explicit HostBuffer(size_t bytes) : bytes_(bytes) {
    // aligned_alloc wants a size that is a multiple of the alignment (and > 0).
    const size_t padded = (bytes + kAlign - 1) / kAlign * kAlign;
    ptr_ = std::aligned_alloc(kAlign, padded ? padded : kAlign);
    if (!ptr_) throw std::bad_alloc();
  }
  ~HostBuffer() override { std::free(ptr_); }
  HostBuffer(const HostBuffer&) = delete;
  HostBuffer& operator=(const HostBuffer&) = delete;
  size_t bytes() const override { return bytes_; }
  void* host_ptr() override { return ptr_; }

 private:
  void* ptr_ = nullptr;
  size_t bytes_ = 0;
};

// ---- argument checks -------------------------------------------------------------

[[noreturn]] void fail(const char* op, const std::string& msg) {
  throw std::invalid_argument(std::string(op) + ": " + msg);
}

std::string desc(const Tensor& t) {
  if (!t.defined()) return "(undefined)";
  return shape_str(t.shape()) + " " + dtype_name(t.dtype());
}

void* host_data(const char* op, const char* name, const Tensor& t, DType dtype) {
  if (!t.defined()) fail(op, std::string(name) + " is undefined");
  if (t.dtype() != dtype)
    fail(op, std::string(name) + " " + desc(t) + " must be " + dtype_name(dtype));
  void* p = t.buffer()->host_ptr();
  if (!p) fail(op, std::string(name) + " " + desc(t) + " is not in host memory");
  return static_cast<char*>(p) + t.offset() * static_cast<int64_t>(dtype_size(dtype));
}

float* F(const char* op, const char* name, const Tensor& t) {
  return static_cast<float*>(host_data(op, name, t, DType::f32));
}
int32_t* I(const char* op, const char* name, const Tensor& t) {
  return static_cast<int32_t*>(host_data(op, name, t, DType::i32));
}

// A tensor seen as a matrix: the last dimension is the row width, the rest are rows.
struct Mat {
  int64_t rows, cols;
};
Mat mat(const Tensor& t) {
  if (t.rank() == 0) return {1, 1};
  const int64_t cols = t.dim(-1);
  int64_t rows = 1;
  for (int i = 0; i + 1 < t.rank(); ++i) rows *= t.shape()[static_cast<size_t>(i)];
  return {rows, cols};
}

void expect_mat(const char* op, const char* name, const Tensor& t, int64_t rows, int64_t cols,
                const char* ref_desc) {
  const Mat m = mat(t);
  if (m.rows != rows || m.cols != cols)
    fail(op, std::string(name) + " " + desc(t) + " must be " + std::to_string(rows) + " x " +
                 std::to_string(cols) + " (" + ref_desc + ")");
}

void expect_numel(const char* op, const char* name, const Tensor& t, int64_t n,
                  const char* ref_desc) {
  if (!t.defined()) fail(op, std::string(name) + " is undefined");
  if (t.numel() != n)
    fail(op, std::string(name) + " " + desc(t) + " must have " + std::to_string(n) + " elements (" +
                 ref_desc + ")");
}

void expect_shape(const char* op, const char* name, const Tensor& t, const Tensor& ref,
                  const char* ref_name) {
  if (!t.defined()) fail(op, std::string(name) + " is undefined");
  if (t.shape() != ref.shape())
    fail(op, std::string(name) + " " + desc(t) + " must have the shape of " + ref_name + " " +
                 desc(ref));
}

// Every index in [lo, hi) (or `skip` for entries that are ignored).
void check_indices(const char* op, const char* name, const int32_t* idx, int64_t n, int64_t lo,
                   int64_t hi, bool allow_negative = false,
                   int64_t skip = std::numeric_limits<int64_t>::min()) {
  for (int64_t i = 0; i < n; ++i) {
    const int64_t v = idx[i];
    if (v == skip || (allow_negative && v < 0)) continue;
    if (v < lo || v >= hi)
      fail(op, std::string(name) + "[" + std::to_string(i) + "] = " + std::to_string(v) +
                   " is out of range [" + std::to_string(lo) + ", " + std::to_string(hi) + ")");
  }
}

void check_blas_size(const char* op, int64_t v) {
  if (v < 0) fail(op, "negative GEMM size " + std::to_string(v));
  if (v > std::numeric_limits<int32_t>::max())
    fail(op, "GEMM size " + std::to_string(v) + " exceeds the BLAS integer range");
}

// Elements [offset, offset + count) must lie inside t.
void check_span(const char* op, const char* name, const Tensor& t, int64_t offset, int64_t count) {
  if (offset < 0 || count < 0 || offset + count > t.numel())
    fail(op, std::string(name) + " " + desc(t) + " is too small: needs elements [" +
                 std::to_string(offset) + ", " + std::to_string(offset + count) + ")");
}

// Rank-4 [B,S,H,hd] activations for RoPE and attention.
struct Heads {
  int64_t B, S, H, hd;
};
Heads heads(const char* op, const char* name, const Tensor& t) {
  if (!t.defined() || t.rank() != 4)
    fail(op, std::string(name) + " " + desc(t) + " must be rank 4 [B,S,H,hd]");
  return {t.dim(0), t.dim(1), t.dim(2), t.dim(3)};
}

// ---- the backend -------------------------------------------------------------------

class HostBackend final : public Backend {
 public:
  explicit HostBackend(const BackendOptions& options) : pool_(checked_threads(options.threads)) {
    // OpenBLAS runs single-threaded, always: its count is process-wide, so a
    // device that changed it would change the thread count, and with it the
    // bits, of another device's GEMM in flight. The backend's own threads
    // split large GEMMs instead (host::sgemm_rows). Every backend sets the
    // same value, so none races another.
    openblas_set_num_threads(1);
  }

  static int checked_threads(int threads) {
    if (threads < 1)
      throw std::invalid_argument("host backend: threads must be >= 1, got " +
                                  std::to_string(threads));
    return threads;
  }

  std::string name() const override { return "host"; }

  Tensor empty(Shape shape, DType dtype) override {
    for (int64_t d : shape)
      if (d < 0) throw std::invalid_argument("empty: negative dimension in " + shape_str(shape));
    const int64_t n = shape_numel(shape);
    auto buf = std::make_shared<HostBuffer>(static_cast<size_t>(n) * dtype_size(dtype));
    return Tensor(std::move(buf), this, std::move(shape), dtype);
  }

  void upload(const Tensor& dst, const void* src, size_t bytes) override {
    if (bytes > dst.bytes()) fail("upload", std::to_string(bytes) + " bytes into " + desc(dst));
    if (bytes) std::memcpy(host_data("upload", "dst", dst, dst.dtype()), src, bytes);
  }

  void download(void* dst, const Tensor& src, size_t bytes) override {
    if (bytes > src.bytes()) fail("download", std::to_string(bytes) + " bytes from " + desc(src));
    if (bytes) std::memcpy(dst, host_data("download", "src", src, src.dtype()), bytes);
  }

  // ---- elementwise ----
  void fill(const Tensor& x, float value) override {
    float* px = F("fill", "x", x);
    split(x.numel(), [&](int64_t b, int64_t e) { host::fill(px + b, value, e - b); });
  }

  void copy(const Tensor& dst, const Tensor& src) override {
    if (!dst.defined() || !src.defined() || dst.numel() != src.numel() ||
        dst.dtype() != src.dtype())
      fail("copy",
           "dst " + desc(dst) + " and src " + desc(src) + " must have the same numel and dtype");
    void* d = host_data("copy", "dst", dst, dst.dtype());
    const void* s = host_data("copy", "src", src, src.dtype());
    std::memmove(d, s, src.bytes());
  }

  void add(const Tensor& out, const Tensor& a, const Tensor& b) override {
    expect_numel("add", "b", b, a.numel(), "numel of a");
    expect_numel("add", "out", out, a.numel(), "numel of a");
    host::add(F("add", "out", out), F("add", "a", a), F("add", "b", b), a.numel());
  }

  void axpy(const Tensor& y, float alpha, const Tensor& x) override {
    expect_numel("axpy", "x", x, y.numel(), "numel of y");
    host::axpy(F("axpy", "y", y), alpha, F("axpy", "x", x), y.numel());
  }

  void scale(const Tensor& x, float alpha) override {
    host::scale(F("scale", "x", x), alpha, x.numel());
  }

  // ---- GEMM ----
  bool supports_batch_invariant() const override { return true; }
  bool set_batch_invariant(bool on) override { return std::exchange(invariant_, on); }

  void gemm(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha, const Tensor& a,
            const Tensor& b, float beta, const Tensor& c) override {
    const char* op = "gemm";
    for (int64_t v : {m, n, k}) check_blas_size(op, v);
    expect_numel(op, "a", a, m * k, "m*k");
    expect_numel(op, "b", b, k * n, "k*n");
    expect_numel(op, "c", c, m * n, "m*n");
    if (invariant_)
      host::sgemm_invariant_split(pool_, ta, tb, m, n, k, alpha, F(op, "a", a), ta ? m : k, F(op, "b", b),
                                  tb ? k : n, beta, F(op, "c", c), n);
    else
      host::sgemm_rows(pool_, ta, tb, m, n, k, alpha, F(op, "a", a), ta ? m : k, F(op, "b", b), tb ? k : n, beta,
                       F(op, "c", c), n);
  }

  void gemm_strided_batched(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                            const Tensor& a, int64_t stride_a, const Tensor& b, int64_t stride_b,
                            float beta, const Tensor& c, int64_t stride_c, int64_t batch) override {
    const char* op = "gemm_strided_batched";
    for (int64_t v : {m, n, k, batch}) check_blas_size(op, v);
    if (stride_a < 0 || stride_b < 0 || stride_c < 0) fail(op, "negative stride");
    // Outputs must not overlap (A and B may, e.g. stride 0 to share a matrix).
    if (batch > 1 && stride_c < m * n)
      fail(op, "stride_c " + std::to_string(stride_c) + " < m*n " + std::to_string(m * n) +
                   ": output matrices would overlap");
    const float* pa = F(op, "a", a);
    const float* pb = F(op, "b", b);
    float* pc = F(op, "c", c);
    if (batch == 0) return;
    check_span(op, "a", a, (batch - 1) * stride_a, m * k);
    check_span(op, "b", b, (batch - 1) * stride_b, k * n);
    check_span(op, "c", c, (batch - 1) * stride_c, m * n);
    for (int64_t i = 0; i < batch; ++i)
      (invariant_ ? host::sgemm_invariant : host::sgemm)(ta, tb, m, n, k, alpha, pa + i * stride_a, ta ? m : k,
                                                         pb + i * stride_b, tb ? k : n, beta, pc + i * stride_c, n);
  }

  void gemm_grouped(bool ta, bool tb, float alpha, const Tensor& a, const Tensor& b, float beta,
                    const Tensor& c, std::span<const GemmGroup> groups) override {
    const char* op = "gemm_grouped";
    const float* pa = F(op, "a", a);
    const float* pb = F(op, "b", b);
    float* pc = F(op, "c", c);
    for (const GemmGroup& g : groups) {  // check all before computing any
      for (int64_t v : {g.m, g.n, g.k}) check_blas_size(op, v);
      check_span(op, "a", a, g.a_offset, g.m * g.k);
      check_span(op, "b", b, g.b_offset, g.k * g.n);
      check_span(op, "c", c, g.c_offset, g.m * g.n);
    }
    std::vector<const GemmGroup*> work;
    for (const GemmGroup& g : groups)
      if (g.m != 0 && g.n != 0) work.push_back(&g);
    auto one = [&](const GemmGroup& g) {
      (invariant_ ? host::sgemm_invariant : host::sgemm)(ta, tb, g.m, g.n, g.k, alpha, pa + g.a_offset, ta ? g.m : g.k, pb + g.b_offset,
                  tb ? g.k : g.n, beta, pc + g.c_offset, g.n);
    };
    // Concurrently, one group per thread (see HostPool), when the groups are
    // independent: no two write the same elements of C, and C is not also an
    // input. Otherwise (or on one thread) in order, as before.
    if (pool_.size() == 1 || work.size() < 2 || !independent(work, a, b, c)) {
      for (const GemmGroup* g : work) one(*g);
      return;
    }
    // Costliest first, so the last items handed out are the short ones.
    std::stable_sort(work.begin(), work.end(), [](const GemmGroup* x, const GemmGroup* y) {
      return x->m * x->n * std::max<int64_t>(x->k, 1) > y->m * y->n * std::max<int64_t>(y->k, 1);
    });
    pool_.run(static_cast<int64_t>(work.size()), [&](int64_t i, int) { one(*work[i]); });
  }

  // True when the groups can run concurrently: no two write overlapping
  // elements of C, and no group writes elements any group reads from A or B.
  // Compared by element ranges within the buffers, not by buffer identity:
  // a model's activations (A and C) are views of one arena buffer.
  static bool independent(std::vector<const GemmGroup*> work, const Tensor& a, const Tensor& b,
                          const Tensor& c) {
    using Span = std::pair<int64_t, int64_t>;  // [begin, end) in elements of the buffer
    std::vector<Span> writes;
    for (const GemmGroup* g : work) writes.push_back({c.offset() + g->c_offset, c.offset() + g->c_offset + g->m * g->n});
    std::sort(writes.begin(), writes.end());
    for (size_t i = 1; i < writes.size(); ++i)
      if (writes[i - 1].second > writes[i].first) return false;
    // Does [begin, end) meet any write? (writes are sorted and disjoint)
    auto meets_a_write = [&](int64_t begin, int64_t end) {
      auto it = std::upper_bound(writes.begin(), writes.end(), Span{begin, std::numeric_limits<int64_t>::max()});
      if (it != writes.begin() && std::prev(it)->second > begin) return true;
      return it != writes.end() && it->first < end;
    };
    for (const auto& [t, is_a] : {std::pair<const Tensor*, bool>{&a, true}, {&b, false}}) {
      if (t->buffer() != c.buffer()) continue;
      for (const GemmGroup* g : work) {
        const int64_t begin = t->offset() + (is_a ? g->a_offset : g->b_offset);
        if (meets_a_write(begin, begin + g->k * (is_a ? g->m : g->n))) return false;
      }
    }
    return true;
  }

  // ---- embedding ----
  void embedding_forward(const Tensor& out, const Tensor& table, const Tensor& ids) override {
    const char* op = "embedding_forward";
    const Mat tm = mat(table);
    const int32_t* pid = I(op, "ids", ids);
    const int64_t T = ids.numel();
    expect_mat(op, "out", out, T, tm.cols, "numel of ids x width of table");
    check_indices(op, "ids", pid, T, 0, tm.rows);
    host::embedding_forward(F(op, "out", out), F(op, "table", table), pid, T, tm.cols);
  }

  void embedding_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids) override {
    const char* op = "embedding_backward";
    const Mat tm = mat(dtable);
    const int32_t* pid = I(op, "ids", ids);
    const int64_t T = ids.numel();
    expect_mat(op, "dout", dout, T, tm.cols, "numel of ids x width of dtable");
    check_indices(op, "ids", pid, T, 0, tm.rows);
    host::embedding_backward(F(op, "dtable", dtable), F(op, "dout", dout), pid, T, tm.cols);
  }

  // ---- RMSNorm ----
  void rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& x, const Tensor& w,
                       float eps) override {
    const char* op = "rmsnorm_forward";
    const Mat xm = mat(x);
    expect_mat(op, "out", out, xm.rows, xm.cols, "as x");
    expect_numel(op, "rstd", rstd, xm.rows, "rows of x");
    expect_numel(op, "w", w, xm.cols, "width of x");
    host::rmsnorm_forward(F(op, "out", out), F(op, "rstd", rstd), F(op, "x", x), F(op, "w", w),
                          xm.rows, xm.cols, eps);
  }

  void rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dout, const Tensor& x,
                        const Tensor& w, const Tensor& rstd) override {
    rmsnorm_bwd(dx, dw, dout, x, w, rstd, true);
  }
  void rmsnorm_backward_overwrite(const Tensor& dx, const Tensor& dw, const Tensor& dout,
                                  const Tensor& x, const Tensor& w, const Tensor& rstd) override {
    rmsnorm_bwd(dx, dw, dout, x, w, rstd, false);
  }
  void rmsnorm_bwd(const Tensor& dx, const Tensor& dw, const Tensor& dout, const Tensor& x,
                   const Tensor& w, const Tensor& rstd, bool accumulate) {
    const char* op = "rmsnorm_backward";
    const Mat xm = mat(x);
    expect_mat(op, "dx", dx, xm.rows, xm.cols, "as x");
    expect_mat(op, "dout", dout, xm.rows, xm.cols, "as x");
    expect_numel(op, "rstd", rstd, xm.rows, "rows of x");
    expect_numel(op, "w", w, xm.cols, "width of x");
    expect_numel(op, "dw", dw, xm.cols, "width of x");
    host::rmsnorm_backward(F(op, "dx", dx), F(op, "dw", dw), F(op, "dout", dout), F(op, "x", x),
                           F(op, "w", w), F(op, "rstd", rstd), xm.rows, xm.cols, accumulate);
  }

  // ---- RoPE ----
  void rope_forward(const Tensor& out, const Tensor& x, int64_t pos_offset, float theta) override {
    const char* op = "rope_forward";
    const Heads s = rope_shape(op, x, theta);
    expect_shape(op, "out", out, x, "x");
    float* po = F(op, "out", out);
    const float* px = F(op, "x", x);
    const int64_t seq = s.S * s.H * s.hd;
    split(s.B, [&](int64_t b, int64_t e) {
      host::rope_forward(po + b * seq, px + b * seq, e - b, s.S, s.H, s.hd, pos_offset, theta);
    }, seq);
  }

  void rope_backward(const Tensor& dx, const Tensor& dout, int64_t pos_offset,
                     float theta) override {
    rope_bwd(dx, dout, pos_offset, theta, true);
  }
  void rope_backward_overwrite(const Tensor& dx, const Tensor& dout, int64_t pos_offset,
                               float theta) override {
    rope_bwd(dx, dout, pos_offset, theta, false);
  }
  void rope_bwd(const Tensor& dx, const Tensor& dout, int64_t pos_offset, float theta,
                bool accumulate) {
    const char* op = "rope_backward";
    const Heads s = rope_shape(op, dout, theta);
    expect_shape(op, "dx", dx, dout, "dout");
    float* pdx = F(op, "dx", dx);
    const float* pd = F(op, "dout", dout);
    const int64_t seq = s.S * s.H * s.hd;
    split(s.B, [&](int64_t b, int64_t e) {
      host::rope_backward(pdx + b * seq, pd + b * seq, e - b, s.S, s.H, s.hd, pos_offset, theta, accumulate);
    }, seq);
  }

  // ---- attention ----
  void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                         const Tensor& v, float scale) override {
    const char* op = "attention_forward";
    const Heads s = heads(op, "q", q);
    expect_shape(op, "k", k, q, "q");
    expect_shape(op, "v", v, q, "q");
    expect_shape(op, "out", out, q, "q");
    expect_numel(op, "lse", lse, s.B * s.H * s.S, "[B,H,S]");
    host::attention_forward(pool_, F(op, "out", out), F(op, "lse", lse), F(op, "q", q),
                            F(op, "k", k), F(op, "v", v), s.B, s.S, s.H, s.hd, scale);
  }

  void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                          const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                          const Tensor& lse, float scale) override {
    attention_bwd(dq, dk, dv, dout, q, k, v, out, lse, scale, true);
  }
  void attention_backward_overwrite(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                    const Tensor& dout, const Tensor& q, const Tensor& k,
                                    const Tensor& v, const Tensor& out, const Tensor& lse,
                                    float scale) override {
    attention_bwd(dq, dk, dv, dout, q, k, v, out, lse, scale, false);
  }
  void attention_bwd(const Tensor& dq, const Tensor& dk, const Tensor& dv, const Tensor& dout,
                     const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& out,
                     const Tensor& lse, float scale, bool accumulate) {
    const char* op = "attention_backward";
    const Heads s = heads(op, "q", q);
    expect_shape(op, "k", k, q, "q");
    expect_shape(op, "v", v, q, "q");
    expect_shape(op, "out", out, q, "q");
    expect_shape(op, "dout", dout, q, "q");
    expect_shape(op, "dq", dq, q, "q");
    expect_shape(op, "dk", dk, q, "q");
    expect_shape(op, "dv", dv, q, "q");
    expect_numel(op, "lse", lse, s.B * s.H * s.S, "[B,H,S]");
    host::attention_backward(pool_, F(op, "dq", dq), F(op, "dk", dk), F(op, "dv", dv),
                             F(op, "dout", dout), F(op, "q", q), F(op, "k", k), F(op, "v", v),
                             F(op, "out", out), F(op, "lse", lse), s.B, s.S, s.H, s.hd, scale,
                             accumulate);
  }

  void attention_cached(const Tensor& out, const Tensor& q, const Tensor& k_cache,
                        const Tensor& v_cache, std::span<const int32_t> pos, float scale) override {
    const char* op = "attention_cached";
    const Heads s = heads(op, "q", q);
    expect_shape(op, "out", out, q, "q");
    const Heads c = heads(op, "k_cache", k_cache);
    expect_shape(op, "v_cache", v_cache, k_cache, "k_cache");
    if (c.B != s.B || c.H != s.H || c.hd != s.hd)
      fail(op, "k_cache " + desc(k_cache) + " must be [B,C,H,hd] with B, H, hd of q " + desc(q));
    if (static_cast<int64_t>(pos.size()) != s.B)
      fail(op, "pos has " + std::to_string(pos.size()) + " entries, expected B = " + std::to_string(s.B));
    check_indices(op, "pos", pos.data(), s.B, 0, c.S - s.S + 1);
    host::attention_cached(F(op, "out", out), F(op, "q", q), F(op, "k_cache", k_cache),
                           F(op, "v_cache", v_cache), pos.data(), s.B, s.S, c.S, s.H, s.hd, scale);
  }

  void rope_kv_append(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& k_cache,
                      const Tensor& v_cache, std::span<const int32_t> pos, float theta) override {
    const char* op = "rope_kv_append";
    const Heads s = rope_shape(op, q, theta);
    expect_shape(op, "k", k, q, "q");
    expect_shape(op, "v", v, q, "q");
    const Heads c = heads(op, "k_cache", k_cache);
    expect_shape(op, "v_cache", v_cache, k_cache, "k_cache");
    if (c.B != s.B || c.H != s.H || c.hd != s.hd)
      fail(op, "k_cache " + desc(k_cache) + " must be [B,C,H,hd] with B, H, hd of q " + desc(q));
    if (static_cast<int64_t>(pos.size()) != s.B)
      fail(op, "pos has " + std::to_string(pos.size()) + " entries, expected B = " + std::to_string(s.B));
    check_indices(op, "pos", pos.data(), s.B, 0, c.S - s.S + 1);
    float *pq = F(op, "q", q), *pk = F(op, "k", k), *pv = F(op, "v", v);
    float *kc = F(op, "k_cache", k_cache), *vc = F(op, "v_cache", v_cache);
    const int64_t row = s.S * s.H * s.hd;  // one sequence's new rows
    for (int64_t b = 0; b < s.B; ++b) {
      host::rope_forward(pq + b * row, pq + b * row, 1, s.S, s.H, s.hd, pos[b], theta);
      host::rope_forward(pk + b * row, pk + b * row, 1, s.S, s.H, s.hd, pos[b], theta);
      const int64_t at = (b * c.S + pos[b]) * s.H * s.hd;
      std::memcpy(kc + at, pk + b * row, static_cast<size_t>(row) * sizeof(float));
      std::memcpy(vc + at, pv + b * row, static_cast<size_t>(row) * sizeof(float));
    }
  }

  // ---- activations ----
  void silu_forward(const Tensor& out, const Tensor& x) override {
    expect_numel("silu_forward", "out", out, x.numel(), "numel of x");
    float* po = F("silu_forward", "out", out);
    const float* px = F("silu_forward", "x", x);
    split(x.numel(), [&](int64_t b, int64_t e) { host::silu_forward(po + b, px + b, e - b); });
  }

  void silu_backward(const Tensor& dx, const Tensor& dout, const Tensor& x) override {
    const char* op = "silu_backward";
    expect_numel(op, "dx", dx, x.numel(), "numel of x");
    expect_numel(op, "dout", dout, x.numel(), "numel of x");
    float* pdx = F(op, "dx", dx);
    const float* pd = F(op, "dout", dout);
    const float* px = F(op, "x", x);
    split(x.numel(), [&](int64_t b, int64_t e) { host::silu_backward(pdx + b, pd + b, px + b, e - b); });
  }

  void swiglu_forward(const Tensor& out, const Tensor& gate, const Tensor& up) override {
    const char* op = "swiglu_forward";
    expect_numel(op, "up", up, gate.numel(), "numel of gate");
    expect_numel(op, "out", out, gate.numel(), "numel of gate");
    float* po = F(op, "out", out);
    const float* pg = F(op, "gate", gate);
    const float* pu = F(op, "up", up);
    split(gate.numel(), [&](int64_t b, int64_t e) { host::swiglu_forward(po + b, pg + b, pu + b, e - b); });
  }

  void swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dout,
                       const Tensor& gate, const Tensor& up) override {
    swiglu_bwd(dgate, dup, dout, gate, up, true);
  }
  void swiglu_backward_overwrite(const Tensor& dgate, const Tensor& dup, const Tensor& dout,
                                 const Tensor& gate, const Tensor& up) override {
    swiglu_bwd(dgate, dup, dout, gate, up, false);
  }
  void swiglu_bwd(const Tensor& dgate, const Tensor& dup, const Tensor& dout, const Tensor& gate,
                  const Tensor& up, bool accumulate) {
    const char* op = "swiglu_backward";
    const int64_t n = gate.numel();
    expect_numel(op, "up", up, n, "numel of gate");
    expect_numel(op, "dout", dout, n, "numel of gate");
    expect_numel(op, "dgate", dgate, n, "numel of gate");
    expect_numel(op, "dup", dup, n, "numel of gate");
    float* pdg = F(op, "dgate", dgate);
    float* pdu = F(op, "dup", dup);
    const float* pd = F(op, "dout", dout);
    const float* pg = F(op, "gate", gate);
    const float* pu = F(op, "up", up);
    split(n, [&](int64_t b, int64_t e) {
      host::swiglu_backward(pdg + b, pdu + b, pd + b, pg + b, pu + b, e - b, accumulate);
    });
  }

  // ---- loss ----
  void cross_entropy_forward(const Tensor& losses, const Tensor& logits, const Tensor& targets,
                             int32_t ignore_index) override {
    const char* op = "cross_entropy_forward";
    const Mat lm = mat(logits);
    const int32_t* pt = ce_targets(op, targets, lm, ignore_index);
    expect_numel(op, "losses", losses, lm.rows, "rows of logits");
    host::cross_entropy_forward(F(op, "losses", losses), F(op, "logits", logits), pt, ignore_index,
                                lm.rows, lm.cols);
  }

  void cross_entropy_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                              int32_t ignore_index, float grad_scale) override {
    cross_entropy_bwd(dlogits, logits, targets, ignore_index, grad_scale, true);
  }
  void cross_entropy_backward_overwrite(const Tensor& dlogits, const Tensor& logits,
                                        const Tensor& targets, int32_t ignore_index,
                                        float grad_scale) override {
    cross_entropy_bwd(dlogits, logits, targets, ignore_index, grad_scale, false);
  }
  void cross_entropy_bwd(const Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                         int32_t ignore_index, float grad_scale, bool accumulate) {
    const char* op = "cross_entropy_backward";
    const Mat lm = mat(logits);
    const int32_t* pt = ce_targets(op, targets, lm, ignore_index);
    expect_mat(op, "dlogits", dlogits, lm.rows, lm.cols, "as logits");
    host::cross_entropy_backward(F(op, "dlogits", dlogits), F(op, "logits", logits), pt,
                                 ignore_index, grad_scale, lm.rows, lm.cols, accumulate);
  }

  // ---- routing ----
  void softmax_forward(const Tensor& out, const Tensor& x) override {
    const char* op = "softmax_forward";
    const Mat xm = mat(x);
    expect_mat(op, "out", out, xm.rows, xm.cols, "as x");
    float* po = F(op, "out", out);
    const float* px = F(op, "x", x);
    if (xm.cols > 0) host::softmax_forward(po, px, xm.rows, xm.cols);
  }

  void softmax_backward(const Tensor& dx, const Tensor& dout, const Tensor& out) override {
    softmax_bwd(dx, dout, out, true);
  }
  void softmax_backward_overwrite(const Tensor& dx, const Tensor& dout, const Tensor& out) override {
    softmax_bwd(dx, dout, out, false);
  }
  void softmax_bwd(const Tensor& dx, const Tensor& dout, const Tensor& out, bool accumulate) {
    const char* op = "softmax_backward";
    const Mat om = mat(out);
    expect_mat(op, "dx", dx, om.rows, om.cols, "as out");
    expect_mat(op, "dout", dout, om.rows, om.cols, "as out");
    host::softmax_backward(F(op, "dx", dx), F(op, "dout", dout), F(op, "out", out), om.rows,
                           om.cols, accumulate);
  }

  void topk_forward(const Tensor& weights, const Tensor& ids, const Tensor& scores,
                    const Tensor& bias, bool renormalize) override {
    const char* op = "topk_forward";
    const Mat sm = mat(scores);
    const Mat wm = mat(weights);
    const int64_t K = wm.cols;
    if (K < 1 || K > sm.cols)
      fail(op, "k = " + std::to_string(K) + " (width of weights " + desc(weights) +
                   ") must be in [1, " + std::to_string(sm.cols) + "] for scores " + desc(scores));
    expect_mat(op, "weights", weights, sm.rows, K, "rows of scores x k");
    expect_mat(op, "ids", ids, sm.rows, K, "rows of scores x k");
    const float* pb = nullptr;
    if (bias.defined()) {
      expect_numel(op, "bias", bias, sm.cols, "width of scores");
      pb = F(op, "bias", bias);
    }
    host::topk_forward(F(op, "weights", weights), I(op, "ids", ids), F(op, "scores", scores), pb,
                       renormalize, sm.rows, sm.cols, K);
  }

  void topk_backward(const Tensor& dscores, const Tensor& dweights, const Tensor& weights,
                     const Tensor& ids, const Tensor& scores, bool renormalize) override {
    const char* op = "topk_backward";
    const Mat sm = mat(scores);
    const int64_t K = mat(weights).cols;
    expect_mat(op, "dscores", dscores, sm.rows, sm.cols, "as scores");
    expect_mat(op, "weights", weights, sm.rows, K, "rows of scores x k");
    expect_mat(op, "dweights", dweights, sm.rows, K, "as weights");
    expect_mat(op, "ids", ids, sm.rows, K, "as weights");
    const int32_t* pid = I(op, "ids", ids);
    check_indices(op, "ids", pid, ids.numel(), 0, sm.cols);
    host::topk_backward(F(op, "dscores", dscores), F(op, "dweights", dweights),
                        F(op, "weights", weights), pid, F(op, "scores", scores), renormalize,
                        sm.rows, sm.cols, K);
  }

  void sum_rows(const Tensor& out, const Tensor& x) override {
    const Mat xm = mat(x);
    expect_numel("sum_rows", "out", out, xm.cols, "width of x");
    host::sum_rows(F("sum_rows", "out", out), F("sum_rows", "x", x), xm.rows, xm.cols);
  }

  void add_row(const Tensor& x, const Tensor& row, float alpha) override {
    const Mat xm = mat(x);
    expect_numel("add_row", "row", row, xm.cols, "width of x");
    host::add_row(F("add_row", "x", x), F("add_row", "row", row), alpha, xm.rows, xm.cols);
  }

  // ---- permutation ----
  void gather_rows(const Tensor& out, const Tensor& src, const Tensor& idx) override {
    const char* op = "gather_rows";
    const Mat sm = mat(src);
    const int32_t* pi = I(op, "idx", idx);
    expect_mat(op, "out", out, idx.numel(), sm.cols, "numel of idx x width of src");
    check_indices(op, "idx", pi, idx.numel(), 0, sm.rows);
    host::gather_rows(F(op, "out", out), F(op, "src", src), pi, idx.numel(), sm.cols);
  }

  void sum_slots(const Tensor& dst, const Tensor& src, const Tensor& slots) override {
    const char* op = "sum_slots";
    const Mat dm = mat(dst), sm = mat(src);
    const int32_t* ps = slot_data(op, slots, dm.rows, sm.rows);
    expect_mat(op, "src", src, sm.rows, dm.cols, "width of dst");
    host::sum_slots(F(op, "dst", dst), F(op, "src", src), ps, dm.rows, mat(slots).cols, dm.cols);
  }

  void combine_forward(const Tensor& out, const Tensor& y, const Tensor& slots,
                       const Tensor& weights) override {
    const char* op = "combine_forward";
    const Mat om = mat(out), ym = mat(y);
    const int32_t* ps = slot_data(op, slots, om.rows, ym.rows);
    const int64_t K = mat(slots).cols;
    expect_mat(op, "y", y, ym.rows, om.cols, "width of out");
    expect_mat(op, "weights", weights, om.rows, K, "as slots");
    host::combine_forward(F(op, "out", out), F(op, "y", y), ps, F(op, "weights", weights), om.rows,
                          K, om.cols);
  }

  void combine_backward(const Tensor& dy, const Tensor& dweights, const Tensor& dout,
                        const Tensor& y, const Tensor& slots, const Tensor& weights) override {
    const char* op = "combine_backward";
    const Mat om = mat(dout), ym = mat(y);
    const int32_t* ps = slot_data(op, slots, om.rows, ym.rows);
    const int64_t K = mat(slots).cols;
    expect_mat(op, "y", y, ym.rows, om.cols, "width of dout");
    expect_mat(op, "dy", dy, ym.rows, om.cols, "as y");
    expect_mat(op, "weights", weights, om.rows, K, "as slots");
    expect_mat(op, "dweights", dweights, om.rows, K, "as slots");
    host::combine_backward(F(op, "dy", dy), F(op, "dweights", dweights), F(op, "dout", dout),
                           F(op, "y", y), ps, F(op, "weights", weights), om.rows, K, om.cols);
  }

  // ---- optimizer ----
  double squared_norm(const Tensor& x) override {
    return host::squared_norm(F("squared_norm", "x", x), x.numel());
  }

  void adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
             const AdamWParams& hp) override {
    adamw_to(param, grad, m, v, m, v, hp);
  }

  // Out of place: one pass, the same operations as in place (bitwise).
  void adamw_to(const Tensor& param, const Tensor& grad, const Tensor& m_in, const Tensor& v_in,
                const Tensor& m_out, const Tensor& v_out, const AdamWParams& hp) override {
    const char* op = "adamw";
    const int64_t n = param.numel();
    expect_numel(op, "grad", grad, n, "numel of param");
    expect_numel(op, "m", m_in, n, "numel of param");
    expect_numel(op, "v", v_in, n, "numel of param");
    expect_numel(op, "m_out", m_out, n, "numel of param");
    expect_numel(op, "v_out", v_out, n, "numel of param");
    if (hp.step < 1) fail(op, "step must be >= 1 (1-based), got " + std::to_string(hp.step));
    const double s = static_cast<double>(hp.step);
    const double bc1 = 1.0 / (1.0 - std::pow(static_cast<double>(hp.beta1), s));
    const double bc2 = 1.0 / (1.0 - std::pow(static_cast<double>(hp.beta2), s));
    float* pp = F(op, "param", param);
    const float* pg = F(op, "grad", grad);
    const float* pm = F(op, "m", m_in);
    const float* pv = F(op, "v", v_in);
    float* pmo = F(op, "m_out", m_out);
    float* pvo = F(op, "v_out", v_out);
    split(n, [&](int64_t b, int64_t e) {
      host::adamw(pp + b, pg + b, pm + b, pv + b, pmo + b, pvo + b, e - b, hp.lr, hp.beta1, hp.beta2, hp.eps,
                  hp.weight_decay, static_cast<float>(bc1), static_cast<float>(bc2), hp.grad_scale);
    });
  }

 private:
  // Elementwise ops on a device with several threads: fn(begin, end) over
  // [0, items) in one contiguous part per pool thread, when every part holds
  // at least kMinPart elements (item_size elements per item; RoPE splits by
  // whole sequences, whose positions restart). Waking the threads costs tens
  // of microseconds. Every element is computed by the same code whatever part
  // it falls in (no reductions, no contraction), so the bits do not depend on
  // the split.
  static constexpr int64_t kMinPart = int64_t{1} << 15;
  template <class Fn>
  void split(int64_t items, Fn&& fn, int64_t item_size = 1) {
    const int64_t parts = std::min<int64_t>({pool_.size(), items, items * item_size / kMinPart});
    if (parts < 2) {
      fn(0, items);
      return;
    }
    pool_.run(parts, [&](int64_t i, int) { fn(items * i / parts, items * (i + 1) / parts); });
  }

  static Heads rope_shape(const char* op, const Tensor& x, float theta) {
    const Heads s = heads(op, "x", x);
    if (s.hd % 2 != 0) fail(op, "head dim of " + desc(x) + " must be even");
    if (!(theta > 0.0f)) fail(op, "theta must be > 0, got " + std::to_string(theta));
    return s;
  }

  // targets: i32 [T], each in [0, V) or == ignore_index.
  static const int32_t* ce_targets(const char* op, const Tensor& targets, const Mat& lm,
                                   int32_t ignore_index) {
    expect_numel(op, "targets", targets, lm.rows, "rows of logits");
    const int32_t* pt = I(op, "targets", targets);
    check_indices(op, "targets", pt, lm.rows, 0, lm.cols, false, ignore_index);
    return pt;
  }

  // slots: i32 [T,k], each < N (negative = empty slot).
  static const int32_t* slot_data(const char* op, const Tensor& slots, int64_t T, int64_t N) {
    const Mat sm = mat(slots);
    if (sm.rows != T)
      fail(op, "slots " + desc(slots) + " must have " + std::to_string(T) + " rows");
    const int32_t* ps = I(op, "slots", slots);
    check_indices(op, "slots", ps, slots.numel(), 0, N, true);
    return ps;
  }

  // The backend's threads: row blocks of a GEMM, grouped GEMM groups, attention
  // heads, parts of elementwise ops.
  host::HostPool pool_;
  bool invariant_ = false;  // set_batch_invariant
};

}  // namespace

std::unique_ptr<Backend> make_host_backend(const BackendOptions& options) {
  return std::make_unique<HostBackend>(options);
}

}  // namespace troupe::kernels
