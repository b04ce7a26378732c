// Gradient slices summed into the shard's buffer (see slice_sum.hpp).
#include "actors/optimizer/slice_sum.hpp"

#include <algorithm>
#include <cstring>
#include <iterator>
#include <map>

namespace troupe::runtime {

void sum_parts_into(float* out, int64_t count, const std::vector<GradPart>& parts) {
  std::map<int64_t, int64_t> written;  // disjoint [begin, end) written so far
  for (const GradPart& p : parts) {
    const int64_t off = p.offset, end = off + static_cast<int64_t>(p.values.size());
    const float* g = p.values.data();
    int64_t at = off;
    auto it = written.upper_bound(off);
    if (it != written.begin() && std::prev(it)->second > off) --it;  // the interval holding off
    while (at < end) {
      // Not yet written up to the next written interval: copy.
      const int64_t fresh_end = (it == written.end() || it->first >= end) ? end : std::max(at, it->first);
      if (fresh_end > at) {
        std::memcpy(out + at, g + (at - off), static_cast<size_t>(fresh_end - at) * sizeof(float));
        at = fresh_end;
      }
      if (at >= end) break;
      // Inside a written interval: add.
      const int64_t stop = std::min(end, it->second);
      for (int64_t i = at; i < stop; ++i) out[i] += g[i - off];
      at = stop;
      ++it;
    }
    // Record [off, end) as written, merged with the intervals it touches.
    int64_t b = off, e = end;
    auto lo = written.upper_bound(b);
    if (lo != written.begin() && std::prev(lo)->second >= b) --lo;
    auto hi = lo;
    while (hi != written.end() && hi->first <= e) {
      b = std::min(b, hi->first);
      e = std::max(e, hi->second);
      ++hi;
    }
    written.erase(lo, hi);
    if (e > b) written.emplace(b, e);
  }
  int64_t at = 0;
  for (const auto& [b, e] : written) {
    if (b > at) std::fill(out + at, out + b, 0.0f);
    at = e;
  }
  if (at < count) std::fill(out + at, out + count, 0.0f);
}

}  // namespace troupe::runtime
