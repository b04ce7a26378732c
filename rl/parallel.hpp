// fn(d) for d = 0 .. n-1, each on its own thread (d = 0 on the caller's): the
// data-parallel synchronous loop's devices (rl/trainer.cpp,
// sample_step_parallel). Every call finishes before the first exception, if
// any, is rethrown. Plain library code: no actors.
//
// DeviceTimes (optional) says where each device's time went over a phase of
// such calls, so the loop can report each device's idle share (a device that
// finishes its part first waits for the slowest at the join; devices 1..
// also wait while device 0 runs the serial parts between calls).
#pragma once

#include <chrono>
#include <cstdint>
#include <exception>
#include <thread>
#include <vector>

namespace troupe::rl {

struct DeviceTimes {
  std::vector<double> busy;  // [device] seconds inside fn(d)
  double in_calls = 0.0;     // seconds from the start of each call to its join, summed

  // Each device's idle seconds over a phase of `wall` seconds in which the
  // calls ran: device 0 (the caller) is busy outside the calls (the serial
  // parts) and idle at the joins; devices 1.. are idle outside fn.
  std::vector<double> idle(double wall) const {
    std::vector<double> out(busy.size(), 0.0);
    for (size_t d = 0; d < busy.size(); ++d)
      out[d] = d == 0 ? in_calls - busy[0] : wall - busy[d];
    for (double& x : out) x = x < 0.0 ? 0.0 : x;  // clock granularity
    return out;
  }
};

template <class F>
void on_each_device(int64_t n, F&& fn, DeviceTimes* times = nullptr) {
  using Clock = std::chrono::steady_clock;
  if (times && static_cast<int64_t>(times->busy.size()) < n) times->busy.resize(static_cast<size_t>(n), 0.0);
  const auto call0 = Clock::now();
  std::vector<std::exception_ptr> failed(static_cast<size_t>(n > 0 ? n : 0));
  std::vector<double> took(failed.size(), 0.0);
  auto guarded = [&](int64_t d) {
    const auto t0 = Clock::now();
    try {
      fn(d);
    } catch (...) {
      failed[static_cast<size_t>(d)] = std::current_exception();
    }
    took[static_cast<size_t>(d)] = std::chrono::duration<double>(Clock::now() - t0).count();
  };
  std::vector<std::thread> threads;
  for (int64_t d = 1; d < n; ++d) threads.emplace_back(guarded, d);
  if (n >= 1) guarded(0);
  for (auto& t : threads) t.join();
  if (times) {
    times->in_calls += std::chrono::duration<double>(Clock::now() - call0).count();
    for (size_t d = 0; d < took.size(); ++d) times->busy[d] += took[d];
  }
  for (const auto& e : failed)
    if (e) std::rethrow_exception(e);
}

}  // namespace troupe::rl
