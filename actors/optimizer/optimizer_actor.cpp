// Optimizer-shard actor (ZeRO-1): owns one contiguous range of the flat
// parameter buffer and its AdamW moments. Per step it collects the gradient
// slices of every (replica, rank) that touches its range, sums them in a
// fixed (replica, rank, offset) order (deterministic, no atomics), reports its
// sum of squares for the global norm, and after the coordinator's (clip, norm)
// clips, updates with the Trainer's AdamW/LR rules and sends the new
// parameters to every rank; on request it hands out its parameters (and
// moments, for checkpoints). Protocol: context.hpp. After each
// update it sends the coordinator (its supervisor) a snapshot of its state
// (parameters, m, v): the state the next step starts from. A replayed step,
// or a fresh shard after a restart, starts from the snapshot the supervisor
// sends back with (restore ...).
#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <tuple>

#include "actors/context.hpp"
#include "actors/optimizer/slice_sum.hpp"
#include "model/update_rules.hpp"
#include "moe/balance.hpp"

namespace troupe::runtime {
namespace {

using SliceKey = std::tuple<uint32_t, uint32_t, uint64_t>;  // replica, rank, offset

struct OptPiece {
  int64_t offset = 0, count = 0;  // relative to the shard's range
  bool decay = true;
};

// A router bias entry (aux-loss-free balancing; not trained by AdamW) or the
// part of it in the shard's range.
struct BiasPiece {
  int layer = 0;
  int64_t first = 0;   // index of the piece's first element within the entry [E]
  int64_t offset = 0;  // relative to the shard's range
  int64_t count = 0;
};

struct ShardCompute {
  kernels::Tensor params, grads, m, v;  // [n] each
  kernels::Tensor own_grads;            // host: the buffer grads is when it borrows no slice
  std::vector<float> acc;               // [n] host reduction buffer (device backends)
  // Host backend: m and v are not updated in place. Each update writes the
  // new moments straight into the snapshot messages it sends the supervisor
  // (adamw_to), and m/v then borrow those messages' blobs, read-only, as the
  // next update's input: the snapshot costs no copy, and the committed one
  // is never written to (a replay restores from it as it was).
  bool host = false;
};

struct ShardState {
  std::shared_ptr<const Shared> sh;
  Device* dev = nullptr;
  int shard = 0;
  std::string name;
  Tickets tickets;
  Range range;
  std::vector<OptPiece> pieces;
  std::vector<BiasPiece> bias;           // router bias parts in the range
  std::vector<int64_t> loads;            // the step's expert loads (for the bias), from the coordinator
  std::pair<uint64_t, uint32_t> loads_step{~uint64_t{0}, 0};  // (step, attempt) of `loads`
  uint64_t step = 0;     // step being reduced (== completed steps)
  uint32_t attempt = 0;  // replay generation of the step
  bool reduced = false;  // gradients summed, waiting for (clip)
  KillSwitch kill;
  uint64_t armed_step = 0;
  std::map<SliceKey, Envelope> inbox;
  std::shared_ptr<ShardCompute> comp;
  uint64_t dropped = 0;
};

using Self = caf::stateful_actor<ShardState>;

// Where in the step the shard is (reported when a fault kills it).
std::string shard_phase(const ShardState& st) {
  if (st.step > st.armed_step) return "finishing its update (new parameters already sent)";
  if (st.reduced) return "waiting for the global norm";
  return "collecting gradients (" + std::to_string(st.inbox.size()) + " of " +
         std::to_string(static_cast<size_t>(st.sh->opt.data_parallel) * live_plan(*st.sh)->gradient_slices(st.range)) + ")";
}

// A ParamSlice of device tensor t, filled straight from the device: the
// tensor is downloaded into the message's data field (one copy, one fresh
// buffer; a download into a vector, then into the message, copied twice). The update closure builds three of these per step (params for the
// ranks, m and v for the kill-and-replay snapshot). One first segment sized
// for the whole message, so capnp allocates once.
Envelope param_slice_of(kernels::Backend& be, const kernels::Tensor& t, uint64_t step, uint32_t shard, Range range,
                        uint32_t attempt = 0) {
  const size_t bytes = static_cast<size_t>(t.numel()) * sizeof(float);
  // The tensor bytes are the message's last allocation and are written
  // whole, so their memory is not zeroed first (half the snapshot's cost).
  return Envelope::build_blob<schemas::ParamSlice>(bytes,
      [&](schemas::ParamSlice::Builder b) {
        b.setStep(step);
        b.setAttempt(attempt);
        b.setShard(shard);
        b.initRange().setOffset(static_cast<uint64_t>(range.offset));
        b.getRange().setCount(static_cast<uint64_t>(range.count));
        auto data = init_tensor_f32_blob(b.initParams(), range.count);
        if (bytes > 0) be.download(data.begin(), t, bytes);
        return data;
      });
}

// The sum of the gradient slices over the range, straight into `out`
// [range] (slice_sum.hpp), in (replica, rank, offset) order.
void sum_slices_into(float* out, Range range, const std::vector<Envelope>& slices) {
  std::vector<GradPart> parts;
  parts.reserve(slices.size());
  for (const Envelope& e : slices) {
    auto r = e.read<schemas::GradSlice>();
    parts.push_back({static_cast<int64_t>((*r)->getRange().getOffset()) - range.offset, tensor_f32((*r)->getGrads())});
  }
  sum_parts_into(out, range.count, parts);
}

// Host backend: m and v borrow the blobs of envelopes `m` and `v` from now
// on (read-only).
void adopt_moments(kernels::Backend& be, ShardCompute& comp, const Envelope& m, const Envelope& v) {
  kernels::Tensor* dst[2] = {&comp.m, &comp.v};
  const Envelope* src[2] = {&m, &v};
  for (int i = 0; i < 2; ++i) {
    auto r = src[i]->read<schemas::ParamSlice>();
    if (!r) throw std::runtime_error("moments snapshot: " + to_string(r.error()));
    const auto x = tensor_f32((*r)->getParams());
    if (static_cast<int64_t>(x.size()) != dst[i]->numel()) throw std::runtime_error("snapshot of the wrong size");
    *dst[i] = kernels::borrow_host_f32(&be, const_cast<float*>(x.data()), static_cast<int64_t>(x.size()), src[i]->data());
  }
}

// Host backend: builds the snapshot's m and v ParamSlices for the update of
// step `step` with `update(m_out, v_out)` writing the new moments straight
// into their blobs, then makes comp.m / comp.v borrow those blobs (read-only
// from now on) for the next update. Returns (m, v).
template <class F>
std::pair<Envelope, Envelope> build_moments(kernels::Backend& be, ShardCompute& comp, F&& update, uint64_t step,
                                            uint32_t shard, Range range) {
  const size_t bytes = static_cast<size_t>(range.count) * sizeof(float);
  auto header = [&](schemas::ParamSlice::Builder b) {
    b.setStep(step);
    b.setShard(shard);
    b.initRange().setOffset(static_cast<uint64_t>(range.offset));
    b.getRange().setCount(static_cast<uint64_t>(range.count));
    return init_tensor_f32_blob(b.initParams(), range.count);
  };
  Envelope v;
  Envelope m = Envelope::build_blob<schemas::ParamSlice>(bytes, [&](schemas::ParamSlice::Builder mb) {
    capnp::Data::Builder m_blob = header(mb);
    v = Envelope::build_blob<schemas::ParamSlice>(bytes, [&](schemas::ParamSlice::Builder vb) {
      capnp::Data::Builder v_blob = header(vb);
      // Borrowed only while the messages are built (their memory is the
      // builders' first segments, which the envelopes then own).
      update(kernels::borrow_host_f32(&be, reinterpret_cast<float*>(m_blob.begin()), range.count, nullptr),
             kernels::borrow_host_f32(&be, reinterpret_cast<float*>(v_blob.begin()), range.count, nullptr));
      return v_blob;
    });
    return m_blob;
  });
  adopt_moments(be, comp, m, v);
  return {std::move(m), std::move(v)};
}

void reduce(Self* self) {
  auto& st = self->state;
  st.reduced = true;
  std::vector<Envelope> slices;
  for (auto& [k, e] : st.inbox) slices.push_back(std::move(e));  // map order: replica, rank, offset
  st.inbox.clear();
  auto comp = st.comp;
  const Range range = st.range;
  const uint64_t step = st.step;
  const uint32_t attempt = st.attempt;
  const uint32_t shard = static_cast<uint32_t>(st.shard);
  caf::actor coord = st.sh->peers.coordinator;
  auto sh = st.sh;
  submit(self, *st.dev, [comp, slices = std::move(slices), range, step, attempt, shard, coord, sh, device = st.dev->id()](kernels::Backend& be) {
    if (comp->host) {
      // One slice over the whole range (one producer, e.g. a single rank):
      // the update reads the gradients from the message itself.
      bool whole = false;
      if (slices.size() == 1) {
        auto r = slices[0].read<schemas::GradSlice>();
        const auto g = tensor_f32((*r)->getGrads());
        whole = static_cast<int64_t>((*r)->getRange().getOffset()) == range.offset &&
                static_cast<int64_t>(g.size()) == range.count;
        if (whole) comp->grads = kernels::borrow_host_f32(&be, const_cast<float*>(g.data()), range.count, slices[0].data());
      }
      if (!whole) {
        comp->grads = comp->own_grads;
        sum_slices_into(comp->grads.f32(), range, slices);
      }
    } else {
      std::fill(comp->acc.begin(), comp->acc.end(), 0.0f);
      for (const Envelope& e : slices) {
        auto r = e.read<schemas::GradSlice>();
        const int64_t off = static_cast<int64_t>((*r)->getRange().getOffset()) - range.offset;
        const auto g = tensor_f32((*r)->getGrads());
        float* a = comp->acc.data() + off;
        for (size_t i = 0; i < g.size(); ++i) a[i] += g[i];
      }
      be.upload_f32(comp->grads, comp->acc);
    }
    const double sq = be.squared_norm(comp->grads);
    post(*sh, device, coord, rt::gnorm_atom_v, step, attempt, shard, sq);
  }, [] {}, owner_label(TraceLabel::Reduce, st.shard));
}

// The shard's state from the plan: its range, its AdamW pieces and router
// bias entries, and its parameters and moments uploaded on its device.
void init_shard(Self* self, std::shared_ptr<const Shared> sh, Device* dev, int shard) {
  auto& st = self->state;
  st.sh = sh;
  st.dev = dev;
  st.shard = shard;
  st.name = shard_name(shard);
  st.range = sh->plan.shard_ranges[static_cast<size_t>(shard)];
  // AdamW pieces: the trainer's optimizer runs, cut to the range this shard owns.
  for (const model::OptimizerRange& o : model::optimizer_ranges(sh->layout)) {
    const Range r = intersect({o.offset, o.numel}, st.range);
    if (r.count == 0) continue;
    st.pieces.push_back({r.offset - st.range.offset, r.count, o.decay});
  }
  // In offset order (the host update carries the moments between pieces over).
  std::sort(st.pieces.begin(), st.pieces.end(), [](const OptPiece& a, const OptPiece& b) { return a.offset < b.offset; });
  if (sh->opt.train.model.ffn == model::Ffn::moe && sh->opt.train.model.balance == moe::Balance::bias)
    for (const model::ParamEntry& e : sh->layout.entries()) {
      if (e.tag.role != model::ParamRole::RouterBias) continue;
      const Range r = intersect({e.offset, e.numel}, st.range);
      if (r.count == 0) continue;
      const int layer = e.tag.layer;
      st.bias.push_back({layer, r.offset - e.offset, r.offset - st.range.offset, r.count});
    }
  st.comp = std::make_shared<ShardCompute>();
  st.comp->host = dev->kind() == kernels::BackendKind::host;
  st.step = sh->start_step;  // resumed: AdamW's step count and the LR schedule go on from there
  auto slice = [&](const std::vector<float>& v) {
    return v.empty() ? std::vector<float>(static_cast<size_t>(st.range.count), 0.0f)
                     : std::vector<float>(v.begin() + st.range.offset, v.begin() + st.range.offset + st.range.count);
  };
  auto init = std::make_shared<std::array<std::vector<float>, 3>>(
      std::array<std::vector<float>, 3>{slice(sh->init), slice(sh->init_m), slice(sh->init_v)});
  auto comp = st.comp;
  const Range range = st.range;
  submit(self, *dev, [comp, range, init](kernels::Backend& be) {
    comp->params = be.from_f32({range.count}, (*init)[0]);
    comp->grads = be.zeros({range.count});
    comp->own_grads = comp->grads;
    comp->m = be.from_f32({range.count}, (*init)[1]);
    comp->v = be.from_f32({range.count}, (*init)[2]);
    comp->acc.assign(static_cast<size_t>(range.count), 0.0f);
  }, [] {}, owner_label(TraceLabel::ShardInit, shard));
}

// Back to the snapshot a step starts from (replay, or a fresh shard).
// Device work of the aborted attempt still queued runs first; its
// sends carry the old attempt and are dropped.
void restore_snapshot(Self* self, uint64_t step, uint32_t attempt, const Envelope& p, const Envelope& m,
                      const Envelope& v) {
  auto& s = self->state;
  s.step = step;
  s.attempt = attempt;
  s.reduced = false;
  s.inbox.clear();
  auto comp = s.comp;
  submit(self, *s.dev, [comp, p, m, v](kernels::Backend& be) {
    const Envelope* src[3] = {&p, &m, &v};
    kernels::Tensor* dst[3] = {&comp->params, &comp->m, &comp->v};
    for (int i = 0; i < 3; ++i) {
      auto r = src[i]->read<schemas::ParamSlice>();
      if (!r) throw std::runtime_error("bad snapshot: " + to_string(r.error()));
      const auto x = tensor_f32((*r)->getParams());
      if (static_cast<int64_t>(x.size()) != dst[i]->numel()) throw std::runtime_error("snapshot of the wrong size");
      // Host moments are only read from (the next update writes new
      // messages), so they borrow the snapshot's memory (below).
      if (!comp->host || i == 0) be.upload_f32(*dst[i], x);
    }
    if (comp->host) adopt_moments(be, *comp, m, v);
  }, [] {}, owner_label(TraceLabel::ShardInit, s.shard));
}

// A gradient slice of the step: checked, kept once per (replica, rank,
// offset); the last one expected starts the reduction.
void take_gradient_slice(Self* self, const Envelope& e) {
  auto& s = self->state;
  if (kill_switch_fires(self, shard_phase(s))) return;
  if (drop_if_damaged(self, e)) return;
  auto fail = [&](const std::string& why) {
    ++s.dropped;
    caf::anon_send(s.sh->peers.coordinator, rt::fail_atom_v, s.name + ": rejected message: " + why);
  };
  auto r = e.read<schemas::GradSlice>();
  if (!r) return fail(to_string(r.error()));
  const uint64_t off = (*r)->getRange().getOffset(), cnt = (*r)->getRange().getCount();
  if ((*r)->getStep() != s.step || (*r)->getAttempt() != s.attempt || s.reduced) {
    ++s.dropped;  // stale (older step or attempt) or duplicate after the reduction
    return;
  }
  if ((*r)->getShard() != static_cast<uint32_t>(s.shard) ||
      off < static_cast<uint64_t>(s.range.offset) ||
      cnt > static_cast<uint64_t>(s.range.offset + s.range.count) - off ||
      tensor_f32((*r)->getGrads()).size() != cnt)
    return fail("gradient slice [" + std::to_string(off) + ", +" + std::to_string(cnt) +
                ") outside shard range [" + std::to_string(s.range.offset) + ", +" +
                std::to_string(s.range.count) + ")");
  const SliceKey k{(*r)->getReplica(), (*r)->getStage(), off};
  if (s.inbox.count(k)) {
    ++s.dropped;
    return;
  }
  s.inbox.emplace(k, e);
  // Counted from the plan in force: a scale event between steps
  // changes how many expert-shard producers meet the range.
  if (s.inbox.size() == static_cast<size_t>(s.sh->opt.data_parallel) * live_plan(*s.sh)->gradient_slices(s.range)) reduce(self);
}

// The coordinator's (clip, norm): AdamW on the reduced gradients with the
// global norm, the router bias, the new parameters to every rank and expert
// shard that meets the range, then the snapshot the next step starts from.
void clip_and_update(Self* self, uint64_t step, uint32_t attempt, double norm) {
  auto& s = self->state;
  if (kill_switch_fires(self, shard_phase(s))) return;
  if (step != s.step || attempt != s.attempt || !s.reduced) {
    ++s.dropped;
    return;
  }
  const auto& o = s.sh->opt;
  const model::OptimConfig optim = o.train.optim;
  const int64_t total = o.train.steps;
  auto comp = s.comp;
  auto pieces = s.pieces;
  const Range range = s.range;
  const uint32_t shard = static_cast<uint32_t>(s.shard);
  auto sh = s.sh;
  if (!s.bias.empty() && s.loads_step != std::make_pair(step, attempt)) {
    caf::anon_send(sh->peers.coordinator, rt::fail_atom_v, s.name + ": no expert loads for the router bias");
    return;
  }
  auto bias = s.bias;
  auto loads = s.loads;
  auto snap = std::make_shared<std::vector<Envelope>>();
  submit(self, *s.dev, [comp, pieces, optim, total, norm, range, shard, step, attempt, sh, snap, bias, loads, device = s.dev->id()](kernels::Backend& be) mutable {
    // The Trainer's rules (model/update_rules.hpp), with the global norm
    // (its clip factor is applied inside AdamW).
    auto hp = [&](const OptPiece& p) {
      return model::adamw_params(optim, static_cast<int64_t>(step), total, p.decay, norm);
    };
    if (comp->host) {
      // The new moments go straight into the snapshot's m and v messages.
      *snap = {Envelope{}, Envelope{}, Envelope{}};
      std::tie((*snap)[1], (*snap)[2]) = build_moments(be, *comp, [&](const kernels::Tensor& m_out, const kernels::Tensor& v_out) {
        for (const OptPiece& p : pieces)
          be.adamw_to(comp->params.view(p.offset, {p.count}), comp->grads.view(p.offset, {p.count}),
                      comp->m.view(p.offset, {p.count}), comp->v.view(p.offset, {p.count}),
                      m_out.view(p.offset, {p.count}), v_out.view(p.offset, {p.count}), hp(p));
        // Moments outside every AdamW piece (the router bias) carry over.
        int64_t at = 0;
        auto carry = [&](int64_t end) {
          if (end > at) {
            be.copy(m_out.view(at, {end - at}), comp->m.view(at, {end - at}));
            be.copy(v_out.view(at, {end - at}), comp->v.view(at, {end - at}));
          }
        };
        for (const OptPiece& p : pieces) {
          carry(p.offset);
          at = std::max(at, p.offset + p.count);
        }
        carry(range.count);
      }, step, shard, range);
    } else {
      for (const OptPiece& p : pieces)
        be.adamw(comp->params.view(p.offset, {p.count}), comp->grads.view(p.offset, {p.count}),
                 comp->m.view(p.offset, {p.count}), comp->v.view(p.offset, {p.count}), hp(p));
    }
    // Aux-loss-free balancing after the update, as model::Trainer does:
    // the layer's whole bias row through moe::update_router_bias.
    const auto& c = sh->opt.train.model;
    const size_t E = static_cast<size_t>(c.n_experts);
    for (const BiasPiece& b : bias) {
      const size_t at = static_cast<size_t>(b.layer) * (E + 1);
      if (loads.size() < at + E) throw std::runtime_error("expert loads miss layer " + std::to_string(b.layer));
      std::vector<float> row(E, 0.0f);
      const kernels::Tensor v = comp->params.view(b.offset, {b.count});
      be.download(row.data() + b.first, v, static_cast<size_t>(b.count) * sizeof(float));
      moe::update_router_bias(row, std::span<const int64_t>(loads.data() + at, E), c.bias_update_rate);
      be.upload(v, row.data() + b.first, static_cast<size_t>(b.count) * sizeof(float));
    }
    const Envelope e = param_slice_of(be, comp->params, step, shard, range, attempt);
    if (comp->host)
      (*snap)[0] = e;
    else
      *snap = {e};
    for (const caf::actor& r : all_ranks(*sh)) post(*sh, device, r, e);
    // Expert shards whose weights meet this range.
    const auto plan = live_plan(*sh);
    for (int rep = 0; rep < sh->opt.data_parallel; ++rep)
      for (size_t p = 0; p < plan->expert_owned.size(); ++p) {
        bool meets = false;
        for (const Range& o : plan->expert_owned[p]) meets = meets || intersect(o, range).count > 0;
        if (meets) post(*sh, device, expert_of(*sh, rep, static_cast<int>(p)), e);
      }
  }, [] {}, owner_label(TraceLabel::Update, s.shard));
  // The kill-and-replay snapshot's m and v, as their own closure right
  // after the update (the device runs closures in order): the new
  // parameters are already on their way to the ranks, and the trace
  // shows what the snapshot costs.
  submit(self, *s.dev, [comp, snap, step, shard, range](kernels::Backend& be) {
    if (comp->host) return;  // the update wrote them already
    snap->push_back(param_slice_of(be, comp->m, step, shard, range));
    snap->push_back(param_slice_of(be, comp->v, step, shard, range));
  }, [self, snap, step, attempt, shard] {
    // Sent by the actor once the snapshot is taken, so the step (which
    // waits for every snapshot) ends only after the shard's last message.
    const auto& x = *snap;
    post(*self->state.sh, self->state.dev->id(), self->state.sh->peers.coordinator, rt::snapshot_atom_v, step, attempt, shard, x[0], x[1], x[2]);
  }, owner_label(TraceLabel::Snapshot, s.shard));
  s.reduced = false;
  ++s.step;
  s.attempt = 0;
}

// The current parameters of the range, read on the device after any
// pending update.
caf::result<Envelope> read_params(Self* self) {
  auto& s = self->state;
  auto rp = self->make_response_promise<Envelope>();
  auto holder = std::make_shared<Envelope>();
  auto comp = s.comp;
  const Range range = s.range;
  const uint32_t shard = static_cast<uint32_t>(s.shard);
  const uint64_t step = s.step;
  submit(self, *s.dev, [comp, holder, range, shard, step](kernels::Backend& be) {
    *holder = param_slice_of(be, comp->params, step, shard, range);
  }, [rp, holder]() mutable { rp.deliver(*holder); }, owner_label(TraceLabel::ParamRead, s.shard));
  return rp;
}

// The parameters and AdamW moments (m, v) of the range, for a
// checkpoint: three ParamSlices, read on the device after any pending
// update.
caf::result<Envelope, Envelope, Envelope> read_state(Self* self) {
  auto& s = self->state;
  auto rp = self->make_response_promise<Envelope, Envelope, Envelope>();
  auto holder = std::make_shared<std::vector<Envelope>>();
  auto comp = s.comp;
  const Range range = s.range;
  const uint32_t shard = static_cast<uint32_t>(s.shard);
  const uint64_t step = s.step;
  submit(self, *s.dev, [comp, holder, range, shard, step](kernels::Backend& be) {
    for (const kernels::Tensor* t : {&comp->params, &comp->m, &comp->v})
      holder->push_back(param_slice_of(be, *t, step, shard, range));
  }, [rp, holder]() mutable { rp.deliver((*holder)[0], (*holder)[1], (*holder)[2]); },
     owner_label(TraceLabel::ParamRead, s.shard));
  return rp;
}

caf::behavior shard_actor(Self* self, std::shared_ptr<const Shared> sh, Device* dev, int shard) {
  init_shard(self, std::move(sh), dev, shard);
  return {
      [self](rt::done_atom, uint64_t ticket) {
        if (kill_switch_fires(self, shard_phase(self->state))) return;
        run_ticket(self->state.tickets, ticket);
      },
      [self](rt::arm_atom, uint64_t step, uint32_t k) {
        self->state.kill.left = k;
        self->state.armed_step = step;
      },
      [self](rt::restore_atom, uint64_t step, uint32_t attempt, const Envelope& p, const Envelope& m, const Envelope& v) {
        restore_snapshot(self, step, attempt, p, m, v);
      },
      [self](const Envelope& e) { take_gradient_slice(self, e); },
      [self](rt::clip_atom, uint64_t step, uint32_t attempt, double norm) { clip_and_update(self, step, attempt, norm); },
      // The step's expert loads (coordinator, before its clip): per MoE
      // layer E routed counts then the dropped count.
      [self](rt::load_atom, uint64_t step, uint32_t attempt, const std::vector<int64_t>& loads) {
        auto& s = self->state;
        s.loads = loads;
        s.loads_step = {step, attempt};
      },
      [self](rt::params_atom) { return read_params(self); },
      [self](rt::params_atom, bool) { return read_state(self); },
      [self](rt::dropped_atom) { return self->state.dropped; },
      [self](rt::name_atom) { return self->state.name; },
  };
}

}  // namespace

caf::actor spawn_shard(caf::actor_system& sys, std::shared_ptr<const Shared> sh, Device& dev, int shard) {
  return sys.spawn(shard_actor, std::move(sh), &dev, shard);
}

}  // namespace troupe::runtime
