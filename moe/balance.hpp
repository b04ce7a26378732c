// Expert load balancing.
//  (a) Auxiliary loss, top-k form (Switch/GShard): aux = alpha * E * sum_i f_i P_i,
//      f_i = share of the T*k routed assignments that chose expert i (counted
//      before capacity dropping; a constant for the gradient), P_i = mean
//      router probability of expert i. d aux / d probs[t,i] = alpha * E * f_i / T.
//  (b) DeepSeek-V3 aux-loss-free: a per-expert bias added to the scores for
//      selection only; after each optimizer step
//      bias_i += gamma * sign(mean load - load_i).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace troupe::moe {

enum class Balance { none, aux_loss, bias };

// "none", "aux_loss", "bias"; throws std::invalid_argument otherwise.
Balance parse_balance(const std::string& name);
// The inverse of parse_balance.
const char* balance_name(Balance balance);

// prob_sum[E] = sum over tokens of router probabilities; routed[E] = assignments.
double aux_loss_value(std::span<const float> prob_sum, std::span<const int64_t> routed,
                      int64_t tokens, int64_t top_k, double alpha);

// The per-expert gradient row, scaled by `scale` (dTotal/daux).
std::vector<float> aux_loss_grad_row(std::span<const int64_t> routed, int64_t tokens,
                                     int64_t top_k, double alpha, double scale);

// bias_i += gamma * sign(mean(load) - load_i), in place.
void update_router_bias(std::span<float> bias, std::span<const int64_t> load, double gamma);

}  // namespace troupe::moe
