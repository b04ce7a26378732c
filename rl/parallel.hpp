// fn(d) for d = 0 .. n-1, each on its own thread (d = 0 on the caller's): the
// data-parallel synchronous loop's devices (rl/trainer.cpp,
// sample_step_parallel). Every call finishes before the first exception, if
// any, is rethrown. Plain library code: no actors.
#pragma once

#include <cstdint>
#include <exception>
#include <thread>
#include <vector>

namespace troupe::rl {

template <class F>
void on_each_device(int64_t n, F&& fn) {
  if (n <= 1) {
    if (n == 1) fn(int64_t{0});
    return;
  }
  std::vector<std::exception_ptr> failed(static_cast<size_t>(n));
  auto guarded = [&](int64_t d) {
    try {
      fn(d);
    } catch (...) {
      failed[static_cast<size_t>(d)] = std::current_exception();
    }
  };
  std::vector<std::thread> threads;
  for (int64_t d = 1; d < n; ++d) threads.emplace_back(guarded, d);
  guarded(0);
  for (auto& t : threads) t.join();
  for (const auto& e : failed)
    if (e) std::rethrow_exception(e);
}

}  // namespace troupe::rl
