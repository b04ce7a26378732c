// Adaptive failure suspicion (see suspicion.hpp).
#include "actors/supervision/suspicion.hpp"

#include <algorithm>
#include <cmath>

namespace troupe::runtime {

namespace {

// -log10 P(X > t) for X ~ N(mean, sd). The exact tail (erfc) rather than
// Akka's logistic approximation, which overstates phi in the far tail
// (7.3 for 6.5 at 5 sd): in double erfc is finite to ~38 sd (phi ~300).
double phi_of(double t, double mean, double sd) {
  const double tail = 0.5 * std::erfc((t - mean) / (sd * std::sqrt(2.0)));
  return tail > 0 ? -std::log10(tail) : 400.0;
}

}  // namespace

Suspicion::Suspicion(SuspicionOptions o) : o_(o) {
  if (o_.window < 1) o_.window = 1;
  if (o_.min_samples < 1) o_.min_samples = 1;
}

void Suspicion::observe(double seconds) {
  if (!std::isfinite(seconds) || seconds < 0) return;
  kept_.push_back(seconds);
  sum_ += seconds;
  sum_sq_ += seconds * seconds;
  if (kept_.size() > o_.window) {
    const double x = kept_.front();
    kept_.pop_front();
    sum_ -= x;
    sum_sq_ -= x * x;
  }
}

double Suspicion::mean() const { return kept_.empty() ? 0.0 : sum_ / static_cast<double>(kept_.size()); }

double Suspicion::sd() const {
  if (kept_.empty()) return 0.0;
  const double m = mean();
  const double var = std::max(0.0, sum_sq_ / static_cast<double>(kept_.size()) - m * m);
  // A tiny positive floor keeps phi defined for a run of identical zeros.
  return std::max({std::sqrt(var), o_.min_sd_fraction * m, 1e-9});
}

double Suspicion::longest() const { return kept_.empty() ? 0.0 : *std::max_element(kept_.begin(), kept_.end()); }

double Suspicion::phi(double elapsed) const {
  if (kept_.empty()) return 0.0;
  return phi_of(elapsed, mean(), sd());
}

double Suspicion::deadline() const {
  if (!ready()) return 0.0;
  const double m = mean(), s = sd();
  // phi grows monotonically in t: bisect for the threshold crossing, in
  // units of sd above the mean (phi 8 is ~5.6 sd; 64 sd is past any phi a
  // double can hold).
  double lo = 0.0, hi = 64.0;
  for (int i = 0; i < 60; ++i) {
    const double mid = 0.5 * (lo + hi);
    (phi_of(m + mid * s, m, s) >= o_.phi ? hi : lo) = mid;
  }
  double t = std::max({m + hi * s, o_.tail_factor * longest(), o_.floor});
  if (o_.ceiling > 0) t = std::min(t, o_.ceiling);
  return t;
}

}  // namespace troupe::runtime
