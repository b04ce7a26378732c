// The OpenCL backend class, shared by its implementation files:
// opencl_backend.cpp (memory, elementwise, GEMM, optimizer, factory),
// opencl_ops.cpp (layer ops) and opencl_routing.cpp (routing, permutation). Internal: include kernels/opencl_backend.hpp
// to create one, kernels/opencl_context.hpp for pool counters and device info.
#pragma once

#include <map>
#include <string>
#include <tuple>

#include "kernels/opencl_context.hpp"

namespace troupe::kernels {

class OpenClBackend;

// Sets the arguments of one kernel launch in order, then enqueues it. Tensor
// arguments expand to (cl_mem, long element offset), matching the kernels.
class ClLaunch {
 public:
  ClLaunch(OpenClBackend& be, const char* kernel, const char* op);
  ClLaunch& t(const Tensor& x);
  ClLaunch& mem(cl_mem m);
  ClLaunch& i(int64_t v);  // int (checked to fit)
  ClLaunch& l(int64_t v);  // long
  ClLaunch& f(float v);
  ClLaunch& err();         // the backend's error word
  ClLaunch& local(size_t bytes);  // a __local buffer of that size
  // One work-item per index in [0, n) (global rounded up to the local size;
  // kernels bound-check). Does nothing when n == 0.
  void items(size_t n);
  // `groups` work-groups of `local` items each (one group per row, say).
  void groups(size_t groups, size_t local);
  // 2D: x in [0, nx), y in [0, ny).
  void items2d(size_t nx, size_t ny);
  cl_kernel kernel() const { return k_; }

 private:
  void set(size_t size, const void* value);
  void enqueue(cl_uint dims, const size_t* global, const size_t* local);

  OpenClBackend& be_;
  cl_kernel k_;
  const char* op_;
  cl_uint idx_ = 0;
};

// A staged tile of the tiled attention kernels.
struct AttnTile {
  int64_t rows;                   // tile rows, the kernels' `tile` argument
  size_t rows_bytes, cols_bytes;  // __local bytes of one tile by rows, of one transposed
};

class OpenClBackend final : public Backend {
 public:
  explicit OpenClBackend(const BackendOptions& options);
  ~OpenClBackend() override;

  std::string name() const override { return "opencl"; }
  ClContext& cl() { return ctx_; }
  cl_mem error_word() const { return err_mem_; }
  // Returns the cl_mem of x after checking that x belongs to this backend.
  cl_mem mem_of(const Tensor& x, const char* op) const;
  // Power-of-two work-group size for a per-row reduction kernel over `width`
  // columns: at most the row cap (1 on CPU devices, 256 elsewhere).
  size_t row_group_size(cl_kernel k, int64_t width);
  void set_row_group_cap(size_t cap);
  size_t row_group_cap() const { return row_cap_; }
  void set_attention_caps(size_t block, size_t tile);
  // Work-group size of a tiled attention kernel: up to the block cap, fewer
  // where the device or the kernel's private use caps it, or S is small.
  size_t attention_block(cl_kernel k, int64_t S);
  // Reads the error word that kernels set on bad indices (ids, targets, slots);
  // throws std::runtime_error naming `op` and the problem if one was set.
  void check_errors(const char* op);
  // check_errors, unless TROUPE_OPENCL_LAZY_CHECKS=1 defers it to synchronize/download.
  void maybe_check_errors(const char* op);

  // ---- memory
  Tensor empty(Shape shape, DType dtype = DType::f32) override;
  void upload(const Tensor& dst, const void* src, size_t bytes) override;
  void download(void* dst, const Tensor& src, size_t bytes) override;
  void synchronize() override;

  // ---- elementwise
  void fill(const Tensor& x, float value) override;
  void copy(const Tensor& dst, const Tensor& src) override;
  void add(const Tensor& out, const Tensor& a, const Tensor& b) override;
  void axpy(const Tensor& y, float alpha, const Tensor& x) override;
  void scale(const Tensor& x, float alpha) override;

  // ---- GEMM
  void gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
            const Tensor& a, const Tensor& b, float beta, const Tensor& c) override;
  void gemm_strided_batched(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k,
                            float alpha, const Tensor& a, int64_t stride_a, const Tensor& b,
                            int64_t stride_b, float beta, const Tensor& c, int64_t stride_c,
                            int64_t batch) override;
  void gemm_grouped(bool trans_a, bool trans_b, float alpha, const Tensor& a, const Tensor& b,
                    float beta, const Tensor& c, std::span<const GemmGroup> groups) override;

