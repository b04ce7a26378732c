// Wall-clock helpers for the figures troupe reports (step times, phase
// times, busy and idle shares). Timings are reported, never used in the math.
#pragma once

#include <chrono>

namespace troupe::model {

using Clock = std::chrono::steady_clock;

// Seconds from `t0` to now.
inline double seconds_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

}  // namespace troupe::model
