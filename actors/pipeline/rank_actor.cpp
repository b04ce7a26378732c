// Pipeline-rank actor: holds the model stages a schedule gives its rank (one
// for sequential/1f1b, two for dualpipe/dualpipev), runs the rank's op list
// in order on its device, exchanges activations and gradients as Envelopes,
// then sends gradient slices to the optimizer shards and loads the updated
// parameter slices they send back. Protocol: context.hpp. On a
// (restore ...) from the supervisor it aborts to the start of a step: drops
// what it holds of older attempts, forgets pending continuations (device
// work already queued still runs, but its sends carry the old attempt and
// are dropped), zeroes its gradients, abandons passes suspended at experts
// and reloads the step's parameters.
//
// With expert shards, a chunk's pass runs step-wise (model::Stage's
// begin_*/resume_*): at every MoE layer a device closure sends one Dispatch
// per shard of the layer, the actor collects the Combines (any order, each
// checked against its Dispatch, repeats dropped) and a new closure resumes
// the pass. Meanwhile the device runs other ready work: the op's other part
// (DualPipe's FB pairs: the other direction's chunk, a different Stage), and
// when every running part waits for experts, the next op (e.g. 1F1B's next
// forward while a backward waits; a backward only when no other backward
// runs, so gradients accumulate in schedule order). That is the
// compute/communication overlap; the interleaved parts' math is independent,
// so the order they interleave in does not change any result.
//
// B/W split (zb1p, dualpipe, dualpipev): a B op runs the input-gradient pass
// (model::Stage::backward_input, or begin_backward deferring its weights)
// and sends the gradient when it ends; the chunk's W op later runs the
// weight pass (backward_weights). The slot stays taken until the W. A
// schedule runs each stage's W's in the order of its B's, so every weight
// gradient gets the same additions in the same order as with the full
// backward (BW) at B. A W that directly follows its own B in the op list
// (e.g. every W of ZB-H1's first rank) defers nothing: that B runs the full
// backward (bitwise the same as B then W, and cheaper: no dY kept) and the
// W is empty.
#include <algorithm>
#include <functional>
#include <map>
#include <optional>
#include <set>
#include <tuple>
#include <utility>

#include "actors/experts/expert_shard.hpp"
#include "actors/transport/moe_messages.hpp"
#include "actors/context.hpp"
#include "model/stage.hpp"
#include "model/weights.hpp"
#include "moe/placement.hpp"

namespace troupe::runtime {
namespace {

using Key = std::tuple<uint64_t, uint32_t, int, int, int, int>;  // step, attempt, kind (0 act, 1 grad), dir, consumer stage, mb
using StageId = std::pair<int, int>;                     // dir, stage
using PartKey = std::tuple<int, int, int, bool>;         // dir, stage, mb, backward

// Device-side state: touched only by closures running on the rank's device.
struct Compute {
  kernels::Tensor params, grads;  // [P] the flat buffers (only owned entries are used)
  model::ModelWeights w, g;
  std::map<StageId, std::unique_ptr<model::Stage>> stages;
  std::vector<float> hidden;       // [T*D] scratch for outgoing tensors
  std::map<PartKey, const model::MoeExchange*> exchanges;  // passes suspended at experts
  uint64_t dispatch_seq = 0;       // MoeId.dispatchId
  // Last stage with a loss head: d total / d logits of each (dir, stage, mb)
  // forward, the dout of its backward.
  std::map<std::tuple<int, int, int>, std::vector<float>> head_dout;
  std::vector<float> logits;       // [T*V] host copy for the loss head
};

// The rows of a MoE exchange (moe::DispatchPlan order) one Dispatch
// carries, in its order: [begin, end) blocks.
using RowBlocks = std::vector<std::pair<int64_t, int64_t>>;

// A chunk's pass waiting for its experts (actor side).
struct Part {
  sched::Chunk c;
  int slot = 0;
  std::function<void(model::Stage&)> finish;  // device work once the pass has ended
  uint32_t layer = 0;
  std::vector<MoeKey> sent;                        // [shard] the Dispatch ids
  std::vector<std::vector<uint32_t>> token_index;  // [shard] rows' tokens, to check the echo
  std::vector<RowBlocks> blocks;                   // [shard] the exchange rows it was sent
  std::vector<Envelope> got;                       // [shard] Combines (empty until received)
  std::vector<bool> have;
  int missing = 0;
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
  bool running = false;
  int backwards = 0;               // backward ops started this attempt
  uint64_t step = 0;               // step being run (== completed steps)
  uint32_t attempt = 0;            // replay generation of the step
  KillSwitch kill;
  double loss_scale = 0.0, aux_scale = 0.0;
  std::map<Key, Envelope> inbox;
  std::set<Key> consumed;
  int parts = 0;                      // parts (F, B) of started ops still running
  int waiting_parts = 0;              // ... of them out at the experts
  int b_parts = 0;                    // ... of them backward
  std::set<std::tuple<int, int, int>> bwd_running;  // (dir, stage, mb) of split B's still running (their W waits)
  std::set<std::tuple<int, int, int>> fused_w;      // (dir, stage, mb) whose B ran the full backward: W is empty
  std::set<std::tuple<int, int, int>> fwd_running;  // (dir, stage, mb) of forwards still running
  std::function<void()> deferred;     // without overlap: the B part, started when F ends
  std::map<PartKey, Part> waiting;    // passes out at the experts
  std::set<uint32_t> slices_from;  // shards whose ParamSlice arrived this step
  int slices_loaded = 0;
  uint64_t dropped = 0;
};

using Self = caf::stateful_actor<RankState>;

void try_run(Self* self);

Envelope make_pipeline(uint64_t step, uint32_t attempt, int replica_id, const sched::Chunk& c,
                       std::span<const float> hidden, std::span<const int32_t> targets, bool backward, int64_t T,
                       int64_t D, std::span<const double> token_data = {}) {
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
    if (!token_data.empty()) {
      const int64_t dshape[2] = {T, static_cast<int64_t>(token_data.size()) / T};
      set_tensor_f64(b.initTokenData(), dshape, token_data);
    }
  });
}

