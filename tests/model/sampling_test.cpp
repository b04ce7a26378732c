// Tests of model/sampling: greedy, temperature, top-k, top-p, RNG determinism,
// and that empirical frequencies match the intended distribution.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <numeric>
#include <vector>

#include "model/sampling.hpp"

using namespace troupe::model;

namespace {

std::vector<float> random_logits(SamplerRng& rng, int64_t vocab, double scale) {
  std::vector<float> l(static_cast<size_t>(vocab));
  for (float& x : l) x = static_cast<float>((rng.next_double() * 2.0 - 1.0) * scale);
  return l;
}

// Reference softmax(logits / T) in float64, written independently of the library.
std::vector<double> softmax(const std::vector<float>& logits, double temperature) {
  double m = -INFINITY;
  for (float l : logits) m = std::max(m, static_cast<double>(l));
  std::vector<double> p(logits.size());
  double sum = 0.0;
  for (size_t i = 0; i < logits.size(); ++i) sum += p[i] = std::exp((logits[i] - m) / temperature);
  for (double& x : p) x /= sum;
  return p;
}

// Tokens of the nucleus: the smallest most-likely set whose mass reaches top_p.
std::vector<int> nucleus(const std::vector<double>& p, double top_p) {
  std::vector<int> order(p.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return p[a] != p[b] ? p[a] > p[b] : a < b; });
  std::vector<int> out;
  double cum = 0.0;
  for (int i : order) {
    out.push_back(i);
    cum += p[static_cast<size_t>(i)];
    if (cum >= top_p) break;
  }
  return out;
}

}  // namespace

TEST(Sampling, GreedyPicksArgmax) {
  SamplerRng gen(7);
  for (int trial = 0; trial < 200; ++trial) {
    const auto logits = random_logits(gen, 50, 5.0);
    const auto expect = std::max_element(logits.begin(), logits.end()) - logits.begin();
    EXPECT_EQ(sample_greedy(logits.data(), 50), expect);
    SamplerRng rng(1);
    const std::string before = rng.state();
    SamplingOptions opt;
    opt.temperature = 0.0;
    EXPECT_EQ(sample_token(logits.data(), 50, opt, rng), expect);
    EXPECT_EQ(rng.state(), before) << "greedy must not consume randomness";
  }
  const float ties[] = {1.0f, 3.0f, -2.0f, 3.0f};
  EXPECT_EQ(sample_greedy(ties, 4), 1) << "ties go to the lowest index";
}

TEST(Sampling, TinyTemperatureEqualsGreedy) {
  SamplerRng gen(11);
  SamplerRng rng(12);
  SamplingOptions opt;
  opt.temperature = 1e-6;
  for (int trial = 0; trial < 300; ++trial) {
    const auto logits = random_logits(gen, 64, 3.0);
    const int32_t greedy = sample_greedy(logits.data(), 64);
    // Skip rows whose top two logits are closer than 1e-4 (then T = 1e-6 is not "zero").
    auto sorted = logits;
    std::sort(sorted.rbegin(), sorted.rend());
    if (sorted[0] - sorted[1] < 1e-4f) continue;
    for (int draw = 0; draw < 20; ++draw) EXPECT_EQ(sample_token(logits.data(), 64, opt, rng), greedy);
  }
}

TEST(Sampling, TopPNeverLeavesTheNucleus) {
  SamplerRng gen(3);
  SamplerRng rng(4);
  for (double top_p : {0.3, 0.6, 0.9}) {
    const auto logits = random_logits(gen, 40, 3.0);
    const auto inside = nucleus(softmax(logits, 1.0), top_p);
    std::vector<int> hits(40, 0);
    SamplingOptions opt;
    opt.top_p = top_p;
    for (int draw = 0; draw < 20000; ++draw) {
      const int32_t t = sample_token(logits.data(), 40, opt, rng);
      ASSERT_TRUE(std::find(inside.begin(), inside.end(), t) != inside.end())
          << "token " << t << " is outside the top_p=" << top_p << " nucleus";
      ++hits[static_cast<size_t>(t)];
    }
    for (int t : inside) EXPECT_GT(hits[static_cast<size_t>(t)], 0) << "nucleus token " << t << " never drawn";
  }
}

TEST(Sampling, TopKKeepsTheKMostLikely) {
  SamplerRng gen(5);
  SamplerRng rng(6);
  const auto logits = random_logits(gen, 30, 2.0);
  std::vector<int> order(30);
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return logits[a] > logits[b]; });
  SamplingOptions opt;
  opt.top_k = 5;
  std::vector<int> hits(30, 0);
  for (int draw = 0; draw < 20000; ++draw) ++hits[static_cast<size_t>(sample_token(logits.data(), 30, opt, rng))];
  for (int r = 0; r < 30; ++r) {
    if (r < 5) EXPECT_GT(hits[static_cast<size_t>(order[r])], 0);
    else EXPECT_EQ(hits[static_cast<size_t>(order[r])], 0) << "rank " << r << " drawn under top_k=5";
  }
}

