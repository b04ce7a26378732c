// Load-aware contiguous expert placement (see placement.hpp).
#include "moe/placement.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

namespace troupe::moe {

namespace {

void check(std::span<const double> loads, const std::vector<int64_t>& b) {
  const int64_t E = static_cast<int64_t>(loads.size());
  bool ok = b.size() >= 2 && b.front() == 0 && b.back() == E;
  for (size_t i = 1; ok && i < b.size(); ++i) ok = b[i] > b[i - 1];
  if (!ok) throw std::invalid_argument("expert bounds must rise strictly from 0 to n_experts (" + std::to_string(E) + ")");
}

std::vector<double> shard_sums(std::span<const double> loads, const std::vector<int64_t>& b) {
  std::vector<double> out(b.size() - 1, 0.0);
  for (size_t s = 0; s + 1 < b.size(); ++s)
    for (int64_t e = b[s]; e < b[s + 1]; ++e) out[s] += loads[static_cast<size_t>(e)];
  return out;
}

}  // namespace

std::vector<int64_t> even_bounds(int64_t n_experts, int shards) {
  if (shards < 1 || shards > n_experts) throw std::invalid_argument("even_bounds: bad shard count");
  std::vector<int64_t> b{0};
  const int64_t base = n_experts / shards, extra = n_experts % shards;
  for (int s = 0; s < shards; ++s) b.push_back(b.back() + base + (s < extra ? 1 : 0));
  return b;
}

std::vector<int64_t> rebalance_bounds(std::span<const double> loads, const std::vector<int64_t>& bounds, int max_moves,
                                      int* moves) {
  check(loads, bounds);
  std::vector<int64_t> b = bounds;
  int done = 0;
  for (; done < max_moves; ++done) {
    const std::vector<double> sum = shard_sums(loads, b);
    const size_t hot = static_cast<size_t>(std::max_element(sum.begin(), sum.end()) - sum.begin());
    if (b[hot + 1] - b[hot] < 2) break;  // a single expert cannot be split further
    // Candidates: its first expert to the left neighbour, its last to the right.
    double best = sum[hot];
    int side = 0;
    if (hot > 0) {
      const double x = loads[static_cast<size_t>(b[hot])];
      const double worse = std::max(sum[hot] - x, sum[hot - 1] + x);
      if (worse < best) best = worse, side = -1;
    }
    if (hot + 2 < b.size()) {
      const double x = loads[static_cast<size_t>(b[hot + 1] - 1)];
      const double worse = std::max(sum[hot] - x, sum[hot + 1] + x);
      if (worse < best) best = worse, side = +1;
    }
    if (side == 0) break;  // no single move lowers the hottest shard's pair
    if (side < 0) ++b[hot];
    else --b[hot + 1];
  }
  if (moves) *moves = done;
  return b;
}

double bounds_imbalance(std::span<const double> loads, const std::vector<int64_t>& bounds) {
  check(loads, bounds);
  const std::vector<double> sum = shard_sums(loads, bounds);
  double total = 0.0, most = 0.0;
  for (double x : sum) total += x, most = std::max(most, x);
  return total > 0.0 ? most * static_cast<double>(sum.size()) / total : 0.0;
}

}  // namespace troupe::moe
