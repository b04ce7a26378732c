// Length buckets for the policy update and their devices (see row_buckets.hpp).
#include "rl/row_buckets.hpp"

#include <algorithm>
#include <limits>
#include <numeric>

namespace troupe::rl {

std::vector<std::pair<int64_t, int64_t>> length_buckets(const std::vector<int64_t>& padded, int64_t k) {
  const int64_t n = static_cast<int64_t>(padded.size());
  std::vector<std::pair<int64_t, int64_t>> spans;
  if (n == 0) return spans;
  k = std::max<int64_t>(1, k);
  std::vector<int64_t> run_end;  // end of each run of equal lengths
  for (int64_t j = 0; j < n; ++j)
    if (j + 1 == n || padded[static_cast<size_t>(j)] != padded[static_cast<size_t>(j + 1)]) run_end.push_back(j + 1);
  const int64_t m_all = static_cast<int64_t>(run_end.size());
  const int64_t k_max = std::min(k, m_all);
  if (k_max * m_all * m_all <= 50'000'000) {
    // best[b][m]: fewest padded tokens for the first m runs in b buckets;
    // from[b][m]: how many runs come before the last bucket.
    auto begin_of = [&](int64_t m) { return m == 0 ? int64_t{0} : run_end[static_cast<size_t>(m - 1)]; };
    const int64_t inf = std::numeric_limits<int64_t>::max() / 4;
    std::vector<std::vector<int64_t>> best(static_cast<size_t>(k_max + 1), std::vector<int64_t>(static_cast<size_t>(m_all + 1), inf));
    std::vector<std::vector<int64_t>> from(best.size(), std::vector<int64_t>(static_cast<size_t>(m_all + 1), 0));
    best[0][0] = 0;
    for (int64_t b = 1; b <= k_max; ++b)
      for (int64_t m = b; m <= m_all; ++m) {
        const int64_t end = run_end[static_cast<size_t>(m - 1)];
        const int64_t len = padded[static_cast<size_t>(end - 1)];
        for (int64_t q = b - 1; q < m; ++q) {
          if (best[b - 1][q] >= inf) continue;
          const int64_t c = best[b - 1][q] + (end - begin_of(q)) * len;
          if (c < best[b][m]) {
            best[b][m] = c;
            from[b][m] = q;
          }
        }
      }
    for (int64_t b = k_max, m = m_all; b > 0; m = from[b][m], --b)
      spans.emplace_back(begin_of(from[b][m]), run_end[static_cast<size_t>(m - 1)]);
    std::reverse(spans.begin(), spans.end());
  } else {
    const int64_t per = (n + k - 1) / k;
    for (int64_t i = 0; i < n; i += per) spans.emplace_back(i, std::min(n, i + per));
  }
  while (static_cast<int64_t>(spans.size()) < std::min(k, n)) {
    size_t big = 0;
    for (size_t x = 1; x < spans.size(); ++x)
      if (spans[x].second - spans[x].first > spans[big].second - spans[big].first) big = x;
    const auto [i, j] = spans[big];
    spans[big] = {i, i + (j - i) / 2};
    spans.insert(spans.begin() + static_cast<std::ptrdiff_t>(big) + 1, {i + (j - i) / 2, j});
  }
  return spans;
}

std::vector<int64_t> deal_buckets(const std::vector<int64_t>& costs, int64_t devices) {
  std::vector<int64_t> device(costs.size(), 0);
  if (devices <= 1) return device;
  std::vector<size_t> by_cost(costs.size());
  std::iota(by_cost.begin(), by_cost.end(), size_t{0});
  std::stable_sort(by_cost.begin(), by_cost.end(), [&](size_t x, size_t y) { return costs[x] > costs[y]; });
  std::vector<int64_t> load(static_cast<size_t>(devices), 0);
  for (size_t g : by_cost) {
    const size_t d = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
    device[g] = static_cast<int64_t>(d);
    load[d] += costs[g];
  }
  return device;
}

}  // namespace troupe::rl
