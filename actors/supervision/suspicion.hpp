// Adaptive failure suspicion, in the manner of the phi-accrual failure
// detector (Hayashibara et al., 2004; Akka's and Cassandra's detectors): the
// time a run waits before it suspects a loss is derived from the times it
// has measured, not fixed. From the latest samples of a duration (a step's
// length, the longest silence within a step, the gap between two heartbeats)
// it keeps their mean and standard deviation; phi(t) = -log10 P(X > t)
// under a normal model of X, so
// suspicion grows with the time waited relative to what the run has seen,
// and the deadline is the t where phi reaches the threshold.
//
// Two guards the normal model lacks, both because a loaded machine's delays
// are heavier-tailed than normal (one descheduled thread is a long outlier):
// the deadline is at least tail_factor x the longest sample kept, and the
// standard deviation is at least min_sd_fraction of the mean (a steady run's
// tiny spread would otherwise suspect its first hiccup). floor and ceiling
// bound the result. No CAF here: the coordinator (actors/supervision) and the
// cluster's heartbeat monitor (actors/cluster) feed it.
#pragma once

#include <cstddef>
#include <deque>

namespace troupe::runtime {

struct SuspicionOptions {
  size_t window = 256;           // the latest samples kept
  size_t min_samples = 8;        // fewer: not ready (the caller keeps its fallback)
  double phi = 8.0;              // suspect at phi >= this: P = 1e-8 under the model (Akka's default)
  double min_sd_fraction = 0.25; // the standard deviation used is at least this x the mean
  double tail_factor = 2.0;      // the deadline is at least this x the longest sample kept
  double floor = 0.0;            // seconds: the deadline is at least this
  double ceiling = 0.0;          // seconds: and at most this (0: none)
};

class Suspicion {
 public:
  explicit Suspicion(SuspicionOptions o = {});

  // A measured duration in seconds (negative or non-finite ones are ignored).
  void observe(double seconds);
  size_t samples() const { return kept_.size(); }
  bool ready() const { return kept_.size() >= o_.min_samples; }

  double mean() const;
  double sd() const;       // floored at min_sd_fraction x mean
  double longest() const;  // of the samples kept
  // -log10 of the probability that a duration exceeds `elapsed` seconds;
  // 0 with no samples.
  double phi(double elapsed) const;
  // Seconds after which phi reaches the threshold, with the guards above; 0
  // when not ready.
  double deadline() const;

 private:
  SuspicionOptions o_;
  std::deque<double> kept_;
  double sum_ = 0.0, sum_sq_ = 0.0;
};

}  // namespace troupe::runtime
