// Deterministic bench inputs: n floats in [-0.5, 0.5) from an LCG seeded by
// `seed` (the same data for the same seed in every bench and build, so two
// builds' timings compare on equal inputs).
#pragma once

#include <cstdint>
#include <vector>

namespace troupe::bench {

inline std::vector<float> random_f32(size_t n, uint64_t seed) {
  std::vector<float> v(n);
  for (float& x : v) {
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    x = static_cast<float>((seed >> 40) & 0xffff) / 65536.0f - 0.5f;
  }
  return v;
}

}  // namespace troupe::bench
