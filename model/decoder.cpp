// The whole-model decoder: one Stage over every layer (see decoder.hpp).
#include "model/decoder.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

namespace troupe::model {

Decoder::Decoder(kernels::Backend& be, const ModelConfig& c, int64_t batch)
    : cfg_(c), batch_(batch), stage_(be, c, batch, 0, c.n_layers, true, true, 1) {}

Decoder::~Decoder() = default;

ForwardResult Decoder::forward(const ModelWeights& w, std::span<const int32_t> inputs,
                               std::span<const int32_t> targets) {
  if (inputs.size() != targets.size())
    throw std::invalid_argument("Decoder::forward: expected " + std::to_string(tokens()) +
                                " inputs and targets, got " + std::to_string(inputs.size()) +
                                " and " + std::to_string(targets.size()));
  return stage_.forward_tokens(0, w, inputs, targets);
}

void Decoder::backward(const ModelWeights& w, const ModelWeights& g, double loss_scale,
                       double aux_scale) {
  stage_.backward(0, w, g, {}, loss_scale, aux_scale);
}

void Decoder::backward_logits(const ModelWeights& w, const ModelWeights& g,
                              std::span<const float> dlogits, double aux_scale) {
  if (static_cast<int64_t>(dlogits.size()) != tokens() * cfg_.vocab_size)
    throw std::invalid_argument("Decoder::backward_logits: expected " +
                                std::to_string(tokens() * cfg_.vocab_size) + " floats, got " +
                                std::to_string(dlogits.size()));
  stage_.backward(0, w, g, dlogits, 0.0, aux_scale);
}

double train_flops_per_token(const ModelConfig& c) {
  const double D = static_cast<double>(c.d_model), V = static_cast<double>(c.vocab_size);
  const double S = static_cast<double>(c.seq_len);
  // Matmul weights touched per token (2 FLOPs per weight per token forward).
  double ffn = 0.0;
  if (c.ffn == Ffn::dense) {
    ffn = 3.0 * D * static_cast<double>(c.dense_hidden);
  } else {
    const double F = static_cast<double>(c.expert_hidden);
    ffn = static_cast<double>(c.n_experts) * D + static_cast<double>(c.top_k) * 3.0 * D * F +
          static_cast<double>(c.shared_experts) * 3.0 * D * F;
  }
  const double per_layer = 4.0 * D * D + ffn;
  // Causal attention: QK^T and AV over (S+1)/2 keys on average, 2 FLOPs each.
  const double attn = 2.0 * 2.0 * D * (S + 1.0) / 2.0;
  const double fwd = 2.0 * (static_cast<double>(c.n_layers) * per_layer + V * D) +
                     static_cast<double>(c.n_layers) * attn;
  return 3.0 * fwd;
}

}  // namespace troupe::model
