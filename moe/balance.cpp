// Load-balancing math: aux-loss value and gradient row, router bias update.
#include "moe/balance.hpp"

#include <stdexcept>

namespace troupe::moe {

Balance parse_balance(const std::string& name) {
  if (name == "none") return Balance::none;
  if (name == "aux_loss") return Balance::aux_loss;
  if (name == "bias") return Balance::bias;
  throw std::invalid_argument("unknown balance method '" + name +
                              "' (expected \"none\", \"aux_loss\" or \"bias\")");
}

const char* balance_name(Balance balance) {
  switch (balance) {
    case Balance::none: return "none";
    case Balance::aux_loss: return "aux_loss";
    case Balance::bias: return "bias";
  }
  return "?";
}

double aux_loss_value(std::span<const float> prob_sum, std::span<const int64_t> routed,
                      int64_t tokens, int64_t top_k, double alpha) {
  if (prob_sum.size() != routed.size()) throw std::invalid_argument("aux_loss_value: sizes");
  if (tokens <= 0) return 0.0;
  const double E = static_cast<double>(routed.size());
  double s = 0.0;
  for (size_t i = 0; i < routed.size(); ++i) {
    const double f = static_cast<double>(routed[i]) / static_cast<double>(tokens * top_k);
    const double P = static_cast<double>(prob_sum[i]) / static_cast<double>(tokens);
    s += f * P;
  }
  return alpha * E * s;
}

std::vector<float> aux_loss_grad_row(std::span<const int64_t> routed, int64_t tokens,
                                     int64_t top_k, double alpha, double scale) {
  std::vector<float> row(routed.size(), 0.0f);
  if (tokens <= 0) return row;
  const double E = static_cast<double>(routed.size());
  for (size_t i = 0; i < routed.size(); ++i) {
    const double f = static_cast<double>(routed[i]) / static_cast<double>(tokens * top_k);
    row[i] = static_cast<float>(scale * alpha * E * f / static_cast<double>(tokens));
  }
  return row;
}

void update_router_bias(std::span<float> bias, std::span<const int64_t> load, double gamma) {
  if (bias.size() != load.size()) throw std::invalid_argument("update_router_bias: sizes");
  if (load.empty()) return;
  double mean = 0.0;
  for (int64_t l : load) mean += static_cast<double>(l);
  mean /= static_cast<double>(load.size());
  for (size_t i = 0; i < load.size(); ++i) {
    const double d = mean - static_cast<double>(load[i]);
    const double sign = d > 0 ? 1.0 : (d < 0 ? -1.0 : 0.0);
    bias[i] = static_cast<float>(static_cast<double>(bias[i]) + gamma * sign);
  }
}

}  // namespace troupe::moe
