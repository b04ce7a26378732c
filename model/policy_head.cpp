// Policy-gradient head over the Decoder: log-probs, entropy and d L / d
// logits on the host in float64 (one [T,V] download and upload per pass; the
// rest is the decoder's own forward and backward on the backend).
#include "model/policy_head.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

#include "model/sampling.hpp"

namespace troupe::model {

PolicyHead::PolicyHead(kernels::Backend& be, const ModelConfig& c, int64_t batch)
    : cfg_(c), dec_(be, c, batch), be_(be) {}

const PolicyForward& PolicyHead::forward(const ModelWeights& w, std::span<const int32_t> inputs,
                                         std::span<const int32_t> targets, double temperature) {
  if (!(temperature > 0.0))
    throw std::invalid_argument("PolicyHead::forward: temperature must be > 0, got " +
                                std::to_string(temperature));
  const ForwardResult r = dec_.forward(w, inputs, targets);  // checks ids and targets
  const int64_t T = dec_.tokens(), V = cfg_.vocab_size;
  temperature_ = temperature;
  targets_.assign(targets.begin(), targets.end());
  logits_.resize(static_cast<size_t>(T * V));
  be_.download(logits_.data(), dec_.logits(), logits_.size() * sizeof(float));
  fwd_.logprobs.assign(static_cast<size_t>(T), 0.0f);
  fwd_.entropy.assign(static_cast<size_t>(T), 0.0f);
  fwd_.counted = r.counted;
  fwd_.aux_loss = r.aux_loss;
  for (int64_t t = 0; t < T; ++t) {
    const int32_t a = targets_[static_cast<size_t>(t)];
    if (a < 0) continue;
    double h = 0.0;
    fwd_.logprobs[static_cast<size_t>(t)] =
        static_cast<float>(token_logprob(logits_.data() + t * V, V, a, temperature, &h));
    fwd_.entropy[static_cast<size_t>(t)] = static_cast<float>(h);
  }
  have_forward_ = true;
  return fwd_;
}

void PolicyHead::backward(const ModelWeights& w, const ModelWeights& grads,
                          std::span<const float> coef, double aux_scale) {
  if (!have_forward_) throw std::logic_error("PolicyHead::backward without a forward");
  const int64_t T = dec_.tokens(), V = cfg_.vocab_size;
  if (static_cast<int64_t>(coef.size()) != T)
    throw std::invalid_argument("PolicyHead::backward: expected " + std::to_string(T) +
                                " coefficients, got " + std::to_string(coef.size()));
  dlogits_.assign(static_cast<size_t>(T * V), 0.0f);
  const double inv_t = 1.0 / temperature_;
  std::vector<double> z(static_cast<size_t>(V));
  for (int64_t t = 0; t < T; ++t) {
    const double g = coef[static_cast<size_t>(t)];
    const int32_t a = targets_[static_cast<size_t>(t)];
    if (a < 0) {
      if (g != 0.0)
        throw std::invalid_argument("PolicyHead::backward: coefficient " + std::to_string(g) +
                                    " at position " + std::to_string(t) + ", which has no target");
      continue;
    }
    if (g == 0.0) continue;
    // d log softmax(l/T)[a] / d l_v = (1[v == a] - p_v) / T.
    const float* l = logits_.data() + t * V;
    double mx = l[0];
    for (int64_t v = 1; v < V; ++v) mx = std::max(mx, static_cast<double>(l[v]));
    double sum = 0.0;
    for (int64_t v = 0; v < V; ++v) sum += (z[static_cast<size_t>(v)] = std::exp((l[v] - mx) * inv_t));
    float* d = dlogits_.data() + t * V;
    for (int64_t v = 0; v < V; ++v)
      d[v] = static_cast<float>(-g * inv_t * z[static_cast<size_t>(v)] / sum);
    d[a] = static_cast<float>(g * inv_t * (1.0 - z[static_cast<size_t>(a)] / sum));
  }
  dec_.backward_logits(w, grads, dlogits_, aux_scale);
}

}  // namespace troupe::model
