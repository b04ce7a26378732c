// The older policy versions a decoupled RL checkpoint needs (rl.sync =
// "fixed_lag"). After k steps the trainer holds version k, but steps k ..
// k + eta - 1 are sampled by versions max(0, k - eta) .. k - 1, which only
// existed as publications. They are saved next to the checkpoint, each as a
// parameters-only checkpoint `<dir>/rl_versions/v<N>` (hashed, verified on
// load like any checkpoint), so a resumed run re-publishes exactly the bits
// the uninterrupted run published and regenerates the rollouts that were in
// flight or waiting in the buffer at the boundary: they are pure functions of
// (seed, step, index, version). Plain library code: no actors.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "model/config.hpp"

namespace troupe::rl {

// The versions needed to resume after `steps_done` steps with max_staleness
// eta: [max(0, steps_done - eta), steps_done) (empty with eta 0).
struct VersionRange {
  int64_t first = 0, end = 0;
};
VersionRange versions_to_keep(int64_t steps_done, int64_t max_staleness);

// Writes every version of `versions` in the range into `<dir>/rl_versions`
// (after the main checkpoint was saved to `dir`, which replaced any older
// rl_versions with it). Throws model::CheckpointError on I/O errors and
// std::invalid_argument when a version of the range is missing.
void save_versions(const std::string& dir, const model::ModelConfig& config, uint64_t seed, VersionRange range,
                   const std::map<int64_t, std::shared_ptr<const std::vector<float>>>& versions);

// Reads the versions of the range back from `<dir>/rl_versions`. Throws
// model::CheckpointError naming the missing or damaged file.
std::map<int64_t, std::vector<float>> load_versions(const std::string& dir, const model::ModelConfig& config,
                                                    VersionRange range);

}  // namespace troupe::rl
