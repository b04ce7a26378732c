// Pipeline-rank actor: holds the model stages a schedule gives its rank (one
// for sequential/1f1b, two for dualpipe/dualpipev), runs the rank's op list
// in order on its device, exchanges activations and gradients as Envelopes,
// then sends gradient slices to the optimizer shards and loads the updated
// parameter slices they send back. Protocol: runtime_internal.hpp. On a
// (restore ...) from the supervisor it aborts to the start of a step: drops
// what it holds of older attempts, forgets pending continuations (device
// work already queued still runs, but its sends carry the old attempt and
// are dropped), zeroes its gradients and reloads the step's parameters.
#include <map>
#include <optional>
#include <set>
#include <tuple>

#include "actors/runtime_internal.hpp"
#include "model/stage.hpp"
#include "model/weights.hpp"

namespace troupe::runtime {
namespace {

using Key = std::tuple<uint64_t, uint32_t, int, int, int, int>;  // step, attempt, kind (0 act, 1 grad), dir, consumer stage, mb
using StageId = std::pair<int, int>;                     // dir, stage

// Device-side state: touched only by closures running on the rank's device.
struct Compute {
  kernels::Tensor params, grads;  // [P] the flat buffers (only owned entries are used)
  model::ModelWeights w, g;
  std::map<StageId, std::unique_ptr<model::Stage>> stages;
  std::vector<float> hidden;       // [T*D] scratch for outgoing tensors
};

struct RankState {
  std::shared_ptr<const Shared> sh;
  Device* dev = nullptr;
  int replica = 0, rank = 0;
  std::string name;
  Tickets tickets;
  std::vector<sched::Op> ops;
  std::vector<StageId> held;
  std::shared_ptr<Compute> comp;
  std::map<StageId, int> slot_count;               // activation slots per held stage
  std::map<StageId, std::vector<int>> free_slots;  // actor side: slot bookkeeping
  std::map<StageId, std::map<int, int>> slot_of;
  size_t next = 0;
  bool busy = false, running = false;
  int backwards = 0;               // backward ops submitted this attempt
  uint64_t step = 0;               // step being run (== completed steps)
  uint32_t attempt = 0;            // replay generation of the step
  KillSwitch kill;
  double loss_scale = 0.0, aux_scale = 0.0;
  std::map<Key, Envelope> inbox;
  std::set<Key> consumed;
  std::set<uint32_t> slices_from;  // shards whose ParamSlice arrived this step
  int slices_loaded = 0;
  uint64_t dropped = 0;
};

using Self = caf::stateful_actor<RankState>;

void try_run(Self* self);

Envelope make_pipeline(uint64_t step, uint32_t attempt, int replica_id, const sched::Chunk& c,
                       std::span<const float> hidden, std::span<const int32_t> targets, bool backward, int64_t T,
                       int64_t D) {
  const uint32_t replica = static_cast<uint32_t>(replica_id);
  auto tag = [&](schemas::PipelineTag::Builder t) {
    t.setStep(step);
    t.setMicrobatch(static_cast<uint32_t>(c.mb));
    t.setStage(static_cast<uint32_t>(c.stage));
    t.setDirection(backward ? schemas::Direction::BACKWARD : schemas::Direction::FORWARD);
    t.setChunk(static_cast<uint32_t>(c.dir));
    t.setReplica(replica);
    t.setAttempt(attempt);
  };
  const int64_t shape[2] = {T, D};
  if (backward)
    return Envelope::build<schemas::Gradients>([&](schemas::Gradients::Builder b) {
      tag(b.initTag());
      set_tensor_f32(b.initGrad(), shape, hidden);
    });
  return Envelope::build<schemas::Activations>([&](schemas::Activations::Builder b) {
    tag(b.initTag());
    set_tensor_f32(b.initHidden(), shape, hidden);
    const int64_t tshape[1] = {static_cast<int64_t>(targets.size())};
    set_tensor_i32(b.initTargets(), tshape, targets);
  });
}

// Forward of chunk f on the device; sends the output on (or the loss).
Device::Work forward_work(Self* self, const sched::Chunk f, int slot, Envelope in) {
  auto& st = self->state;
  auto comp = st.comp;
  auto sh = st.sh;
  const int last = sh->sl.num_stages - 1;
  caf::actor next_rank = f.stage < last ? rank_of(*sh, st.replica, sched::stage_rank(sh->sl, f.dir, f.stage + 1))
                                        : caf::actor{};
  caf::actor coord = sh->peers.coordinator;
  const uint64_t step = st.step;
  const uint32_t attempt = st.attempt;
  const int replica = st.replica;
  return [comp, f, slot, in, next_rank, coord, step, attempt, replica, last, sh](kernels::Backend&) {
    model::Stage& stage = *comp->stages.at({f.dir, f.stage});
    auto r = in.read<schemas::Activations>();
    if (!r) throw std::runtime_error("bad activations: " + to_string(r.error()));
    const auto tg = tensor_i32((*r)->getTargets());
    const bool is_last = f.stage == last;
    model::ForwardResult res;
    if (f.stage == 0)
      res = stage.forward_tokens(slot, comp->w, tensor_i32((*r)->getTokenIds()),
                                 is_last ? tg : std::span<const int32_t>());
    else
      res = stage.forward_hidden(slot, comp->w, tensor_f32((*r)->getHidden()),
                                 is_last ? tg : std::span<const int32_t>());
    post(*sh, coord, rt::loss_atom_v, step, attempt, static_cast<uint32_t>(replica),
                   static_cast<uint32_t>(f.mb), static_cast<uint32_t>(f.stage), res.loss_sum,
                   res.aux_loss);
    if (is_last) return;
    comp->hidden.resize(static_cast<size_t>(stage.tokens() * stage.d_model()));
    stage.read_output(slot, comp->hidden);
    post(*sh, next_rank, make_pipeline(step, attempt, replica, f, comp->hidden, tg, false, stage.tokens(), stage.d_model()));
  };
}

// Backward of chunk b; sends the input gradient to the previous stage.
Device::Work backward_work(Self* self, const sched::Chunk b, int slot, Envelope dout) {
  auto& st = self->state;
  auto comp = st.comp;
  auto sh = st.sh;
  const int last = sh->sl.num_stages - 1;
  caf::actor prev_rank = b.stage > 0 ? rank_of(*sh, st.replica, sched::stage_rank(sh->sl, b.dir, b.stage - 1))
                                     : caf::actor{};
  const uint64_t step = st.step;
  const uint32_t attempt = st.attempt;
  const int replica = st.replica;
  const double ls = st.loss_scale, as = st.aux_scale;
  return [comp, b, slot, dout, prev_rank, step, attempt, replica, last, ls, as, sh](kernels::Backend&) {
    model::Stage& stage = *comp->stages.at({b.dir, b.stage});
    std::span<const float> g;
    std::optional<Read<schemas::Gradients>> keep;
    if (b.stage < last) {
      auto r = dout.read<schemas::Gradients>();
      if (!r) throw std::runtime_error("bad gradients: " + to_string(r.error()));
      keep = *r;
      g = tensor_f32((*keep)->getGrad());
    }
    stage.backward(slot, comp->w, comp->g, g, ls, as);
    if (b.stage == 0) return;
    comp->hidden.resize(static_cast<size_t>(stage.tokens() * stage.d_model()));
    stage.read_input_grad(comp->hidden);
    post(*sh, prev_rank, make_pipeline(step, attempt, replica, b, comp->hidden, {}, true, stage.tokens(), stage.d_model()));
  };
}

Key act_key(const RankState& st, const sched::Chunk& c) { return {st.step, st.attempt, 0, c.dir, c.stage, c.mb}; }
Key grad_key(const RankState& st, const sched::Chunk& c) { return {st.step, st.attempt, 1, c.dir, c.stage, c.mb}; }

bool take(RankState& st, const Key& k, Envelope& out) {
  auto it = st.inbox.find(k);
  if (it == st.inbox.end()) return false;
  out = std::move(it->second);
  st.inbox.erase(it);
  st.consumed.insert(k);
  return true;
}

// After the last op: gradient slices to the shards, then zero the gradients.
void send_grads(Self* self) {
  auto& st = self->state;
  auto comp = st.comp;
  auto sh = st.sh;
  const uint64_t step = st.step;
  const uint32_t attempt = st.attempt;
  const int replica = st.replica, rank = st.rank;
  submit(self, *st.dev, [comp, sh, step, attempt, replica, rank](kernels::Backend& be) {
    const std::vector<float> all = be.download_f32(comp->grads);
    for (size_t s = 0; s < sh->shard_ranges.size(); ++s) {
      for (const Range& own : sh->rank_owned[static_cast<size_t>(rank)]) {
        const Range piece = intersect(own, sh->shard_ranges[s]);
        if (piece.count == 0) continue;
        Envelope e = Envelope::build<schemas::GradSlice>([&](schemas::GradSlice::Builder b) {
          b.setStep(step);
          b.setReplica(static_cast<uint32_t>(replica));
          b.setShard(static_cast<uint32_t>(s));
          b.setStage(static_cast<uint32_t>(rank));
          b.initRange().setOffset(static_cast<uint64_t>(piece.offset));
          b.getRange().setCount(static_cast<uint64_t>(piece.count));
          const int64_t shape[1] = {piece.count};
          set_tensor_f32(b.initGrads(), shape,
                         std::span<const float>(all.data() + piece.offset, static_cast<size_t>(piece.count)));
          b.setMicrobatches(static_cast<uint32_t>(sh->chunks));
          b.setAttempt(attempt);
        });
        post(*sh, shard_of(*sh, s), e);
      }
    }
    be.fill(comp->grads, 0.0f);
  }, [] {}, owner_label(TraceLabel::GradSend, rank));
}

// Every activation slot free (at spawn and when a step is aborted).
void reset_slots(RankState& st) {
  st.free_slots.clear();
  st.slot_of.clear();
  for (const auto& [id, n] : st.slot_count)
    for (int i = n - 1; i >= 0; --i) st.free_slots[id].push_back(i);
}

// Where in the step the rank is (reported when a fault kills it).
std::string rank_phase(const RankState& st) {
  if (!st.running && st.next == 0) return "waiting for its step to start";
  if (st.next < st.ops.size()) return st.backwards == 0 ? "in its forwards, before any backward" : "in its backward ops";
  return "loading parameters after sending gradients (" + std::to_string(st.slices_loaded) + " of " +
         std::to_string(st.sh->shard_ranges.size()) + " slices loaded)";
}

// Abort to the start of step `step`, attempt `attempt` (the supervisor then
// sends the step's parameters, the data and (start ...)).
void abort_to(Self* self, uint64_t step, uint32_t attempt) {
  auto& st = self->state;
  st.step = step;
  st.attempt = attempt;
  st.running = false;
  st.busy = false;
  st.next = 0;
  st.backwards = 0;
  st.slices_from.clear();
  st.slices_loaded = 0;
  st.tickets.pending.clear();  // late completions of old work find nothing to continue
  reset_slots(st);
  const Key keep{step, attempt, 0, 0, 0, 0};
  st.inbox.erase(st.inbox.begin(), st.inbox.lower_bound(keep));
  st.consumed.erase(st.consumed.begin(), st.consumed.lower_bound(keep));
  auto comp = st.comp;
  // Queued after any old work on the device, so old backwards cannot leak in.
  submit(self, *st.dev, [comp](kernels::Backend& be) { be.fill(comp->grads, 0.0f); }, [] {},
         owner_label(TraceLabel::RankInit, st.rank));
}

void try_run(Self* self) {
  auto& st = self->state;
  while (st.running && !st.busy && st.next < st.ops.size()) {
    const sched::Op& op = st.ops[st.next];
    const int last = st.sh->sl.num_stages - 1;
    const bool has_f = op.type == sched::OpType::F || op.type == sched::OpType::FB;
    // B runs the full backward (inputs and weights) and W is then a no-op: the
    // weight gradients are the same values, computed earlier than scheduled.
    const bool has_b = op.type == sched::OpType::BW || op.type == sched::OpType::FB ||
                       op.type == sched::OpType::B;
    if (has_f && !st.inbox.count(act_key(st, op.f))) return;
    if (has_b && op.b.stage < last && !st.inbox.count(grad_key(st, op.b))) return;
    st.busy = true;
    if (has_f) {
      Envelope in;
      take(st, act_key(st, op.f), in);
      const StageId id{op.f.dir, op.f.stage};
      auto& fr = st.free_slots[id];
      if (fr.empty()) throw std::logic_error(st.name + ": no free activation slot");
      const int slot = fr.back();
      fr.pop_back();
      st.slot_of[id][op.f.mb] = slot;
      st.dev->submit(forward_work(self, op.f, slot, std::move(in)),
                     [coord = st.sh->peers.coordinator, who = st.name](const std::string& what) {
                       caf::anon_send(coord, rt::fail_atom_v, who + ": " + what);
                     },
                     chunk_label(TraceLabel::Forward, op.f, st.rank));
    }
    if (has_b) {
      Envelope dout;
      if (op.b.stage < last) take(st, grad_key(st, op.b), dout);
      ++st.backwards;
      const StageId id{op.b.dir, op.b.stage};
      const int slot = st.slot_of[id].at(op.b.mb);
      st.slot_of[id].erase(op.b.mb);
      // The device runs this backward before any later forward reuses the slot.
      st.free_slots[id].push_back(slot);
      st.dev->submit(backward_work(self, op.b, slot, std::move(dout)),
                     [coord = st.sh->peers.coordinator, who = st.name](const std::string& what) {
                       caf::anon_send(coord, rt::fail_atom_v, who + ": " + what);
                     },
                     chunk_label(TraceLabel::Backward, op.b, st.rank));
    }
    // A no-op closure marks the end of the op (the device runs in order).
    submit(self, *st.dev, [](kernels::Backend&) {}, [self] {
      auto& s = self->state;
      s.busy = false;
      if (++s.next == s.ops.size()) send_grads(self);
      else try_run(self);
    });
    return;
  }
}

caf::behavior rank_actor(Self* self, std::shared_ptr<const Shared> sh, Device* dev, int replica, int rank) {
  auto& st = self->state;
  st.sh = sh;
  st.dev = dev;
  st.replica = replica;
  st.rank = rank;
  st.name = "stage:" + std::to_string(rank) + (sh->opt.data_parallel > 1 ? "/replica:" + std::to_string(replica) : "");
  st.ops = sched::make_schedule(sh->sl.kind, rank, sh->sl.num_ranks, sh->chunks);
  // Stages held and the most micro-batches each keeps in flight.
  std::map<StageId, int> live, peak;
  for (const sched::Op& op : st.ops) {
    if (op.type == sched::OpType::F || op.type == sched::OpType::FB) {
      const StageId id{op.f.dir, op.f.stage};
      peak[id] = std::max(peak[id], ++live[id]);
    }
    if (op.type == sched::OpType::BW || op.type == sched::OpType::FB || op.type == sched::OpType::B)
      --live[{op.b.dir, op.b.stage}];
  }
  for (const auto& [id, n] : peak) st.held.push_back(id);
  st.slot_count = peak;
  reset_slots(st);
  st.comp = std::make_shared<Compute>();
  auto comp = st.comp;
  const std::map<StageId, int> slots = peak;
  submit(self, *dev, [comp, sh, slots](kernels::Backend& be) {
    const model::ModelConfig& c = sh->opt.train.model;
    comp->params = be.from_f32({sh->layout.total()}, sh->init);
    comp->grads = be.zeros({sh->layout.total()});
    comp->w = model::bind_weights(sh->layout, c, comp->params);
    comp->g = model::bind_weights(sh->layout, c, comp->grads);
    const int last = sh->sl.num_stages - 1;
    for (const auto& [id, n] : slots) {
      const auto [lb, le] = sh->stage_layers[static_cast<size_t>(id.second)];
      comp->stages[id] = std::make_unique<model::Stage>(be, c, sh->mb_batch, lb, le, id.second == 0,
                                                        id.second == last, n);
    }
  }, [] {}, owner_label(TraceLabel::RankInit, rank));

  return {
      [self](rt::done_atom, uint64_t ticket) {
        if (kill_switch_fires(self, rank_phase(self->state))) return;
        run_ticket(self->state.tickets, ticket);
      },
      [self](rt::start_atom, uint64_t step, uint32_t attempt, double loss_scale, double aux_scale) {
        auto& s = self->state;
        if (kill_switch_fires(self, rank_phase(s))) return;
        if (step != s.step || attempt != s.attempt || s.running) {
          ++s.dropped;
          return;
        }
        s.running = true;
        s.next = 0;
        s.backwards = 0;
        s.loss_scale = loss_scale;
        s.aux_scale = aux_scale;
        s.slices_from.clear();
        s.slices_loaded = 0;
        // Forget dedupe keys of finished steps and attempts.
        s.consumed.erase(s.consumed.begin(), s.consumed.lower_bound(Key{step, attempt, 0, 0, 0, 0}));
        try_run(self);
      },
      [self](rt::arm_atom, uint64_t, uint32_t k) { self->state.kill.left = k; },
      [self](rt::restore_atom, uint64_t step, uint32_t attempt) { abort_to(self, step, attempt); },
      // One shard's slice of the parameters the restored step starts from
      // (sent by the supervisor from its snapshot, so trusted).
      [self](rt::restore_atom, const Envelope& e) {
        auto& s = self->state;
        auto p = e.read<schemas::ParamSlice>();
        if (!p) {
          caf::anon_send(s.sh->peers.coordinator, rt::fail_atom_v, s.name + ": bad restore slice: " + to_string(p.error()));
          return;
        }
        const Range r{static_cast<int64_t>((*p)->getRange().getOffset()), static_cast<int64_t>((*p)->getRange().getCount())};
        auto comp = s.comp;
        submit(self, *s.dev, [comp, e, r](kernels::Backend& be) {
          auto rd = e.read<schemas::ParamSlice>();
          be.upload_f32(comp->params.view(r.offset, {r.count}), tensor_f32((*rd)->getParams()));
        }, [] {}, owner_label(TraceLabel::ParamLoad, s.rank));
      },
      [self](const Envelope& e) {
        auto& s = self->state;
        if (kill_switch_fires(self, rank_phase(s))) return;
        auto kind = e.kind();
        auto fail = [&](const std::string& why) {
          ++s.dropped;
          caf::anon_send(s.sh->peers.coordinator, rt::fail_atom_v, s.name + ": rejected message: " + why);
        };
        if (!kind) return fail(to_string(kind.error()));
        if (*kind == Envelope::Kind::ACTIVATIONS || *kind == Envelope::Kind::GRADIENTS) {
          const bool fwd = *kind == Envelope::Kind::ACTIVATIONS;
          schemas::PipelineTag::Reader tag;
          caf::expected<Read<schemas::Activations>> a = caf::error{};
          caf::expected<Read<schemas::Gradients>> g = caf::error{};
          if (fwd) {
            a = e.read<schemas::Activations>();
            if (!a) return fail(to_string(a.error()));
            tag = (*a)->getTag();
          } else {
            g = e.read<schemas::Gradients>();
            if (!g) return fail(to_string(g.error()));
            tag = (*g)->getTag();
          }
          const uint32_t from = tag.getStage();
          const int consumer = fwd ? (from == kDataStage ? 0 : static_cast<int>(from) + 1)
                                   : static_cast<int>(from) - 1;
          const Key k{tag.getStep(), tag.getAttempt(), fwd ? 0 : 1, static_cast<int>(tag.getChunk()), consumer,
                      static_cast<int>(tag.getMicrobatch())};
          if (std::make_pair(tag.getStep(), tag.getAttempt()) < std::make_pair(s.step, s.attempt) ||
              tag.getReplica() != static_cast<uint32_t>(s.replica) || s.inbox.count(k) || s.consumed.count(k)) {
            ++s.dropped;  // stale (older step or attempt), misaddressed or duplicate
            return;
          }
          s.inbox.emplace(k, e);
          try_run(self);
          return;
        }
        if (*kind == Envelope::Kind::PARAM_SLICE) {
          auto p = e.read<schemas::ParamSlice>();
          if (!p) return fail(to_string(p.error()));
          const uint32_t shard = (*p)->getShard();
          if ((*p)->getStep() != s.step || (*p)->getAttempt() != s.attempt || !s.running || s.next != s.ops.size() ||
              shard >= s.sh->shard_ranges.size() || s.slices_from.count(shard)) {
            ++s.dropped;
            return;
          }
          const Range want = s.sh->shard_ranges[shard];
          if (static_cast<int64_t>((*p)->getRange().getOffset()) != want.offset ||
              static_cast<int64_t>((*p)->getRange().getCount()) != want.count)
            return fail("parameter slice range does not match shard " + std::to_string(shard));
          s.slices_from.insert(shard);
          auto comp = s.comp;
          submit(self, *s.dev, [comp, e, want](kernels::Backend& be) {
            auto r = e.read<schemas::ParamSlice>();
            const auto v = tensor_f32((*r)->getParams());
            be.upload_f32(comp->params.view(want.offset, {want.count}), v);
          }, [self] {
            auto& s2 = self->state;
            if (++s2.slices_loaded < static_cast<int>(s2.sh->shard_ranges.size())) return;
            s2.running = false;
            post(*s2.sh, s2.sh->peers.coordinator, rt::stepok_atom_v, s2.step, s2.attempt,
                           static_cast<uint32_t>(s2.replica), static_cast<uint32_t>(s2.rank));
            ++s2.step;
            s2.attempt = 0;
            s2.next = 0;
          }, owner_label(TraceLabel::ParamLoad, s.rank));
          return;
        }
        fail(std::string("unexpected message kind ") + kind_name(*kind));
      },
      [self](rt::dropped_atom) { return self->state.dropped; },
  };
}

}  // namespace

caf::actor spawn_rank(caf::actor_system& sys, std::shared_ptr<const Shared> sh, Device& dev,
                      int replica, int rank) {
  return sys.spawn(rank_actor, std::move(sh), &dev, replica, rank);
}

}  // namespace troupe::runtime
