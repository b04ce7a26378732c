// Staleness rules of decoupled RL (see staleness.hpp).
#include "rl/staleness.hpp"

#include <algorithm>
#include <set>

namespace troupe::rl {

VersionWindow admissible_versions(SyncMode mode, int64_t trainer_version, int64_t max_staleness) {
  const int64_t lo = first_version_for(trainer_version, max_staleness);
  // fixed_lag pins the version (that is what makes it a pure function of the
  // seed); latest lets it float up to the trainer's own version: a newer one
  // cannot exist yet, since version v + 1 needs step v trained.
  if (mode == SyncMode::latest) return {lo, trainer_version};
  return {lo, lo};
}

bool within(std::span<const int64_t> versions, VersionWindow window) {
  return std::all_of(versions.begin(), versions.end(),
                     [&](int64_t v) { return v >= window.lo && v <= window.hi; });
}

void add_version_lags(std::map<int64_t, int64_t>& histogram, std::span<const int64_t> versions, int64_t trainer_version) {
  for (int64_t v : versions) ++histogram[trainer_version - v];
}

int64_t distinct_versions(std::span<const int64_t> versions) {
  return static_cast<int64_t>(std::set<int64_t>(versions.begin(), versions.end()).size());
}

}  // namespace troupe::rl
