// Tensor: a typed, shaped view of a backend buffer (float32 or int32, contiguous).
// A tensor never owns compute; a Backend runs ops on it. Views share the buffer,
// so a flat parameter buffer can hand out named per-layer views.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>
#include <vector>

namespace troupe::kernels {

class Backend;

enum class DType : uint8_t { f32 = 0, i32 = 1 };

inline size_t dtype_size(DType) { return 4; }  // both dtypes are 4 bytes wide
const char* dtype_name(DType d);

// Backend-specific storage. Host buffers expose a pointer; device buffers do not.
class Buffer {
 public:
  virtual ~Buffer() = default;
  virtual size_t bytes() const = 0;
  // Host-addressable memory, or nullptr for device memory.
  virtual void* host_ptr() { return nullptr; }
};

using Shape = std::vector<int64_t>;
int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);

class Tensor {
 public:
  Tensor() = default;
  Tensor(std::shared_ptr<Buffer> buf, Backend* backend, Shape shape, DType dtype, int64_t offset = 0);

  bool defined() const { return buf_ != nullptr; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int rank() const { return static_cast<int>(shape_.size()); }
  // Size of dimension i; negative i counts from the back.
  int64_t dim(int i) const;
  int64_t numel() const { return numel_; }
  size_t bytes() const { return static_cast<size_t>(numel_) * dtype_size(dtype_); }
  // Offset of element 0 in the buffer, in elements.
  int64_t offset() const { return offset_; }
  Buffer* buffer() const { return buf_.get(); }
  const std::shared_ptr<Buffer>& buffer_ptr() const { return buf_; }
  Backend* backend() const { return backend_; }

  // A view of numel(shape) elements starting `offset` elements into this tensor.
  Tensor view(int64_t offset, Shape shape) const;
  // Same elements, another shape (numel must match).
  Tensor reshape(Shape shape) const { return view(0, std::move(shape)); }
  // Rows [begin, end) along dimension 0.
  Tensor rows(int64_t begin, int64_t end) const;

  // Host pointers: only valid on host-backed tensors (asserts otherwise).
  float* f32() const;
  int32_t* i32() const;

 private:
  std::shared_ptr<Buffer> buf_;
  Backend* backend_ = nullptr;
  Shape shape_;
  DType dtype_ = DType::f32;
  int64_t offset_ = 0;
  int64_t numel_ = 0;
};

// A host-backend f32 tensor [n] over memory it does not own (a message's
// tensor blob): `keep` keeps that memory alive as long as any view of the
// tensor. Only for the host backend (other backends cannot address it), and
// the caller decides who may write to it.
Tensor borrow_host_f32(Backend* host_backend, float* data, int64_t n, std::shared_ptr<const void> keep);

}  // namespace troupe::kernels
