// Sampling implementation. Probabilities are computed in float64 (softmax with
// the max subtracted), so tiny temperatures underflow cleanly to a one-hot on
// the argmax instead of producing NaN. Token ranking for top-k/top-p uses a
// total order (probability, then index), so results never depend on sort
// stability.
#include "model/sampling.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>
#include <stdexcept>
#include <vector>

namespace troupe::model {

uint64_t SamplerRng::next_u64() {
  uint64_t z = (s_ += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

double SamplerRng::next_double() { return static_cast<double>(next_u64() >> 11) * 0x1.0p-53; }

std::string SamplerRng::state() const {
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[static_cast<size_t>(i)] = static_cast<char>((s_ >> (8 * i)) & 0xff);
  return out;
}

void SamplerRng::set_state(const std::string& bytes) {
  if (bytes.size() != 8)
    throw std::invalid_argument("SamplerRng: state must be 8 bytes, got " + std::to_string(bytes.size()));
  uint64_t s = 0;
  for (int i = 0; i < 8; ++i) s |= static_cast<uint64_t>(static_cast<unsigned char>(bytes[static_cast<size_t>(i)])) << (8 * i);
  s_ = s;
}

namespace {

// Rejects logits no distribution can be made from; returns the largest.
float check_logits(const float* logits, int64_t vocab) {
  if (vocab <= 0) throw std::invalid_argument("sampling: vocab must be > 0");
  float best = -INFINITY;
  for (int64_t i = 0; i < vocab; ++i) {
    const float l = logits[i];
    if (std::isnan(l) || l == INFINITY)
      throw std::invalid_argument("sampling: logit " + std::to_string(i) + " is " +
                                  (std::isnan(l) ? "NaN" : "+inf"));
    best = std::max(best, l);
  }
  if (best == -INFINITY) throw std::invalid_argument("sampling: every logit is -inf");
  return best;
}

int32_t argmax(const float* logits, int64_t vocab) {
  int64_t best = 0;
  for (int64_t i = 1; i < vocab; ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<int32_t>(best);
}

}  // namespace

int32_t sample_greedy(const float* logits, int64_t vocab) {
  check_logits(logits, vocab);
  return argmax(logits, vocab);
}

void sampling_probs(double* probs, const float* logits, int64_t vocab, const SamplingOptions& opt) {
  const float max_logit = check_logits(logits, vocab);
  if (!(opt.top_p > 0.0 && opt.top_p <= 1.0))
    throw std::invalid_argument("sampling: top_p must be in (0, 1], got " + std::to_string(opt.top_p));
  if (opt.top_k < 0) throw std::invalid_argument("sampling: top_k must be >= 0");
  const auto n = static_cast<size_t>(vocab);
  if (!(opt.temperature > 0.0)) {  // greedy (also catches NaN temperature)
    std::fill(probs, probs + n, 0.0);
    probs[argmax(logits, vocab)] = 1.0;
    return;
  }
  for (size_t i = 0; i < n; ++i)
    probs[i] = std::exp((static_cast<double>(logits[i]) - max_logit) / opt.temperature);

  const bool cut_k = opt.top_k > 0 && opt.top_k < vocab;
  if (cut_k || opt.top_p < 1.0) {
    std::vector<int32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
      return probs[a] != probs[b] ? probs[a] > probs[b] : a < b;
    });
    size_t keep = cut_k ? static_cast<size_t>(opt.top_k) : n;
    if (opt.top_p < 1.0) {
      double total = 0.0;
      for (size_t j = 0; j < keep; ++j) total += probs[order[j]];
      double cum = 0.0;
      size_t j = 0;
      while (j < keep) {
        cum += probs[order[j++]];
        if (cum >= opt.top_p * total) break;
      }
      keep = j;
    }
    for (size_t j = keep; j < n; ++j) probs[order[j]] = 0.0;
  }
  double sum = 0.0;
  for (size_t i = 0; i < n; ++i) sum += probs[i];
  for (size_t i = 0; i < n; ++i) probs[i] /= sum;  // sum >= 1: the argmax term is exp(0)
}

int32_t sample_token(const float* logits, int64_t vocab, const SamplingOptions& opt, SamplerRng& rng) {
  check_logits(logits, vocab);
  std::vector<double> probs(static_cast<size_t>(vocab));
  sampling_probs(probs.data(), logits, vocab, opt);  // also validates the options
  if (!(opt.temperature > 0.0)) return argmax(logits, vocab);
  const double u = rng.next_double();
  double cum = 0.0;
  int32_t last = 0;
  for (int64_t i = 0; i < vocab; ++i) {
    if (probs[static_cast<size_t>(i)] == 0.0) continue;
    cum += probs[static_cast<size_t>(i)];
    last = static_cast<int32_t>(i);
    if (u < cum) return last;
  }
  return last;  // u landed in the rounding slack above the final cumulative sum
}

double token_logprob(const float* logits, int64_t vocab, int32_t token, double temperature,
                     double* entropy) {
  const double mx = check_logits(logits, vocab);
  if (token < 0 || token >= vocab)
    throw std::invalid_argument("token_logprob: token " + std::to_string(token) +
                                " outside the vocabulary of " + std::to_string(vocab));
  const double inv_t = temperature > 0.0 ? 1.0 / temperature : 1.0;
  // z_i = (l_i - max) / T; log p_i = z_i - log sum exp z; H = lse - sum p_i z_i.
  double sum = 0.0, pz = 0.0;
  for (int64_t i = 0; i < vocab; ++i) {
    const double z = (static_cast<double>(logits[i]) - mx) * inv_t;
    const double e = std::exp(z);
    sum += e;
    if (e > 0.0) pz += e * z;
  }
  const double lse = std::log(sum);
  if (entropy) *entropy = lse - pz / sum;
  return (static_cast<double>(logits[token]) - mx) * inv_t - lse;
}

}  // namespace troupe::model
