// Expert-shard actor: grouped-GEMM expert forward/backward for the experts
// one shard owns, fed by Dispatch Envelopes and answering Combines; weight
// gradients go to the optimizer shards at step end. Protocol and error
// contract: actors/experts/expert_shard.hpp.
#include "actors/experts/expert_shard.hpp"

#include <cstring>
#include <algorithm>
#include <bit>
#include <numeric>
#include <set>
#include <stdexcept>
#include <tuple>
#include <utility>

#include "actors/transport/moe_messages.hpp"
#include "moe/experts.hpp"

namespace troupe::runtime {

namespace {

using ActKey = std::pair<uint32_t, uint32_t>;  // chunk, microbatch

// Forward activations of one dispatch (device thread only).
struct Saved {
  kernels::Tensor xs, y;  // [n,D]
  moe::ExpertActs acts;   // [n,F] each
};

// Device-side state: touched only by closures on the shard's device.
struct XCompute {
  kernels::Tensor params;                    // [3*n*F*D] gate | up | down of the owned experts
  moe::ExpertWeights w;                      // views of params
  std::map<uint32_t, kernels::Tensor> grads; // chunk -> accumulator laid out like params
  std::map<ActKey, Saved> saved;
};

// What the actor remembers of a forward dispatch (to check its backward).
struct FwdMeta {
  std::vector<uint32_t> expert_ids, token_index;
  std::vector<float> weights;
  std::vector<int64_t> counts;
};

struct XState {
  std::shared_ptr<const Shared> sh;
  Device* dev = nullptr;
  ExpertShardSpec spec;
  ExpertRange experts;
  std::vector<int64_t> held;  // sorted: its range and its copies (the order of its weights)
  std::vector<Range> ranges;  // expert_set_ranges(held): gate runs, up runs, down runs
  ShardView view;
  int64_t F = 0, D = 0;
  std::string name;
  Tickets tickets;
  std::shared_ptr<XCompute> comp;
  bool kill_on_load = false;  // TestHooks::kill_while_loading armed it (coordinator.cpp, request_load)
  uint64_t step = 0;
  uint32_t attempt = 0;
  bool waiting_params = false;               // grads sent, ParamSlices pending
  std::map<ActKey, FwdMeta> fwd;             // forwards of (step, attempt) awaiting their backward
  std::set<ActKey> fwd_done, bwd_done;       // dedupe within (step, attempt)
  std::set<uint32_t> slices_from;            // optimizer shards answered this step
  size_t slices_expected = 0;
  int slices_loaded = 0;
  std::vector<std::pair<Envelope, caf::actor>> early;  // dispatches of step + 1
  uint64_t dropped = 0;
  KillSwitch kill;
};

using Self = caf::stateful_actor<XState>;

moe::ExpertWeights weight_views(const kernels::Tensor& buf, int64_t n, int64_t F, int64_t D) {
  const int64_t per = n * F * D;
  return {buf.view(0, {n, F, D}), buf.view(per, {n, F, D}), buf.view(2 * per, {n, D, F})};
}

TraceLabel label(TraceLabel::Kind kind, const MoeKey& id, int producer) {
  TraceLabel l;
  l.kind = kind;
  l.mb = static_cast<int16_t>(id.microbatch);
  l.stage = static_cast<int16_t>(id.layer);
  l.chunk = static_cast<int16_t>(id.chunk);
  l.owner = static_cast<int16_t>(producer);
  return l;
}

void reject(Self* self, const std::string& why) {
  auto& s = self->state;
  ++s.dropped;
  caf::anon_send(s.sh->peers.coordinator, rt::fail_atom_v, s.name + ": rejected dispatch: " + why);
}

// Forgets (step, attempt)'s activations and gradients (a new step or a replay).
void reset_step(Self* self) {
  auto& s = self->state;
  s.fwd.clear();
  s.fwd_done.clear();
  s.bwd_done.clear();
  auto comp = s.comp;
  submit(self, *s.dev, [comp](kernels::Backend& be) {
    comp->saved.clear();
    for (auto& [c, g] : comp->grads) be.fill(g, 0.0f);
  }, [] {});
}

// Where in the step the shard is (reported when a fault kills it).
std::string expert_phase(const XState& s) {
  if (s.waiting_params)
    return "loading parameters after sending gradients (" + std::to_string(s.slices_loaded) + " of " +
           std::to_string(s.slices_expected) + " slices loaded)";
  if (!s.bwd_done.empty()) return "in its backward dispatches";
  if (!s.fwd_done.empty()) return "in its forward dispatches, before any backward";
  return "waiting for its step's dispatches";
}

// Abort to the start of step `step`, attempt `attempt` (a replay): the
// supervisor then sends the parameter slices the step starts from.
void abort_to(Self* self, uint64_t step, uint32_t attempt) {
  auto& s = self->state;
  s.step = step;
  s.attempt = attempt;
  s.waiting_params = false;
  s.slices_from.clear();
  s.slices_loaded = 0;
  s.early.clear();
  s.tickets.pending.clear();  // late completions of old work find nothing to continue
  reset_step(self);           // queued after any old work: activations and gradients dropped
}

caf::actor reply_to(Self* self, const MoeKey& id) {
  auto& s = self->state;
  if (auto sender = self->current_sender()) return caf::actor_cast<caf::actor>(sender);
  const auto& sl = s.sh->plan.sl;
  // The ids are untrusted: range-check them before any rank arithmetic.
  if (id.replica >= static_cast<uint32_t>(s.sh->opt.data_parallel) ||
      id.chunk >= static_cast<uint32_t>(std::max(sl.num_dirs, 1)) ||
      id.stage >= static_cast<uint32_t>(std::max(sl.num_stages, 0)))
    return {};
  const int r = sched::stage_rank(sl, static_cast<int>(id.chunk), static_cast<int>(id.stage));
  if (r < 0) return {};
  return rank_of(*s.sh, static_cast<int>(id.replica), r);
}

// Step end: the chunk accumulators summed in chunk order, sliced per
// optimizer shard.
void send_grads(Self* self) {
  auto& s = self->state;
  s.waiting_params = true;
  auto comp = s.comp;
  auto sh = s.sh;
  const auto ranges = s.ranges;
  const uint64_t step = s.step;
  const uint32_t attempt = s.attempt;
  const uint32_t replica = static_cast<uint32_t>(s.spec.replica);
  const uint32_t producer = kExpertProducerBase + static_cast<uint32_t>(s.spec.producer);
  const uint32_t mbs = static_cast<uint32_t>(s.spec.microbatches);
  const int device = s.dev->id();
  submit(self, *s.dev, [comp, sh, ranges, step, attempt, replica, producer, mbs, device](kernels::Backend& be) {
    std::vector<float> total;
    for (auto& [chunk, g] : comp->grads) {
      std::vector<float> part = be.download_f32(g);
      if (total.empty()) total = std::move(part);  // the first chunk as is (no 0 + x)
      else for (size_t i = 0; i < total.size(); ++i) total[i] += part[i];
      be.fill(g, 0.0f);
    }
    int64_t base = 0;  // offset of each range inside `total`
    for (const Range& own : ranges) {
      for (size_t sh_i = 0; sh_i < sh->plan.shard_ranges.size(); ++sh_i) {
        const Range piece = intersect(own, sh->plan.shard_ranges[sh_i]);
        if (piece.count == 0) continue;
        const float* src = total.empty() ? nullptr : total.data() + base + (piece.offset - own.offset);
        std::vector<float> zeros;
        if (!src) zeros.assign(static_cast<size_t>(piece.count), 0.0f), src = zeros.data();
        const size_t bytes = static_cast<size_t>(piece.count) * sizeof(float);
        Envelope e = Envelope::build_blob<schemas::GradSlice>(bytes, [&](schemas::GradSlice::Builder b) {
          b.setStep(step);
          b.setReplica(replica);
          b.setShard(static_cast<uint32_t>(sh_i));
          b.setStage(producer);
          b.setMicrobatches(mbs);
          b.setAttempt(attempt);
          b.initRange().setOffset(static_cast<uint64_t>(piece.offset));
          b.getRange().setCount(static_cast<uint64_t>(piece.count));
          auto data = init_tensor_f32_blob(b.initGrads(), piece.count);
          if (bytes > 0) std::memcpy(data.begin(), src, bytes);
          return data;
        });
        post(*sh, device, shard_of(*sh, sh_i), e);
      }
      base += own.count;
    }
  }, [] {}, owner_label(TraceLabel::GradSend, static_cast<int>(producer - kExpertProducerBase)));
}

void handle_dispatch(Self* self, const Envelope& e, caf::actor dest);

void forward(Self* self, const CheckedDispatch& cd, caf::actor dest) {
  auto& s = self->state;
  const ActKey k{cd.id.chunk, cd.id.microbatch};
  FwdMeta meta;
  auto d = cd.msg.get();
  const uint32_t n = d.getNumRows();
  for (uint32_t i = 0; i < n; ++i) {
    meta.expert_ids.push_back(d.getExpertIds()[i]);
    meta.token_index.push_back(d.getTokenIndex()[i]);
    meta.weights.push_back(d.getCombineWeights()[i]);
  }
  meta.counts = cd.counts;
  s.fwd_done.insert(k);
  auto comp = s.comp;
  const int64_t F = s.F, D = s.D;
  const MoeKey id = cd.id;
  auto msg = cd.msg;
  auto token_index = meta.token_index;
  auto counts = meta.counts;
  s.fwd.emplace(k, std::move(meta));
  const MoeKey reply = id;

  auto sh = s.sh;
  submit(self, *s.dev, [comp, sh, k, n, F, D, id, reply, msg, token_index, counts, dest, device = s.dev->id()](kernels::Backend& be) {
    std::vector<float> y;
    if (n > 0) {
      Saved sv;
      sv.xs = be.from_f32({n, D}, tensor_f32(msg->getRows()));
      sv.y = be.zeros({n, D});
      sv.acts = {be.zeros({n, F}), be.zeros({n, F}), be.zeros({n, F})};
      moe::experts_forward(be, sv.y, sv.acts, sv.xs, comp->w, counts);
      y = be.download_f32(sv.y);
      comp->saved[k] = std::move(sv);
    }
    if (dest) post(*sh, device, dest, make_combine(reply, static_cast<uint32_t>(D), y, token_index, {}));
  }, [] {}, label(TraceLabel::Forward, id, s.spec.producer));
}

void backward(Self* self, const CheckedDispatch& cd, caf::actor dest) {
  auto& s = self->state;
  const ActKey k{cd.id.chunk, cd.id.microbatch};
  auto it = s.fwd.find(k);
  if (it == s.fwd.end())
    return reject(self, "backward " + to_string(cd.id) + " without its forward");
  auto d = cd.msg.get();
  const uint32_t n = d.getNumRows();
  const FwdMeta& meta = it->second;
  bool same = n == meta.expert_ids.size();
  for (uint32_t i = 0; same && i < n; ++i)
    same = d.getExpertIds()[i] == meta.expert_ids[i] && d.getTokenIndex()[i] == meta.token_index[i] &&
           std::bit_cast<uint32_t>(d.getCombineWeights()[i]) == std::bit_cast<uint32_t>(meta.weights[i]);
  if (!same)
    return reject(self, "backward " + to_string(cd.id) + " rows (" + std::to_string(n) +
                            ") do not match the forward's expert ids / token indices / combine weights (" +
                            std::to_string(meta.expert_ids.size()) + " rows)");
  auto token_index = meta.token_index;
  auto counts = meta.counts;
  s.fwd.erase(it);
  s.bwd_done.insert(k);
  auto comp = s.comp;
  const int64_t F = s.F, D = s.D;
  const int64_t nexp = static_cast<int64_t>(s.held.size());
  const MoeKey id = cd.id;
  auto msg = cd.msg;
  auto sh = s.sh;
  submit(self, *s.dev, [comp, sh, k, n, F, D, nexp, id, msg, token_index, counts, dest, device = s.dev->id()](kernels::Backend& be) {
    std::vector<float> dx, dw;
    if (n > 0) {
      auto sv = comp->saved.find(k);
      if (sv == comp->saved.end()) throw std::logic_error("expert shard: activations of " + to_string(id) + " missing");
      auto& acc = comp->grads[id.chunk];
      if (!acc.defined()) {
        acc = be.zeros({3 * nexp * F * D});
      }
      const moe::ExpertWeights dwv = weight_views(acc, nexp, F, D);
      std::vector<float> wts(n);
      for (uint32_t i = 0; i < n; ++i) wts[i] = msg->getCombineWeights()[i];
      std::vector<int32_t> slots(n);
      std::iota(slots.begin(), slots.end(), 0);
      const kernels::Tensor dout = be.from_f32({n, D}, tensor_f32(msg->getRows()));
      const kernels::Tensor tw = be.from_f32({n, 1}, wts), ts = be.from_i32({n, 1}, slots);
      const kernels::Tensor dy = be.zeros({n, D}), dwt = be.zeros({n, 1}), dxs = be.zeros({n, D});
      // Each row is its own "token" with one choice: dy = w * dOut, dw = dot(dOut, y),
      // the same per-row arithmetic as the single-process layer's combine_backward.
      be.combine_backward(dy, dwt, dout, sv->second.y, ts, tw);
      const moe::ExpertActs scratch{be.zeros({n, F}), be.zeros({n, F}), be.zeros({n, F})};
      moe::experts_backward(be, dxs, dwv, scratch, dy, sv->second.xs, sv->second.acts, comp->w, counts);
      dx = be.download_f32(dxs);
      dw = be.download_f32(dwt);
      comp->saved.erase(sv);
    }
    if (dest) post(*sh, device, dest, make_combine(id, static_cast<uint32_t>(D), dx, token_index, dw));
  }, [] {}, label(TraceLabel::Backward, id, s.spec.producer));
  if (s.bwd_done.size() == static_cast<size_t>(s.spec.microbatches)) send_grads(self);
}

void handle_dispatch(Self* self, const Envelope& e, caf::actor dest) {
  auto& s = self->state;
  auto cd = check_dispatch(e, s.view);
  if (!cd) return reject(self, self->system().render(cd.error()));
  const MoeKey& id = cd->id;
  if (!dest) return reject(self, to_string(id) + ": no sender and no rank holds (chunk, stage) to answer");
  if (id.step < s.step || (id.step == s.step && id.attempt < s.attempt)) {
    ++s.dropped;  // stale
    return;
  }
  if (id.step > s.step) {
    if (id.step == s.step + 1 && s.waiting_params && s.early.size() < 4096) {
      s.early.emplace_back(e, dest);  // the next step began before our parameters arrived
      return;
    }
    return reject(self, to_string(id) + ": step ahead of this shard's step " + std::to_string(s.step));
  }
  if (id.attempt > s.attempt) {  // replay of the step: forget the failed attempt
    s.attempt = id.attempt;
    s.waiting_params = false;
    s.slices_from.clear();
    s.slices_loaded = 0;
    reset_step(self);
  }
  if (s.waiting_params) {
    ++s.dropped;  // the step's gradients are already out
    return;
  }
  const ActKey k{id.chunk, id.microbatch};
  if (id.backward ? s.bwd_done.count(k) > 0 : s.fwd_done.count(k) > 0) {
    ++s.dropped;  // duplicate
    return;
  }
  if (id.backward) backward(self, *cd, std::move(dest));
  else forward(self, *cd, std::move(dest));
}

void handle_params(Self* self, const Envelope& e) {
  auto& s = self->state;
  auto p = e.read<schemas::ParamSlice>();
  if (!p) {
    ++s.dropped;
    caf::anon_send(s.sh->peers.coordinator, rt::fail_atom_v, s.name + ": rejected message: " + self->system().render(p.error()));
    return;
  }
  const uint32_t shard = (*p)->getShard();
  if ((*p)->getStep() != s.step || (*p)->getAttempt() != s.attempt || !s.waiting_params ||
      shard >= s.sh->plan.shard_ranges.size() ||
      s.slices_from.count(shard)) {
    ++s.dropped;
    return;
  }
  const Range got{static_cast<int64_t>((*p)->getRange().getOffset()), static_cast<int64_t>((*p)->getRange().getCount())};
  const Range want = s.sh->plan.shard_ranges[shard];
  if (got.offset != want.offset || got.count != want.count) {
    ++s.dropped;
    caf::anon_send(s.sh->peers.coordinator, rt::fail_atom_v,
                   s.name + ": parameter slice range does not match optimizer shard " + std::to_string(shard));
    return;
  }
  s.slices_from.insert(shard);
  auto comp = s.comp;
  const auto ranges = s.ranges;
  submit(self, *s.dev, [comp, e, ranges, got](kernels::Backend& be) {
    auto r = e.read<schemas::ParamSlice>();
    const auto v = tensor_f32((*r)->getParams());
    int64_t base = 0;
    for (const Range& own : ranges) {
      const Range piece = intersect(own, got);
      if (piece.count > 0)
        be.upload_f32(comp->params.view(base + piece.offset - own.offset, {piece.count}),
                      v.subspan(static_cast<size_t>(piece.offset - got.offset), static_cast<size_t>(piece.count)));
      base += own.count;
    }
  }, [self] {
    auto& s2 = self->state;
    if (++s2.slices_loaded < static_cast<int>(s2.slices_expected)) return;
    post(*s2.sh, s2.dev->id(), s2.sh->peers.coordinator, rt::stepok_atom_v, s2.step, s2.attempt,
         static_cast<uint32_t>(s2.spec.replica), kExpertProducerBase + static_cast<uint32_t>(s2.spec.producer));
    ++s2.step;
    s2.attempt = 0;
    s2.waiting_params = false;
    s2.slices_from.clear();
    s2.slices_loaded = 0;
    s2.fwd.clear();
    s2.fwd_done.clear();
    s2.bwd_done.clear();
    auto early = std::move(s2.early);
    s2.early.clear();
    for (auto& [env, dest] : early) handle_dispatch(self, env, dest);
  }, owner_label(TraceLabel::ParamLoad, s.spec.producer));
}

caf::behavior expert_actor(Self* self, std::shared_ptr<const Shared> sh, Device* dev, ExpertShardSpec spec) {
  auto& st = self->state;
  const model::ModelConfig& c = sh->opt.train.model;
  if (spec.microbatches <= 0) spec.microbatches = sh->plan.chunks;
  st.sh = sh;
  st.dev = dev;
  st.spec = spec;
  st.experts = spec.experts.size() > 0 ? spec.experts : expert_split(c.n_experts, spec.shards, spec.shard);
  st.held = spec.copies;
  for (int64_t e = st.experts.begin; e < st.experts.end; ++e) st.held.push_back(e);
  std::sort(st.held.begin(), st.held.end());
  st.ranges = expert_set_ranges(sh->layout, c, spec.layer, st.held);
  st.F = c.expert_hidden;
  st.D = c.d_model;
  st.name = expert_name(spec.replica, spec.layer, spec.shard, sh->opt.data_parallel);
  st.view.replica = static_cast<uint32_t>(spec.replica);
  st.view.layer = static_cast<uint32_t>(spec.layer);
  st.view.shard = static_cast<uint32_t>(spec.shard);
  st.view.expert_begin = static_cast<uint32_t>(st.experts.begin);
  st.view.expert_end = static_cast<uint32_t>(st.experts.end);
  for (int64_t e : spec.copies) st.view.copies.push_back(static_cast<uint32_t>(e));
  st.view.width = static_cast<uint32_t>(c.d_model);
  st.view.tokens = static_cast<uint32_t>(sh->plan.mb_batch * c.seq_len);
  st.view.top_k = static_cast<uint32_t>(c.top_k);
  st.slices_expected = sh->plan.meeting_shards({st.ranges.begin(), st.ranges.end()});
  st.comp = std::make_shared<XCompute>();
  auto comp = st.comp;
  st.step = spec.start_step;
  std::shared_ptr<const std::vector<float>> init = spec.weights;
  if (!init && spec.await_restore) {
    int64_t total = 0;
    for (const Range& r : st.ranges) total += r.count;
    init = std::make_shared<std::vector<float>>(static_cast<size_t>(total), 0.0f);
  } else if (!init) {
    auto from_init = std::make_shared<std::vector<float>>();
    for (const Range& r : st.ranges)
      from_init->insert(from_init->end(), sh->init.begin() + r.offset, sh->init.begin() + r.offset + r.count);
    init = std::move(from_init);
  }
  const int64_t n = static_cast<int64_t>(st.held.size()), F = st.F, D = st.D;
  submit(self, *dev, [comp, init, n, F, D](kernels::Backend& be) {
    comp->params = be.from_f32({static_cast<int64_t>(init->size())}, *init);
    comp->w = weight_views(comp->params, n, F, D);
  }, [] {}, owner_label(TraceLabel::RankInit, spec.producer));

  return {
      [self](rt::done_atom, uint64_t ticket) {
        if (kill_switch_fires(self, expert_phase(self->state))) return;
        run_ticket(self->state.tickets, ticket);
      },
      [self](rt::arm_atom, uint64_t, uint32_t k) { self->state.kill.left = k; },
      // Test hook kill_while_loading: die when next asked for the loaded weights.
      [self](rt::arm_atom, rt::rescale_atom) { self->state.kill_on_load = true; },
      [self](rt::restore_atom, uint64_t step, uint32_t attempt) { abort_to(self, step, attempt); },
      // One optimizer shard's slice of the parameters the restored step
      // starts from (the supervisor's snapshot, so trusted): the part in the
      // owned ranges is loaded.
      [self](rt::restore_atom, const Envelope& e) {
        auto& s = self->state;
        restore_params(self, e, s.comp, s.ranges, owner_label(TraceLabel::ParamLoad, s.spec.producer));
      },
      [self](const Envelope& e) {
        auto& s = self->state;
        if (kill_switch_fires(self, expert_phase(s))) return;
        if (drop_if_damaged(self, e)) return;
        auto kind = e.kind();
        if (!kind) return reject(self, self->system().render(kind.error()));
        if (*kind == Envelope::Kind::DISPATCH) {
          // Resolve where the Combine goes now: the sender is only known here.
          caf::actor dest;
          auto d = e.read<schemas::Dispatch>();
          if (d) {
            // A stale attempt is dropped before its address is checked: a
            // shrink replays the step on a renumbered plan, so a dispatch of
            // the failed attempt may reach a shard now holding another slot.
            const MoeKey k = read_moe_key((*d)->getId());
            if (k.step < s.step || (k.step == s.step && k.attempt < s.attempt)) {
              ++s.dropped;
              return;
            }
            dest = reply_to(self, k);
          }
          return handle_dispatch(self, e, std::move(dest));
        }
        if (*kind == Envelope::Kind::PARAM_SLICE) return handle_params(self, e);
        ++s.dropped;
        caf::anon_send(s.sh->peers.coordinator, rt::fail_atom_v,
                       s.name + ": unexpected message kind " + kind_name(*kind));
      },
      [self](rt::dropped_atom) { return self->state.dropped; },
      // A placement change asks a new shard when its weights are in (its
      // restore was queued before this). An armed kill fires here too: the
      // coordinator's test of a shard lost while loading.
      [self](rt::rescale_atom) -> caf::result<uint64_t> {
        auto& s = self->state;
        if (s.kill_on_load) {
          die_injected(self, "loading its weights");
          return caf::make_error(caf::sec::runtime_error, std::string("killed while loading"));
        }
        auto rp = self->make_response_promise<uint64_t>();
        uint64_t bytes = 0;
        for (const Range& r : s.ranges) bytes += static_cast<uint64_t>(r.count) * sizeof(float);
        submit(self, *s.dev, [](kernels::Backend&) {}, [rp, bytes]() mutable { rp.deliver(bytes); },
               owner_label(TraceLabel::ParamLoad, s.spec.producer));
        return rp;
      },
      [self](rt::name_atom) { return self->state.name; },
      [self](rt::params_atom) -> caf::result<Envelope, Envelope, Envelope> {
        auto& s = self->state;
        if (s.ranges.size() != 3)
          return caf::make_error(caf::sec::runtime_error, s.name + ": (params) of a shard holding copies");
        auto rp = self->make_response_promise<Envelope, Envelope, Envelope>();
        auto holder = std::make_shared<std::vector<Envelope>>();
        auto comp = s.comp;
        const auto ranges = s.ranges;
        const uint64_t step = s.step;
        submit(self, *s.dev, [comp, holder, ranges, step](kernels::Backend& be) {
          const std::vector<float> all = be.download_f32(comp->params);
          int64_t base = 0;
          for (const Range& r : ranges) {
            holder->push_back(Envelope::build<schemas::ParamSlice>([&](schemas::ParamSlice::Builder b) {
              b.setStep(step);
              b.initRange().setOffset(static_cast<uint64_t>(r.offset));
              b.getRange().setCount(static_cast<uint64_t>(r.count));
              const int64_t shape[1] = {r.count};
              set_tensor_f32(b.initParams(), shape,
                             std::span<const float>(all.data() + base, static_cast<size_t>(r.count)));
            }));
            base += r.count;
          }
        }, [rp, holder]() mutable { rp.deliver((*holder)[0], (*holder)[1], (*holder)[2]); },
           owner_label(TraceLabel::ParamRead, s.spec.producer));
        return rp;
      },
  };
}

}  // namespace

caf::actor spawn_expert_shard(caf::actor_system& sys, std::shared_ptr<const Shared> sh, Device& dev,
                              const ExpertShardSpec& spec) {
  // Bad specs throw here, in the caller, not inside the actor's start-up.
  const model::ModelConfig& c = sh->opt.train.model;
  const ExpertRange experts =
      spec.experts.size() > 0 ? spec.experts : expert_split(c.n_experts, spec.shards, spec.shard);
  if (experts.begin < 0 || experts.end > c.n_experts)
    throw std::invalid_argument("spawn_expert_shard: experts outside the layer's " + std::to_string(c.n_experts));
  std::vector<int64_t> held = spec.copies;
  for (int64_t e : held)
    if (e < 0 || e >= c.n_experts || (e >= experts.begin && e < experts.end))
      throw std::invalid_argument("spawn_expert_shard: copy of expert " + std::to_string(e) +
                                  " (outside the layer or inside the shard's own range)");
  for (int64_t e = experts.begin; e < experts.end; ++e) held.push_back(e);
  std::sort(held.begin(), held.end());
  if (std::adjacent_find(held.begin(), held.end()) != held.end())
    throw std::invalid_argument("spawn_expert_shard: an expert copied twice");
  (void)expert_set_ranges(sh->layout, c, spec.layer, held);
  if (spec.weights) {
    const int64_t want = 3 * static_cast<int64_t>(held.size()) * c.expert_hidden * c.d_model;
    if (static_cast<int64_t>(spec.weights->size()) != want)
      throw std::invalid_argument("spawn_expert_shard: " + std::to_string(spec.weights->size()) +
                                  " weights for a shard of " + std::to_string(want));
  }
  return sys.spawn(expert_actor, std::move(sh), &dev, spec);
}

}  // namespace troupe::runtime
