// Uses the installed troupe libraries: the parameter layout of the quickstart
// MoE decoder (model) and GRPO advantages of one group (rl). Prints both, so
// tests/launch/package_test.sh can check the numbers.
#include <cstdint>
#include <cstdio>
#include <vector>

#include "model/config.hpp"
#include "model/params.hpp"
#include "rl/group.hpp"

int main() {
  troupe::model::ModelConfig config;  // the quickstart shape
  const troupe::model::ParamLayout layout = troupe::model::build_param_layout(config);
  std::printf("parameters %lld in %zu tensors\n", static_cast<long long>(layout.total()), layout.entries().size());

  const std::vector<double> rewards = {1.0, 0.0, 0.0, 1.0};
  std::vector<double> advantages(rewards.size());
  std::vector<uint8_t> keep(1);
  troupe::rl::AdvantageOptions options;
  options.scale_by_std = false;  // Dr. GRPO: R - mean
  const auto stats = troupe::rl::group_advantages(advantages, keep, rewards, 4, options);
  std::printf("advantages %.2f %.2f %.2f %.2f reward_mean %.2f\n", advantages[0], advantages[1], advantages[2],
              advantages[3], stats.reward_mean);
  return 0;
}
