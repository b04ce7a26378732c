// Arena: activation memory for one microbatch, carved out of a few large
// backend buffers when a layer is built and reused every step, so the training
// loop allocates nothing. Used by the MoE layer and the decoder.
#pragma once

#include <cstdint>
#include <vector>

#include "kernels/backend.hpp"

namespace troupe::moe {

class Arena {
 public:
  // Chunks hold at least `chunk_elems` elements each (more for large requests).
  explicit Arena(kernels::Backend& backend, int64_t chunk_elems = int64_t{1} << 20);
  Arena(const Arena&) = delete;
  Arena& operator=(const Arena&) = delete;

  kernels::Tensor f32(kernels::Shape shape) { return take(std::move(shape), kernels::DType::f32); }
  kernels::Tensor i32(kernels::Shape shape) { return take(std::move(shape), kernels::DType::i32); }
  // Elements handed out so far (both dtypes, padding included).
  int64_t used() const { return used_; }
  kernels::Backend& backend() const { return backend_; }

 private:
  kernels::Tensor take(kernels::Shape shape, kernels::DType dtype);
  struct Chunk {
    kernels::Tensor storage;
    int64_t next = 0;
  };
  kernels::Backend& backend_;
  int64_t chunk_elems_;
  int64_t used_ = 0;
  // One open chunk per dtype: views must have the dtype of their buffer.
  std::vector<Chunk> chunks_[2];
};

}  // namespace troupe::moe
