// Faults on messages in flight (see fault_injector.hpp).
#include "actors/supervision/fault_injector.hpp"

#include <algorithm>

namespace troupe::runtime {

FaultInjector::FaultInjector(std::shared_ptr<Interposer> next)
    : next_(std::move(next)), worker_([this] { release_loop(); }) {}

FaultInjector::~FaultInjector() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
    held_.clear();
  }
  cv_.notify_all();
  worker_.join();
}

void FaultInjector::arm(const caf::actor& target, const FaultSpec& f) {
  std::lock_guard<std::mutex> lock(mu_);
  Armed a{target, f.kind, f.count, std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(f.delay_ms)),
          Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(f.duration_ms))};
  armed_.push_back(std::move(a));
}

void FaultInjector::send(const caf::actor& to, caf::message msg) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto now = Clock::now();
  Clock::time_point release{};  // > now: hold until then
  int copies = 1;
  for (auto it = armed_.begin(); it != armed_.end();) {
    Armed& a = *it;
    if (a.target != to) {
      ++it;
      continue;
    }
    bool done = false;
    switch (a.kind) {
      case FaultKind::drop:
        copies = 0;
        done = --a.remaining <= 0;
        break;
      case FaultKind::duplicate:
        copies = std::max(copies, 2);
        done = --a.remaining <= 0;
        break;
      case FaultKind::delay:
        release = std::max(release, now + a.delay);
        done = --a.remaining <= 0;
        break;
      case FaultKind::pause:
        if (now < a.until) release = std::max(release, a.until);
        done = now >= a.until;
        break;
      case FaultKind::kill:
        done = true;  // kills are armed in the actor itself, never here
        break;
    }
    it = done ? armed_.erase(it) : it + 1;
    if (copies == 0) return;  // lost
  }
  // A later message to a target never overtakes one still held for it.
  if (auto last = last_release_.find(to.address()); last != last_release_.end() && last->second > now)
    release = std::max(release, last->second);
  if (release > now) {
    for (int i = 0; i < copies; ++i) held_.emplace(std::make_pair(release, seq_++), std::make_pair(to, msg));
    last_release_[to.address()] = release;
    lock.unlock();
    cv_.notify_all();
    return;
  }
  lock.unlock();
  for (int i = 1; i < copies; ++i) forward(to, msg);
  forward(to, std::move(msg));
}

void FaultInjector::forward(const caf::actor& to, caf::message msg) {
  if (next_) next_->send(to, std::move(msg));
  else caf::anon_send(to, std::move(msg));
}

void FaultInjector::release_loop() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stop_) {
    if (held_.empty()) {
      cv_.wait(lock);
      continue;
    }
    const auto due = held_.begin()->first.first;
    if (Clock::now() < due) {
      cv_.wait_until(lock, due);
      continue;
    }
    auto node = held_.extract(held_.begin());
    lock.unlock();
    forward(node.mapped().first, std::move(node.mapped().second));
    lock.lock();
  }
}

}  // namespace troupe::runtime