// Expert load of the slot's forward (per MoE layer: E routed counts, then the
// dropped count) to the coordinator; sent before the loss report.
void report_load(const Shared& sh, int device, const model::Stage& stage, int slot, const caf::actor& coord,
                 uint64_t step, uint32_t attempt, int replica, const sched::Chunk& f) {
  const auto load = stage.expert_load(slot);
  if (load.empty()) return;
  const auto dropped = stage.dropped(slot);
  std::vector<int64_t> v;
  for (size_t l = 0; l < load.size(); ++l) {
    v.insert(v.end(), load[l].begin(), load[l].end());
    v.push_back(dropped[l]);
  }
  post(sh, device, coord, rt::load_atom_v, step, attempt, static_cast<uint32_t>(replica), static_cast<uint32_t>(f.mb),
       static_cast<uint32_t>(f.stage), v);
}

// Where a chunk's results go (captured by its device closures).
struct ChunkCtx {
  std::shared_ptr<const Shared> sh;
  std::shared_ptr<Compute> comp;
  sched::Chunk c;
  int slot = 0;
  int last = 0;  // last stage index
  caf::actor peer, coord;  // forward: next rank; backward: previous rank
  uint64_t step = 0;
  uint32_t attempt = 0;
  int replica = 0;
  int device = -1;  // the rank's device (the sender, for the seam)
};

ChunkCtx chunk_ctx(Self* self, const sched::Chunk& c, int slot, bool backward) {
  auto& st = self->state;
  const auto& sh = *st.sh;
  ChunkCtx x;
  x.sh = st.sh;
  x.comp = st.comp;
  x.c = c;
  x.slot = slot;
  x.last = sh.plan.sl.num_stages - 1;
  if (!backward && c.stage < x.last) x.peer = rank_of(sh, st.replica, sched::stage_rank(sh.plan.sl, c.dir, c.stage + 1));
  if (backward && c.stage > 0) x.peer = rank_of(sh, st.replica, sched::stage_rank(sh.plan.sl, c.dir, c.stage - 1));
  x.coord = sh.peers.coordinator;
  x.step = st.step;
  x.attempt = st.attempt;
  x.replica = st.replica;
  x.device = st.dev->id();
  return x;
}

// Starts the forward of x.c on `stage` from the activations `in`: the whole
// pass (experts inside the stage) or up to the first MoE layer.
template <class F>
auto begin_forward(const ChunkCtx& x, model::Stage& stage, const Envelope& in, F&& run) {
  auto r = in.read<schemas::Activations>();
  if (!r) throw std::runtime_error("bad activations: " + to_string(r.error()));
  const auto tg = tensor_i32((*r)->getTargets());
  const std::span<const int32_t> targets = x.c.stage == x.last ? tg : std::span<const int32_t>();
  if (x.c.stage == 0) return run(stage, tensor_i32((*r)->getTokenIds()), std::span<const float>(), targets);
  return run(stage, std::span<const int32_t>(), tensor_f32((*r)->getHidden()), targets);
}

// Last stage with a loss head (RuntimeOptions::loss_head): the head turns
// the forward's logits, targets and the per-token inputs that rode along
// into d total / d logits (kept for the backward) and a per-token report
// (to the coordinator, before the loss report).
void apply_loss_head(const ChunkCtx& x, model::Stage& stage, const Envelope& in) {
  const model::LossHead& head = *x.sh->opt.loss_head;
  auto r = in.read<schemas::Activations>();
  if (!r) throw std::runtime_error("bad activations: " + to_string(r.error()));
  const auto targets = tensor_i32((*r)->getTargets());
  const auto data = tensor_f64((*r)->getTokenData());
  const int64_t T = stage.tokens(), V = x.sh->opt.train.model.vocab_size;
  if (static_cast<int64_t>(targets.size()) != T || static_cast<int64_t>(data.size()) != T * head.columns())
    throw std::runtime_error("loss head: micro-batch " + std::to_string(x.c.mb) + " arrived with " +
                             std::to_string(targets.size()) + " targets and " + std::to_string(data.size()) +
                             " token inputs (expected " + std::to_string(T) + " and " +
                             std::to_string(T * head.columns()) + ")");
  Compute& comp = *x.comp;
  const kernels::Tensor& lg = stage.logits(x.slot);
  comp.logits.resize(static_cast<size_t>(T * V));
  lg.backend()->download(comp.logits.data(), lg, comp.logits.size() * sizeof(float));
  std::vector<float>& dout = comp.head_dout[{x.c.dir, x.c.stage, x.c.mb}];
  dout.resize(comp.logits.size());
  std::vector<double> report(static_cast<size_t>(T * head.report_columns()));
  head.apply(comp.logits, targets, data, V, dout, report);
  post(*x.sh, x.device, x.coord, rt::head_atom_v, x.step, x.attempt, static_cast<uint32_t>(x.replica),
       static_cast<uint32_t>(x.c.mb), report);
}

