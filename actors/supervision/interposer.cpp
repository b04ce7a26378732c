// Interposers on the actors' step messages (see interposer.hpp).
#include "actors/supervision/interposer.hpp"

#include <algorithm>
#include <atomic>
#include <vector>

#include "actors/runtime.hpp"
#include "actors/supervision/fault_injector.hpp"
#include "actors/transport/caf_types.hpp"
#include "actors/transport/moe_messages.hpp"

namespace troupe::runtime {

namespace {

class Duplicate final : public Interposer {
 public:
  void send(int, const caf::actor& to, caf::message msg) override {
    caf::anon_send(to, msg);
    caf::anon_send(to, std::move(msg));
  }
};

class CorruptCombine final : public Interposer {
 public:
  CorruptCombine(uint32_t layer, uint32_t shard, std::shared_ptr<Interposer> next)
      : layer_(layer), shard_(shard), next_(std::move(next)) {}

  void send(int from_device, const caf::actor& to, caf::message msg) override {
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
          forward(from_device, to, caf::make_message(make_combine(id, c.getWidth(), tensor_f32(c.getRows()), token_index, weight_grads)));
          return;
        }
      }
    }
    forward(from_device, to, std::move(msg));
  }

 private:
  void forward(int from_device, const caf::actor& to, caf::message msg) {
    if (next_) next_->send(from_device, to, std::move(msg));
    else caf::anon_send(to, std::move(msg));
  }

  uint32_t layer_, shard_;
  std::shared_ptr<Interposer> next_;
  std::atomic<bool> done_{false};
};

}  // namespace

std::shared_ptr<Interposer> duplicate_sends() { return std::make_shared<Duplicate>(); }

std::shared_ptr<Interposer> corrupt_first_combine(uint32_t layer, uint32_t shard, std::shared_ptr<Interposer> next) {
  return std::make_shared<CorruptCombine>(layer, shard, std::move(next));
}

void StaleReplay::send(int from_device, const caf::actor& to, caf::message msg) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    kept_.push_back({from_device, to, msg});
  }
  forward(from_device, to, std::move(msg));
}

uint32_t StaleReplay::replay() {
  std::vector<Kept> kept;
  {
    std::lock_guard<std::mutex> lock(mu_);
    kept.swap(kept_);
  }
  for (auto& k : kept) forward(k.from_device, k.to, std::move(k.msg));
  return static_cast<uint32_t>(kept.size());
}

void StaleReplay::forget() {
  std::lock_guard<std::mutex> lock(mu_);
  kept_.clear();
}

void StaleReplay::forward(int from_device, const caf::actor& to, caf::message msg) {
  if (next_) next_->send(from_device, to, std::move(msg));
  else caf::anon_send(to, std::move(msg));
}

Interposers make_interposer(const RuntimeOptions& o, const TestHooks* hooks, int first_moe_layer) {
  Interposers out;
  if (hooks && hooks->duplicate_sends) out.chain = duplicate_sends();
  if (hooks && hooks->corrupt_combine && first_moe_layer >= 0)
    out.chain = corrupt_first_combine(static_cast<uint32_t>(first_moe_layer), 0, std::move(out.chain));
  if (hooks && hooks->replay_stale) out.chain = out.stale = std::make_shared<StaleReplay>(std::move(out.chain));
  const bool any = std::any_of(o.faults.begin(), o.faults.end(), [](const FaultSpec& f) { return on_messages(f.kind); });
  if (any) out.chain = out.injector = std::make_shared<FaultInjector>(std::move(out.chain));
  return out;
}

}  // namespace troupe::runtime
