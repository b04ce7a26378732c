// Next-token sampling from one row of logits: greedy, temperature, top-k and
// top-p (nucleus). Every random choice comes from a SamplerRng the caller owns
// and seeds, so generation is reproducible and the RNG state can be saved.
#pragma once

#include <cstdint>
#include <string>

namespace troupe::model {

// splitmix64 stream: 64 bits of state, fast, statistically strong enough for
// sampling, and identical on every platform (no std:: distributions).
class SamplerRng {
 public:
  explicit SamplerRng(uint64_t seed = 0) : s_(seed) {}
  uint64_t next_u64();
  double next_double();  // uniform in [0, 1), 53 random bits
  // 8 little-endian bytes; set_state throws std::invalid_argument on any other size.
  std::string state() const;
  void set_state(const std::string& bytes);

 private:
  uint64_t s_;
};

struct SamplingOptions {
  double temperature = 1.0;  // logits are divided by it; <= 0 means greedy
  int64_t top_k = 0;         // keep the k most likely tokens; 0 = all
  double top_p = 1.0;        // keep the smallest most-likely set with mass >= top_p; 1 = all
};

// Index of the largest logit (the lowest index among ties).
int32_t sample_greedy(const float* logits, int64_t vocab);

// Draws one token. Consumes exactly one next_double() unless greedy (none).
// Throws std::invalid_argument for NaN or +inf logits, all -inf logits,
// vocab <= 0, or top_p outside (0, 1].
int32_t sample_token(const float* logits, int64_t vocab, const SamplingOptions& opt, SamplerRng& rng);

// The distribution sample_token draws from: probs[vocab] after temperature,
// top-k and top-p, renormalised to sum to 1 (a one-hot argmax when greedy).
// Tokens are ranked by probability, ties by lower index.
void sampling_probs(double* probs, const float* logits, int64_t vocab, const SamplingOptions& opt);

// log softmax(logits / T)[token] in float64, T = temperature (T <= 0, greedy,
// counts as T = 1). No top-k/top-p truncation: this is the log-prob that a
// policy-gradient loss recomputes at the same temperature (model/policy_head.hpp),
// so generation and training agree on it. With `entropy`, also writes the
// entropy of softmax(logits / T). Throws like sampling_probs on bad logits.
double token_logprob(const float* logits, int64_t vocab, int32_t token, double temperature,
                     double* entropy = nullptr);

}  // namespace troupe::model
