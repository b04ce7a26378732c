// Activation arena: bump allocation of tensor views from large backend buffers.
#include "moe/arena.hpp"

namespace troupe::moe {

using kernels::DType;
using kernels::Shape;
using kernels::Tensor;

// Views start on 16-element (64-byte) boundaries so vector loads and OpenCL
// sub-buffer style offsets stay aligned.
static constexpr int64_t kAlign = 16;

Arena::Arena(kernels::Backend& backend, int64_t chunk_elems)
    : backend_(backend), chunk_elems_(chunk_elems) {}

Tensor Arena::take(Shape shape, DType dtype) {
  const int64_t n = kernels::shape_numel(shape);
  const int64_t padded = (n + kAlign - 1) / kAlign * kAlign;
  auto& list = chunks_[static_cast<int>(dtype)];
  if (list.empty() || list.back().next + padded > list.back().storage.numel()) {
    const int64_t size = padded > chunk_elems_ ? padded : chunk_elems_;
    list.push_back(Chunk{backend_.empty({size}, dtype), 0});
  }
  Chunk& c = list.back();
  Tensor t = c.storage.view(c.next, std::move(shape));
  c.next += padded;
  used_ += padded;
  return t;
}

}  // namespace troupe::moe