  // ---- model ops (opencl_ops.cpp, opencl_routing.cpp)
  void embedding_forward(const Tensor& out, const Tensor& table, const Tensor& ids) override;
  void embedding_backward(const Tensor& dtable, const Tensor& dout, const Tensor& ids) override;
  void rmsnorm_forward(const Tensor& out, const Tensor& rstd, const Tensor& x, const Tensor& w,
                       float eps) override;
  void rmsnorm_backward(const Tensor& dx, const Tensor& dw, const Tensor& dout, const Tensor& x,
                        const Tensor& w, const Tensor& rstd) override;
  void rope_forward(const Tensor& out, const Tensor& x, int64_t pos_offset, float theta) override;
  void rope_backward(const Tensor& dx, const Tensor& dout, int64_t pos_offset,
                     float theta) override;
  void attention_forward(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                         const Tensor& v, float scale) override;
  void attention_backward(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                          const Tensor& dout, const Tensor& q, const Tensor& k, const Tensor& v,
                          const Tensor& out, const Tensor& lse, float scale) override;
  void attention_backward_overwrite(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                    const Tensor& dout, const Tensor& q, const Tensor& k,
                                    const Tensor& v, const Tensor& out, const Tensor& lse,
                                    float scale) override;
  void attention_cached(const Tensor& out, const Tensor& q, const Tensor& k_cache,
                        const Tensor& v_cache, std::span<const int32_t> pos, float scale) override;
  void rope_kv_append(const Tensor& q, const Tensor& k, const Tensor& v, const Tensor& k_cache,
                      const Tensor& v_cache, std::span<const int32_t> pos, float theta) override;
  void silu_forward(const Tensor& out, const Tensor& x) override;
  void silu_backward(const Tensor& dx, const Tensor& dout, const Tensor& x) override;
  void swiglu_forward(const Tensor& out, const Tensor& gate, const Tensor& up) override;
  void swiglu_backward(const Tensor& dgate, const Tensor& dup, const Tensor& dout,
                       const Tensor& gate, const Tensor& up) override;
  void cross_entropy_forward(const Tensor& losses, const Tensor& logits, const Tensor& targets,
                             int32_t ignore_index) override;
  void cross_entropy_backward(const Tensor& dlogits, const Tensor& logits, const Tensor& targets,
                              int32_t ignore_index, float grad_scale) override;
  void softmax_forward(const Tensor& out, const Tensor& x) override;
  void softmax_backward(const Tensor& dx, const Tensor& dout, const Tensor& out) override;
  void topk_forward(const Tensor& weights, const Tensor& ids, const Tensor& scores,
                    const Tensor& bias, bool renormalize) override;
  void topk_backward(const Tensor& dscores, const Tensor& dweights, const Tensor& weights,
                     const Tensor& ids, const Tensor& scores, bool renormalize) override;
  void sum_rows(const Tensor& out, const Tensor& x) override;
  void add_row(const Tensor& x, const Tensor& row, float alpha) override;
  void gather_rows(const Tensor& out, const Tensor& src, const Tensor& idx) override;
  void sum_slots(const Tensor& dst, const Tensor& src, const Tensor& slots) override;
  void combine_forward(const Tensor& out, const Tensor& y, const Tensor& slots,
                       const Tensor& weights) override;
  void combine_backward(const Tensor& dy, const Tensor& dweights, const Tensor& dout,
                        const Tensor& y, const Tensor& slots, const Tensor& weights) override;

  // ---- optimizer
  double squared_norm(const Tensor& x) override;
  void adamw(const Tensor& param, const Tensor& grad, const Tensor& m, const Tensor& v,
             const AdamWParams& hp) override;

 private:
  // out[i] (+)= sum over rows of x (two deterministic passes); used by sum_rows.
  void column_sum(const Tensor& out, const Tensor& x, bool accumulate, const char* op);
  // Both attention backward entry points; accumulate: add to dq, dk, dv, else write them.
  void attention_backward_impl(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                               const Tensor& dout, const Tensor& q, const Tensor& k,
                               const Tensor& v, const Tensor& out, const Tensor& lse, float scale,
                               bool accumulate, const char* op);
  // The staged tile of the tiled attention kernels for head dim hd: `arrays`
  // tiles must fit half the device's __local memory (opencl_ops.cpp).
  AttnTile attention_tile(int64_t hd, int arrays) const;
  // C = 0 over rows x cols elements `stride` apart (GEMM with beta == 0).
  void zero_strided(const Tensor& c, int64_t offset, int64_t rows, int64_t cols, int64_t stride,
                    const char* op);
  // The (cos, sin) table for RoPE at these settings, built on first use.
  const Tensor& rope_table(int64_t S, int64_t hd, int64_t pos_offset, float theta,
                           const char* op);
  void gemm_one(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                const Tensor& a, int64_t a_off, const Tensor& b, int64_t b_off, float beta,
                const Tensor& c, int64_t c_off, const char* op);

  ClContext ctx_;
  cl_mem err_mem_ = nullptr;
  std::shared_ptr<Buffer> err_buf_;
  bool lazy_checks_ = false;
  size_t row_cap_ = 256;
  size_t att_block_cap_ = 64, att_tile_cap_ = 32;  // set_attention_caps
  // RoPE tables by (S, hd, pos_offset, theta bits); a handful at most (cleared when full).
  std::map<std::tuple<int64_t, int64_t, int64_t, uint32_t>, Tensor> rope_tables_;
};

// Argument checks shared by both implementation files; each throws
// std::invalid_argument("opencl <op>: ...") naming the tensor and what was wrong.
void cl_need(bool ok, const char* op, const std::string& what);
void cl_need_f32(const Tensor& t, const char* op, const char* name);
void cl_need_i32(const Tensor& t, const char* op, const char* name);
void cl_need_numel(const Tensor& t, int64_t n, const char* op, const char* name);
void cl_need_int(int64_t v, const char* op, const char* name);  // fits in a 32-bit int

// A tensor as a matrix: the last dimension is the row width, the others are
// rows (rank 0: one element). The same convention as the host backend.
struct ClMat {
  int64_t rows, cols;
};
ClMat cl_mat(const Tensor& t);
void cl_need_mat(const Tensor& t, int64_t rows, int64_t cols, const char* op, const char* name);

constexpr int64_t kColsumChunk = 32;  // COLSUM_CHUNK in kernels/cl/kernels.cl

}  // namespace troupe::kernels
