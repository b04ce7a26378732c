// Small helpers shared by the bench programs: the median of a sample and the
// machine's load average (every table says the load it was measured at).
#pragma once

#include <algorithm>
#include <fstream>
#include <string>
#include <vector>

namespace troupe::bench {

// The median (the mean of the two middle values for an even count); 0 for none.
inline double median(std::vector<double> v) {
  if (v.empty()) return 0.0;
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

// "/proc/loadavg"'s first three fields, or "unknown".
inline std::string load_average() {
  std::ifstream f("/proc/loadavg");
  std::string a, b, c;
  if (!(f >> a >> b >> c)) return "unknown";
  return a + " " + b + " " + c;
}

}  // namespace troupe::bench