// After the forward: load and loss to the coordinator, the output on.
void finish_forward(const ChunkCtx& x, model::Stage& stage, const Envelope& in, const model::ForwardResult& res) {
  report_load(*x.sh, x.device, stage, x.slot, x.coord, x.step, x.attempt, x.replica, x.c);
  if (x.c.stage == x.last && x.sh->opt.loss_head) apply_loss_head(x, stage, in);
  post(*x.sh, x.device, x.coord, rt::loss_atom_v, x.step, x.attempt, static_cast<uint32_t>(x.replica),
       static_cast<uint32_t>(x.c.mb), static_cast<uint32_t>(x.c.stage), res.loss_sum, res.aux_loss);
  if (x.c.stage == x.last) return;
  auto r = in.read<schemas::Activations>();
  const auto tg = tensor_i32((*r)->getTargets());
  const auto data = (*r)->hasTokenData() ? tensor_f64((*r)->getTokenData()) : std::span<const double>();
  Compute& comp = *x.comp;
  comp.hidden.resize(static_cast<size_t>(stage.tokens() * stage.d_model()));
  stage.read_output(x.slot, comp.hidden);
  post(*x.sh, x.device, x.peer,
       make_pipeline(x.step, x.attempt, x.replica, x.c, comp.hidden, tg, false, stage.tokens(), stage.d_model(), data));
}

// d output of the backward of x.c (on the last stage: empty, or the loss
// head's d total / d logits).
std::span<const float> backward_dout(const ChunkCtx& x, const Envelope& dout, std::optional<Read<schemas::Gradients>>& keep) {
  if (x.c.stage == x.last) {
    if (!x.sh->opt.loss_head) return {};
    return x.comp->head_dout.at({x.c.dir, x.c.stage, x.c.mb});
  }
  auto r = dout.read<schemas::Gradients>();
  if (!r) throw std::runtime_error("bad gradients: " + to_string(r.error()));
  keep = *r;
  return tensor_f32((*keep)->getGrad());
}

// After the backward: the input gradient to the previous stage.
void finish_backward(const ChunkCtx& x, model::Stage& stage) {
  if (x.c.stage == 0) return;
  Compute& comp = *x.comp;
  comp.hidden.resize(static_cast<size_t>(stage.tokens() * stage.d_model()));
  stage.read_input_grad(comp.hidden);
  post(*x.sh, x.device, x.peer, make_pipeline(x.step, x.attempt, x.replica, x.c, comp.hidden, {}, true, stage.tokens(), stage.d_model()));
}

// Forward of chunk f on the device, experts inside the stage.
Device::Work forward_work(Self* self, const sched::Chunk f, int slot, Envelope in) {
  const ChunkCtx x = chunk_ctx(self, f, slot, false);
  return [x, in](kernels::Backend&) {
    model::Stage& stage = *x.comp->stages.at({x.c.dir, x.c.stage});
    const model::ForwardResult res = begin_forward(x, stage, in, [&](model::Stage& s, auto ids, auto hidden, auto tg) {
      return x.c.stage == 0 ? s.forward_tokens(x.slot, x.comp->w, ids, tg) : s.forward_hidden(x.slot, x.comp->w, hidden, tg);
    });
    finish_forward(x, stage, in, res);
  };
}

// Backward of chunk b, experts inside the stage: the full backward, or
// (split) its B, the input gradient sent as soon as it is known.
Device::Work backward_work(Self* self, const sched::Chunk b, int slot, Envelope dout, double ls, double as,
                           bool split) {
  const ChunkCtx x = chunk_ctx(self, b, slot, true);
  return [x, dout, ls, as, split](kernels::Backend&) {
    model::Stage& stage = *x.comp->stages.at({x.c.dir, x.c.stage});
    std::optional<Read<schemas::Gradients>> keep;
    if (split) stage.backward_input(x.slot, x.comp->w, x.comp->g, backward_dout(x, dout, keep), ls, as);
    else stage.backward(x.slot, x.comp->w, x.comp->g, backward_dout(x, dout, keep), ls, as);
    finish_backward(x, stage);
  };
}

