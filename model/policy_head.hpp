// The policy-gradient loss head: per-token log pi(a_t | context) and entropy
// at a sampling temperature T in a forward, then, given per-token
// coefficients g_t = dL/dlogp_t that the RL loss computes from those
// log-probs (rl/), the backward of
//     L = sum_t g_t * log softmax(logits_t / T)[a_t]  +  aux_scale * aux_loss
// through the whole decoder, reusing its backward (dense and MoE), with
// gradients accumulating into the trainer's flat gradient buffer. The MoE
// load-balancing terms apply as in training: the aux loss through aux_scale,
// the selection-bias update from expert_load() like any training step.
//
// log pi here is exactly token_logprob (model/sampling.hpp), the value the
// KV-cache generator records per sampled token, computed the same way.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kernels/backend.hpp"
#include "model/config.hpp"
#include "model/decoder.hpp"
#include "model/weights.hpp"

namespace troupe::model {

struct PolicyForward {
  std::vector<float> logprobs;  // [B*S] log pi(target_t | tokens <= t) at T; 0 where target is -1
  std::vector<float> entropy;   // [B*S] entropy of softmax(logits_t / T); 0 where target is -1
  int64_t counted = 0;          // tokens with a target
  double aux_loss = 0.0;        // sum over MoE layers (0 when dense or not aux_loss)
};

// The head's math on host logits [T,V] (row t's target targets[t], -1 =
// none), shared with a pipeline's last stage (Stage::backward takes the
// logits gradient as dout): per-token log-probs and entropies at T, and
// dlogits[T,V] = d(sum_t coef[t] logp_t)/d logits (overwritten; 0 on rows
// without a target; a non-zero coefficient there is std::invalid_argument).
void policy_logprobs(std::span<float> logprobs, std::span<float> entropy,
                     std::span<const float> logits, std::span<const int32_t> targets,
                     int64_t vocab, double temperature);
void policy_logits_grad(std::span<float> dlogits, std::span<const float> logits,
                        std::span<const int32_t> targets, std::span<const float> coef,
                        int64_t vocab, double temperature);

class PolicyHead {
 public:
  // `batch` rows of config.seq_len tokens (prompt + completion, padded).
  PolicyHead(kernels::Backend& backend, const ModelConfig& config, int64_t batch);

  // inputs/targets: [batch*seq_len]; targets[t] is the token a_t whose
  // log-prob is wanted at position t (usually inputs[t+1]), -1 on prompt and
  // padding. temperature > 0 (std::invalid_argument otherwise).
  const PolicyForward& forward(const ModelWeights& w, std::span<const int32_t> inputs,
                               std::span<const int32_t> targets, double temperature);
  // Backward of sum_t coef[t] * logprobs[t] + aux_scale * aux_loss for the
  // last forward. coef: [batch*seq_len], 0 wherever the target is -1
  // (std::invalid_argument otherwise). Gradients ACCUMULATE into `grads`.
  void backward(const ModelWeights& w, const ModelWeights& grads, std::span<const float> coef,
                double aux_scale);

  // The underlying decoder (expert_load() for bias balancing, logits()).
  Decoder& decoder() { return dec_; }

 private:
  ModelConfig cfg_;
  Decoder dec_;
  kernels::Backend& be_;
  double temperature_ = 0.0;
  bool have_forward_ = false;
  std::vector<int32_t> targets_;
  std::vector<float> logits_;   // [T,V] host copy of the last forward's logits
  std::vector<float> dlogits_;  // [T,V]
  PolicyForward fwd_;
};

}  // namespace troupe::model
