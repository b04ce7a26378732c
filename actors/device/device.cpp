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

Device::Device(int id, const kernels::BackendOptions& options, Stepping stepping)
    : id_(id), kind_(options.kind), manual_(stepping == Stepping::manual) {
  if (manual_) {
    backend_ = kernels::make_backend(options);
    return;
  }
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
    if (activity_) activity_->work_queued();
    queue_.push_back(Item{std::move(work), std::move(on_error), label});
  }
  if (!manual_) cv_.notify_one();
}

void Device::watch_activity(std::shared_ptr<ActivityClock> clock) {
  std::lock_guard<std::mutex> lk(mu_);
  activity_ = std::move(clock);
}

void Device::drain() {
  if (manual_) {
    while (run_one()) {
    }
    return;
  }
  std::unique_lock<std::mutex> lk(mu_);
  idle_cv_.wait(lk, [&] { return queue_.empty() && !running_; });
}

bool Device::run_one() {
  if (!manual_) throw std::logic_error("Device::run_one: the device runs its own thread");
  Popped p;
  {
    std::lock_guard<std::mutex> lk(mu_);
    if (queue_.empty()) return false;
    p = pop_locked();
  }
  run_item(p);
  return true;
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

void Device::slow_down(double factor, std::chrono::steady_clock::time_point until) {
  std::lock_guard<std::mutex> lk(mu_);
  slow_factor_ = factor > 1 ? factor : 1.0;
  slow_until_ = until;
}

uint64_t Device::slowed() const {
  std::lock_guard<std::mutex> lk(mu_);
  return slowed_;
}

double Device::slowed_seconds() const {
  std::lock_guard<std::mutex> lk(mu_);
  return slowed_seconds_;
}

uint64_t Device::completed() const {
  std::lock_guard<std::mutex> lk(mu_);
  return completed_;
}

Device::Popped Device::pop_locked() {
  Popped p;
  p.item = std::move(queue_.front());
  queue_.pop_front();
  running_ = true;
  p.record = tracing_ && p.item.label.kind != TraceLabel::None;
  if (slow_factor_ > 1 && std::chrono::steady_clock::now() < slow_until_) p.factor = slow_factor_;
  return p;
}

void Device::loop() {
  for (;;) {
    Popped p;
    {
      std::unique_lock<std::mutex> lk(mu_);
      cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
      if (queue_.empty()) return;  // stop requested and nothing left
      p = pop_locked();
    }
    run_item(p);
    idle_cv_.notify_all();
  }
}

void Device::run_item(Popped& p) {
  const bool timed = p.record || p.factor > 1;
  // Two clock reads per labelled closure; the event is stored under the
  // lock taken anyway.
  const int64_t t0 = timed ? now_ns() : 0;
  try {
    p.item.work(*backend_);
  } catch (const std::exception& e) {
    if (p.item.on_error) p.item.on_error(e.what());
  } catch (...) {
    if (p.item.on_error) p.item.on_error("unknown exception");
  }
  int64_t t1 = timed ? now_ns() : 0;
  if (p.factor > 1) {
    // The straggler: the device stays busy (nothing else runs on it) for
    // (factor - 1) times what the closure took. The trace shows the
    // stretched closure, as a slow device would.
    const auto extra = std::chrono::nanoseconds(static_cast<int64_t>(static_cast<double>(t1 - t0) * (p.factor - 1)));
    std::this_thread::sleep_for(extra);
    const int64_t t2 = now_ns();
    std::lock_guard<std::mutex> lk(mu_);
    ++slowed_;
    slowed_seconds_ += static_cast<double>(t2 - t1) * 1e-9;
    t1 = t2;
  }
  std::lock_guard<std::mutex> lk(mu_);
  if (p.record) events_.push_back(TraceEvent{p.item.label, t0, t1});
  running_ = false;
  ++completed_;
  if (activity_) activity_->work_done();
}

}  // namespace troupe::runtime
