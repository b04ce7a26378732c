// The older policy versions of a decoupled RL checkpoint (version_store.hpp).
#include "rl/version_store.hpp"

#include <algorithm>
#include <stdexcept>

#include "model/checkpoint.hpp"
#include "model/params.hpp"

namespace troupe::rl {
namespace {

std::string version_dir(const std::string& dir, int64_t v) { return dir + "/rl_versions/v" + std::to_string(v); }

}  // namespace

VersionRange versions_to_keep(int64_t steps_done, int64_t max_staleness) {
  return {std::max<int64_t>(0, steps_done - max_staleness), steps_done};
}

void save_versions(const std::string& dir, const model::ModelConfig& config, uint64_t seed, VersionRange range,
                   const std::map<int64_t, std::shared_ptr<const std::vector<float>>>& versions) {
  const model::ParamLayout layout = model::build_param_layout(config);
  for (int64_t v = range.first; v < range.end; ++v) {
    const auto it = versions.find(v);
    if (it == versions.end() || !it->second)
      throw std::invalid_argument("rl: cannot checkpoint policy version " + std::to_string(v) + ": it was not kept");
    model::TrainingState st;
    st.config = config;
    st.seed = seed;
    st.step = v;
    st.data_cursor = v;
    st.params = *it->second;
    model::save_checkpoint(version_dir(dir, v), st, layout);
  }
}

std::map<int64_t, std::vector<float>> load_versions(const std::string& dir, const model::ModelConfig& config,
                                                    VersionRange range) {
  const model::ParamLayout layout = model::build_param_layout(config);
  std::map<int64_t, std::vector<float>> out;
  for (int64_t v = range.first; v < range.end; ++v) {
    const std::string at = version_dir(dir, v);
    if (!model::checkpoint_exists(at))
      throw model::CheckpointError(at, "missing: a decoupled RL checkpoint after step " + std::to_string(range.end) +
                                           " needs policy version " + std::to_string(v) + " to resume");
    model::TrainingState st = model::load_checkpoint(at, layout);
    if (st.step != v) throw model::CheckpointError(at, "holds version " + std::to_string(st.step) + ", expected " + std::to_string(v));
    out.emplace(v, std::move(st.params));
  }
  return out;
}

}  // namespace troupe::rl
