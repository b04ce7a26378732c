// The sim models' randomness (rl_sim, ep_sim): the splitmix64 finalizer as a
// fixed hash, so a seed gives the same draws on every platform (std
// distributions are implementation-defined).
#pragma once

#include <cstdint>

namespace troupe::sim {

inline uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

}  // namespace troupe::sim
