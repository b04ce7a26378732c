// The optimizer shard's gradient reduction on the host: the slices of every
// (replica, rank) summed straight into the shard's gradient buffer, in one
// pass where they do not overlap. Separate from the actor so that it can be
// tested against the plain "zeros, then add every slice in order" sum.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace troupe::runtime {

struct GradPart {
  int64_t offset = 0;  // into the output, in elements
  std::span<const float> values;
};

// out[0, count) = the sum of `parts` in their order: the first part to reach
// an element copies it, later ones add; elements no part reaches are zeroed.
// Bitwise the sum "zeros, then add every part in order" gives, except that a
// first contribution of -0 stays -0 (as an unreduced gradient does). Parts
// must lie inside [0, count) (the caller has validated the ranges).
void sum_parts_into(float* out, int64_t count, const std::vector<GradPart>& parts);

}  // namespace troupe::runtime
