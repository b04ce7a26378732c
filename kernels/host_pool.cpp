// HostPool (see host_pool.hpp): workers sleep on a condition variable between
// regions (no spinning: the machine may be shared), take items from an atomic
// counter, and the caller works alongside them, then waits for the stragglers.
#include "kernels/host_pool.hpp"

#include <atomic>
#include <condition_variable>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace troupe::kernels::host {

struct HostPool::Shared {
  std::mutex mu;
  std::condition_variable start, done;
  uint64_t generation = 0;  // bumped once per region; workers wait for a new one
  bool stop = false;
  int busy = 0;             // workers not yet finished with this region
  const std::function<void(int64_t, int)>* body = nullptr;
  int64_t n = 0;
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  std::vector<std::thread> threads;
  std::atomic<bool> in_use{false};  // a region is running

  void work(int worker) {
    for (;;) {
      const int64_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= n) return;
      try {
        (*body)(i, worker);
      } catch (...) {
        std::lock_guard<std::mutex> lk(mu);
        if (!error) error = std::current_exception();
      }
    }
  }

  void worker_loop(int worker) {
    uint64_t seen = 0;
    std::unique_lock<std::mutex> lk(mu);
    for (;;) {
      start.wait(lk, [&] { return stop || generation != seen; });
      if (stop) return;
      seen = generation;
      lk.unlock();
      work(worker);
      lk.lock();
      if (--busy == 0) done.notify_one();
    }
  }
};

HostPool::HostPool(int threads) : size_(threads < 1 ? 1 : threads), shared_(new Shared) {
  for (int w = 1; w < size_; ++w)
    shared_->threads.emplace_back([s = shared_.get(), w] { s->worker_loop(w); });
}

HostPool::~HostPool() {
  {
    std::lock_guard<std::mutex> lk(shared_->mu);
    shared_->stop = true;
  }
  shared_->start.notify_all();
  for (std::thread& t : shared_->threads) t.join();
}

void HostPool::run(int64_t n, const std::function<void(int64_t, int)>& body) {
  Shared& s = *shared_;
  bool idle = false;
  if (size_ == 1 || n < 2 || !s.in_use.compare_exchange_strong(idle, true)) {
    for (int64_t i = 0; i < n; ++i) body(i, 0);
    return;
  }
  {
    std::lock_guard<std::mutex> lk(s.mu);
    s.body = &body;
    s.n = n;
    s.next.store(0, std::memory_order_relaxed);
    s.busy = size_ - 1;
    s.error = nullptr;
    ++s.generation;
  }
  s.start.notify_all();
  s.work(0);
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lk(s.mu);
    s.done.wait(lk, [&] { return s.busy == 0; });
    error = s.error;
    s.body = nullptr;
  }
  s.in_use.store(false);
  if (error) std::rethrow_exception(error);
}

}  // namespace troupe::kernels::host
