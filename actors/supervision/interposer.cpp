// Interposers on the actors' step messages (see interposer.hpp).
#include "actors/supervision/interposer.hpp"

#include <algorithm>
#include <atomic>
#include <vector>

#include "actors/runtime.hpp"
#include "actors/supervision/fault_injector.hpp"
#include "actors/transport/caf_types.hpp"
#include "actors/transport/moe_messages.hpp"
#include "actors/transport/ring_transport.hpp"

namespace troupe::runtime {

namespace {

class Duplicate final : public Interposer {
 public:
  explicit Duplicate(std::shared_ptr<Interposer> next) : next_(std::move(next)) {}
  void send(int from_device, const caf::actor& to, caf::message msg, Link link) override {
    if (next_) {
      next_->send(from_device, to, msg, link);
      next_->send(from_device, to, std::move(msg), link);
      return;
    }
    send_anon(to, msg);
    send_anon(to, std::move(msg));
  }

 private:
  std::shared_ptr<Interposer> next_;
};

class CorruptCombine final : public Interposer {
 public:
  CorruptCombine(uint32_t layer, uint32_t shard, std::shared_ptr<Interposer> next)
      : layer_(layer), shard_(shard), next_(std::move(next)) {}

  void send(int from_device, const caf::actor& to, caf::message msg, Link link) override {
    if (!done_.load() && msg.size() == 1 && msg.match_element<Envelope>(0)) {
      if (auto r = msg.get_as<Envelope>(0).read<schemas::Combine>()) {
        auto c = r->get();
        MoeKey id = read_moe_key(c.getId());
        if (id.replica == 0 && id.layer == layer_ && id.shard == shard_ && !id.backward && !done_.exchange(true)) {
          ++id.dispatch_id;  // no longer echoes the dispatch
          std::vector<uint32_t> token_index;
          for (uint32_t t : c.getTokenIndex()) token_index.push_back(t);
          std::vector<float> weight_grads;
          for (float w : c.getWeightGrads()) weight_grads.push_back(w);
          forward(from_device, to, caf::make_message(make_combine(id, c.getWidth(), tensor_f32(c.getRows()), token_index, weight_grads)),
                  link);
          return;
        }
      }
    }
    forward(from_device, to, std::move(msg), link);
  }

 private:
  void forward(int from_device, const caf::actor& to, caf::message msg, Link link) {
    if (next_) next_->send(from_device, to, std::move(msg), link);
    else send_anon(to, std::move(msg));
  }

  uint32_t layer_, shard_;
  std::shared_ptr<Interposer> next_;
  std::atomic<bool> done_{false};
};

}  // namespace

std::shared_ptr<Interposer> duplicate_sends(std::shared_ptr<Interposer> next) {
  return std::make_shared<Duplicate>(std::move(next));
}

std::shared_ptr<Interposer> corrupt_first_combine(uint32_t layer, uint32_t shard, std::shared_ptr<Interposer> next) {
  return std::make_shared<CorruptCombine>(layer, shard, std::move(next));
}

void StaleReplay::send(int from_device, const caf::actor& to, caf::message msg, Link link) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    kept_.push_back({from_device, to, msg, link});
  }
  forward(from_device, to, std::move(msg), link);
}

uint32_t StaleReplay::replay() {
  std::vector<Kept> kept;
  {
    std::lock_guard<std::mutex> lock(mu_);
    kept.swap(kept_);
  }
  for (auto& k : kept) forward(k.from_device, k.to, std::move(k.msg), k.link);
  return static_cast<uint32_t>(kept.size());
}

void StaleReplay::forget() {
  std::lock_guard<std::mutex> lock(mu_);
  kept_.clear();
}

void StaleReplay::forward(int from_device, const caf::actor& to, caf::message msg, Link link) {
  if (next_) next_->send(from_device, to, std::move(msg), link);
  else send_anon(to, std::move(msg));
}

class LossDetector::Numbering final : public Interposer {
 public:
  Numbering(LossDetector& detector, std::shared_ptr<Interposer> next) : detector_(detector), next_(std::move(next)) {}
  void send(int from_device, const caf::actor& to, caf::message msg, Link) override {
    // Numbered and handed on under one lock: the numbers enter the lossy hop
    // in order.
    std::lock_guard<std::mutex> lock(mu_);
    auto& [number, epoch] = last_[to.address()];
    const Link link{++number, detector_.epoch_.load(std::memory_order_relaxed), epoch};
    epoch = link.epoch;
    next_->send(from_device, to, std::move(msg), link);
  }

 private:
  LossDetector& detector_;  // owns the chain this is part of
  std::shared_ptr<Interposer> next_;
  std::mutex mu_;
  std::map<caf::actor_addr, std::pair<uint64_t, uint64_t>> last_;  // per receiver: (last number, its epoch)
};

std::shared_ptr<Interposer> LossDetector::numbering(std::shared_ptr<Interposer> lossy) {
  return std::make_shared<Numbering>(*this, std::move(lossy));
}

void LossDetector::send(int, const caf::actor& to, caf::message msg, Link link) {
  bool gap = false;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (link.seq > 0) {
      uint64_t& seen = seen_[to.address()];
      gap = link.seq > seen + 1;
      if (gap) ++gaps_;
      seen = std::max(seen, link.seq);
    }
    // Delivered under the lock too: the receiver's mailbox gets them in the order checked.
    send_anon(to, std::move(msg));
  }
  if (gap && on_gap_) on_gap_(link.prev_epoch);
}

uint64_t LossDetector::gaps() const {
  std::lock_guard<std::mutex> lock(mu_);
  return gaps_;
}

Interposers make_interposer(const RuntimeOptions& o, const TestHooks* hooks, int first_moe_layer,
                            std::function<void(uint64_t epoch)> on_gap) {
  Interposers out;
  const bool lossy = std::any_of(o.faults.begin(), o.faults.end(), [](const FaultSpec& f) { return on_messages(f.kind); });
  // The detector ends the chain: it sees what survived every hop before it.
  if (lossy && o.processes == 1) out.chain = out.loss = std::make_shared<LossDetector>(std::move(on_gap));
  if (hooks && hooks->duplicate_sends) out.chain = duplicate_sends(std::move(out.chain));
  if (hooks && hooks->corrupt_combine && first_moe_layer >= 0)
    out.chain = corrupt_first_combine(static_cast<uint32_t>(first_moe_layer), 0, std::move(out.chain));
  if (hooks && hooks->replay_stale) out.chain = out.stale = std::make_shared<StaleReplay>(std::move(out.chain));
  if (lossy) {
    out.chain = out.injector = std::make_shared<FaultInjector>(std::move(out.chain));
    if (out.loss) out.chain = out.loss->numbering(std::move(out.chain));
  }
  return out;
}

}  // namespace troupe::runtime
