// Policy-gradient head over the Decoder: log-probs, entropy and d L / d
// logits on the host in float64 (one [T,V] download and upload per pass; the
// rest is the decoder's own forward and backward on the backend).
#include "model/policy_head.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "model/sampling.hpp"

namespace troupe::model {

void policy_logprobs(std::span<float> logprobs, std::span<float> entropy,
                     std::span<const float> logits, std::span<const int32_t> targets,
                     int64_t V, double temperature) {
  const size_t T = targets.size();
  if (logprobs.size() != T || entropy.size() != T || logits.size() != T * static_cast<size_t>(V))
    throw std::invalid_argument("policy_logprobs: sizes disagree (" + std::to_string(T) + " targets, " +
                                std::to_string(logits.size()) + " logits, vocab " + std::to_string(V) + ")");
  if (!(temperature > 0.0))
    throw std::invalid_argument("policy head: temperature must be > 0, got " + std::to_string(temperature));
  for (size_t t = 0; t < T; ++t) {
    logprobs[t] = entropy[t] = 0.0f;
    if (targets[t] < 0) continue;
    double h = 0.0;
    logprobs[t] = static_cast<float>(token_logprob(logits.data() + t * V, V, targets[t], temperature, &h));
    entropy[t] = static_cast<float>(h);
  }
}

void policy_logits_grad(std::span<float> dlogits, std::span<const float> logits,
                        std::span<const int32_t> targets, std::span<const float> coef, int64_t V,
                        double temperature) {
  const size_t T = targets.size();
  if (coef.size() != T)
    throw std::invalid_argument("policy head: expected " + std::to_string(T) + " coefficients, got " +
                                std::to_string(coef.size()));
  if (dlogits.size() != T * static_cast<size_t>(V) || logits.size() != dlogits.size())
    throw std::invalid_argument("policy_logits_grad: sizes disagree");
  if (!(temperature > 0.0))
    throw std::invalid_argument("policy head: temperature must be > 0, got " + std::to_string(temperature));
  std::fill(dlogits.begin(), dlogits.end(), 0.0f);
  const double inv_t = 1.0 / temperature;
  std::vector<double> z(static_cast<size_t>(V));
  for (size_t t = 0; t < T; ++t) {
    const double g = coef[t];
    const int32_t a = targets[t];
    if (a < 0) {
      if (g != 0.0)
        throw std::invalid_argument("policy head: coefficient " + std::to_string(g) + " at position " +
                                    std::to_string(t) + ", which has no target");
      continue;
    }
    if (g == 0.0) continue;
    // d log softmax(l/T)[a] / d l_v = (1[v == a] - p_v) / T.
    const float* l = logits.data() + t * V;
    double mx = l[0];
    for (int64_t v = 1; v < V; ++v) mx = std::max(mx, static_cast<double>(l[v]));
    double sum = 0.0;
    for (int64_t v = 0; v < V; ++v) sum += (z[static_cast<size_t>(v)] = std::exp((l[v] - mx) * inv_t));
    float* d = dlogits.data() + t * V;
    for (int64_t v = 0; v < V; ++v) d[v] = static_cast<float>(-g * inv_t * z[static_cast<size_t>(v)] / sum);
    d[a] = static_cast<float>(g * inv_t * (1.0 - z[static_cast<size_t>(a)] / sum));
  }
}

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
  fwd_.logprobs.resize(static_cast<size_t>(T));
  fwd_.entropy.resize(static_cast<size_t>(T));
  fwd_.counted = r.counted;
  fwd_.aux_loss = r.aux_loss;
  policy_logprobs(fwd_.logprobs, fwd_.entropy, logits_, targets_, V, temperature);
  have_forward_ = true;
  return fwd_;
}

void PolicyHead::backward(const ModelWeights& w, const ModelWeights& grads,
                          std::span<const float> coef, double aux_scale) {
  if (!have_forward_) throw std::logic_error("PolicyHead::backward without a forward");
  dlogits_.resize(logits_.size());
  policy_logits_grad(dlogits_, logits_, targets_, coef, cfg_.vocab_size, temperature_);
  dec_.backward_logits(w, grads, dlogits_, aux_scale);
}

}  // namespace troupe::model
