// Coordinator actor: drives steps and is the data loader. For a step it cuts
// the batch into micro-batches (replica r takes micro-batches
// [r*C, (r+1)*C) of the Trainer's split), sends them to the first-stage ranks,
// starts every rank, reduces the shards' squared norms into the global norm
// (in shard order) and answers the step request once every rank has loaded
// the new parameters. Protocol: context.hpp.
//
// It is also the supervisor of the ranks and shards (supervisor.hpp): when
// one goes down it is respawned, and a running step is discarded and run
// again from its start (attempt + 1) with the same data. It arms the
// [[faults]] kills at the start of their step. Its deadlines and the replays
// of lost messages are in coordinator_deadlines.cpp; the state both files
// share is in coordinator_state.hpp.
#include "actors/supervision/coordinator_state.hpp"

namespace troupe::runtime {
namespace coord {

void maybe_finish(Self* self) {
  auto& s = self->state;
  const auto& sh = *s.sh;
  // Expert shards report (stepok) like ranks once their parameters are loaded.
  const size_t ranks = static_cast<size_t>(sh.opt.data_parallel) *
                       (static_cast<size_t>(sh.plan.sl.num_ranks) + live_plan(sh)->expert_owned.size());
  const size_t reports = static_cast<size_t>(sh.opt.data_parallel) * static_cast<size_t>(sh.plan.chunks) *
                         static_cast<size_t>(sh.plan.sl.num_stages);
  // The shards' snapshots too: the next step may have to start from them.
  if (!s.running || s.finished.size() != ranks || s.losses.size() != reports || !s.sup->all_staged()) return;
  const size_t mbs = static_cast<size_t>(sh.opt.data_parallel) * static_cast<size_t>(sh.plan.chunks);
  if (sh.opt.loss_head && s.head.size() != mbs) return;
  // Same sums as the Trainer: loss over micro-batches in order; aux per
  // micro-batch (here: over its stages), then over micro-batches.
  double loss_sum = 0.0, aux = 0.0;
  const int last = sh.plan.sl.num_stages - 1;
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
  if (sh.opt.loss_head) {
    std::lock_guard<std::mutex> lock(sh.fed_mu);
    sh.head_report.clear();
    for (auto& [g, v] : s.head) sh.head_report.push_back(std::move(v));  // global mb order
  }
  const double lr = model::learning_rate(sh.opt.train.optim, static_cast<int64_t>(s.step), sh.opt.train.steps);
  const auto now = std::chrono::steady_clock::now();
  s.slowest = std::max(s.slowest, std::chrono::duration<double>(now - s.started).count());
  // A sample of what a fault-free step looks like (no fault armed in it, not
  // replayed, not the first).
  if (s.first_finished && s.attempt == 0 && s.armed == 0) {
    s.step_times.observe(std::chrono::duration<double>(now - s.started).count());
    if (sh.activity) s.silences.observe(1e-9 * static_cast<double>(sh.activity->longest_silence_ns()));
  }
  s.first_finished = true;
  update_stats(sh, [&](FaultSummary& st) {
    ++st.steps;
    st.useful_seconds += std::chrono::duration<double>(now - s.started).count();
    st.wall_seconds += std::chrono::duration<double>(now - s.first_started).count();
    st.recovered += s.armed;
    if (s.repairing) {
      auto& r = st.repairs[s.repair_role];
      const double secs = std::chrono::duration<double>(now - s.repair_from).count();
      ++r.count;
      r.total_seconds += secs;
      r.max_seconds = std::max(r.max_seconds, secs);
    }
  });
  s.armed = 0;
  s.message_fault_role.clear();
  s.repairing = false;
  s.deadline_replays = 0;
  s.quiet_replays = 0;
  s.running = false;
  s.sup->commit();
  ++s.step;
  s.attempt = 0;
  s.reply.deliver(loss_sum * s.loss_scale, aux * s.aux_scale, s.norm, lr);
}

// Every shard's partial norm is in (and every loss report, so the step's
// expert loads are complete): the global norm goes to the shards, after the
// loads when the router bias is balanced by them (aux-loss-free balancing).
void maybe_clip(Self* self) {
  auto& s = self->state;
  const auto& sh = *s.sh;
  const size_t reports = static_cast<size_t>(sh.opt.data_parallel) * static_cast<size_t>(sh.plan.chunks) *
                         static_cast<size_t>(sh.plan.sl.num_stages);
  if (!s.running || s.clipped || s.partials.size() != sh.plan.shard_ranges.size() || s.losses.size() != reports) return;
  s.clipped = true;
  double total = 0.0;
  for (const auto& [k, v] : s.partials) total += v;  // shard order
  s.norm = std::sqrt(total);
  if (sh.opt.train.model.ffn == model::Ffn::moe && sh.opt.train.model.balance == moe::Balance::bias) {
    std::vector<int64_t> loads;
    for (const auto& [stage, v] : s.loads) loads.insert(loads.end(), v.begin(), v.end());
    for (const caf::actor& a : all_shards(sh)) post(sh, kNoDevice, a, rt::load_atom_v, s.step, s.attempt, loads);
  }
  for (const caf::actor& a : all_shards(sh)) post(sh, kNoDevice, a, rt::clip_atom_v, s.step, s.attempt, s.norm);
}

// Arms the [[faults]] of this step: the target dies on its k-th message.
void arm_faults(Self* self) {
  auto& s = self->state;
  const auto& sh = *s.sh;
  for (size_t i = 0; i < sh.opt.faults.size(); ++i) {
    const FaultSpec& f = sh.opt.faults[i];
    if (s.fault_armed[i] || f.at_step != static_cast<int64_t>(s.step) + 1) continue;
    if (int proc = -1; parse_process_target(f.target, proc)) {
      // Fired by the cluster as the step starts (Cluster::before_step); the
      // recovery is on_process_lost's.
      s.fault_armed[i] = true;
      ++s.armed;
      update_stats(sh, [&](FaultSummary& st) { ++st.injected[fault_kind_name(f.kind)]; });
      continue;
    }
    const std::optional<FaultTarget> t = parse_fault_target(f.target);
    const auto plan = live_plan(sh);  // the expert shards in force this step
    const ActorPlan* target = t ? plan->target(*t) : nullptr;
    if (!target) continue;  // validate() rejected it already
    s.fault_armed[i] = true;
    ++s.armed;
    update_stats(sh, [&](FaultSummary& st) { ++st.injected[fault_kind_name(f.kind)]; });
    if (on_messages(f.kind) && f.kind != FaultKind::duplicate && s.message_fault_role.empty())
      s.message_fault_role = role_name(t->role);
    if (on_messages(f.kind)) {  // acts on messages in flight, at the seam
      if (sh.injector) sh.injector->arm(target_actor(sh, *t), f, sh.opt.train.seed, s.step, target->device);
      continue;
    }
    if (f.kind == FaultKind::slow) {  // the target's device becomes a straggler
      Device* dev = target->device >= 0 && static_cast<size_t>(target->device) < sh.devices.size()
                        ? sh.devices[static_cast<size_t>(target->device)] : nullptr;
      if (!dev) continue;
      const auto now = std::chrono::steady_clock::now();
      dev->slow_down(f.factor, f.duration_ms > 0 ? now + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                                                              std::chrono::duration<double, std::milli>(f.duration_ms))
                                                 : std::chrono::steady_clock::time_point::max());
      continue;
    }
    const uint32_t n = target->messages_per_step;
    const uint32_t k = f.at_message > 0 ? static_cast<uint32_t>(std::min<int64_t>(f.at_message, n))
                                        : kill_point(sh.opt.train.seed, s.step, fault_key(f.target), n);
    // The same path as the step's messages (post), so it arrives before them.
    send_anon(target_actor(sh, *t), caf::make_message(rt::arm_atom_v, s.step, k));
  }
}

void start_step(Self* self) {
  auto& s = self->state;
  const auto& sh = *s.sh;
  const auto& o = sh.opt.train;
  const int64_t S = o.model.seq_len, Bm = sh.plan.mb_batch;
  // With a loss head the batch is fed (Runtime::step_on), with its per-token
  // inputs; every attempt of the step reads the same one.
  std::shared_ptr<const FedBatch> fed;
  if (sh.opt.loss_head) {
    std::lock_guard<std::mutex> lock(sh.fed_mu);
    fed = sh.fed;
  }
  const int64_t columns = sh.opt.loss_head ? sh.opt.loss_head->columns() : 0;
  model::Batch loaded;
  if (!fed) loaded = s.data->train_batch(static_cast<int64_t>(s.step), o.data.batch_size, S);
  const std::vector<int32_t>& inputs = fed ? fed->inputs : loaded.inputs;
  const std::vector<int32_t>& targets = fed ? fed->targets : loaded.targets;
  int64_t counted = 0;
  for (int32_t t : targets) counted += t >= 0;
  s.loss_scale = counted > 0 ? 1.0 / static_cast<double>(counted) : 0.0;
  s.aux_scale = 1.0 / static_cast<double>(o.microbatches);
  s.losses.clear();
  s.partials.clear();
  s.finished.clear();
  s.loads.clear();
  s.load_from.clear();
  s.head.clear();
  s.clipped = false;
  s.sup->clear_staged();
  s.running = true;
  // A slow fault counted in steps ends when the step after its window starts.
  for (size_t i = 0; i < sh.opt.faults.size(); ++i) {
    const FaultSpec& f = sh.opt.faults[i];
    if (f.kind != FaultKind::slow || !s.fault_armed[i] || f.duration_ms > 0 ||
        static_cast<int64_t>(s.step) + 1 != f.at_step + f.steps)
      continue;
    const std::optional<FaultTarget> t = parse_fault_target(f.target);
    const ActorPlan* target = t ? sh.plan.target(*t) : nullptr;
    if (target && target->device >= 0 && static_cast<size_t>(target->device) < sh.devices.size() &&
        sh.devices[static_cast<size_t>(target->device)])
      sh.devices[static_cast<size_t>(target->device)]->slow_down(1.0);
  }
  if (s.attempt == 0) arm_faults(self);
  // The step's deadline (a lost message or a frozen actor never ends it).
  s.started = std::chrono::steady_clock::now();
  if (s.attempt == 0) s.first_started = s.started;
  // Across processes a lost or hung peer is the cluster's to report
  // (peer_timeout); replays there are not built yet, so only an explicit
  // step_deadline arms one.
  if (sh.opt.processes == 1 || sh.opt.step_deadline > 0) {
    const double limit = step_deadline(s);
    self->delayed_send(self, seconds(limit), rt::deadline_atom_v, s.step, s.attempt, limit);
  }
  if (sh.activity) sh.activity->reset();
  if (sh.loss) sh.loss->set_epoch(LossDetector::epoch_of(s.step, s.attempt));
  if (const double quiet = message_deadline(s); quiet > 0)
    self->delayed_send(self, seconds(quiet), rt::quiet_atom_v, s.step, s.attempt);
  const int64_t n = Bm * S;
  for (int r = 0; r < sh.opt.data_parallel; ++r) {
    for (int j = 0; j < sh.plan.chunks; ++j) {
      const int64_t g = static_cast<int64_t>(r) * sh.plan.chunks + j;
      const int dir = sh.plan.sl.num_dirs == 2 && j >= sched::first_mb(sh.plan.sl, 1) ? 1 : 0;
      const int64_t shape[1] = {n};
      Envelope e = Envelope::build<schemas::Activations>([&](schemas::Activations::Builder b) {
        auto t = b.initTag();
        t.setStep(s.step);
        t.setMicrobatch(static_cast<uint32_t>(j));
        t.setStage(kDataStage);
        t.setDirection(schemas::Direction::FORWARD);
        t.setChunk(static_cast<uint32_t>(dir));
        t.setReplica(static_cast<uint32_t>(r));
        t.setAttempt(s.attempt);
        const int64_t none[2] = {n, 0};  // [tokens, 0]: no hidden state, the first stage embeds the ids
        set_tensor_f32(b.initHidden(), none, {});
        set_tensor_i32(b.initTokenIds(), shape, std::span<const int32_t>(inputs.data() + g * n, static_cast<size_t>(n)));
        set_tensor_i32(b.initTargets(), shape, std::span<const int32_t>(targets.data() + g * n, static_cast<size_t>(n)));
        if (fed) {
          const int64_t dshape[2] = {n, columns};
          set_tensor_f64(b.initTokenData(), dshape,
                         std::span<const double>(fed->token_data.data() + g * n * columns, static_cast<size_t>(n * columns)));
        }
      });
      post(sh, kNoDevice, rank_of(sh, r, sched::stage_rank(sh.plan.sl, dir, 0)), e);
    }
  }
  for (const caf::actor& a : all_ranks(sh)) post(sh, kNoDevice, a, rt::start_atom_v, s.step, s.attempt, s.loss_scale, s.aux_scale);
}

// Asks the new expert shard `a` in slot (replica, producer) of the pending
// placement change for its loaded bytes; the answer comes once its restore
// (queued before) is on its device. The test hook kill_while_loading arms
// it to die on that request (and on nothing else it handles before).
void request_load(Self* self, const caf::actor& a, int replica, int producer) {
  auto& s = self->state;
  const TestHooks* hooks = s.sh->hooks.get();
  if (s.kill_loading_left < 0) s.kill_loading_left = hooks ? hooks->kill_while_loading_times : 0;
  if (s.kill_loading_left > 0 && live_plan(*s.sh)->expert(replica, producer).name == hooks->kill_while_loading) {
    --s.kill_loading_left;
    send_anon(a, caf::make_message(rt::arm_atom_v, rt::rescale_atom_v));
  }
  const auto w = s.loading;
  const auto slot = std::make_pair(replica, producer);
  w->left[slot] = a;
  // The restore went through the ring to a's process (send_anon); this
  // request goes through CAF and must not overtake it.
  fence_ring(a, std::chrono::milliseconds(static_cast<int64_t>(s.sh->opt.peer_timeout * 1000.0)));
  self->request(a, caf::infinite, rt::rescale_atom_v)
      .then(
          [self, w, slot, a](uint64_t b) {
            auto it = w->left.find(slot);
            if (it == w->left.end() || it->second != a) return;  // a replaced shard's late answer
            w->bytes += b;
            w->left.erase(it);
            if (!w->left.empty()) return;
            w->rp.deliver(w->bytes);
            if (self->state.loading == w) self->state.loading.reset();
          },
          // It went down before its weights were in: the down handler
          // respawns it and asks the fresh one (or fails the change).
          [](caf::error&) {});
}

// Waits (s.loading) for every shard of `fresh`; answers at once when a
// change spawned none.
void await_loads(Self* self, const std::vector<Supervisor::NewShard>& fresh) {
  auto& s = self->state;
  s.loading->left.clear();
  s.loading->bytes = 0;
  for (const Supervisor::NewShard& n : fresh) request_load(self, n.actor, n.replica, n.producer);
  if (fresh.empty()) {
    s.loading->rp.deliver(uint64_t{0});
    s.loading.reset();
  }
}

std::vector<caf::actor> actors_of(const std::vector<Supervisor::NewShard>& v) {
  std::vector<caf::actor> out;
  for (const Supervisor::NewShard& n : v) out.push_back(n.actor);
  return out;
}

// The run failed (s.error): a pending placement change fails with it.
void fail_loading(Self* self) {
  auto& s = self->state;
  if (!s.loading) return;
  s.loading->left.clear();
  s.loading->rp.deliver(caf::make_error(caf::sec::runtime_error, s.error));
  s.loading.reset();
}

// [experts] on_failure = "shrink": `child` (an expert shard) broke its
// restart budget. Its slot goes (Supervisor::shrink_experts); a running step
// is replayed on the smaller plan, a pending placement change waits for the
// new set instead. Returns false (nothing done) when shrinking is not
// possible: the run then stops as with on_failure = "stop".
bool shrink(Self* self, const Supervisor::Child& child, const std::string& cause, const std::string& why) {
  auto& s = self->state;
  const auto& sh = *s.sh;
  if (child.role != Role::Expert || sh.opt.expert_on_failure != ExpertOnFailure::shrink ||
      live_plan(sh)->expert_shards < 2)
    return false;
  // Across processes the coordinator cannot tell a live process of the
  // smaller plan before the replay starts: there, shrink only once the other
  // process is lost (on_process_lost shrinks around it).
  if (sh.opt.processes > 1 && !(sh.lost_processes & 2u)) {
    s.error = why + " (shrink on a restart budget runs in one process, or after process 1 was lost)";
    return false;
  }
  const uint32_t attempt = s.running ? s.attempt + 1 : s.attempt;
  std::pair<int, int> counts;
  std::vector<Supervisor::NewShard> fresh;
  try {
    fresh = s.sup->shrink_experts(self, child, s.step, attempt, &counts);
  } catch (const std::exception& e) {
    s.error = why + " (shrink failed: " + e.what() + ")";
    return false;
  }
  update_stats(sh, [&](FaultSummary& st) { st.replays += s.running; });
  if (s.running) {
    repair_starts(s, role_name(child.role));
    s.attempt = attempt;
    s.sup->restore_all(self, s.step, s.attempt, actors_of(fresh));
    start_step(self);
  } else if (s.loading) {
    await_loads(self, fresh);
  }
  RestartEvent ev;
  ev.step = static_cast<int64_t>(s.step) + 1;
  ev.attempt = static_cast<int>(s.attempt) + 1;
  ev.actor = child.name;
  ev.cause = cause;
  ev.replayed = s.running;
  ev.shrink = true;
  ev.shards_before = counts.first;
  ev.shards_after = counts.second;
  if (auto it = s.last_phase.find(child.name); it != s.last_phase.end()) {
    ev.phase = "while " + it->second;
    s.last_phase.erase(it);
  }
  try {
    if (sh.on_restart) sh.on_restart(ev);
  } catch (const std::exception&) {
  }
  return true;
}

// Whether losing a process is survived: 2 processes, process_loss = recover
// (only process 1 can be lost; losing process 0 loses the coordinator).
bool recovers_processes(const Shared& sh) {
  return sh.opt.processes == 2 && sh.opt.process_loss == ProcessLoss::recover;
}

// Process 1 of 2 is lost (dead, or hung and then SIGKILLed by the
// directory): every actor it held is respawned here, on process 0's devices
// (Runtime's device_for: the recomputed placement), and restored from the
// committed snapshot the coordinator holds — the parameters and AdamW moments
// of every optimizer shard as of the last finished step, replicated here each
// step (process 0 is the buddy of process 1). A running step is discarded
// and replayed as the next attempt, so at most one step's work is lost and
// the run ends bitwise equal to the fault-free one. No MPI call is made from
// here on: the run ends through CAF alone.
void on_process_lost(Self* self, const std::string& what) {
  auto& s = self->state;
  if (!s.error.empty()) return;
  const std::vector<Supervisor::Child> gone = s.sup->children_off(self->node());
  if (gone.empty()) return;  // recovered already (the other report of the same loss)
  const auto now = std::chrono::steady_clock::now();
  const int64_t step1 = static_cast<int64_t>(s.step) + 1;
  // Detection: from the start of the step the loss hit (the process faults
  // fire as it starts) to now.
  const double noticed = s.running ? std::chrono::duration<double>(now - s.first_started).count() : 0.0;
  if (s.running) repair_starts(s, "process");
  s.sh->lost_processes |= 2u;  // process 1 (recovers_processes): placement changes now spawn here
  const uint32_t attempt = s.running ? s.attempt + 1 : s.attempt;
  // on_failure = "shrink": the lost expert shards' slots go (their experts
  // join the survivors) instead of respawning them; the other actors are
  // respawned either way.
  std::vector<Supervisor::NewShard> shrunk;
  std::pair<int, int> counts{0, 0};
  bool shrinking = false;
  if (s.sh->opt.expert_on_failure == ExpertOnFailure::shrink) {
    std::string why;
    if (auto made = s.sup->shrink_lost_experts(self, gone, s.step, attempt, &counts, &why)) {
      shrunk = std::move(*made);
      shrinking = true;
      std::fprintf(stderr, "troupe[process 0]: shrinking around the lost process: expert shards per layer %d -> %d\n",
                   counts.first, counts.second);
    } else {
      std::fprintf(stderr, "troupe[process 0]: cannot shrink around the lost process (%s); respawning its expert shards\n",
                   why.c_str());
    }
  }
  std::string names;
  int64_t respawned = 0;
  for (const auto& c : gone)
    if (!shrinking || c.role != Role::Expert) names += (names.empty() ? "" : ", ") + c.name, ++respawned;
  std::fprintf(stderr, "troupe[process 0]: %s in step %lld, noticed %.3f s after it started; restarting %s on process 0\n",
               what.c_str(), static_cast<long long>(step1), noticed, names.c_str());
  update_stats(*s.sh, [&](FaultSummary& st) {
    st.restarts += respawned;
    st.replays += s.running;
    ++st.processes_lost;
    st.detect_seconds += noticed;
  });
  std::vector<caf::actor> fresh = actors_of(shrunk);
  for (const auto& c : gone) {
    if (shrinking && c.role == Role::Expert) continue;
    fresh.push_back(s.sup->respawn(self, c, s.step, attempt));
    // A new shard of a pending placement change that was loading there:
    // the respawned one is asked again (as in on_child_down).
    if (c.role == Role::Expert && s.loading && s.loading->left.count({c.replica, c.index}))
      request_load(self, fresh.back(), c.replica, c.index);
  }
  const bool replay = s.running;
  if (replay) {
    s.attempt = attempt;
    s.sup->restore_all(self, s.step, s.attempt, fresh);
    start_step(self);
  } else if (shrinking && s.loading) {
    await_loads(self, shrunk);  // a placement change was loading: it answers once the smaller set is in
  }
  for (const auto& c : gone) {
    if (shrinking && c.role == Role::Expert) continue;  // one shrink line below
    RestartEvent ev;
    ev.step = step1;
    ev.attempt = static_cast<int>(s.attempt) + 1;
    ev.actor = c.name;
    ev.cause = what;
    ev.replayed = replay;
    try {
      if (s.sh->on_restart) s.sh->on_restart(ev);
    } catch (const std::exception&) {
    }
  }
  if (shrinking) {
    RestartEvent ev;
    ev.step = step1;
    ev.attempt = static_cast<int>(s.attempt) + 1;
    ev.actor = "the expert shards of process 1";
    ev.process_lost = true;
    ev.cause = what;
    ev.replayed = replay;
    ev.shrink = true;
    ev.shards_before = counts.first;
    ev.shards_after = counts.second;
    try {
      if (s.sh->on_restart) s.sh->on_restart(ev);
    } catch (const std::exception&) {
    }
  }
}

// A supervised actor went down: respawn it; if a step is running, discard it
// and run it again from the snapshot it started from.
void on_child_down(Self* self, const caf::down_msg& m) {
  auto& s = self->state;
  const Supervisor::Child* found = s.sup->find(m.source);
  // A Runtime::kill caller learns the outcome once this handler is done.
  struct Answer {
    Self* self;
    caf::actor_addr who;
    ~Answer() {
      auto& st = self->state;
      auto it = st.kill_waiters.find(who);
      if (it == st.kill_waiters.end()) return;
      if (st.error.empty()) it->second.deliver(true);
      else it->second.deliver(caf::make_error(caf::sec::runtime_error, st.error));
      st.kill_waiters.erase(it);
    }
  } answer{self, m.source};
  if (!found || m.reason == caf::exit_reason::user_shutdown || !s.error.empty()) return;
  const Supervisor::Child child = *found;
  const std::string cause = m.reason == caf::exit_reason::kill ? "killed" : self->system().render(m.reason);
  const int64_t step1 = static_cast<int64_t>(s.step) + 1;
  if (m.source.node() != self->node() && recovers_processes(*s.sh)) {
    // An actor of the other process: that process is lost (the directory
    // reports it too; whichever comes first recovers, the other finds
    // nothing left to do).
    on_process_lost(self, "process 1 lost (" + child.name + " went down: " + cause + ")");
    return;
  }
  if (m.source.node() != self->node()) {
    // An actor of another process: it went down with its process, which the
    // cluster reports; the supervisor restarts only actors on its own devices.
    s.error = child.name + " in another process went down (" + cause + ") in step " + std::to_string(step1);
    fail_loading(self);
    if (s.running) {
      s.running = false;
      s.reply.deliver(caf::make_error(caf::sec::runtime_error, s.error));
    }
    return;
  }
  if (std::string why = s.sup->admit_restart(child, cause, step1); !why.empty()) {
    if (shrink(self, child, cause, why)) return;
    if (s.error.empty()) s.error = why;
    fail_loading(self);
    if (s.running) {
      s.running = false;
      s.reply.deliver(caf::make_error(caf::sec::runtime_error, s.error));
    }
    return;
  }
  update_stats(*s.sh, [&](FaultSummary& st) {
    ++st.restarts;
    st.replays += s.running;
  });
  if (s.running) repair_starts(s, role_name(child.role));
  // A replay starts the step again as the next attempt; between steps the
  // child alone is restored to where the others are.
  const uint32_t attempt = s.running ? s.attempt + 1 : s.attempt;
  const caf::actor fresh = s.sup->respawn(self, child, s.step, attempt);
  // A new shard of a pending placement change died while loading: the
  // fresh one (restored above) is asked again, so no expert is left without
  // weights and the change still answers once all of them are in.
  if (child.role == Role::Expert && s.loading && s.loading->left.count({child.replica, child.index}))
    request_load(self, fresh, child.replica, child.index);
  // one_for_all / rest_for_one: the siblings go too, respawned first and then
  // killed, so their down messages find no child and restart nothing; they
  // count once with the failure against the restart intensity (as Erlang's).
  std::vector<caf::actor> fresh_all{fresh};
  std::vector<std::string> also;
  for (const auto& [sib, old] : s.sup->siblings(child, s.sh->opt.strategy)) {
    fresh_all.push_back(s.sup->respawn(self, sib, s.step, attempt));
    self->send_exit(old, caf::exit_reason::kill);
    also.push_back(sib.name);
  }
  update_stats(*s.sh, [&](FaultSummary& st) { st.restarts += static_cast<int64_t>(also.size()); });
  RestartEvent ev;
  ev.step = step1;
  ev.actor = child.name;
  ev.cause = cause;
  if (auto it = s.last_phase.find(child.name); it != s.last_phase.end()) {
    ev.phase = "while " + it->second;
    s.last_phase.erase(it);
  }
  ev.replayed = s.running;
  if (s.running) {
    s.attempt = attempt;
    s.sup->restore_all(self, s.step, s.attempt, fresh_all);
    start_step(self);
  }
  ev.attempt = static_cast<int>(s.attempt) + 1;
  try {
    if (s.sh->on_restart) s.sh->on_restart(ev);
    for (const std::string& name : also) {
      if (!s.sh->on_restart) break;
      RestartEvent sib = ev;
      sib.actor = name;
      sib.cause = strategy_name(s.sh->opt.strategy) + " after " + child.name + " went down";
      sib.phase.clear();
      s.sh->on_restart(sib);
    }
  } catch (const std::exception&) {
    // A reporting problem (e.g. a full disk for the log) must not take the
    // supervisor down with it.
  }
}

// Whether a message of (step, attempt) belongs to the running attempt; one
// that does not (stale, or after the step ended) is counted and dropped.
bool current(CoordState& s, uint64_t step, uint32_t attempt) {
  if (step == s.step && attempt == s.attempt && s.running) return true;
  ++s.dropped;
  return false;
}

// The driver's (step): starts the next step, answered once it finished.
StepReply begin_step(Self* self) {
  auto& s = self->state;
  s.reply = self->make_response_promise<double, double, double, double>();
  if (!s.error.empty()) {
    s.reply.deliver(caf::make_error(caf::sec::runtime_error, s.error));
  } else if (s.running) {
    s.reply.deliver(caf::make_error(caf::sec::runtime_error, std::string("a step is already running")));
  } else {
    s.sup->watch(self);
    start_step(self);
  }
  return s.reply;
}

// An actor reported a failure: the run fails with its text.
void on_failure(Self* self, const std::string& what) {
  auto& s = self->state;
  if (s.error.empty()) s.error = what;
  fail_loading(self);
  if (s.running) {
    s.running = false;
    s.reply.deliver(caf::make_error(caf::sec::runtime_error, s.error));
  }
}

// Runtime::kill: kill a supervised actor now; the answer comes once the
// supervisor has handled its going down (restart, replay or escalation).
caf::result<bool> kill_now(Self* self, const std::string& target) {
  auto& s = self->state;
  const std::optional<FaultTarget> t = parse_fault_target(target);
  const caf::actor a = t && t->replica < s.sh->opt.data_parallel ? target_actor(*s.sh, *t) : caf::actor{};
  if (!a) return caf::make_error(caf::sec::runtime_error, "no actor " + target);
  if (!s.error.empty()) return caf::make_error(caf::sec::runtime_error, s.error);
  s.sup->watch(self);
  auto rp = self->make_response_promise();
  s.kill_waiters[a.address()] = rp;
  self->send_exit(a, caf::exit_reason::kill);
  return rp;
}

// A placement change (Runtime::step, between steps): the expert shards
// become `shards` per MoE layer, split by `bounds` (empty: evenly), holding
// the `copies` ((moe layer index, shard, expert) triples; empty: none) with
// the `shares` of their rows ((moe layer index, expert, n, n weights) runs;
// empty: even splits); the answer (the bytes of weights the new shards
// loaded) comes once every new shard has its weights.
caf::result<uint64_t> rescale(Self* self, const ExpertLayout& layout) {
  auto& s = self->state;
  if (!s.error.empty()) return caf::make_error(caf::sec::runtime_error, s.error);
  if (s.running) return caf::make_error(caf::sec::runtime_error, std::string("rescale: a step is running"));
  if (!s.sh->plan.expert_parallel())
    return caf::make_error(caf::sec::runtime_error, std::string("rescale: the run has no expert shards"));
  s.sup->watch(self);
  std::vector<Supervisor::NewShard> fresh;
  try {
    const RuntimeOptions o = with_expert_layout(s.sh->opt, layout, s.sh->plan.moe_layers.size());
    fresh = s.sup->rescale_experts(self, make_plan(o), s.step, s.attempt);
  } catch (const std::exception& e) {
    return caf::make_error(caf::sec::runtime_error, std::string("rescale: ") + e.what());
  }
  s.loading = std::make_shared<CoordState::Loading>();
  auto rp = self->make_response_promise();
  s.loading->rp = rp;
  await_loads(self, fresh);
  return rp;
}

// Expert load of micro-batch mb at a stage: per MoE layer of the stage, E
// routed counts then the dropped count. Sent before the stage's loss report
// of the same micro-batch, so a finished step has all of them.
void add_loads(Self* self, uint64_t step, uint32_t attempt, uint32_t replica, uint32_t mb, uint32_t stage,
               const std::vector<int64_t>& v) {
  auto& s = self->state;
  if (!current(s, step, attempt)) return;
  if (!s.load_from.emplace(replica, mb, stage).second) {
    ++s.dropped;  // a duplicate
    return;
  }
  auto& sum = s.loads[static_cast<int>(stage)];
  if (sum.empty()) sum.assign(v.size(), 0);
  if (sum.size() != v.size()) {
    ++s.dropped;
    return;
  }
  for (size_t i = 0; i < v.size(); ++i) sum[i] += v[i];
}

caf::behavior coordinator(Self* self, std::shared_ptr<const Shared> sh) {
  auto& st = self->state;
  st.sh = sh;
  st.step = sh->start_step;  // resumed: the saved step (its data cursor)
  const auto& o = sh->opt.train;
  if (!sh->opt.loss_head) st.data = model::make_data_source(o.data, o.seed, o.model.seq_len);  // else fed
  st.sup = std::make_unique<Supervisor>(sh);
  st.fault_armed.assign(sh->opt.faults.size(), false);
  st.step_times = Suspicion(sh->opt.step_suspicion);
  st.silences = Suspicion(sh->opt.message_suspicion);
  self->set_down_handler([self](caf::down_msg& m) { on_child_down(self, m); });
  // A step's reports are kept once each (a duplicate is counted and dropped).
  auto once = [self](bool inserted) {
    if (!inserted) ++self->state.dropped;
    return inserted;
  };
  return {
      [self](rt::step_atom) { return begin_step(self); },
      [self, once](rt::loss_atom, uint64_t step, uint32_t attempt, uint32_t replica, uint32_t mb, uint32_t stage,
                   double loss, double aux) {
        auto& s = self->state;
        const int g = static_cast<int>(replica) * s.sh->plan.chunks + static_cast<int>(mb);
        if (!current(s, step, attempt) ||
            !once(s.losses.emplace(std::make_tuple(g, static_cast<int>(stage)), std::make_pair(loss, aux)).second))
          return;
        maybe_clip(self);
        maybe_finish(self);
      },
      // The loss head's per-token report of micro-batch mb (last stage).
      [self, once](rt::head_atom, uint64_t step, uint32_t attempt, uint32_t replica, uint32_t mb,
                   const std::vector<double>& report) {
        auto& s = self->state;
        const int g = static_cast<int>(replica) * s.sh->plan.chunks + static_cast<int>(mb);
        if (current(s, step, attempt) && once(s.head.emplace(g, report).second)) maybe_finish(self);
      },
      [self, once](rt::gnorm_atom, uint64_t step, uint32_t attempt, uint32_t shard, double sq) {
        auto& s = self->state;
        if (current(s, step, attempt) && once(s.partials.emplace(shard, sq).second)) maybe_clip(self);
      },
      [self, once](rt::stepok_atom, uint64_t step, uint32_t attempt, uint32_t replica, uint32_t rank) {
        auto& s = self->state;
        if (current(s, step, attempt) && once(s.finished.emplace(replica, rank).second)) maybe_finish(self);
      },
      // The cluster's directory found process 1 lost (runtime_cluster.cpp).
      [self](rt::lost_atom, const std::string& what) { on_process_lost(self, what); },
      [self](rt::fail_atom, const std::string& what) { on_failure(self, what); },
      [self](rt::load_atom, uint64_t step, uint32_t attempt, uint32_t replica, uint32_t mb, uint32_t stage,
             const std::vector<int64_t>& v) { add_loads(self, step, attempt, replica, mb, stage, v); },
      [self](rt::load_atom) { return self->state.last_loads; },
      [self, once](rt::snapshot_atom, uint64_t step, uint32_t attempt, uint32_t shard, const Envelope& p,
                   const Envelope& m, const Envelope& v) {
        auto& s = self->state;
        if (current(s, step, attempt) && once(s.sup->stage(shard, p, m, v))) maybe_finish(self);
      },
      [self](rt::fault_atom, const std::string& who, const std::string& phase) { self->state.last_phase[who] = phase; },
      [self](rt::fault_atom, const std::string& target) { return kill_now(self, target); },
      [self](rt::deadline_atom, uint64_t step, uint32_t attempt, double limit) { on_deadline(self, step, attempt, limit); },
      [self](rt::quiet_atom, uint64_t step, uint32_t attempt) { on_quiet_check(self, step, attempt); },
      [self](rt::gap_atom, uint64_t epoch) { on_gap(self, epoch); },
      [self](rt::rescale_atom, int32_t shards, const std::vector<int64_t>& bounds, const std::vector<int64_t>& copies,
             const std::vector<int64_t>& shares) { return rescale(self, ExpertLayout{shards, bounds, copies, shares}); },
      [self](rt::dropped_atom) { return self->state.dropped; },
      [self](rt::corrupt_atom, const std::string& who, const std::string& why) { on_damaged(self, who, why); },
      [self](rt::corrupt_atom) { return self->state.damaged; },
      [self](rt::name_atom) { return self->state.sh->plan.coordinator().name; },
  };
}

}  // namespace coord

caf::actor spawn_coordinator(caf::actor_system& sys, std::shared_ptr<const Shared> sh) {
  return sys.spawn(coord::coordinator, std::move(sh));
}

}  // namespace troupe::runtime
