// Supervisor (see supervisor.hpp): child bookkeeping, restart intensity,
// respawn, the shards' step-start snapshots and the restore messages of a
// replay; plus the per-step message counts that bound the seeded kill point.
#include "actors/supervision/supervisor.hpp"

#include <stdexcept>

#include "actors/cluster/placement.hpp"

namespace troupe::runtime {

namespace {

Envelope slice_of(uint32_t shard, Range range, std::span<const float> v) {
  return Envelope::build<schemas::ParamSlice>([&](schemas::ParamSlice::Builder b) {
    b.setShard(shard);
    b.initRange().setOffset(static_cast<uint64_t>(range.offset));
    b.getRange().setCount(static_cast<uint64_t>(range.count));
    const int64_t shape[1] = {range.count};
    set_tensor_f32(b.initParams(), shape, v);
  });
}

std::string rank_name(const Shared& sh, int replica, int rank) {
  return "stage:" + std::to_string(rank) + (sh.opt.data_parallel > 1 ? "/replica:" + std::to_string(replica) : "");
}

}  // namespace

Supervisor::Supervisor(std::shared_ptr<const Shared> sh) : sh_(std::move(sh)) {
  // The state before the first step: initial parameters, zero moments (or,
  // resumed, the checkpoint's parameters and moments).
  for (size_t i = 0; i < sh_->shard_ranges.size(); ++i) {
    const Range r = sh_->shard_ranges[i];
    const std::vector<float> zeros(static_cast<size_t>(r.count), 0.0f);
    const auto shard = static_cast<uint32_t>(i);
    auto part = [&](const std::vector<float>& v) {
      return v.empty() ? std::span<const float>(zeros)
                       : std::span<const float>(v.data() + r.offset, static_cast<size_t>(r.count));
    };
    committed_.push_back({slice_of(shard, r, part(sh_->init)), slice_of(shard, r, part(sh_->init_m)),
                          slice_of(shard, r, part(sh_->init_v))});
  }
}

void Supervisor::watch(caf::event_based_actor* self) {
  if (watching_) return;
  watching_ = true;
  std::lock_guard<std::mutex> lock(sh_->peers_mu);
  for (size_t r = 0; r < sh_->peers.ranks.size(); ++r)
    for (size_t k = 0; k < sh_->peers.ranks[r].size(); ++k) {
      const caf::actor& a = sh_->peers.ranks[r][k];
      self->monitor(a);
      children_[a.address()] = {FaultTarget::Role::Stage, static_cast<int>(r), static_cast<int>(k),
                                rank_name(*sh_, static_cast<int>(r), static_cast<int>(k))};
    }
  for (size_t i = 0; i < sh_->peers.shards.size(); ++i) {
    const caf::actor& a = sh_->peers.shards[i];
    self->monitor(a);
    children_[a.address()] = {FaultTarget::Role::Optimizer, 0, static_cast<int>(i), "optimizer:" + std::to_string(i)};
  }
  const int shards = std::max(1, sh_->opt.expert_shards);
  for (size_t r = 0; r < sh_->peers.experts.size(); ++r)
    for (size_t x = 0; x < sh_->peers.experts[r].size(); ++x) {
      const caf::actor& a = sh_->peers.experts[r][x];
      self->monitor(a);
      const int layer = sh_->moe_layers[x / static_cast<size_t>(shards)], shard = static_cast<int>(x) % shards;
      children_[a.address()] = {FaultTarget::Role::Expert, static_cast<int>(r), static_cast<int>(x),
                                expert_name(static_cast<int>(r), layer, shard, sh_->opt.data_parallel)};
    }
}

const Supervisor::Child* Supervisor::find(const caf::actor_addr& who) const {
  auto it = children_.find(who);
  return it == children_.end() ? nullptr : &it->second;
}

std::string Supervisor::admit_restart(const Child& child, const std::string& cause, int64_t step) {
  const int window = std::max(1, sh_->opt.restart_window);
  history_.push_back(step);
  while (!history_.empty() && history_.front() <= step - window) history_.pop_front();
  if (static_cast<int>(history_.size()) <= sh_->opt.max_restarts) return "";
  return child.name + " went down (" + cause + ") in step " + std::to_string(step) + ": " +
         std::to_string(history_.size()) + " restarts within " + std::to_string(window) +
         " step(s), more than max_restarts = " + std::to_string(sh_->opt.max_restarts) + "; giving up";
}

void Supervisor::respawn(caf::event_based_actor* self, const Child& child) {
  const Child c = child;  // `child` lives in children_, which changes below
  caf::actor fresh = sh_->spawn(self->system(), c.role, c.replica, c.index);
  self->monitor(fresh);
  std::lock_guard<std::mutex> lock(sh_->peers_mu);
  caf::actor& slot = c.role == FaultTarget::Role::Stage
                         ? sh_->peers.ranks[static_cast<size_t>(c.replica)][static_cast<size_t>(c.index)]
                     : c.role == FaultTarget::Role::Expert
                         ? sh_->peers.experts[static_cast<size_t>(c.replica)][static_cast<size_t>(c.index)]
                         : sh_->peers.shards[static_cast<size_t>(c.index)];
  children_.erase(slot.address());
  slot = fresh;
  children_[fresh.address()] = c;
}

bool Supervisor::stage(uint32_t shard, Envelope p, Envelope m, Envelope v) {
  if (shard >= committed_.size() || staged_.count(shard)) return false;
  staged_[shard] = {std::move(p), std::move(m), std::move(v)};
  return true;
}

void Supervisor::commit() {
  for (auto& [shard, snap] : staged_) committed_[shard] = std::move(snap);
  staged_.clear();
}

void Supervisor::restore_shard(caf::event_based_actor* self, size_t shard, uint64_t step, uint32_t attempt) const {
  const auto& c = committed_[shard];
  self->send(shard_of(*sh_, shard), rt::restore_atom_v, step, attempt, c[0], c[1], c[2]);
}

void Supervisor::restore_rank(caf::event_based_actor* self, const caf::actor& rank, uint64_t step,
                              uint32_t attempt) const {
  self->send(rank, rt::restore_atom_v, step, attempt);
  for (const auto& c : committed_) self->send(rank, rt::restore_atom_v, c[0]);
}

// Expert shards take the same messages as ranks: (restore, s, attempt), then
// every shard's parameter slice, of which they load their experts' part.
void Supervisor::restore_all(caf::event_based_actor* self, uint64_t step, uint32_t attempt) const {
  for (size_t i = 0; i < committed_.size(); ++i) restore_shard(self, i, step, attempt);
  for (const caf::actor& r : all_ranks(*sh_)) restore_rank(self, r, step, attempt);
  for (const caf::actor& x : all_experts(*sh_)) restore_rank(self, x, step, attempt);
}

void Supervisor::restore_one(caf::event_based_actor* self, const Child& child, uint64_t step, uint32_t attempt) const {
  if (child.role == FaultTarget::Role::Optimizer) restore_shard(self, static_cast<size_t>(child.index), step, attempt);
  else if (child.role == FaultTarget::Role::Expert) restore_rank(self, expert_of(*sh_, child.replica, child.index), step, attempt);
  else restore_rank(self, rank_of(*sh_, child.replica, child.index), step, attempt);
}

uint32_t Supervisor::send_stale(caf::event_based_actor* self, uint64_t step) const {
  if (step == 0) return 0;
  const uint64_t old = step - 1;
  uint32_t sent = 0;
  const int64_t T = sh_->mb_batch * sh_->opt.train.model.seq_len;
  const int64_t none[2] = {T, 0};
  const int64_t ids[1] = {T};
  const std::vector<int32_t> zeros(static_cast<size_t>(T), 0);
  for (int r = 0; r < sh_->opt.data_parallel; ++r)
    for (int k = 0; k < sh_->sl.num_ranks; ++k) {
      const caf::actor a = rank_of(*sh_, r, k);
      // The finished step's parameter slices again.
      for (const auto& c : committed_) self->send(a, c[0]), ++sent;
      // A micro-batch of the finished step (data as the coordinator sends it).
      self->send(a, Envelope::build<schemas::Activations>([&](schemas::Activations::Builder b) {
        auto t = b.initTag();
        t.setStep(old);
        t.setStage(kDataStage);
        t.setReplica(static_cast<uint32_t>(r));
        set_tensor_f32(b.initHidden(), none, {});
        set_tensor_i32(b.initTokenIds(), ids, zeros);
        set_tensor_i32(b.initTargets(), ids, zeros);
      }));
      ++sent;
    }
  // Expert shards: the finished step's parameter slices again.
  for (const caf::actor& x : all_experts(*sh_))
    for (const auto& c : committed_) self->send(x, c[0]), ++sent;
  for (size_t i = 0; i < committed_.size(); ++i) {
    const Range range = sh_->shard_ranges[i];
    const caf::actor a = shard_of(*sh_, i);
    self->send(a, Envelope::build<schemas::GradSlice>([&](schemas::GradSlice::Builder b) {
      b.setStep(old);
      b.setShard(static_cast<uint32_t>(i));
      b.initRange().setOffset(static_cast<uint64_t>(range.offset));
      b.getRange().setCount(static_cast<uint64_t>(range.count));
      const int64_t shape[1] = {range.count};
      set_tensor_f32(b.initGrads(), shape, std::vector<float>(static_cast<size_t>(range.count), 1.0f));
    }));
    self->send(a, rt::clip_atom_v, old, uint32_t{0}, 1.0);
    sent += 2;
  }
  return sent;
}

uint32_t rank_messages_per_step(const Shared& sh, int rank) {
  const int last = sh.sl.num_stages - 1;
  // Each part (F or B) of an op is its own device closure; with expert
  // shards a pass also stops at each MoE layer of its stage (one closure
  // more) and gets one Combine per shard there.
  auto part = [&](const sched::Chunk& c) {
    if (!sh.expert_parallel()) return 1u;
    const auto [lb, le] = sh.stage_layers[static_cast<size_t>(c.stage)];
    uint32_t moe = 0;
    for (int l : sh.moe_layers) moe += l >= lb && l < le;
    return 1 + moe * (1 + static_cast<uint32_t>(sh.opt.expert_shards));
  };
  uint32_t n = 2;  // (start) and the completion of the gradient send
  for (const sched::Op& op : sched::make_schedule(sh.sl.kind, rank, sh.sl.num_ranks, sh.chunks)) {
    const bool has_f = op.type == sched::OpType::F || op.type == sched::OpType::FB;
    const bool has_b = op.type == sched::OpType::BW || op.type == sched::OpType::FB || op.type == sched::OpType::B;
    if (has_f) n += 1 + part(op.f);  // its input activations and its pass
    if (has_b) n += part(op.b) + (op.b.stage < last ? 1 : 0);  // its pass and its output gradient
    if (!has_f && !has_b) ++n;  // W: a no-op closure
  }
  return n + 2 * static_cast<uint32_t>(sh.shard_ranges.size());  // each slice and its load
}

uint32_t shard_messages_per_step(const Shared& sh, int shard) {
  const Range range = sh.shard_ranges[static_cast<size_t>(shard)];
  uint32_t slices = 0;
  for (int rep = 0; rep < sh.opt.data_parallel; ++rep) {
    for (const auto& owned : sh.rank_owned)
      for (const Range& o : owned)
        if (intersect(o, range).count > 0) ++slices;
    for (const auto& owned : sh.expert_owned)  // expert shards send gradient slices too
      for (const Range& o : owned)
        if (intersect(o, range).count > 0) ++slices;
  }
  return slices + 3;  // + reduction done, (clip), update done
}

uint32_t expert_messages_per_step(const Shared& sh, int producer) {
  uint32_t slices = 0;  // optimizer shards whose range meets the shard's experts
  for (const Range& sr : sh.shard_ranges) {
    bool meets = false;
    for (const Range& o : sh.expert_owned[static_cast<size_t>(producer)]) meets = meets || intersect(o, sr).count > 0;
    if (meets) ++slices;
  }
  // Each micro-batch's forward and backward dispatch and their completions,
  // the gradient send's completion, then each slice and its load.
  return 4 * static_cast<uint32_t>(sh.chunks) + 1 + 2 * slices;
}

}  // namespace troupe::runtime