// The W of chunk b: its weight gradients, deferred by its B, accumulate.
Device::Work weight_work(Self* self, const sched::Chunk b, int slot) {
  return [comp = self->state.comp, b, slot](kernels::Backend&) {
    comp->stages.at({b.dir, b.stage})->backward_weights(slot);
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
  const int replica = st.replica, rank = st.rank, device = st.dev->id();
  submit(self, *st.dev, [comp, sh, step, attempt, replica, rank, device](kernels::Backend& be) {
    // Only the entries this rank's stages touch leave the device (the rest of
    // the flat buffer stays zero): a full-buffer download cost ~7 ms a step.
    const auto& owned = sh->plan.rank_owned[static_cast<size_t>(rank)];
    for (size_t s = 0; s < sh->plan.shard_ranges.size(); ++s) {
      for (const Range& own : owned) {
        const Range piece = intersect(own, sh->plan.shard_ranges[s]);
        if (piece.count == 0) continue;
        // Straight from the device into the message (one copy, no zeroing).
        const size_t bytes = static_cast<size_t>(piece.count) * sizeof(float);
        Envelope e = Envelope::build_blob<schemas::GradSlice>(bytes, [&](schemas::GradSlice::Builder b) {
          b.setStep(step);
          b.setReplica(static_cast<uint32_t>(replica));
          b.setShard(static_cast<uint32_t>(s));
          b.setStage(static_cast<uint32_t>(rank));
          b.setMicrobatches(static_cast<uint32_t>(sh->plan.chunks));
          b.setAttempt(attempt);
          b.initRange().setOffset(static_cast<uint64_t>(piece.offset));
          b.getRange().setCount(static_cast<uint64_t>(piece.count));
          auto data = init_tensor_f32_blob(b.initGrads(), piece.count);
          be.download(data.begin(), comp->grads.view(piece.offset, {piece.count}), bytes);
          return data;
        });
        post(*sh, device, shard_of(*sh, s), e);
      }
    }
    for (const Range& own : owned) be.fill(comp->grads.view(own.offset, {own.count}), 0.0f);
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
  if (st.next < st.ops.size() || st.parts > 0)
    return st.backwards == 0 ? "in its forwards, before any backward" : "in its backward ops";
  return "loading parameters after sending gradients (" + std::to_string(st.slices_loaded) + " of " +
         std::to_string(st.sh->plan.shard_ranges.size()) + " slices loaded)";
}

// Abort to the start of step `step`, attempt `attempt` (the supervisor then
// sends the step's parameters, the data and (start ...)).
void abort_to(Self* self, uint64_t step, uint32_t attempt) {
  auto& st = self->state;
  st.step = step;
  st.attempt = attempt;
  st.running = false;
  st.next = 0;
  st.backwards = 0;
  st.parts = st.waiting_parts = st.b_parts = 0;
  st.fwd_running.clear();
  st.bwd_running.clear();
  st.fused_w.clear();
  st.deferred = nullptr;
  st.waiting.clear();
  st.slices_from.clear();
  st.slices_loaded = 0;
  st.tickets.pending.clear();  // late completions of old work find nothing to continue
  reset_slots(st);
  const Key keep{step, attempt, 0, 0, 0, 0};
  st.inbox.erase(st.inbox.begin(), st.inbox.lower_bound(keep));
  st.consumed.erase(st.consumed.begin(), st.consumed.lower_bound(keep));
  auto comp = st.comp;
  // Queued after any old work on the device, so old backwards cannot leak in;
  // passes of the old attempt suspended at experts are dropped.
  submit(self, *st.dev, [comp](kernels::Backend& be) {
    be.fill(comp->grads, 0.0f);
    comp->exchanges.clear();
    for (auto& [id, stage] : comp->stages) stage->abandon_passes();
  }, [] {}, owner_label(TraceLabel::RankInit, st.rank));
}

// ---- Expert parallelism: passes that stop at MoE layers --------------------

void part_done(Self* self, bool backward);

// What a step-wise closure leaves for the actor: the Dispatches of the
// exchange it stopped at, or nothing when the pass has finished.
struct Suspended {
  bool finished = false;
  uint32_t layer = 0;
  std::vector<Envelope> dispatches;  // [shard]
  std::vector<MoeKey> keys;          // [shard]
  std::vector<std::vector<uint32_t>> token_index;
  std::vector<RowBlocks> blocks;     // [shard] the rows sent under the split in force (its Combines come back in it)
};

// Builds one Dispatch per expert shard of the exchange's layer (device
// thread): rows grouped by expert as the plan has them; forward rows are the
// gathered token rows, backward rows the layer-output gradient of each row's
// token (the shard applies the combine weight, as moe_messages.hpp says).
// An expert with copies (replicas) has its rows split over its holders in
// shard order, contiguous blocks in token order (Plan::expert_rows: by its
// shares, or evenly): the same
// rows in forward and backward, so each copy's gradient is its block's.
void build_dispatches(const Shared& sh, Compute& comp, const model::MoeExchange& ex, const MoeKey& base,
                      int64_t T, int64_t D, Suspended& out) {
  const moe::DispatchPlan& p = *ex.plan;
  const int64_t N = p.rows(), k = p.top_k, E = p.n_experts;
  std::vector<float> rows(static_cast<size_t>(N * D));
  kernels::Backend& be = *ex.in.backend();
  if (!ex.backward) {
    if (N > 0) be.download(rows.data(), ex.in.rows(0, N), rows.size() * sizeof(float));
  } else {
    std::vector<float> dout(static_cast<size_t>(T * D));
    be.download(dout.data(), ex.dout, dout.size() * sizeof(float));
    for (int64_t i = 0; i < N; ++i)
      std::copy_n(dout.data() + p.token_index[static_cast<size_t>(i)] * D, D, rows.data() + i * D);
  }
  std::vector<float> wts(static_cast<size_t>(T * k)), row_w(static_cast<size_t>(N), 0.0f);
  be.download(wts.data(), ex.moe->weights(), wts.size() * sizeof(float));
  for (size_t s = 0; s < p.slots.size(); ++s)
    if (p.slots[s] >= 0) row_w[static_cast<size_t>(p.slots[s])] = wts[s];
  // The split in force: [[elastic]] events and the eplb policy change it between steps.
  const auto plan = live_plan(sh);
  const int shards = plan->expert_shards;
  out.layer = static_cast<uint32_t>(ex.layer);
  for (int sh_i = 0; sh_i < shards; ++sh_i) {
    RowBlocks blocks;
    std::vector<uint32_t> ids, tix;
    for (int64_t e : plan->held_experts(static_cast<int>(ex.layer), sh_i)) {
      if (e >= E) throw std::logic_error("expert split beyond the layer's experts");
      const std::vector<int> h = plan->holders(static_cast<int>(ex.layer), e);
      const int j = static_cast<int>(std::find(h.begin(), h.end(), sh_i) - h.begin());
      const int64_t o0 = p.offsets[static_cast<size_t>(e)];
      const auto [a, b] = plan->expert_rows(static_cast<int>(ex.layer), e, static_cast<int>(h.size()), j,
                                            p.offsets[static_cast<size_t>(e) + 1] - o0);
      if (b == a) continue;
      if (!blocks.empty() && blocks.back().second == o0 + a) blocks.back().second = o0 + b;
      else blocks.emplace_back(o0 + a, o0 + b);
      for (int64_t i = o0 + a; i < o0 + b; ++i) {
        ids.push_back(static_cast<uint32_t>(e));
        tix.push_back(static_cast<uint32_t>(p.token_index[static_cast<size_t>(i)]));
      }
    }
    // One block (no copies): the rows as they lie; else gathered.
    std::vector<float> xs, ws;
    std::span<const float> xr, wr;
    if (blocks.size() == 1) {
      const auto [r0, r1] = blocks.front();
      xr = std::span<const float>(rows.data() + r0 * D, static_cast<size_t>((r1 - r0) * D));
      wr = std::span<const float>(row_w.data() + r0, static_cast<size_t>(r1 - r0));
    } else {
      for (const auto& [r0, r1] : blocks) {
        xs.insert(xs.end(), rows.begin() + r0 * D, rows.begin() + r1 * D);
        ws.insert(ws.end(), row_w.begin() + r0, row_w.begin() + r1);
      }
      xr = xs;
      wr = ws;
    }
    out.blocks.push_back(std::move(blocks));
    MoeKey id = base;
    id.layer = static_cast<uint32_t>(ex.layer);
    id.shard = static_cast<uint32_t>(sh_i);
    id.backward = ex.backward;
    id.dispatch_id = ++comp.dispatch_seq;
    out.dispatches.push_back(make_dispatch(id, static_cast<uint32_t>(D), xr, ids, wr, tix));
    out.keys.push_back(id);
    out.token_index.push_back(std::move(tix));
  }
}

// Runs `advance` (which begins or resumes the pass of `key` and returns the
// exchange it stops at) on the device; then either sends the Dispatches and
// waits for the Combines, or, when the pass has finished, runs `finish` (on
// the device) and ends the part.
void run_step(Self* self, const PartKey key, const sched::Chunk c, int slot,
              std::function<const model::MoeExchange*(model::Stage&)> advance,
              std::function<void(model::Stage&)> finish) {
  auto& st = self->state;
  auto comp = st.comp;
  auto sh = st.sh;
  auto out = std::make_shared<Suspended>();
  MoeKey base;
  base.step = st.step;
  base.attempt = st.attempt;
  base.microbatch = static_cast<uint32_t>(c.mb);
  base.stage = static_cast<uint32_t>(c.stage);
  base.chunk = static_cast<uint32_t>(c.dir);
  base.replica = static_cast<uint32_t>(st.replica);
  const bool backward = std::get<3>(key);
  submit(self, *st.dev, [comp, sh, key, c, advance, finish, out, base](kernels::Backend&) {
    model::Stage& stage = *comp->stages.at({c.dir, c.stage});
    const model::MoeExchange* ex = advance(stage);
    if (!ex) {
      comp->exchanges.erase(key);
      finish(stage);
      out->finished = true;
      return;
    }
    comp->exchanges[key] = ex;
    build_dispatches(*sh, *comp, *ex, base, stage.tokens(), stage.d_model(), *out);
  }, [self, key, out, c, slot, finish] {
    auto& s = self->state;
    const bool bwd = std::get<3>(key);
    if (out->finished) {
      const bool split = bwd && s.bwd_running.erase({c.dir, c.stage, c.mb}) > 0;  // its W frees the slot
      if (bwd && !split && s.sh->opt.overlap) s.free_slots[{c.dir, c.stage}].push_back(slot);  // see try_run
      if (!bwd) s.fwd_running.erase({c.dir, c.stage, c.mb});
      return part_done(self, bwd);
    }
    ++s.waiting_parts;
    Part& p = s.waiting[key];
    p = Part{};
    p.c = c;
    p.slot = slot;
    p.finish = finish;
    p.layer = out->layer;
    p.sent = out->keys;
    p.token_index = std::move(out->token_index);
    p.blocks = std::move(out->blocks);
    p.got.resize(p.sent.size());
    p.have.assign(p.sent.size(), false);
    p.missing = static_cast<int>(p.sent.size());
    const auto li = static_cast<size_t>(std::find(s.sh->plan.moe_layers.begin(), s.sh->plan.moe_layers.end(),
                                                  static_cast<int>(p.layer)) - s.sh->plan.moe_layers.begin());
    for (size_t k = 0; k < out->dispatches.size(); ++k)
      post(*s.sh, s.dev->id(), expert_of(*s.sh, s.replica, static_cast<int>(li * out->dispatches.size() + k)), out->dispatches[k]);
    try_run(self);  // the device may take the next op meanwhile
  }, chunk_label(backward ? TraceLabel::Backward : TraceLabel::Forward, c, st.rank));
}

// All Combines of `key`'s exchange are in: copy their rows into the
// exchange's output and resume the pass.
void resume_step(Self* self, const PartKey key, Part part) {
  auto& st = self->state;
  auto comp = st.comp;
  auto sh = st.sh;
  const bool backward = std::get<3>(key);
  auto got = std::make_shared<std::vector<Envelope>>(std::move(part.got));
  auto split = std::make_shared<std::vector<RowBlocks>>(std::move(part.blocks));
  auto upload = [comp, key, got, split, sh](model::Stage&) {
    const model::MoeExchange& ex = *comp->exchanges.at(key);
    kernels::Backend& be = *ex.out.backend();
    const int64_t D = ex.out.dim(1);
    for (size_t k = 0; k < got->size(); ++k) {
      if ((*split)[k].empty()) continue;
      auto rd = (*got)[k].read<schemas::Combine>();
      const auto rows = tensor_f32((*rd)->getRows());
      size_t at = 0;  // the Combine's rows come in the Dispatch's order: block after block
      for (const auto& [r0, r1] : (*split)[k]) {
        be.upload_f32(ex.out.rows(r0, r1), rows.subspan(at, static_cast<size_t>((r1 - r0) * D)));
        at += static_cast<size_t>((r1 - r0) * D);
      }
    }
  };
  // The pass continues in the closure run_step submits: upload first.
  const int slot = part.slot;
  run_step(self, key, part.c, slot, [upload, comp, slot, backward](model::Stage& stage) -> const model::MoeExchange* {
    upload(stage);
    return backward ? stage.resume_backward(slot, comp->w, comp->g) : stage.resume_forward(slot, comp->w);
  }, part.finish);
}

// A Combine from an expert shard: checked against its Dispatch, kept, and
// when the exchange is complete the pass resumes.
void on_combine(Self* self, const Envelope& e) {
  auto& s = self->state;
  auto r = e.read<schemas::Combine>();
  auto fail = [&](const std::string& why) {
    ++s.dropped;
    caf::anon_send(s.sh->peers.coordinator, rt::fail_atom_v, s.name + ": rejected combine: " + why);
  };
  if (!r) return fail(to_string(r.error()));
  const MoeKey id = read_moe_key((*r)->getId());
  const PartKey key{static_cast<int>(id.chunk), static_cast<int>(id.stage), static_cast<int>(id.microbatch), id.backward};
  auto it = s.waiting.find(key);
  if (id.step != s.step || id.attempt != s.attempt || it == s.waiting.end() || it->second.layer != id.layer || id.shard >= it->second.sent.size() ||
      it->second.have[id.shard]) {
    ++s.dropped;  // stale, for an exchange already complete, or a repeat
    return;
  }
  Part& p = it->second;
  const uint32_t D = static_cast<uint32_t>(s.sh->opt.train.model.d_model);
  auto ok = check_combine(e, p.sent[id.shard], D, p.token_index[id.shard]);
  if (!ok) return fail(to_string(ok.error()));
  if (tensor_f32((*ok)->getRows()).size() != static_cast<size_t>(p.token_index[id.shard].size()) * D)
    return fail("combine rows do not match [numRows, width]");
  p.got[id.shard] = e;
  p.have[id.shard] = true;
  if (--p.missing > 0) return;
  Part done = std::move(p);
  s.waiting.erase(it);
  --s.waiting_parts;
  resume_step(self, key, std::move(done));
}

// Forward / backward of a chunk with the experts in expert-shard actors.
void start_forward_parts(Self* self, const sched::Chunk f, int slot, Envelope in) {
  const ChunkCtx x = chunk_ctx(self, f, slot, false);
  auto advance = [x, in](model::Stage& stage) -> const model::MoeExchange* {
    return begin_forward(x, stage, in, [&](model::Stage& s, auto ids, auto hidden, auto tg) {
      return x.c.stage == 0 ? s.begin_forward_tokens(x.slot, x.comp->w, ids, tg)
                            : s.begin_forward_hidden(x.slot, x.comp->w, hidden, tg);
    });
  };
  auto finish = [x, in](model::Stage& stage) { finish_forward(x, stage, in, stage.forward_result(x.slot)); };
  run_step(self, PartKey{f.dir, f.stage, f.mb, false}, f, slot, advance, finish);
}

void start_backward_parts(Self* self, const sched::Chunk b, int slot, Envelope dout, double ls, double as,
                          bool split) {
  const ChunkCtx x = chunk_ctx(self, b, slot, true);
  auto advance = [x, dout, ls, as, split](model::Stage& stage) -> const model::MoeExchange* {
    std::optional<Read<schemas::Gradients>> keep;
    return stage.begin_backward(x.slot, x.comp->w, x.comp->g, backward_dout(x, dout, keep), ls, as, split);
  };
  auto finish = [x](model::Stage& stage) { finish_backward(x, stage); };
  run_step(self, PartKey{b.dir, b.stage, b.mb, true}, b, slot, advance, finish);
}

// A part (F or B) has finished; the step's last part sends the gradients.
void part_done(Self* self, bool backward) {
  auto& s = self->state;
  --s.parts;
  if (backward) --s.b_parts;
  if (s.deferred) return std::exchange(s.deferred, nullptr)();  // without overlap: B after F
  if (s.parts == 0 && s.next == s.ops.size()) send_grads(self);
  else try_run(self);
}

// Starts the ops in order. An op starts when the previous ones have finished,
// or (expert shards with overlap) when every part still running waits for
// its experts: the device then runs the next op's forward (or backward when
// no backward is running: one backward at a time keeps the gradient
// accumulation order and the Stage's one-suspended-backward rule).
void try_run(Self* self) {
  auto& st = self->state;
  while (st.running && st.next < st.ops.size()) {
    const sched::Op& op = st.ops[st.next];
    const int last = st.sh->plan.sl.num_stages - 1;
    const bool has_f = op.type == sched::OpType::F || op.type == sched::OpType::FB;
    const bool has_b = op.type == sched::OpType::BW || op.type == sched::OpType::FB ||
                       op.type == sched::OpType::B;
    // B of the B/W split, unless its W is the very next op (see the top) or
    // the split is off (RuntimeOptions::split_backward).
    const bool split = op.type == sched::OpType::B && st.sh->opt.split_backward &&
                       !(st.next + 1 < st.ops.size() && st.ops[st.next + 1].type == sched::OpType::W &&
                         st.ops[st.next + 1].b == op.b);
    const bool has_w = op.type == sched::OpType::W;
    if (has_w && st.fused_w.erase({op.b.dir, op.b.stage, op.b.mb})) {  // its B ran the full backward
      ++st.next;
      continue;
    }
    if (st.parts > 0 && !(st.sh->plan.expert_parallel() && st.sh->opt.overlap && st.parts == st.waiting_parts &&
                          (!has_b || st.b_parts == 0)))
      return;
    if (has_w && st.bwd_running.count({op.b.dir, op.b.stage, op.b.mb})) return;  // its B first
    if (has_f && !st.inbox.count(act_key(st, op.f))) return;
    if (has_b && op.b.stage < last && !st.inbox.count(grad_key(st, op.b))) return;
    if (has_b && st.fwd_running.count({op.b.dir, op.b.stage, op.b.mb})) return;  // its own forward first
    if (has_f && st.free_slots[{op.f.dir, op.f.stage}].empty()) {
      if (st.parts > 0) return;  // a running backward frees one
      throw std::logic_error(st.name + ": no free activation slot");
    }
    const bool early_free = st.sh->plan.expert_parallel() && st.sh->opt.overlap;
    const int before = st.parts;
    ++st.next;
    if (has_f) {
      Envelope in;
      take(st, act_key(st, op.f), in);
      const StageId id{op.f.dir, op.f.stage};
      auto& fr = st.free_slots[id];
      const int slot = fr.back();
      fr.pop_back();
      st.slot_of[id][op.f.mb] = slot;
      st.fwd_running.insert({op.f.dir, op.f.stage, op.f.mb});
      ++st.parts;
      if (st.sh->plan.expert_parallel()) start_forward_parts(self, op.f, slot, std::move(in));
      else submit(self, *st.dev, forward_work(self, op.f, slot, std::move(in)),
                  [self, f = op.f] {
                    self->state.fwd_running.erase({f.dir, f.stage, f.mb});
                    part_done(self, false);
                  },
                  chunk_label(TraceLabel::Forward, op.f, st.rank));
    }
    if (has_b) {
      Envelope dout;
      if (op.b.stage < last) take(st, grad_key(st, op.b), dout);
      ++st.backwards;
      const StageId id{op.b.dir, op.b.stage};
      const int slot = st.slot_of[id].at(op.b.mb);
      // Ops start in order and one at a time: the device runs this backward
      // before any later forward reuses the slot. With overlap a later
      // forward may start while it waits for experts: the slot is freed when
      // the backward has ended (start_backward_parts). A split B keeps the
      // slot for its W (the weight pass reads the slot's activations).
      if (!split) {
        st.slot_of[id].erase(op.b.mb);
        if (!early_free) st.free_slots[id].push_back(slot);
        if (op.type == sched::OpType::B) st.fused_w.insert({op.b.dir, op.b.stage, op.b.mb});
      } else if (st.sh->plan.expert_parallel()) {
        st.bwd_running.insert({op.b.dir, op.b.stage, op.b.mb});
      }
      ++st.parts;
      ++st.b_parts;
      if (st.sh->plan.expert_parallel() && has_f && !st.sh->opt.overlap)
        st.deferred = [self, b = op.b, slot, dout, ls = st.loss_scale, as = st.aux_scale, split] {
          start_backward_parts(self, b, slot, dout, ls, as, split);
        };
      else if (st.sh->plan.expert_parallel())
        start_backward_parts(self, op.b, slot, std::move(dout), st.loss_scale, st.aux_scale, split);
      else submit(self, *st.dev, backward_work(self, op.b, slot, std::move(dout), st.loss_scale, st.aux_scale, split),
                  [self] { part_done(self, true); }, chunk_label(TraceLabel::Backward, op.b, st.rank));
    }
    if (has_w) {
      const StageId id{op.b.dir, op.b.stage};
      const int slot = st.slot_of[id].at(op.b.mb);
      st.slot_of[id].erase(op.b.mb);
      // One closure, never suspended: nothing else starts while it runs, so
      // the slot is free for any op after it.
      st.free_slots[id].push_back(slot);
      ++st.parts;
      submit(self, *st.dev, weight_work(self, op.b, slot), [self] { part_done(self, false); },
             chunk_label(TraceLabel::Weight, op.b, st.rank));
    }
    if (st.parts == before) throw std::logic_error(st.name + ": an op with nothing to run");
  }
}

// The rank's state from the plan: its op list, the stages it holds with the
// most micro-batches each keeps in flight, and its parameters and stages made
// on its device.
void init_rank(Self* self, std::shared_ptr<const Shared> sh, Device* dev, int replica, int rank) {
  auto& st = self->state;
  st.sh = sh;
  st.dev = dev;
  st.replica = replica;
  st.rank = rank;
  st.step = sh->start_step;  // resumed: the saved step
  st.name = rank_name(replica, rank, sh->opt.data_parallel);
  st.ops = sched::make_schedule(sh->plan.sl.kind, rank, sh->plan.sl.num_ranks, sh->plan.chunks);
  // Stages held and the most micro-batches each keeps in flight.
  std::map<StageId, int> live, peak;
  for (const sched::Op& op : st.ops) {
    if (op.type == sched::OpType::F || op.type == sched::OpType::FB) {
      const StageId id{op.f.dir, op.f.stage};
      peak[id] = std::max(peak[id], ++live[id]);
    }
    // A slot is taken from the chunk's forward to its full backward, or,
    // split, to its W.
    if (op.type == sched::OpType::BW || op.type == sched::OpType::FB || op.type == sched::OpType::W)
      --live[{op.b.dir, op.b.stage}];
  }
  // With overlap, a forward may start while the previous op's backward (on
  // the same stage) waits for its experts: one slot more.
  if (sh->plan.expert_parallel() && sh->opt.overlap)
    for (auto& [id, n] : peak) ++n;
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
    const int last = sh->plan.sl.num_stages - 1;
    for (const auto& [id, n] : slots) {
      const auto [lb, le] = sh->plan.stage_layers[static_cast<size_t>(id.second)];
      comp->stages[id] = std::make_unique<model::Stage>(be, c, sh->plan.mb_batch, lb, le, id.second == 0,
                                                        id.second == last, n);
    }
  }, [] {}, owner_label(TraceLabel::RankInit, rank));
}

// A message the rank cannot take: counted, and the run fails with why.
void reject(Self* self, const std::string& why) {
  auto& s = self->state;
  ++s.dropped;
  caf::anon_send(s.sh->peers.coordinator, rt::fail_atom_v, s.name + ": rejected message: " + why);
}

// The coordinator's (start): the rank runs its op list for (step, attempt).
void start_ops(Self* self, uint64_t step, uint32_t attempt, double loss_scale, double aux_scale) {
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
}

// Activations (forward) or gradients (backward) from the neighbouring rank
// or the data loader: kept once per key, then the ops that can run do.
void take_pipeline_message(Self* self, const Envelope& e, bool fwd) {
  auto& s = self->state;
  schemas::PipelineTag::Reader tag;
  caf::expected<Read<schemas::Activations>> a = caf::error{};
  caf::expected<Read<schemas::Gradients>> g = caf::error{};
  if (fwd) {
    a = e.read<schemas::Activations>();
    if (!a) return reject(self, to_string(a.error()));
    tag = (*a)->getTag();
  } else {
    g = e.read<schemas::Gradients>();
    if (!g) return reject(self, to_string(g.error()));
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
}

// An optimizer shard's updated slice, after the step's last op: uploaded on
// the device; once every shard's is in, the rank reports the step done.
void load_param_slice(Self* self, const Envelope& e) {
  auto& s = self->state;
  auto p = e.read<schemas::ParamSlice>();
  if (!p) return reject(self, to_string(p.error()));
  const uint32_t shard = (*p)->getShard();
  if ((*p)->getStep() != s.step || (*p)->getAttempt() != s.attempt || !s.running || s.next != s.ops.size() ||
      shard >= s.sh->plan.shard_ranges.size() || s.slices_from.count(shard)) {
    ++s.dropped;
    return;
  }
  const Range want = s.sh->plan.shard_ranges[shard];
  if (static_cast<int64_t>((*p)->getRange().getOffset()) != want.offset ||
      static_cast<int64_t>((*p)->getRange().getCount()) != want.count)
    return reject(self, "parameter slice range does not match shard " + std::to_string(shard));
  s.slices_from.insert(shard);
  auto comp = s.comp;
  submit(self, *s.dev, [comp, e, want](kernels::Backend& be) {
    auto r = e.read<schemas::ParamSlice>();
    const auto v = tensor_f32((*r)->getParams());
    be.upload_f32(comp->params.view(want.offset, {want.count}), v);
  }, [self] {
    auto& s2 = self->state;
    if (++s2.slices_loaded < static_cast<int>(s2.sh->plan.shard_ranges.size())) return;
    s2.running = false;
    post(*s2.sh, s2.dev->id(), s2.sh->peers.coordinator, rt::stepok_atom_v, s2.step, s2.attempt,
         static_cast<uint32_t>(s2.replica), static_cast<uint32_t>(s2.rank));
    ++s2.step;
    s2.attempt = 0;
    s2.next = 0;
  }, owner_label(TraceLabel::ParamLoad, s.rank));
}

caf::behavior rank_actor(Self* self, std::shared_ptr<const Shared> sh, Device* dev, int replica, int rank) {
  init_rank(self, std::move(sh), dev, replica, rank);
  return {
      [self](rt::done_atom, uint64_t ticket) {
        if (kill_switch_fires(self, rank_phase(self->state))) return;
        run_ticket(self->state.tickets, ticket);
      },
      [self](rt::start_atom, uint64_t step, uint32_t attempt, double loss_scale, double aux_scale) {
        start_ops(self, step, attempt, loss_scale, aux_scale);
      },
      [self](rt::arm_atom, uint64_t, uint32_t k) { self->state.kill.left = k; },
      [self](rt::restore_atom, uint64_t step, uint32_t attempt) { abort_to(self, step, attempt); },
      // One shard's slice of the parameters the restored step starts from
      // (sent by the supervisor from its snapshot, so trusted).
      [self](rt::restore_atom, const Envelope& e) {
        auto& s = self->state;
        restore_params(self, e, s.comp, {}, owner_label(TraceLabel::ParamLoad, s.rank));  // its own coordinates
      },
      [self](const Envelope& e) {
        if (kill_switch_fires(self, rank_phase(self->state))) return;
        if (drop_if_damaged(self, e)) return;
        const auto kind = e.kind();
        if (!kind) return reject(self, to_string(kind.error()));
        switch (*kind) {
          case Envelope::Kind::ACTIVATIONS: return take_pipeline_message(self, e, true);
          case Envelope::Kind::GRADIENTS: return take_pipeline_message(self, e, false);
          case Envelope::Kind::COMBINE: return on_combine(self, e);
          case Envelope::Kind::PARAM_SLICE: return load_param_slice(self, e);
          default: return reject(self, std::string("unexpected message kind ") + kind_name(*kind));
        }
      },
      [self](rt::dropped_atom) { return self->state.dropped; },
      [self](rt::name_atom) { return self->state.name; },
  };
}

}  // namespace

caf::actor spawn_rank(caf::actor_system& sys, std::shared_ptr<const Shared> sh, Device& dev,
                      int replica, int rank) {
  return sys.spawn(rank_actor, std::move(sh), &dev, replica, rank);
}

}  // namespace troupe::runtime
