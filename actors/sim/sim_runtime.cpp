// Sim devices: the pipeline-rank actors of a simulated topology and the
// driver that runs steps through them (see sim_runtime.hpp for the timing
// rules). Protocol of step s (all in one process):
//   driver -> every rank actor   (sim_start, s, t0, driver)
//   rank -> rank                 Envelope(Activations | Gradients), tensors
//                                empty, tag.simTimeNs = virtual send time
//   rank -> driver               (sim_done, s, device, finish, busy, sent)
//                                after its last op, or (sim_fail, what)
//   driver -> rank (on a stall)  (sim_status) -> what it waits for
#include "actors/sim/sim_runtime.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>
#include <stdexcept>
#include <tuple>

#include <caf/all.hpp>

#include "actors/transport/caf_types.hpp"

namespace troupe::sim {
namespace {

// Control atoms of the simulation (CAF 0.17 atoms need no type IDs).
using start_atom = caf::atom_constant<caf::atom("sim_start")>;
using done_atom = caf::atom_constant<caf::atom("sim_done")>;
using fail_atom = caf::atom_constant<caf::atom("sim_fail")>;
using status_atom = caf::atom_constant<caf::atom("sim_status")>;

// Everything the actors share; immutable once the first step starts, except
// each device's own timeline (written only by that device's actor, read by
// the driver after the actor reported done).
struct Shared {
  sched::Layout layout;
  std::vector<std::vector<sched::Op>> ops;  // [rank]
  std::vector<StageCost> costs;             // [stage]
  int64_t link_ns = 0;                      // latency + transfer of one message
  int64_t d_model = 1;
  std::vector<std::vector<caf::actor>> peers;  // [replica][rank]
  std::vector<std::vector<Span>> timeline;     // [device], empty when not recorded
};

using Key = std::tuple<uint64_t, int, int, int, int>;  // step, kind (0 act, 1 grad), dir, consumer stage, mb

struct RankState {
  std::shared_ptr<Shared> sh;
  int replica = 0, rank = 0, device = 0;
  uint64_t step = 0;
  int64_t clock = 0, busy = 0;
  uint64_t sent = 0;  // envelopes to other devices this step
  size_t pc = 0;
  bool running = false;
  caf::actor driver;
  std::map<Key, int64_t> arrivals;  // message -> virtual arrival time
};

using Self = caf::stateful_actor<RankState>;

Key key_of(uint64_t step, const sched::Msg& m) {
  return {step, m.kind == sched::MsgKind::activation ? 0 : 1, m.to.dir, m.to.stage, m.to.mb};
}

int64_t cost_of(const Shared& sh, const sched::Op& op) {
  const auto& c = sh.costs;
  switch (op.type) {
    case sched::OpType::F: return c[static_cast<size_t>(op.f.stage)].f;
    case sched::OpType::B: return c[static_cast<size_t>(op.b.stage)].b - c[static_cast<size_t>(op.b.stage)].w;
    case sched::OpType::W: return c[static_cast<size_t>(op.b.stage)].w;
    case sched::OpType::BW: return c[static_cast<size_t>(op.b.stage)].b;
    case sched::OpType::FB: return c[static_cast<size_t>(op.f.stage)].f + c[static_cast<size_t>(op.b.stage)].b;
  }
  return 0;
}

// An activation for (or gradient of) chunk m.to, with no tensor data: the
// shape is [0, d_model]; the bytes it stands for are in the link time.
Envelope make_message(const Shared& sh, uint64_t step, int replica, const sched::Msg& m, int64_t send_ns) {
  const bool act = m.kind == sched::MsgKind::activation;
  auto tag = [&](schemas::PipelineTag::Builder t) {
    t.setStep(step);
    t.setMicrobatch(static_cast<uint32_t>(m.to.mb));
    t.setStage(static_cast<uint32_t>(act ? m.to.stage - 1 : m.to.stage + 1));  // the sender's stage
    t.setDirection(act ? schemas::Direction::FORWARD : schemas::Direction::BACKWARD);
    t.setChunk(static_cast<uint32_t>(m.to.dir));
    t.setReplica(static_cast<uint32_t>(replica));
    t.setSimTimeNs(static_cast<uint64_t>(send_ns));
  };
  const int64_t shape[2] = {0, sh.d_model};
  // The message is a few dozen words: a small first segment spares the
  // default 8 KiB zeroed allocation per message (most of the send cost).
  constexpr unsigned kWords = 64;
  if (act)
    return Envelope::build<schemas::Activations>([&](schemas::Activations::Builder b) {
      tag(b.initTag());
      set_tensor_f32(b.initHidden(), shape, {});
    }, kWords);
  return Envelope::build<schemas::Gradients>([&](schemas::Gradients::Builder b) {
    tag(b.initTag());
    set_tensor_f32(b.initGrad(), shape, {});
  }, kWords);
}

void fail(Self* self, const std::string& what) {
  auto& s = self->state;
  s.running = false;
  caf::anon_send(s.driver, fail_atom::value,
                 "device " + std::to_string(s.device) + " (replica " + std::to_string(s.replica) + ", rank " +
                     std::to_string(s.rank) + "): " + what);
}

// Runs ops while their inputs have arrived; reports to the driver after the last.
void try_run(Self* self) {
  auto& s = self->state;
  const Shared& sh = *s.sh;
  const auto& ops = sh.ops[static_cast<size_t>(s.rank)];
  std::vector<Span>* tl = sh.timeline.empty() ? nullptr : &s.sh->timeline[static_cast<size_t>(s.device)];
  while (s.running && s.pc < ops.size()) {
    const sched::Op& op = ops[s.pc];
    int64_t start = s.clock;
    for (const sched::Msg& m : op.recv) {
      auto it = s.arrivals.find(key_of(s.step, m));
      if (it == s.arrivals.end()) return;  // blocked: the message handler resumes us
      start = std::max(start, it->second);
    }
    for (const sched::Msg& m : op.recv) s.arrivals.erase(key_of(s.step, m));
    const int64_t cost = cost_of(sh, op);
    const int64_t end = start + cost;
    if (tl) {
      if (start > s.clock) tl->push_back(Span{Span::Wait, op.type, {}, {}, s.clock, start, static_cast<int64_t>(s.step)});
      tl->push_back(Span{Span::Op, op.type, op.f, op.b, start, end, static_cast<int64_t>(s.step)});
    }
    s.busy += cost;
    s.clock = end;
    for (const sched::Msg& m : op.send) {
      if (m.peer != s.rank) ++s.sent;
      caf::anon_send(sh.peers[static_cast<size_t>(s.replica)][static_cast<size_t>(m.peer)],
                     make_message(sh, s.step, s.replica, m, end));
    }
    ++s.pc;
  }
  if (s.running && s.pc == ops.size()) {
    s.running = false;
    caf::anon_send(s.driver, done_atom::value, s.step, static_cast<int32_t>(s.device), s.clock, s.busy, s.sent);
  }
}

// Stores the arrival time of an activation or gradient; false with `why` for
// a message that does not belong to this rank's step.
bool accept(Self* self, schemas::PipelineTag::Reader tag, bool act, std::string& why) {
  auto& s = self->state;
  const sched::Layout& l = s.sh->layout;
  const int dir = static_cast<int>(tag.getChunk());
  const int from = static_cast<int>(tag.getStage());
  const int to = act ? from + 1 : from - 1;
  const int mb = static_cast<int>(tag.getMicrobatch());
  if (tag.getReplica() != static_cast<uint32_t>(s.replica)) return why = "replica mismatch", false;
  if (dir < 0 || dir >= l.num_dirs || from < 0 || from >= l.num_stages || to < 0 || to >= l.num_stages)
    return why = "stage or direction out of range", false;
  if (mb < sched::first_mb(l, dir) || mb >= sched::first_mb(l, dir) + l.mbs_per_dir)
    return why = "micro-batch " + std::to_string(mb) + " out of range", false;
  if (sched::stage_rank(l, dir, to) != s.rank) return why = "addressed to another rank", false;
  if (tag.getStep() < s.step) return why = "stale step", false;
  const int sender = sched::stage_rank(l, dir, from);
  const int64_t sent = static_cast<int64_t>(tag.getSimTimeNs());
  const Key k{tag.getStep(), act ? 0 : 1, dir, to, mb};
  if (s.arrivals.count(k)) return why = "duplicate message", false;
  s.arrivals.emplace(k, sent + (sender == s.rank ? 0 : s.sh->link_ns));
  return true;
}

caf::behavior sim_rank(Self* self, std::shared_ptr<Shared> sh, int replica, int rank) {
  auto& st = self->state;
  st.sh = std::move(sh);
  st.replica = replica;
  st.rank = rank;
  st.device = replica * st.sh->layout.num_ranks + rank;
  return {
      [self](start_atom, uint64_t step, int64_t t0, const caf::actor& driver) {
        auto& s = self->state;
        s.driver = driver;
        s.step = step;
        s.clock = t0;
        s.busy = 0;
        s.sent = 0;
        s.pc = 0;
        s.running = true;
        s.arrivals.erase(s.arrivals.begin(), s.arrivals.lower_bound(Key{step, 0, 0, 0, 0}));
        try_run(self);
      },
      [self](const Envelope& e) {
        auto kind = e.kind();
        if (!kind) return fail(self, "rejected message: " + to_string(kind.error()));
        std::string why;
        bool ok = false;
        if (*kind == Envelope::Kind::ACTIVATIONS) {
          auto r = e.read<schemas::Activations>();
          if (!r) return fail(self, "rejected activations: " + to_string(r.error()));
          ok = accept(self, (*r)->getTag(), true, why);
        } else if (*kind == Envelope::Kind::GRADIENTS) {
          auto r = e.read<schemas::Gradients>();
          if (!r) return fail(self, "rejected gradients: " + to_string(r.error()));
          ok = accept(self, (*r)->getTag(), false, why);
        } else {
          return fail(self, std::string("unexpected message kind ") + kind_name(*kind));
        }
        if (!ok) return fail(self, "rejected message: " + why);
        try_run(self);
      },
      [self](status_atom) -> std::string {
        auto& s = self->state;
        const auto& ops = s.sh->ops[static_cast<size_t>(s.rank)];
        std::string out = "device " + std::to_string(s.device) + " (replica " + std::to_string(s.replica) +
                          ", rank " + std::to_string(s.rank) + "): ";
        if (s.pc >= ops.size()) return out + "finished its ops";
        const sched::Op& op = ops[s.pc];
        out += "blocked at op " + std::to_string(s.pc) + " " + sched::to_string(op) + " waiting for";
        for (const sched::Msg& m : op.recv)
          if (!s.arrivals.count(key_of(s.step, m))) out += " " + sched::to_string(m);
        return out;
      },
  };
}

std::string check_options(const SimOptions& o, const sched::Layout& l) {
  if (o.replicas < 1) return "replicas must be >= 1";
  if (o.steps < 0) return "steps must be >= 0";
  if (o.stage_costs.size() != 1 && o.stage_costs.size() != static_cast<size_t>(l.num_stages))
    return "stage_costs has " + std::to_string(o.stage_costs.size()) + " entries; the layout has " +
           std::to_string(l.num_stages) + " stages (give one entry per stage, or one for all)";
  for (const StageCost& c : o.stage_costs)
    if (c.f < 0 || c.b < 0 || c.w < 0 || c.w > c.b) return "stage costs must be >= 0 with w <= b";
  if (o.link_latency_ns < 0 || o.message_bytes < 0 || o.optimizer_ns < 0) return "latency, bytes and optimizer time must be >= 0";
  if (!(o.link_bytes_per_ns >= 0) || !std::isfinite(o.link_bytes_per_ns)) return "link bandwidth must be finite and >= 0";
  if (o.d_model < 1) return "d_model must be >= 1";
  if (!(o.stall_seconds > 0)) return "stall_seconds must be > 0";
  return "";
}

void run_steps(const SimOptions& o, const std::shared_ptr<Shared>& sh, SimResult& res);

}  // namespace

SimResult simulate(const SimOptions& o) {
  SimResult res;
  auto sh = std::make_shared<Shared>();
  try {
    sh->layout = sched::make_layout(o.kind, o.stages, o.chunks);
  } catch (const std::invalid_argument& e) {
    res.error = e.what();
    return res;
  }
  if (res.error = check_options(o, sh->layout); !res.error.empty()) return res;
  const sched::Layout& l = sh->layout;
  sh->ops = sched::make_all_schedules(o.kind, o.stages, o.chunks);
  sh->costs = o.stage_costs.size() == 1 ? std::vector<StageCost>(static_cast<size_t>(l.num_stages), o.stage_costs[0])
                                        : o.stage_costs;
  const int64_t transfer = o.link_bytes_per_ns > 0
                               ? static_cast<int64_t>(std::llround(static_cast<double>(o.message_bytes) / o.link_bytes_per_ns))
                               : 0;
  sh->link_ns = o.link_latency_ns + transfer;
  sh->d_model = o.d_model;
  res.devices = o.replicas * o.stages;
  if (o.record_timeline) sh->timeline.resize(static_cast<size_t>(res.devices));

  const auto wall0 = std::chrono::steady_clock::now();
  run_steps(o, sh, res);
  // The actor system is gone (every actor has stopped): the timelines are ours.
  if (res.error.empty()) res.completed = true;
  res.timeline = std::move(sh->timeline);
  res.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - wall0).count();
  return res;
}

