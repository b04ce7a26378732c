// Tensor views and shape helpers (backend-independent).
#include "kernels/tensor.hpp"

#include <cassert>
#include <sstream>
#include <stdexcept>

namespace troupe::kernels {

const char* dtype_name(DType d) { return d == DType::f32 ? "f32" : "i32"; }

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
}

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << '[';
  for (size_t i = 0; i < s.size(); ++i) os << (i ? "," : "") << s[i];
  os << ']';
  return os.str();
}

Tensor::Tensor(std::shared_ptr<Buffer> buf, Backend* backend, Shape shape, DType dtype,
               int64_t offset)
    : buf_(std::move(buf)), backend_(backend), shape_(std::move(shape)), dtype_(dtype),
      offset_(offset), numel_(shape_numel(shape_)) {
  if (buf_ && static_cast<size_t>(offset_ + numel_) * dtype_size(dtype_) > buf_->bytes())
    throw std::out_of_range("tensor " + shape_str(shape_) + " at offset " +
                            std::to_string(offset_) + " exceeds its buffer");
}

int64_t Tensor::dim(int i) const {
  if (i < 0) i += rank();
  assert(i >= 0 && i < rank());
  return shape_[static_cast<size_t>(i)];
}

Tensor Tensor::view(int64_t offset, Shape shape) const {
  if (offset < 0 || offset + shape_numel(shape) > numel_)
    throw std::out_of_range("view " + shape_str(shape) + " at " + std::to_string(offset) +
                            " exceeds tensor " + shape_str(shape_));
  return Tensor(buf_, backend_, std::move(shape), dtype_, offset_ + offset);
}

Tensor Tensor::rows(int64_t begin, int64_t end) const {
  assert(rank() >= 1 && begin >= 0 && begin <= end && end <= shape_[0]);
  Shape s = shape_;
  s[0] = end - begin;
  const int64_t row = shape_[0] ? numel_ / shape_[0] : 0;
  return view(begin * row, std::move(s));
}

float* Tensor::f32() const {
  assert(dtype_ == DType::f32);
  void* p = buf_ ? buf_->host_ptr() : nullptr;
  if (!p) throw std::logic_error("Tensor::f32(): not a host tensor");
  return static_cast<float*>(p) + offset_;
}

int32_t* Tensor::i32() const {
  assert(dtype_ == DType::i32);
  void* p = buf_ ? buf_->host_ptr() : nullptr;
  if (!p) throw std::logic_error("Tensor::i32(): not a host tensor");
  return static_cast<int32_t*>(p) + offset_;
}

namespace {

class BorrowedHostBuffer final : public Buffer {
 public:
  BorrowedHostBuffer(void* data, size_t bytes, std::shared_ptr<const void> keep)
      : data_(data), bytes_(bytes), keep_(std::move(keep)) {}
  size_t bytes() const override { return bytes_; }
  void* host_ptr() override { return data_; }

 private:
  void* data_;
  size_t bytes_;
  std::shared_ptr<const void> keep_;
};

}  // namespace

Tensor borrow_host_f32(Backend* host_backend, float* data, int64_t n, std::shared_ptr<const void> keep) {
  if (n < 0 || (n > 0 && data == nullptr)) throw std::invalid_argument("borrow_host_f32: no memory for " + std::to_string(n) + " floats");
  return Tensor(std::make_shared<BorrowedHostBuffer>(data, static_cast<size_t>(n) * sizeof(float), std::move(keep)),
                host_backend, {n}, DType::f32);
}

}  // namespace troupe::kernels
