// Staleness rules of decoupled RL as plain functions over per-token policy
// versions (no actors): the admission bound of rl.max_staleness and the
// version-lag histogram. The rollout buffer (actors/rl/) admits a step's
// rollouts with these, so the bound is one rule in one place for both sync
// modes:
//   fixed_lag  every token of step s carries version max(0, s - eta) exactly;
//   latest     every token of step s carries a version in [s - eta, s]: the
//              trainer trains step s at version s (s updates applied) and
//              no token older than s - eta is ever trained on.
#pragma once

#include <cstdint>
#include <map>
#include <span>
#include <vector>

#include "rl/config.hpp"

namespace troupe::rl {

// The versions a step's tokens may carry when the trainer, at version
// `trainer_version`, trains on them: [lo, hi] inclusive.
struct VersionWindow {
  int64_t lo = 0, hi = 0;
};
VersionWindow admissible_versions(SyncMode mode, int64_t trainer_version, int64_t max_staleness);

// The lowest version a generator may start step `step` with: the coordinator
// deals the step once this version is published (generators wait, paused,
// rather than produce work the buffer would refuse).
inline int64_t first_version_for(int64_t step, int64_t max_staleness) {
  return step > max_staleness ? step - max_staleness : 0;
}

// Whether every version in `versions` lies in the window (true when empty).
bool within(std::span<const int64_t> versions, VersionWindow window);

// Adds the lag (trainer_version - v) of every version v to `histogram`
// (lag -> tokens).
void add_version_lags(std::map<int64_t, int64_t>& histogram, std::span<const int64_t> versions, int64_t trainer_version);

// How many distinct versions a token sequence carries (a rollout that spans a
// publication in "latest" carries two or more).
int64_t distinct_versions(std::span<const int64_t> versions);

}  // namespace troupe::rl