namespace {

// Spawns the rank actors and drives options.steps steps through them; the
// actor system lives and dies in here.
void run_steps(const SimOptions& o, const std::shared_ptr<Shared>& sh, SimResult& res) {
  caf::actor_system_config cfg;
  register_caf_types(cfg);
  caf::actor_system sys{cfg};
  sh->peers.resize(static_cast<size_t>(o.replicas));
  for (int r = 0; r < o.replicas; ++r)
    for (int k = 0; k < o.stages; ++k) sh->peers[static_cast<size_t>(r)].push_back(sys.spawn(sim_rank, sh, r, k));

  caf::scoped_actor self{sys};
  const caf::actor driver = caf::actor_cast<caf::actor>(self);
  const auto stall = std::chrono::milliseconds(static_cast<int64_t>(o.stall_seconds * 1000));
  int64_t clock = 0;
  res.busy.assign(static_cast<size_t>(res.devices), 0);
  res.finish.assign(static_cast<size_t>(res.devices), 0);
  for (int64_t step = 1; step <= o.steps && res.error.empty(); ++step) {
    const auto t_step = std::chrono::steady_clock::now();
    StepReport rep;
    rep.step = step;
    rep.start_ns = clock;
    for (const auto& replica : sh->peers)
      for (const caf::actor& a : replica) self->send(a, start_atom::value, static_cast<uint64_t>(step), clock, driver);
    std::vector<char> done(static_cast<size_t>(res.devices), 0);
    int remaining = res.devices;
    int64_t end = clock;
    bool stalled = false;
    while (remaining > 0 && res.error.empty() && !stalled) {
      self->receive(
          [&](done_atom, uint64_t s, int32_t dev, int64_t finish, int64_t busy, uint64_t sent) {
            if (s != static_cast<uint64_t>(step) || dev < 0 || dev >= res.devices || done[static_cast<size_t>(dev)]) {
              res.error = "unexpected completion report from device " + std::to_string(dev);
              return;
            }
            done[static_cast<size_t>(dev)] = 1;
            --remaining;
            end = std::max(end, finish);
            rep.messages += sent;
            if (step == 1) {
              res.busy[static_cast<size_t>(dev)] = busy;
              res.finish[static_cast<size_t>(dev)] = finish - clock;
            }
          },
          [&](fail_atom, const std::string& what) { res.error = what; },
          caf::after(stall) >> [&] { stalled = true; });
    }
    if (stalled) {
      res.error = "no progress for " + std::to_string(o.stall_seconds) + " s (deadlock?):";
      for (int d = 0, shown = 0; d < res.devices && shown < 16; ++d) {
        if (done[static_cast<size_t>(d)]) continue;
        ++shown;
        const caf::actor& a = sh->peers[static_cast<size_t>(d / o.stages)][static_cast<size_t>(d % o.stages)];
        self->request(a, std::chrono::seconds(5), status_atom::value)
            .receive([&](const std::string& s) { res.error += "\n  " + s; },
                     [&](caf::error& e) { res.error += "\n  device " + std::to_string(d) + ": " + sys.render(e); });
      }
    }
    if (!res.error.empty()) break;
    rep.pipeline_ns = end - clock;
    rep.step_ns = rep.pipeline_ns + o.optimizer_ns;
    if (o.optimizer_ns > 0 && o.record_timeline)
      for (auto& tl : sh->timeline) tl.push_back(Span{Span::Optimizer, sched::OpType::F, {}, {}, end, end + o.optimizer_ns, step});
    rep.wall_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_step).count();
    if (step == 1) res.makespan = rep.pipeline_ns;
    res.messages += rep.messages;
    res.steps.push_back(rep);
    if (o.on_step) o.on_step(rep);
    clock += rep.step_ns;
  }
  for (const auto& replica : sh->peers)
    for (const caf::actor& a : replica) self->send_exit(a, caf::exit_reason::user_shutdown);
  sh->peers.clear();  // the actors hold `sh`: break the cycle so they can go
}

}  // namespace

}  // namespace troupe::sim
