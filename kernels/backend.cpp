// Backend-independent helpers: typed upload/download, zero-filled tensors,
// global gradient clipping and the backend factory.
#include "kernels/backend.hpp"

#include <cmath>
#include <stdexcept>

#include "kernels/host_backend.hpp"
#include "kernels/opencl_backend.hpp"

namespace troupe::kernels {

Tensor Backend::zeros(Shape shape, DType dtype) {
  Tensor t = empty(std::move(shape), dtype);
  if (dtype == DType::f32) {
    fill(t, 0.0f);
  } else {
    std::vector<int32_t> z(static_cast<size_t>(t.numel()), 0);
    upload(t, z.data(), t.bytes());
  }
  return t;
}

bool Backend::set_batch_invariant(bool on) {
  if (on) throw std::logic_error("the " + name() + " backend has no batch-invariant GEMM");
  return false;
}

// Overwrite variants, for backends without a one-pass kernel: zero, then add.
void Backend::rmsnorm_backward_overwrite(const Tensor& dx, const Tensor& dw, const Tensor& dout,
                                         const Tensor& x, const Tensor& w, const Tensor& rstd) {
  fill(dx, 0.0f);
  rmsnorm_backward(dx, dw, dout, x, w, rstd);
}

void Backend::rope_backward_overwrite(const Tensor& dx, const Tensor& dout, int64_t pos_offset,
                                      float theta) {
  fill(dx, 0.0f);
  rope_backward(dx, dout, pos_offset, theta);
}

void Backend::attention_backward_overwrite(const Tensor& dq, const Tensor& dk, const Tensor& dv,
                                           const Tensor& dout, const Tensor& q, const Tensor& k,
                                           const Tensor& v, const Tensor& out, const Tensor& lse,
                                           float scale) {
  fill(dq, 0.0f);
  fill(dk, 0.0f);
  fill(dv, 0.0f);
  attention_backward(dq, dk, dv, dout, q, k, v, out, lse, scale);
}

void Backend::swiglu_backward_overwrite(const Tensor& dgate, const Tensor& dup, const Tensor& dout,
                                        const Tensor& gate, const Tensor& up) {
  fill(dgate, 0.0f);
  fill(dup, 0.0f);
  swiglu_backward(dgate, dup, dout, gate, up);
}

void Backend::cross_entropy_backward_overwrite(const Tensor& dlogits, const Tensor& logits,
                                               const Tensor& targets, int32_t ignore_index,
                                               float grad_scale) {
  fill(dlogits, 0.0f);
  cross_entropy_backward(dlogits, logits, targets, ignore_index, grad_scale);
}

void Backend::softmax_backward_overwrite(const Tensor& dx, const Tensor& dout, const Tensor& out) {
  fill(dx, 0.0f);
  softmax_backward(dx, dout, out);
}

static void check_transfer(const Tensor& t, DType dtype, size_t count, const char* what) {
  if (t.dtype() != dtype || static_cast<size_t>(t.numel()) != count)
    throw std::invalid_argument(std::string(what) + ": tensor " + shape_str(t.shape()) + " " +
                                dtype_name(t.dtype()) + " vs " + std::to_string(count) + " " +
                                dtype_name(dtype) + " elements");
}

void Backend::upload_f32(const Tensor& dst, std::span<const float> src) {
  check_transfer(dst, DType::f32, src.size(), "upload_f32");
  upload(dst, src.data(), src.size_bytes());
}

void Backend::upload_i32(const Tensor& dst, std::span<const int32_t> src) {
  check_transfer(dst, DType::i32, src.size(), "upload_i32");
  upload(dst, src.data(), src.size_bytes());
}

std::vector<float> Backend::download_f32(const Tensor& src) {
  std::vector<float> out(static_cast<size_t>(src.numel()));
  check_transfer(src, DType::f32, out.size(), "download_f32");
  download(out.data(), src, src.bytes());
  return out;
}

std::vector<int32_t> Backend::download_i32(const Tensor& src) {
  std::vector<int32_t> out(static_cast<size_t>(src.numel()));
  check_transfer(src, DType::i32, out.size(), "download_i32");
  download(out.data(), src, src.bytes());
  return out;
}

Tensor Backend::from_f32(Shape shape, std::span<const float> src) {
  Tensor t = empty(std::move(shape), DType::f32);
  upload_f32(t, src);
  return t;
}

Tensor Backend::from_i32(Shape shape, std::span<const int32_t> src) {
  Tensor t = empty(std::move(shape), DType::i32);
  upload_i32(t, src);
  return t;
}

double clip_grad_norm(Backend& backend, std::span<const Tensor> grads, double max_norm) {
  double sq = 0.0;
  for (const Tensor& g : grads) sq += backend.squared_norm(g);
  const double norm = std::sqrt(sq);
  if (max_norm > 0.0 && norm > max_norm) {
    const float s = static_cast<float>(max_norm / (norm + 1e-6));
    for (const Tensor& g : grads) backend.scale(g, s);
  }
  return norm;
}

const char* backend_kind_name(BackendKind kind) { return kind == BackendKind::host ? "host" : "opencl"; }

const char* opencl_device_type_name(OpenclDeviceType type) {
  switch (type) {
    case OpenclDeviceType::any: return "any";
    case OpenclDeviceType::gpu: return "gpu";
    case OpenclDeviceType::cpu: return "cpu";
  }
  return "?";
}

BackendKind parse_backend_kind(const std::string& name) {
  if (name == "host") return BackendKind::host;
  if (name == "opencl") return BackendKind::opencl;
  throw std::invalid_argument("unknown backend kind '" + name + "' (expected \"host\" or \"opencl\")");
}

OpenclDeviceType parse_opencl_device_type(const std::string& name) {
  if (name == "any" || name.empty()) return OpenclDeviceType::any;
  if (name == "gpu") return OpenclDeviceType::gpu;
  if (name == "cpu") return OpenclDeviceType::cpu;
  throw std::invalid_argument("opencl: unknown device_type '" + name + "' (expected \"any\", \"gpu\" or \"cpu\")");
}

std::unique_ptr<Backend> make_backend(const BackendOptions& options) {
  if (options.kind == BackendKind::opencl) return make_opencl_backend(options);
  return make_host_backend(options);
}

}  // namespace troupe::kernels
