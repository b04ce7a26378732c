// Faults on messages in flight (see fault_injector.hpp).
#include "actors/supervision/fault_injector.hpp"

#include <algorithm>

#include "actors/transport/caf_types.hpp"
#include "actors/transport/ring_transport.hpp"

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

void FaultInjector::arm(const caf::actor& target, const FaultSpec& f, uint64_t seed, uint64_t step, int device) {
  std::lock_guard<std::mutex> lock(mu_);
  Armed a{target, f.kind, f.count, std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(f.delay_ms)),
          Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double, std::milli>(f.duration_ms)),
          kill_point(seed, step, fault_key(f.target), 0xFFFFFFFFu, 1), device};
  armed_.push_back(std::move(a));
}

void FaultInjector::place(const caf::actor& a, int device) {
  std::lock_guard<std::mutex> lock(mu_);
  device_of_[a.address()] = device;
}

uint64_t FaultInjector::corrupted() const {
  std::lock_guard<std::mutex> lock(mu_);
  return corrupted_;
}

uint64_t FaultInjector::partitioned() const {
  std::lock_guard<std::mutex> lock(mu_);
  return partitioned_;
}

namespace {

// The Envelope as it would cross a process boundary (its wire frame), one
// bit flipped, decoded again by the receiving side's codec: an invalid
// Envelope carrying the decode error (the frame's CRC-32 catches every
// single flip), exactly what the CAF transport delivers for damaged bytes.
Envelope flip_one_bit(const Envelope& e, uint64_t draw) {
  std::vector<uint8_t> frame = e.encode();
  const uint64_t bit = draw % (frame.size() * 8);
  frame[bit / 8] ^= static_cast<uint8_t>(1u << (bit % 8));
  auto back = Envelope::decode(frame.data(), frame.size());
  return back ? std::move(*back) : Envelope::invalid(std::move(back.error()));
}

}  // namespace

void FaultInjector::send(int from_device, const caf::actor& to, caf::message msg, Link link) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto now = Clock::now();
  Clock::time_point release{};  // > now: hold until then
  int copies = 1;
  for (auto it = armed_.begin(); it != armed_.end();) {
    Armed& a = *it;
    if (a.kind == FaultKind::partition) {  // any sender and receiver: does the message cross?
      const bool done = now >= a.until;
      if (!done) {
        const auto d = device_of_.find(to.address());
        const int to_device = d == device_of_.end() ? -1 : d->second;
        if ((from_device == a.device) != (to_device == a.device)) {
          release = std::max(release, a.until);
          ++partitioned_;
        }
      }
      it = done ? armed_.erase(it) : it + 1;
      continue;
    }
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
      case FaultKind::corrupt:
        // Only Envelopes have bytes to damage (control tuples pass untouched).
        if (msg.size() == 1 && msg.match_element<Envelope>(0)) {
          const uint64_t draw = a.seed * 0x9E3779B97F4A7C15ull + static_cast<uint64_t>(a.remaining) * 0xBF58476D1CE4E5B9ull;
          msg = caf::make_message(flip_one_bit(msg.get_as<Envelope>(0), draw ^ (draw >> 29)));
          ++corrupted_;
          done = --a.remaining <= 0;
        }
        break;
      case FaultKind::partition:  // handled above
      case FaultKind::kill:
      case FaultKind::slow:
      case FaultKind::stop:
        done = true;  // kills are armed in the actor itself, slow in the device: never here
        break;
    }
    it = done ? armed_.erase(it) : it + 1;
    if (copies == 0) return;  // lost
  }
  // A later message to a target never overtakes one still held for it, not
  // even one whose time has come but that the release thread has not handed
  // on yet: it queues behind it.
  if (auto last = last_release_.find(to.address()); last != last_release_.end() && last->second > now)
    release = std::max(release, last->second);
  const bool behind = unreleased_[to.address()] > 0;
  if (release > now || behind) {
    release = std::max(release, now);
    for (int i = 0; i < copies; ++i) held_.emplace(std::make_pair(release, seq_++), Held{from_device, to, msg, link});
    unreleased_[to.address()] += copies;
    last_release_[to.address()] = release;
    lock.unlock();
    cv_.notify_all();
    return;
  }
  lock.unlock();
  for (int i = 1; i < copies; ++i) forward(from_device, to, msg, link);
  forward(from_device, to, std::move(msg), link);
}

void FaultInjector::forward(int from_device, const caf::actor& to, caf::message msg, Link link) {
  if (next_) next_->send(from_device, to, std::move(msg), link);
  else send_anon(to, std::move(msg));
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
    const caf::actor_addr to = node.mapped().to.address();
    forward(node.mapped().from_device, node.mapped().to, std::move(node.mapped().msg), node.mapped().link);
    lock.lock();
    if (auto u = unreleased_.find(to); u != unreleased_.end() && --u->second <= 0) unreleased_.erase(u);
  }
}

}  // namespace troupe::runtime
