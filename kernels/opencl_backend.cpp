// OpenCL backend, part 1: the factory, kernel launches, memory, elementwise
// ops, GEMM through CLBlast, and the optimizer ops. Model ops are in
// opencl_ops.cpp; platform/queue/program/pool plumbing in opencl_context.cpp.
#include "kernels/opencl_backend.hpp"

#include <clblast.h>

#include <climits>
#include <cmath>
#include <cstdlib>
#include <mutex>
#include <stdexcept>

#include "kernels/opencl_backend_impl.hpp"

namespace troupe::kernels {

// ---- argument checks ----------------------------------------------------------------

void cl_need(bool ok, const char* op, const std::string& what) {
  if (!ok) throw std::invalid_argument(std::string("opencl ") + op + ": " + what);
}

void cl_need_f32(const Tensor& t, const char* op, const char* name) {
  cl_need(t.defined(), op, std::string(name) + " is undefined");
  cl_need(t.dtype() == DType::f32, op, std::string(name) + " must be f32, got i32");
}

void cl_need_i32(const Tensor& t, const char* op, const char* name) {
  cl_need(t.defined(), op, std::string(name) + " is undefined");
  cl_need(t.dtype() == DType::i32, op, std::string(name) + " must be i32, got f32");
}

void cl_need_numel(const Tensor& t, int64_t n, const char* op, const char* name) {
  cl_need(t.numel() == n, op,
          std::string(name) + " " + shape_str(t.shape()) + " must have " + std::to_string(n) +
              " elements");
}

void cl_need_int(int64_t v, const char* op, const char* name) {
  cl_need(v >= 0 && v <= INT_MAX, op,
          std::string(name) + " = " + std::to_string(v) + " is outside [0, 2^31)");
}

ClMat cl_mat(const Tensor& t) {
  if (t.rank() == 0) return {1, 1};
  int64_t rows = 1;
  for (int i = 0; i + 1 < t.rank(); ++i) rows *= t.dim(i);
  return {rows, t.dim(-1)};
}

void cl_need_mat(const Tensor& t, int64_t rows, int64_t cols, const char* op, const char* name) {
  const ClMat m = cl_mat(t);
  cl_need(m.rows == rows && m.cols == cols, op,
          std::string(name) + " " + shape_str(t.shape()) + " must be " + std::to_string(rows) +
              " x " + std::to_string(cols));
}

// ---- launches ---------------------------------------------------------------------------

ClLaunch::ClLaunch(OpenClBackend& be, const char* kernel, const char* op)
    : be_(be), k_(be.cl().kernel(kernel)), op_(op) {}

void ClLaunch::set(size_t size, const void* value) {
  cl_check(clSetKernelArg(k_, idx_, size, value), op_, "clSetKernelArg");
  ++idx_;
}

ClLaunch& ClLaunch::t(const Tensor& x) {
  cl_mem m = be_.mem_of(x, op_);
  const cl_long off = x.offset();
  set(sizeof(cl_mem), &m);
  set(sizeof(cl_long), &off);
  return *this;
}

ClLaunch& ClLaunch::mem(cl_mem m) {
  set(sizeof(cl_mem), &m);
  return *this;
}

ClLaunch& ClLaunch::i(int64_t v) {
  cl_need(v >= INT_MIN && v <= INT_MAX, op_,
          "argument " + std::to_string(v) + " does not fit a 32-bit int");
  const cl_int x = static_cast<cl_int>(v);
  set(sizeof(x), &x);
  return *this;
}

ClLaunch& ClLaunch::l(int64_t v) {
  const cl_long x = v;
  set(sizeof(x), &x);
  return *this;
}

ClLaunch& ClLaunch::f(float v) {
  set(sizeof(v), &v);
  return *this;
}

ClLaunch& ClLaunch::err() { return mem(be_.error_word()); }

ClLaunch& ClLaunch::local(size_t bytes) {
  cl_check(clSetKernelArg(k_, idx_, bytes, nullptr), op_, "clSetKernelArg");
  ++idx_;
  return *this;
}

void ClLaunch::enqueue(cl_uint dims, const size_t* global, const size_t* local) {
  cl_check(clEnqueueNDRangeKernel(be_.cl().queue(), k_, dims, nullptr, global, local, 0, nullptr,
                                  nullptr),
           op_, "clEnqueueNDRangeKernel");
}

void ClLaunch::items(size_t n) {
  if (n == 0) return;
  const size_t local = be_.cl().work_group_size(k_, 64);
  const size_t global = (n + local - 1) / local * local;
  enqueue(1, &global, &local);
}

void ClLaunch::groups(size_t groups, size_t local) {
  if (groups == 0) return;
  const size_t global = groups * local;
  enqueue(1, &global, &local);
}

void ClLaunch::items2d(size_t nx, size_t ny) {
  if (nx == 0 || ny == 0) return;
  // Rows narrower than 64 get a narrower group rather than idle work-items.
  size_t want = 1;
  while (want < nx && want < 64) want *= 2;
  const size_t lx = be_.cl().work_group_size(k_, want);
  const size_t local[2] = {lx, 1};
  const size_t global[2] = {(nx + lx - 1) / lx * lx, ny};
  enqueue(2, global, local);
}

// ---- backend: setup, errors, memory -------------------------------------------------------

OpenClBackend::OpenClBackend(const BackendOptions& options) : ctx_(options) {
  const char* lazy = std::getenv("TROUPE_OPENCL_LAZY_CHECKS");
  lazy_checks_ = lazy && std::string(lazy) == "1";
  // Row reductions: one work-item per row on CPU devices (PoCL runs a work-group
  // as loops split at every barrier; measured ~10x faster than 128-wide groups
  // for RMSNorm), a tree over up to 256 work-items elsewhere.
  row_cap_ = ctx_.info().device_type == "cpu" ? 1 : 256;
  auto buf = std::make_shared<ClBuffer>(ctx_.pool(), sizeof(cl_int), "create backend");
  err_mem_ = buf->mem();
  err_buf_ = std::move(buf);
  const cl_int zero = 0;
  cl_check(clEnqueueWriteBuffer(ctx_.queue(), err_mem_, CL_TRUE, 0, sizeof(zero), &zero, 0,
                                nullptr, nullptr),
           "create backend", "clEnqueueWriteBuffer");
}

OpenClBackend::~OpenClBackend() { clFinish(ctx_.queue()); }

cl_mem OpenClBackend::mem_of(const Tensor& x, const char* op) const {
  cl_need(x.defined(), op, "tensor is undefined");
  cl_need(x.backend() == this, op,
          "tensor " + shape_str(x.shape()) + " belongs to another backend");
  return static_cast<ClBuffer*>(x.buffer())->mem();
}

size_t OpenClBackend::row_group_size(cl_kernel k, int64_t width) {
  size_t want = 1;
  while (want < static_cast<size_t>(width) && want < row_cap_) want *= 2;
  return ctx_.work_group_size(k, want);
}

void OpenClBackend::set_row_group_cap(size_t cap) {
  cl_need(cap >= 1 && cap <= 256 && (cap & (cap - 1)) == 0, "set_row_group_cap",
          "cap must be a power of two in [1, 256], got " + std::to_string(cap));
  row_cap_ = cap;
}

static const char* error_word_text(int code) {
  switch (code) {  // codes from kernels/cl/common.cl
    case 1: return "token id outside [0, vocab) (embedding_forward/embedding_backward)";
    case 2: return "target outside [0, vocab) and not the ignore index (cross_entropy)";
    case 3: return "row index outside [0, rows of src) (gather_rows)";
    case 4: return "slot outside [0, rows of y/src) (sum_slots/combine_forward/combine_backward)";
    case 5: return "expert id outside [0, experts) (topk_backward)";
    case 6: return "a row of y is named by two slots (combine_backward scatters to each row once)";
    default: return "unknown error code";
  }
}

void OpenClBackend::check_errors(const char* op) {
  cl_int word = 0;
  cl_check(clEnqueueReadBuffer(ctx_.queue(), err_mem_, CL_TRUE, 0, sizeof(word), &word, 0, nullptr,
                               nullptr),
           op, "clEnqueueReadBuffer(error word)");
  if (word == 0) return;
  const cl_int zero = 0;  // clear it so the backend stays usable after the error
  cl_check(clEnqueueWriteBuffer(ctx_.queue(), err_mem_, CL_TRUE, 0, sizeof(zero), &zero, 0,
                                nullptr, nullptr),
           op, "clEnqueueWriteBuffer(error word)");
  throw std::invalid_argument(std::string("opencl ") + op + ": bad input: " +
                              error_word_text(word));
}

void OpenClBackend::maybe_check_errors(const char* op) {
  if (!lazy_checks_) check_errors(op);
}

Tensor OpenClBackend::empty(Shape shape, DType dtype) {
  for (int64_t d : shape)
    cl_need(d >= 0, "empty", "negative dimension in " + shape_str(shape));
  const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
  auto buf = std::make_shared<ClBuffer>(ctx_.pool(), bytes, "empty");
  return Tensor(std::move(buf), this, std::move(shape), dtype);
}

void OpenClBackend::upload(const Tensor& dst, const void* src, size_t bytes) {
  cl_mem m = mem_of(dst, "upload");
  cl_need(bytes <= dst.bytes(), "upload",
          std::to_string(bytes) + " bytes into a tensor of " + std::to_string(dst.bytes()));
  if (bytes == 0) return;
  cl_check(clEnqueueWriteBuffer(ctx_.queue(), m, CL_TRUE, dst.offset() * 4, bytes, src, 0, nullptr,
                                nullptr),
           "upload", "clEnqueueWriteBuffer");
}

void OpenClBackend::download(void* dst, const Tensor& src, size_t bytes) {
  cl_mem m = mem_of(src, "download");
  cl_need(bytes <= src.bytes(), "download",
          std::to_string(bytes) + " bytes from a tensor of " + std::to_string(src.bytes()));
  if (bytes > 0)
    cl_check(clEnqueueReadBuffer(ctx_.queue(), m, CL_TRUE, src.offset() * 4, bytes, dst, 0,
                                 nullptr, nullptr),
             "download", "clEnqueueReadBuffer");
  if (lazy_checks_) check_errors("download");
}

void OpenClBackend::synchronize() {
  cl_check(clFinish(ctx_.queue()), "synchronize", "clFinish");
  check_errors("synchronize");
}

// ---- elementwise ---------------------------------------------------------------------------

void OpenClBackend::fill(const Tensor& x, float value) {
  cl_need_f32(x, "fill", "x");
  ClLaunch(*this, "fill_f32", "fill").t(x).l(x.numel()).f(value).items(x.numel());
}

void OpenClBackend::copy(const Tensor& dst, const Tensor& src) {
  cl_need(dst.defined() && src.defined(), "copy", "undefined tensor");
  cl_need(dst.dtype() == src.dtype(), "copy", "dtypes differ");
  cl_need_numel(dst, src.numel(), "copy", "dst");
  cl_mem d = mem_of(dst, "copy"), s = mem_of(src, "copy");
  if (dst.numel() == 0) return;
  if (d == s) {
    if (dst.offset() == src.offset()) return;
    const int64_t lo = std::min(dst.offset(), src.offset());
    const int64_t hi = std::max(dst.offset(), src.offset());
    cl_need(hi >= lo + dst.numel(), "copy", "source and destination overlap");
  }
  cl_check(clEnqueueCopyBuffer(ctx_.queue(), s, d, src.offset() * 4, dst.offset() * 4, dst.bytes(),
                               0, nullptr, nullptr),
           "copy", "clEnqueueCopyBuffer");
}

void OpenClBackend::add(const Tensor& out, const Tensor& a, const Tensor& b) {
  const char* op = "add";
  cl_need_f32(out, op, "out");
  cl_need_f32(a, op, "a");
  cl_need_f32(b, op, "b");
  cl_need_numel(a, out.numel(), op, "a");
  cl_need_numel(b, out.numel(), op, "b");
  ClLaunch(*this, "add_f32", op).t(out).t(a).t(b).l(out.numel()).items(out.numel());
}

void OpenClBackend::axpy(const Tensor& y, float alpha, const Tensor& x) {
  cl_need_f32(y, "axpy", "y");
  cl_need_f32(x, "axpy", "x");
  cl_need_numel(x, y.numel(), "axpy", "x");
  ClLaunch(*this, "axpy_f32", "axpy").t(y).t(x).f(alpha).l(y.numel()).items(y.numel());
}

void OpenClBackend::scale(const Tensor& x, float alpha) {
  cl_need_f32(x, "scale", "x");
  ClLaunch(*this, "scale_f32", "scale").t(x).f(alpha).l(x.numel()).items(x.numel());
}

// ---- GEMM ---------------------------------------------------------------------------------

// CLBlast 1.5.3 (Debian 12) can fail with kUnexpectedError when several threads
// call it at once (its kernel cache race, fixed upstream in 1.6.1, CLBlast
// issue #486). Devices are threads with a backend each, so calls are
// serialized; a call only enqueues work, so the lock is held briefly (except on
// the first use of a shape, when CLBlast compiles).
static std::mutex& clblast_mutex() {
  static std::mutex mu;
  return mu;
}

void OpenClBackend::zero_strided(const Tensor& c, int64_t offset, int64_t rows, int64_t cols,
                                 int64_t stride, const char* op) {
  ClLaunch(*this, "fill2d_f32", op)
      .mem(mem_of(c, op))
      .l(c.offset() + offset)
      .i(rows)
      .l(cols)
      .l(stride)
      .f(0.0f)
      .items2d(static_cast<size_t>(cols), static_cast<size_t>(rows));
}

static void need_gemm_span(const Tensor& t, int64_t off, int64_t count, const char* op,
                           const char* name) {
  cl_need_f32(t, op, name);
  cl_need(off >= 0 && off + count <= t.numel(), op,
          std::string(name) + " " + shape_str(t.shape()) + " is too small: needs " +
              std::to_string(count) + " elements at offset " + std::to_string(off));
}

void OpenClBackend::gemm_one(bool ta, bool tb, int64_t m, int64_t n, int64_t k, float alpha,
                             const Tensor& a, int64_t a_off, const Tensor& b, int64_t b_off,
                             float beta, const Tensor& c, int64_t c_off, const char* op) {
  cl_need(m >= 0 && n >= 0 && k >= 0, op, "negative GEMM size");
  need_gemm_span(a, a_off, m * k, op, "A");
  need_gemm_span(b, b_off, k * n, op, "B");
  need_gemm_span(c, c_off, m * n, op, "C");
  if (m == 0 || n == 0) return;
  // beta == 0 must overwrite C even if it holds NaN (pooled memory is not cleared).
  if (beta == 0.0f) zero_strided(c, c_off, 1, m * n, m * n, op);
  if (k == 0) {  // C = beta * C; CLBlast rejects k == 0
    if (beta != 0.0f && beta != 1.0f) scale(c.view(c_off, {m * n}), beta);
    return;
  }
  cl_command_queue q = ctx_.queue();
  std::lock_guard<std::mutex> lock(clblast_mutex());
  const auto status = clblast::Gemm<float>(
      clblast::Layout::kRowMajor, ta ? clblast::Transpose::kYes : clblast::Transpose::kNo,
      tb ? clblast::Transpose::kYes : clblast::Transpose::kNo, static_cast<size_t>(m),
      static_cast<size_t>(n), static_cast<size_t>(k), alpha, mem_of(a, op),
      static_cast<size_t>(a.offset() + a_off), static_cast<size_t>(ta ? m : k), mem_of(b, op),
      static_cast<size_t>(b.offset() + b_off), static_cast<size_t>(tb ? k : n), beta,
      mem_of(c, op), static_cast<size_t>(c.offset() + c_off), static_cast<size_t>(n), &q);
  cl_check(static_cast<cl_int>(status), op, "clblast::Gemm");
}

void OpenClBackend::gemm(bool trans_a, bool trans_b, int64_t m, int64_t n, int64_t k, float alpha,
                         const Tensor& a, const Tensor& b, float beta, const Tensor& c) {
  gemm_one(trans_a, trans_b, m, n, k, alpha, a, 0, b, 0, beta, c, 0, "gemm");
}

void OpenClBackend::gemm_strided_batched(bool ta, bool tb, int64_t m, int64_t n, int64_t k,
                                         float alpha, const Tensor& a, int64_t stride_a,
                                         const Tensor& b, int64_t stride_b, float beta,
                                         const Tensor& c, int64_t stride_c, int64_t batch) {
  const char* op = "gemm_strided_batched";
  cl_need(m >= 0 && n >= 0 && k >= 0 && batch >= 0, op, "negative size");
  cl_need(stride_a >= 0 && stride_b >= 0 && stride_c >= 0, op, "negative stride");
  if (batch == 0) return;
  cl_need(batch == 1 || stride_c >= m * n, op, "C matrices overlap (stride_c < m*n)");
  need_gemm_span(a, 0, (batch - 1) * stride_a + m * k, op, "A");
  need_gemm_span(b, 0, (batch - 1) * stride_b + k * n, op, "B");
  need_gemm_span(c, 0, (batch - 1) * stride_c + m * n, op, "C");
  if (m == 0 || n == 0) return;
  if (k == 0 || batch == 1) {  // CLBlast rejects k == 0; one matrix needs no batching
    for (int64_t i = 0; i < batch; ++i)
      gemm_one(ta, tb, m, n, k, alpha, a, i * stride_a, b, i * stride_b, beta, c, i * stride_c, op);
    return;
  }
  if (beta == 0.0f) zero_strided(c, 0, batch, m * n, stride_c, op);
  cl_command_queue q = ctx_.queue();
  std::lock_guard<std::mutex> lock(clblast_mutex());
  const auto status = clblast::GemmStridedBatched<float>(
      clblast::Layout::kRowMajor, ta ? clblast::Transpose::kYes : clblast::Transpose::kNo,
      tb ? clblast::Transpose::kYes : clblast::Transpose::kNo, static_cast<size_t>(m),
      static_cast<size_t>(n), static_cast<size_t>(k), alpha, mem_of(a, op),
      static_cast<size_t>(a.offset()), static_cast<size_t>(ta ? m : k),
      static_cast<size_t>(stride_a), mem_of(b, op), static_cast<size_t>(b.offset()),
      static_cast<size_t>(tb ? k : n), static_cast<size_t>(stride_b), beta, mem_of(c, op),
      static_cast<size_t>(c.offset()), static_cast<size_t>(n), static_cast<size_t>(stride_c),
      static_cast<size_t>(batch), &q);
  cl_check(static_cast<cl_int>(status), op, "clblast::GemmStridedBatched");
}

void OpenClBackend::gemm_grouped(bool ta, bool tb, float alpha, const Tensor& a, const Tensor& b,
                                 float beta, const Tensor& c, std::span<const GemmGroup> groups) {
  // One CLBlast call per group; empty groups (experts that got no tokens) are skipped.
  for (const GemmGroup& g : groups) {
    if (g.m == 0) continue;
    gemm_one(ta, tb, g.m, g.n, g.k, alpha, a, g.a_offset, b, g.b_offset, beta, c, g.c_offset,
             "gemm_grouped");
  }
}

// ---- optimizer -------------------------------------------------------------------------------

double OpenClBackend::squared_norm(const Tensor& x) {
  const char* op = "squared_norm";
  cl_need_f32(x, op, "x");
  if (x.numel() == 0) return 0.0;
  ClLaunch launch(*this, "sqnorm_partial", op);
  const size_t local = ctx_.work_group_size(launch.kernel(), row_cap_);
  // Fixed partition for a given size and device: up to 1024 contiguous chunks,
  // so the partials and their order never change; the host adds them in double.
  const int64_t groups = std::min<int64_t>(1024, x.numel());
  const int64_t chunk = (x.numel() + groups - 1) / groups;
  Tensor partial = empty({groups});
  launch.mem(mem_of(partial, op)).t(x).l(x.numel()).l(chunk).groups(static_cast<size_t>(groups),
                                                                     local);
  std::vector<float> host = download_f32(partial);
  double sum = 0.0;
  for (float p : host) sum += static_cast<double>(p);
  return sum;
}

void OpenClBackend::adamw(const Tensor& param, const Tensor& grad, const Tensor& m,
                          const Tensor& v, const AdamWParams& hp) {
  const char* op = "adamw";
  cl_need_f32(param, op, "param");
  cl_need_f32(grad, op, "grad");
  cl_need_f32(m, op, "m");
  cl_need_f32(v, op, "v");
  cl_need_numel(grad, param.numel(), op, "grad");
  cl_need_numel(m, param.numel(), op, "m");
  cl_need_numel(v, param.numel(), op, "v");
  cl_need(hp.step >= 1, op, "step must be >= 1 (1-based)");
  const double bc1 = 1.0 - std::pow(static_cast<double>(hp.beta1), static_cast<double>(hp.step));
  const double bc2 = 1.0 - std::pow(static_cast<double>(hp.beta2), static_cast<double>(hp.step));
  ClLaunch(*this, "adamw", op)
      .t(param)
      .t(grad)
      .t(m)
      .t(v)
      .f(hp.lr)
      .f(hp.beta1)
      .f(hp.beta2)
      .f(hp.eps)
      .f(hp.weight_decay)
      .f(static_cast<float>(bc1))
      .f(static_cast<float>(bc2))
      .f(hp.grad_scale)
      .l(param.numel())
      .items(param.numel());
}

// ---- factory and introspection -------------------------------------------------------------

std::unique_ptr<Backend> make_opencl_backend(const BackendOptions& options) {
  return std::make_unique<OpenClBackend>(options);
}

static OpenClBackend& as_opencl(Backend& backend, const char* what) {
  auto* be = dynamic_cast<OpenClBackend*>(&backend);
  if (!be)
    throw std::invalid_argument(std::string(what) + ": backend '" + backend.name() +
                                "' is not an OpenCL backend");
  return *be;
}

ClPoolStats opencl_pool_stats(Backend& backend) {
  return as_opencl(backend, "opencl_pool_stats").cl().pool()->stats();
}

void opencl_set_row_group_cap(Backend& backend, size_t cap) {
  as_opencl(backend, "opencl_set_row_group_cap").set_row_group_cap(cap);
}

void opencl_set_attention_caps(Backend& backend, size_t block, size_t tile) {
  as_opencl(backend, "opencl_set_attention_caps").set_attention_caps(block, tile);
}

size_t opencl_row_group_cap(Backend& backend) {
  return as_opencl(backend, "opencl_row_group_cap").row_group_cap();
}

ClDeviceInfo opencl_device_info(Backend& backend) {
  return as_opencl(backend, "opencl_device_info").cl().info();
}

}  // namespace troupe::kernels
