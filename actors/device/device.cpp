// Device: one thread, one backend, a FIFO of closures (see device.hpp).
#include "actors/device/device.hpp"

#include <chrono>
#include <stdexcept>

namespace troupe::runtime {

namespace {
int64_t now_ns() {
  return std::chrono::duration_cast<std::chrono::nanoseconds>(std::chrono::steady_clock::now().time_since_epoch())
      .count();
}
}  // namespace

Device::Device(int id, const kernels::BackendOptions& options) : id_(id), kind_(options.kind) {
  // The backend is built on the device thread; the constructor waits for it.
  bool ready = false;
  thread_ = std::thread([this, options, &ready] {
    try {
      auto be = kernels::make_backend(options);
      std::lock_guard<std::mutex> lk(mu_);
      backend_ = std::move(be);
    } catch (...) {
      std::lock_guard<std::mutex> lk(mu_);
      init_error_ = std::current_exception();
    }
    {
      std::lock_guard<std::mutex> lk(mu_);
      ready = true;
    }
    idle_cv_.notify_all();
    if (backend_) loop();
  });
  std::unique_lock<std::mutex> lk(mu_);
  idle_cv_.wait(lk, [&] { return ready; });
  if (init_error_) {
    lk.unlock();
    thread_.join();
    std::rethrow_exception(init_error_);
  }
}

Device::~Device() {
  {
    std::lock_guard<std::mutex> lk(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
  // The backend (and every buffer allocated from it) goes last.
}

void Device::submit(Work work, OnError on_error, TraceLabel label) {
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (stop_) throw std::logic_error("Device::submit after shutdown");
    queue_.push_back(Item{std::move(work), std::move(on_error), label});
  }
  cv_.notify_one();
}

void Device::drain() {
  std::unique_lock<std::mutex> lk(mu_);
  idle_cv_.wait(lk, [&] { return queue_.empty() && !running_; });
}

void Device::enable_trace(size_t reserve) {
  std::lock_guard<std::mutex> lk(mu_);
  tracing_ = true;
  events_.reserve(reserve);
}

std::vector<TraceEvent> Device::trace() const {
  std::lock_guard<std::mutex> lk(mu_);
  return events_;
}

uint64_t Device::completed() const {
  std::lock_guard<std::mutex> lk(mu_);
  return completed_;
}

void Device::loop() {
  for (;;) {
    Item item;
    bool record = false;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop requested and nothing left
      item = std::move(queue_.front());
      queue_.pop_front();
      running_ = true;
      record = tracing_ && item.label.kind != TraceLabel::None;
    }
    // Two clock reads per labelled closure; the event is stored under the
    // lock the loop takes anyway.
    const int64_t t0 = record ? now_ns() : 0;
    try {
      item.work(*backend_);
    } catch (const std::exception& e) {
      if (item.on_error) item.on_error(e.what());
    } catch (...) {
      if (item.on_error) item.on_error("unknown exception");
    }
    const int64_t t1 = record ? now_ns() : 0;
    {
      std::lock_guard<std::mutex> lk(mu_);
      if (record) events_.push_back(TraceEvent{item.label, t0, t1});
      running_ = false;
      ++completed_;
    }
    idle_cv_.notify_all();
  }
}

}  // namespace troupe::runtime