// With a fixed seed the counts are fixed numbers; the bound (5 standard
// deviations of a binomial) says the sampler draws from softmax(logits / T).
TEST(Sampling, FrequenciesMatchSoftmax) {
  const std::vector<float> logits = {1.0f, 0.5f, -0.3f, 2.0f, 0.0f, -1.5f, 1.2f, -INFINITY};
  const int n = 200000;
  for (double temperature : {0.5, 1.0, 2.0}) {
    SamplerRng rng(42);
    SamplingOptions opt;
    opt.temperature = temperature;
    std::vector<int> hits(logits.size(), 0);
    for (int draw = 0; draw < n; ++draw)
      ++hits[static_cast<size_t>(sample_token(logits.data(), static_cast<int64_t>(logits.size()), opt, rng))];
    const auto p = softmax(logits, temperature);
    for (size_t i = 0; i < p.size(); ++i) {
      const double freq = static_cast<double>(hits[i]) / n;
      const double sigma = std::sqrt(p[i] * (1.0 - p[i]) / n);
      EXPECT_NEAR(freq, p[i], 5.0 * sigma + 1e-9) << "token " << i << " at T=" << temperature;
    }
    EXPECT_EQ(hits.back(), 0) << "a -inf logit was drawn";
  }
}

TEST(Sampling, TopPFrequenciesMatchRenormalisedNucleus) {
  const std::vector<float> logits = {2.0f, 1.5f, 1.0f, 0.0f, -1.0f, -2.0f};
  SamplingOptions opt;
  opt.top_p = 0.8;
  const auto p = softmax(logits, 1.0);
  const auto inside = nucleus(p, 0.8);
  double mass = 0.0;
  for (int t : inside) mass += p[static_cast<size_t>(t)];
  std::vector<double> probs(logits.size());
  sampling_probs(probs.data(), logits.data(), 6, opt);
  const int n = 100000;
  SamplerRng rng(9);
  std::vector<int> hits(6, 0);
  for (int draw = 0; draw < n; ++draw) ++hits[static_cast<size_t>(sample_token(logits.data(), 6, opt, rng))];
  for (size_t i = 0; i < 6; ++i) {
    const bool in = std::find(inside.begin(), inside.end(), static_cast<int>(i)) != inside.end();
    const double want = in ? p[i] / mass : 0.0;
    EXPECT_NEAR(probs[i], want, 1e-12);
    const double sigma = std::sqrt(want * (1.0 - want) / n);
    EXPECT_NEAR(static_cast<double>(hits[i]) / n, want, 5.0 * sigma + 1e-9) << "token " << i;
  }
}

TEST(Sampling, SameSeedSameTokensAndStateRoundTrip) {
  const std::vector<float> logits = {0.1f, 0.2f, 0.3f, 0.4f, 0.5f};
  SamplingOptions opt;
  opt.temperature = 1.3;
  opt.top_p = 0.95;
  SamplerRng a(123), b(123);
  for (int i = 0; i < 100; ++i) ASSERT_EQ(sample_token(logits.data(), 5, opt, a), sample_token(logits.data(), 5, opt, b));
  SamplerRng c(0);
  c.set_state(a.state());
  for (int i = 0; i < 100; ++i) ASSERT_EQ(a.next_u64(), c.next_u64());
  SamplerRng d(124);
  std::vector<int32_t> ta, td;
  SamplerRng e(123);
  for (int i = 0; i < 50; ++i) {
    ta.push_back(sample_token(logits.data(), 5, opt, e));
    td.push_back(sample_token(logits.data(), 5, opt, d));
  }
  EXPECT_NE(ta, td) << "different seeds should give different samples";
  EXPECT_THROW(c.set_state("short"), std::invalid_argument);
}

// token_logprob is log softmax(logits / T) over the full vocabulary (top-p
// and top-k not applied; greedy counts as T = 1), with the entropy of it.
TEST(Sampling, TokenLogprobIsTheTemperedFullSoftmax) {
  SamplerRng rng(9);
  const std::vector<float> l = random_logits(rng, 50, 4.0);
  for (double T : {0.5, 1.0, 1.7}) {
    const std::vector<double> p = softmax(l, T);
    double h_want = 0.0;
    for (double x : p) h_want -= x > 0 ? x * std::log(x) : 0.0;
    for (int32_t tok : {0, 7, 49}) {
      double h = -1.0;
      EXPECT_NEAR(token_logprob(l.data(), 50, tok, T, &h), std::log(p[tok]), 1e-12);
      EXPECT_NEAR(h, h_want, 1e-12);
    }
  }
  const std::vector<double> p1 = softmax(l, 1.0);
  EXPECT_NEAR(token_logprob(l.data(), 50, 3, 0.0), std::log(p1[3]), 1e-12);
  EXPECT_THROW(token_logprob(l.data(), 50, 50, 1.0), std::invalid_argument);
  EXPECT_THROW(token_logprob(l.data(), 50, -1, 1.0), std::invalid_argument);
}

TEST(Sampling, RejectsBadInput) {
  SamplerRng rng(1);
  SamplingOptions opt;
  const float with_nan[] = {0.0f, NAN, 1.0f};
  EXPECT_THROW(sample_token(with_nan, 3, opt, rng), std::invalid_argument);
  EXPECT_THROW(sample_greedy(with_nan, 3), std::invalid_argument);
  const float with_inf[] = {0.0f, INFINITY};
  EXPECT_THROW(sample_token(with_inf, 2, opt, rng), std::invalid_argument);
  const float all_neg_inf[] = {-INFINITY, -INFINITY};
  EXPECT_THROW(sample_token(all_neg_inf, 2, opt, rng), std::invalid_argument);
  const float ok[] = {0.0f, 1.0f};
  EXPECT_THROW(sample_token(ok, 0, opt, rng), std::invalid_argument);
  opt.top_p = 0.0;
  EXPECT_THROW(sample_token(ok, 2, opt, rng), std::invalid_argument);
  opt.top_p = 1.5;
  EXPECT_THROW(sample_token(ok, 2, opt, rng), std::invalid_argument);
  opt.top_p = 1.0;
  opt.top_k = -1;
  EXPECT_THROW(sample_token(ok, 2, opt, rng), std::invalid_argument);
}
