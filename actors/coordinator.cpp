// Coordinator actor: drives steps and is the data loader. For a step it cuts
// the batch into micro-batches (replica r takes micro-batches
// [r*C, (r+1)*C) of the Trainer's split), sends them to the first-stage ranks,
// starts every rank, reduces the shards' squared norms into the global norm
// (in shard order) and answers the step request once every rank has loaded
// the new parameters. Protocol: runtime_internal.hpp.
#include <cmath>
#include <map>
#include <set>
#include <tuple>

#include "actors/runtime_internal.hpp"
#include "model/data.hpp"

namespace troupe::runtime {
namespace {

using StepReply = caf::typed_response_promise<double, double, double, double>;

struct CoordState {
  std::shared_ptr<const Shared> sh;
  std::unique_ptr<model::DataSource> data;
  uint64_t step = 0;
  bool running = false;
  StepReply reply;
  std::map<std::tuple<int, int>, std::pair<double, double>> losses;  // (global mb, stage) -> loss, aux
  std::map<uint32_t, double> partials;                               // shard -> sum of squares
  std::set<std::pair<uint32_t, uint32_t>> finished;                  // (replica, rank or expert producer)
  std::map<int, std::vector<int64_t>> loads;                         // stage -> summed (load) reports of the step
  std::vector<int64_t> last_loads;                                   // the last finished step's, in stage order
  double loss_scale = 0.0, aux_scale = 0.0, norm = 0.0;
  bool clipped = false;  // (clip) sent for the step
  std::string error;
  uint64_t dropped = 0;
};

using Self = caf::stateful_actor<CoordState>;

void maybe_finish(Self* self) {
  auto& s = self->state;
  const auto& sh = *s.sh;
  // Expert shards report (stepok) like ranks once their parameters are loaded.
  const size_t ranks = static_cast<size_t>(sh.opt.data_parallel) * (static_cast<size_t>(sh.sl.num_ranks) + sh.expert_owned.size());
  const size_t reports = static_cast<size_t>(sh.opt.data_parallel) * static_cast<size_t>(sh.chunks) *
                         static_cast<size_t>(sh.sl.num_stages);
  if (!s.running || s.finished.size() != ranks || s.losses.size() != reports) return;
  // Same sums as the Trainer: loss over micro-batches in order; aux per
  // micro-batch (here: over its stages), then over micro-batches.
  double loss_sum = 0.0, aux = 0.0;
  const int last = sh.sl.num_stages - 1;
  int cur = -1;
  double mb_aux = 0.0;
  for (const auto& [k, v] : s.losses) {
    const auto [mb, stage] = k;
    if (mb != cur) {
      if (cur >= 0) aux += mb_aux;
      cur = mb;
      mb_aux = 0.0;
    }
    mb_aux += v.second;
    if (stage == last) loss_sum += v.first;
  }
  if (cur >= 0) aux += mb_aux;
  s.last_loads.clear();
  for (const auto& [stage, v] : s.loads) s.last_loads.insert(s.last_loads.end(), v.begin(), v.end());
  const double lr = model::learning_rate(sh.opt.train.optim, static_cast<int64_t>(s.step), sh.opt.train.steps);
  s.running = false;
  ++s.step;
  s.reply.deliver(loss_sum * s.loss_scale, aux * s.aux_scale, s.norm, lr);
}

// Every shard's partial norm is in (and every loss report, so the step's
// expert loads are complete): the global norm goes to the shards, after the
// loads when the router bias is balanced by them (aux-loss-free balancing).
void maybe_clip(Self* self) {
  auto& s = self->state;
  const auto& sh = *s.sh;
  const size_t reports = static_cast<size_t>(sh.opt.data_parallel) * static_cast<size_t>(sh.chunks) *
                         static_cast<size_t>(sh.sl.num_stages);
  if (!s.running || s.clipped || s.partials.size() != sh.shard_ranges.size() || s.losses.size() != reports) return;
  s.clipped = true;
  double total = 0.0;
  for (const auto& [k, v] : s.partials) total += v;  // shard order
  s.norm = std::sqrt(total);
  if (sh.opt.train.model.ffn == "moe" && sh.opt.train.model.balance == "bias") {
    std::vector<int64_t> loads;
    for (const auto& [stage, v] : s.loads) loads.insert(loads.end(), v.begin(), v.end());
    for (const caf::actor& a : sh.peers.shards) self->send(a, rt::load_atom_v, s.step, loads);
  }
  for (const caf::actor& a : sh.peers.shards) self->send(a, rt::clip_atom_v, s.step, s.norm);
}

void start_step(Self* self) {
  auto& s = self->state;
  const auto& sh = *s.sh;
  const auto& o = sh.opt.train;
  const int64_t S = o.model.seq_len, Bm = sh.mb_batch;
  const model::Batch batch = s.data->train_batch(static_cast<int64_t>(s.step), o.data.batch_size, S);
  int64_t counted = 0;
  for (int32_t t : batch.targets) counted += t >= 0;
  s.loss_scale = counted > 0 ? 1.0 / static_cast<double>(counted) : 0.0;
  s.aux_scale = 1.0 / static_cast<double>(o.microbatches);
  s.losses.clear();
  s.partials.clear();
  s.finished.clear();
  s.loads.clear();
  s.clipped = false;
  s.running = true;
  const int64_t n = Bm * S;
  for (int r = 0; r < sh.opt.data_parallel; ++r) {
    for (int j = 0; j < sh.chunks; ++j) {
      const int64_t g = static_cast<int64_t>(r) * sh.chunks + j;
      const int dir = sh.sl.num_dirs == 2 && j >= sched::first_mb(sh.sl, 1) ? 1 : 0;
      const int64_t shape[1] = {n};
      Envelope e = Envelope::build<schemas::Activations>([&](schemas::Activations::Builder b) {
        auto t = b.initTag();
        t.setStep(s.step);
        t.setMicrobatch(static_cast<uint32_t>(j));
        t.setStage(kDataStage);
        t.setDirection(schemas::Direction::FORWARD);
        t.setChunk(static_cast<uint32_t>(dir));
        t.setReplica(static_cast<uint32_t>(r));
        const int64_t none[2] = {n, 0};  // [tokens, 0]: no hidden state, the first stage embeds the ids
        set_tensor_f32(b.initHidden(), none, {});
        set_tensor_i32(b.initTokenIds(), shape, std::span<const int32_t>(batch.inputs.data() + g * n, static_cast<size_t>(n)));
        set_tensor_i32(b.initTargets(), shape, std::span<const int32_t>(batch.targets.data() + g * n, static_cast<size_t>(n)));
      });
      self->send(sh.peers.ranks[r][sched::stage_rank(sh.sl, dir, 0)], std::move(e));
    }
  }
  for (const auto& replica : sh.peers.ranks)
    for (const caf::actor& a : replica) self->send(a, rt::start_atom_v, s.step, s.loss_scale, s.aux_scale);
}

caf::behavior coordinator(Self* self, std::shared_ptr<const Shared> sh) {
  auto& st = self->state;
  st.sh = sh;
  const auto& o = sh->opt.train;
  st.data = model::make_data_source(o.data, o.seed, o.model.seq_len);
  return {
      [self](rt::step_atom) -> StepReply {
        auto& s = self->state;
        s.reply = self->make_response_promise<double, double, double, double>();
        if (!s.error.empty()) {
          s.reply.deliver(caf::make_error(caf::sec::runtime_error, s.error));
        } else if (s.running) {
          s.reply.deliver(caf::make_error(caf::sec::runtime_error, std::string("a step is already running")));
        } else {
          start_step(self);
        }
        return s.reply;
      },
      [self](rt::loss_atom, uint64_t step, uint32_t replica, uint32_t mb, uint32_t stage, double loss,
             double aux) {
        auto& s = self->state;
        const int g = static_cast<int>(replica) * s.sh->chunks + static_cast<int>(mb);
        if (step != s.step || !s.running || !s.losses.emplace(std::make_tuple(g, static_cast<int>(stage)), std::make_pair(loss, aux)).second) {
          ++s.dropped;
          return;
        }
        maybe_clip(self);
        maybe_finish(self);
      },
      [self](rt::gnorm_atom, uint64_t step, uint32_t shard, double sq) {
        auto& s = self->state;
        if (step != s.step || !s.running || !s.partials.emplace(shard, sq).second) {
          ++s.dropped;
          return;
        }
        maybe_clip(self);
      },
      [self](rt::stepok_atom, uint64_t step, uint32_t replica, uint32_t rank) {
        auto& s = self->state;
        if (step != s.step || !s.running || !s.finished.emplace(replica, rank).second) {
          ++s.dropped;
          return;
        }
        maybe_finish(self);
      },
      [self](rt::fail_atom, const std::string& what) {
        auto& s = self->state;
        if (s.error.empty()) s.error = what;
        if (s.running) {
          s.running = false;
          s.reply.deliver(caf::make_error(caf::sec::runtime_error, s.error));
        }
      },
      // Expert load of micro-batch mb at a stage: per MoE layer of the stage,
      // E routed counts then the dropped count. Sent before the stage's loss
      // report of the same micro-batch, so a finished step has all of them.
      [self](rt::load_atom, uint64_t step, uint32_t, uint32_t, uint32_t stage, const std::vector<int64_t>& v) {
        auto& s = self->state;
        if (step != s.step || !s.running) {
          ++s.dropped;
          return;
        }
        auto& sum = s.loads[static_cast<int>(stage)];
        if (sum.empty()) sum.assign(v.size(), 0);
        if (sum.size() != v.size()) {
          ++s.dropped;
          return;
        }
        for (size_t i = 0; i < v.size(); ++i) sum[i] += v[i];
      },
      [self](rt::load_atom) { return self->state.last_loads; },
      [self](rt::dropped_atom) { return self->state.dropped; },
  };
}

}  // namespace

caf::actor spawn_coordinator(caf::actor_system& sys, std::shared_ptr<const Shared> sh) {
  return sys.spawn(coordinator, std::move(sh));
}

}  // namespace troupe::runtime
