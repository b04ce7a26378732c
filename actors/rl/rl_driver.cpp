// The coordinator (dealing, weight versions, supervision, fault injection)
// and the trainer actor of decoupled RL, and the facade that brings them up
// (see rl_actors.hpp; the protocol is in rl_messages.hpp).
#include <algorithm>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>

#include "actors/rl/rl_actors.hpp"
#include "actors/rl/rl_messages.hpp"
#include "actors/rl/rl_remote.hpp"
#include "actors/supervision/fault_injector.hpp"
#include "actors/cluster/runtime_cluster_internal.hpp"
#include "actors/transport/caf_scheduler.hpp"
#include "actors/transport/caf_types.hpp"
#include "actors/transport/envelope_shm.hpp"
#include "model/checkpoint.hpp"
#include "rl/staleness.hpp"
#include "rl/version_store.hpp"
#include "rl/task.hpp"
#include "model/clock.hpp"

namespace troupe::runtime {

namespace {

using model::Clock;
using model::seconds_since;


// What the coordinator and the trainer share with the facade. The
// coordinator writes `restarts`, `events` and `error` under `mu`; the trainer
// drains restarts to the observer from its own thread.
struct RunContext {
  std::mutex mu;
  std::vector<RestartEvent> restarts, unreported;
  std::vector<std::string> events;
  std::string error;  // set once: the run failed (the trainer stops on it)
  RlActorObserver* observer = nullptr;
  rl::RlSummary summary;
  RlActorReport report;  // the trainer's and generators' figures
  Clock::time_point t0;
};

struct DriverState {
  std::shared_ptr<const RlShared> sh;
  std::shared_ptr<RunContext> ctx;
  std::shared_ptr<RlLedger> ledger;
  std::shared_ptr<BufferStore> store;  // the buffer's state: a respawned buffer goes on from it
  caf::actor buffer, trainer;
  // The trainer's last request for a step (forwarded to the buffer; sent
  // again to a respawned one): -1 none yet.
  int64_t take_step = -1;
  caf::actor take_from;
  std::vector<caf::actor> gens, rewards;
  std::map<int64_t, rlmsg::Weights> versions;  // published, still needed
  int64_t published = -1;                      // newest version
  int64_t next = 0;                            // next step to deal
  std::set<int64_t> admitted;                  // steps the ledger took
  std::vector<char> fired;                     // per fault: armed already
  // [[faults]] delay / duplicate / pause on generators and reward actors act
  // on what the coordinator sends them (jobs, weight syncs, rollouts to
  // score), at the same seam as the pre-training runtime's message faults;
  // null when the run has none.
  std::shared_ptr<FaultInjector> injector;
  int restarts = 0;
  // Weight syncs, per generator: its incarnation (restarts), the version last
  // sent to it (-1: none since it started), the syncs awaiting confirmation
  // (version -> attempt) and whether it is being restarted for missing one.
  std::vector<int64_t> incarnation, last_sent;
  std::vector<std::map<int64_t, int>> unconfirmed;
  std::vector<char> sync_kill;
  std::vector<int> gen_process;  // [generator] the process its current incarnation runs on
  // Generators on other processes (null: all here), and the processes
  // watched for loss.
  std::shared_ptr<RemoteGenerators> remote;
  // The end of the run: the children whose down is still awaited.
  bool ending = false;
  caf::error end_reason;
  std::set<caf::actor_addr> awaiting;
  // Children seen going down and not replaced (a failed run's): not awaited at the end.
  std::set<caf::actor_addr> gone;
};

int64_t eta_of(const DriverState& s) { return s.sh->opt->train.rl.max_staleness; }
int64_t version_for(const DriverState& s, int64_t step) { return rl::first_version_for(step, eta_of(s)); }
bool latest_mode(const DriverState& s) { return s.sh->opt->train.rl.sync == rl::SyncMode::latest; }

// Sends a job, weight sync or rollout to a generator or reward actor: through
// the fault injector when the run has message faults on them.
template <class... Ts>
void to_actor(caf::event_based_actor* self, DriverState& s, const caf::actor& to, Ts&&... xs) {
  if (s.injector) s.injector->send(-1, to, caf::make_message(std::forward<Ts>(xs)...), runtime::Link{});
  else self->send(to, std::forward<Ts>(xs)...);
}

// Sends version v to generator k with a deadline for its confirmation
// (`attempt` 1; the deadline handler sends attempt 2).
void send_sync(caf::event_based_actor* self, DriverState& s, size_t k, int64_t v, int attempt = 1) {
  if (attempt == 1 && s.last_sent[k] == v) return;  // it has it (or it is on its way)
  s.last_sent[k] = v;
  s.unconfirmed[k][v] = attempt;
  to_actor(self, s, s.gens[k], rlmsg::sync_atom::value, s.versions.at(v));
  const auto deadline = std::chrono::microseconds(static_cast<int64_t>(s.sh->opt->train.rl.sync_deadline_ms * 1000.0));
  self->delayed_send(self, deadline, rlmsg::deadline_atom::value, static_cast<int>(k), s.incarnation[k], v, attempt);
}

// Where an RL actor armed by kill fault `f` dies: its at_message, or a point
// seeded from the run's seed, the step and the target.
uint32_t rl_kill_point(const DriverState& s, const FaultSpec& f) {
  return f.at_message > 0 ? static_cast<uint32_t>(f.at_message)
                          : kill_point(s.sh->seed, static_cast<uint64_t>(f.at_step), f.target, kRlKillPoints);
}

// Arms `target` with its kill point when a not-yet-fired fault names it for
// a job of step `step` (0-based) or later: the fault hits the first job of
// its step it gets.
void maybe_arm(caf::event_based_actor* self, DriverState& s, const caf::actor& to, bool generator, int index,
               int64_t step) {
  const auto& faults = s.sh->opt->faults;
  for (size_t i = 0; i < faults.size(); ++i) {
    bool gen = false;
    int k = 0;
    if (s.fired[i] || !parse_rl_fault_target(faults[i].target, gen, k) || gen != generator || k != index) continue;
    if (step + 1 < faults[i].at_step) continue;
    s.fired[i] = 1;
    if (faults[i].kind == FaultKind::drop) {
      self->send(to, rlmsg::arm_drop_atom::value, faults[i].count);
      continue;
    }
    if (on_messages(faults[i].kind)) {  // delay, duplicate, pause: what is sent to it from now on
      if (s.injector) s.injector->arm(to, faults[i]);
      continue;
    }
    self->send(to, rlmsg::arm_atom::value, rl_kill_point(s, faults[i]));
  }
}

// Arms the rollout buffer when a not-yet-fired kill names it and step `step`
// (0-based) reaches its at_step: it dies at its next admission.
void maybe_arm_buffer(caf::event_based_actor* self, DriverState& s, int64_t step) {
  const auto& faults = s.sh->opt->faults;
  for (size_t i = 0; i < faults.size(); ++i) {
    if (s.fired[i] || !is_rl_buffer_target(faults[i].target) || step + 1 < faults[i].at_step) continue;
    s.fired[i] = 1;
    self->send(s.buffer, rlmsg::arm_atom::value, rl_kill_point(s, faults[i]));
  }
}

void deal(caf::event_based_actor* self, DriverState& s, int64_t step, bool redeal) {
  const int64_t v = version_for(s, step);
  const size_t k = static_cast<size_t>(step) % s.gens.size();
  if (!redeal) {
    std::lock_guard<std::mutex> lock(s.ctx->mu);
    s.ctx->events.push_back("deal " + std::to_string(step) + " " + std::to_string(v));
  }
  maybe_arm(self, s, s.gens[k], true, static_cast<int>(k), step);
  maybe_arm_buffer(self, s, step);
  // fixed_lag: the version the step needs; latest: the newest (>= v).
  send_sync(self, s, k, latest_mode(s) ? s.published : v);
  to_actor(self, s, s.gens[k], rlmsg::job_atom::value, step, v);
}

// Deals every step whose version is published, in step order.
void deal_ready(caf::event_based_actor* self, DriverState& s) {
  while (s.next < s.sh->steps && version_for(s, s.next) <= s.published) deal(self, s, s.next++, false);
}

void fail(caf::event_based_actor* self, DriverState& s, const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(s.ctx->mu);
    if (s.ctx->error.empty()) s.ctx->error = why;
  }
  // Unblocks the trainer: an empty batch means "stop, the run failed".
  if (s.trainer) self->send(s.trainer, rlmsg::batch_atom::value, rlmsg::Scored{}, int64_t{0}, int64_t{0}, int64_t{0});
}

caf::actor spawn_generator(caf::event_based_actor* self, DriverState& s, int k) {
  const auto i = static_cast<size_t>(k);
  if (s.incarnation.size() <= i) {
    s.incarnation.resize(i + 1, -1);
    s.last_sent.resize(i + 1, -1);
    s.unconfirmed.resize(i + 1);
    s.sync_kill.resize(i + 1, 0);
    s.gen_process.resize(i + 1, 0);
  }
  ++s.incarnation[i];
  s.last_sent[i] = -1;
  s.unconfirmed[i].clear();
  s.sync_kill[i] = 0;
  const int process = s.remote ? s.remote->process_of(k) : 0;
  s.gen_process[i] = process;
  if (process > 0)
    return self->spawn<caf::monitored>(generator_proxy, s.remote, k, process, s.incarnation[i],
                                       caf::actor_cast<caf::actor>(self));
  return self->spawn<caf::detached + caf::monitored>(generator_actor, s.sh, k, s.incarnation[i],
                                                     caf::actor_cast<caf::actor>(self));
}

// A generator process is lost (its host or a proxy found the link down):
// its generators restart on process 0 from now on.
void note_process_lost(caf::event_based_actor* self, DriverState& s, int process) {
  if (!s.remote || process <= 0 || !s.remote->lost.insert(process).second) return;
  if (!s.sh->opt->processes.recover) {
    fail(self, s, "generator process " + std::to_string(process) + " was lost ([topology] process_loss = \"fail\")");
    return;
  }
  note_survived_process_loss();
  // Its proxies go down now (one waiting for a spawn answer would otherwise
  // wait out its request timeout); each restarts on process 0.
  for (size_t k = 0; k < s.gens.size(); ++k)
    if (s.gen_process[k] == process) self->send_exit(s.gens[k], caf::exit_reason::remote_link_unreachable);
  std::lock_guard<std::mutex> lock(s.ctx->mu);
  ++s.ctx->report.processes_lost;
  s.ctx->events.push_back("process lost " + std::to_string(process));
}
caf::actor spawn_reward(caf::event_based_actor* self, DriverState& s, int k) {
  return self->spawn<caf::detached + caf::monitored>(reward_actor, s.sh, k);
}
caf::actor spawn_buffer(caf::event_based_actor* self, DriverState& s) {
  return self->spawn<caf::monitored>(buffer_actor, s.sh, s.ledger, s.store, caf::actor_cast<caf::actor>(self));
}

// The rollout buffer went down: a new one goes on from the store (what it
// had admitted and not yet handed over is still there); what was on its way
// to the dead one is lost, so every dealt step the coordinator has not heard
// admitted is dealt again (the ledger drops what the store already has and
// says so), and the trainer's request is sent again.
void respawn_buffer(caf::event_based_actor* self, DriverState& s, const caf::down_msg& dm) {
  if (++s.restarts > s.sh->opt->max_restarts) {
    fail(self, s, "rollout_buffer went down (" + caf::to_string(dm.reason) + ") after " +
                      std::to_string(s.sh->opt->max_restarts) + " restarts in this run: giving up");
    return;
  }
  s.buffer = spawn_buffer(self, s);
  int64_t first = -1;
  for (int64_t step = s.sh->first_step; step < s.next; ++step) {
    if (s.admitted.count(step)) continue;
    if (first < 0) first = step;
    deal(self, s, step, true);
  }
  if (s.take_step >= 0) self->send(s.buffer, rlmsg::take_atom::value, s.take_step, s.take_from);
  RestartEvent e;
  e.step = (first < 0 ? s.next : first) + 1;
  e.attempt = 1;
  e.actor = "rollout_buffer";
  e.cause = dm.reason == caf::exit_reason::kill ? "killed" : caf::to_string(dm.reason);
  e.phase = first < 0 ? "nothing in flight" : "unadmitted steps dealt again from step " + std::to_string(first + 1);
  std::lock_guard<std::mutex> lock(s.ctx->mu);
  s.ctx->restarts.push_back(e);
  s.ctx->unreported.push_back(e);
}

using DriverSelf = caf::stateful_actor<DriverState>;

// Supervision, one_for_one: a generator or reward actor that goes down is
// respawned alone under the same name, and every step routed through it
// that the ledger has not admitted is dealt again; rollouts are pure
// functions of (seed, step, index, version), so the re-run reproduces them
// and the ledger drops whatever the dead actor had delivered already.
void on_child_down(DriverSelf* self, caf::down_msg& dm) {
  DriverState& s = self->state;
  if (s.ending) {
    // Shutting down: each child's down is awaited, so an actor that died
    // just before the end (after delivering its last result) is still
    // counted, deterministically; nothing is respawned any more.
    s.awaiting.erase(dm.source);
    if (dm.reason != caf::exit_reason::user_shutdown && dm.source != s.buffer.address()) {
      RestartEvent e;
      e.step = s.next;
      e.attempt = 1;
      e.actor = "?";
      for (size_t k = 0; k < s.gens.size(); ++k)
        if (s.gens[k].address() == dm.source) e.actor = "generator:" + std::to_string(k);
      for (size_t k = 0; k < s.rewards.size(); ++k)
        if (s.rewards[k].address() == dm.source)
          e.actor = rl_reward_actor_name(s.sh->opt->train.rl.reward == rl::RewardSource::model, static_cast<int>(k));
      e.cause = dm.reason == caf::exit_reason::kill ? "killed" : caf::to_string(dm.reason);
      e.phase = "the run had ended: not respawned";
      std::lock_guard<std::mutex> lock(s.ctx->mu);
      s.ctx->restarts.push_back(e);
      s.ctx->unreported.push_back(e);
    }
    if (s.awaiting.empty()) self->quit(s.end_reason);
    return;
  }
  if (dm.reason == caf::exit_reason::user_shutdown) return;
  s.gone.insert(dm.source);  // dead for good: a respawn gets a new address
  if (s.remote)
    for (size_t p = 1; p < s.remote->hosts.size(); ++p)
      if (s.remote->hosts[p].address() == dm.source) return note_process_lost(self, s, static_cast<int>(p));
  bool generator = false;
  int index = -1;
  for (size_t k = 0; k < s.gens.size(); ++k)
    if (s.gens[k].address() == dm.source) generator = true, index = static_cast<int>(k);
  for (size_t k = 0; k < s.rewards.size() && index < 0; ++k)
    if (s.rewards[k].address() == dm.source) index = static_cast<int>(k);
  if (index < 0) {
    if (s.buffer.address() == dm.source) respawn_buffer(self, s, dm);
    return;
  }
  const std::string name = generator ? "generator:" + std::to_string(index)
                                     : rl_reward_actor_name(s.sh->opt->train.rl.reward == rl::RewardSource::model, index);
  // Only a proxy goes down with this reason: its process is gone (the
  // host's own down may have said so already). process_loss governs that,
  // not the restart budget: a process holding more generators than
  // max_restarts must not fail a run that recovers from its loss (each
  // generator moves to process 0 once, so this cannot repeat).
  const bool link_lost = generator && s.remote && dm.reason == caf::exit_reason::remote_link_unreachable;
  if (!link_lost && ++s.restarts > s.sh->opt->max_restarts) {
    fail(self, s, name + " went down (" + caf::to_string(dm.reason) + ") after " +
                      std::to_string(s.sh->opt->max_restarts) + " restarts in this run: giving up");
    return;
  }
  const bool missed_sync = generator && s.sync_kill[static_cast<size_t>(index)];
  const int was_on = link_lost ? s.gen_process[static_cast<size_t>(index)] : 0;
  if (link_lost) note_process_lost(self, s, was_on);
  if (link_lost && !s.sh->opt->processes.recover) return;
  if (generator) s.gens[static_cast<size_t>(index)] = spawn_generator(self, s, index);
  else s.rewards[static_cast<size_t>(index)] = spawn_reward(self, s, index);
  const size_t n = generator ? s.gens.size() : s.rewards.size();
  int64_t first = -1;
  for (int64_t step = s.sh->first_step; step < s.next; ++step) {
    if (s.admitted.count(step) || static_cast<size_t>(step) % n != static_cast<size_t>(index)) continue;
    if (first < 0) first = step;
    deal(self, s, step, true);
  }
  RestartEvent e;
  e.step = (first < 0 ? s.next : first) + 1;
  e.attempt = 1;
  e.actor = name;
  e.cause = missed_sync ? "weight sync deadline missed twice"
            : link_lost ? "process " + std::to_string(was_on) + " lost; restarted on process 0"
            : dm.reason == caf::exit_reason::kill ? "killed" : caf::to_string(dm.reason);
  e.phase = first < 0 ? "idle" : "its in-flight steps dealt again from step " + std::to_string(first + 1);
  std::lock_guard<std::mutex> lock(s.ctx->mu);
  s.ctx->restarts.push_back(e);
  s.ctx->unreported.push_back(e);
}

// The end of the run (the facade's exit): children go down with it.
void on_end(DriverSelf* self, caf::exit_msg& m) {
  DriverState& s = self->state;
  if (s.ending) return;
  s.ending = true;
  s.end_reason = m.reason;
  for (auto& a : s.gens) s.awaiting.insert(a.address());
  for (auto& a : s.rewards) s.awaiting.insert(a.address());
  s.awaiting.insert(s.buffer.address());
  for (const auto& a : s.gone) s.awaiting.erase(a);
  if (s.awaiting.empty()) return self->quit(s.end_reason);
  for (auto& a : s.gens) self->send_exit(a, caf::exit_reason::user_shutdown);
  for (auto& a : s.rewards) self->send_exit(a, caf::exit_reason::user_shutdown);
  self->send_exit(s.buffer, caf::exit_reason::user_shutdown);
}

// A version the trainer published: kept while a step may need it, pushed
// to every generator under latest; steps it unblocks are dealt.
void on_publish(DriverSelf* self, rlmsg::Weights& w) {
  DriverState& s = self->state;
  if (!s.trainer) s.trainer = caf::actor_cast<caf::actor>(self->current_sender());
  {
    std::lock_guard<std::mutex> lock(s.ctx->mu);
    s.ctx->events.push_back("publish " + std::to_string(w.version));
  }
  s.published = w.version;
  s.versions[w.version] = std::move(w);
  // Versions no undelivered step can need any more are dropped.
  int64_t lowest = s.next;
  for (int64_t step = s.sh->first_step; step < s.next; ++step)
    if (!s.admitted.count(step)) lowest = std::min(lowest, step);
  const int64_t keep = std::min(version_for(s, lowest), s.published);
  s.versions.erase(s.versions.begin(), s.versions.lower_bound(keep));
  // latest: every generator gets each version as it is published and
  // takes it at its next fence, mid-rollout or not.
  if (latest_mode(s))
    for (size_t k = 0; k < s.gens.size(); ++k) send_sync(self, s, k, s.published);
  deal_ready(self, s);
}

// A sync not confirmed in time: sent again once, then the generator is
// restarted (the down handler deals its unadmitted steps again).
void on_sync_deadline(DriverSelf* self, int k, int64_t incarnation, int64_t v, int attempt) {
  DriverState& s = self->state;
  const auto i = static_cast<size_t>(k);
  if (incarnation != s.incarnation[i] || s.sync_kill[i]) return;
  const auto it = s.unconfirmed[i].find(v);
  if (it == s.unconfirmed[i].end() || it->second != attempt) return;
  std::lock_guard<std::mutex> lock(s.ctx->mu);
  if (attempt == 1) {
    ++s.ctx->report.sync_retries;
    s.ctx->events.push_back("sync retry generator:" + std::to_string(k) + " " + std::to_string(v));
    if (!s.versions.count(v)) return;  // no step needs it any more
    send_sync(self, s, i, v, 2);
  } else {
    ++s.ctx->report.sync_restarts;
    s.ctx->events.push_back("sync restart generator:" + std::to_string(k) + " " + std::to_string(v));
    s.sync_kill[i] = 1;
    self->send_exit(s.gens[i], caf::exit_reason::kill);
  }
}

caf::behavior driver_actor(caf::stateful_actor<DriverState>* self, std::shared_ptr<const RlShared> sh,
                           std::shared_ptr<RunContext> ctx, std::shared_ptr<RlLedger> ledger,
                           std::shared_ptr<RemoteGenerators> remote) {
  DriverState& s = self->state;
  s.sh = sh;
  s.remote = remote;
  if (remote)
    for (auto& h : remote->hosts)
      if (h) self->monitor(h);
  s.ctx = ctx;
  s.ledger = ledger;
  s.store = std::make_shared<BufferStore>();
  s.fired.assign(sh->opt->faults.size(), 0);
  for (const FaultSpec& f : sh->opt->faults)
    if (on_messages(f.kind) && f.kind != FaultKind::drop && !s.injector) s.injector = std::make_shared<FaultInjector>();
  s.next = sh->first_step;  // resumed: the steps before it are in the checkpoint
  const rl::RlConfig& rl = sh->opt->train.rl;
  s.buffer = spawn_buffer(self, s);
  for (int k = 0; k < rl.generators; ++k) s.gens.push_back(spawn_generator(self, s, k));
  for (int k = 0; k < rl.reward_actors; ++k) s.rewards.push_back(spawn_reward(self, s, k));
  self->set_down_handler([self](caf::down_msg& dm) { on_child_down(self, dm); });
  self->set_exit_handler([self](caf::exit_msg& m) { on_end(self, m); });
  return {
      [self](rlmsg::publish_atom, rlmsg::Weights& w) { on_publish(self, w); },
      [self](rlmsg::synced_atom, int k, int64_t incarnation, int64_t v) {
        DriverState& s = self->state;
        if (incarnation != s.incarnation[static_cast<size_t>(k)]) return;  // from a dead incarnation
        auto& open = s.unconfirmed[static_cast<size_t>(k)];
        // latest: a generator holding version v needs no older one; fixed_lag
        // samples each step with its exact version, so each sync counts.
        if (latest_mode(s)) open.erase(open.begin(), open.upper_bound(v));
        else open.erase(v);
      },
      [self](rlmsg::deadline_atom, int k, int64_t incarnation, int64_t v, int attempt) {
        on_sync_deadline(self, k, incarnation, v, attempt);
      },
      [self](rlmsg::rollout_atom, rlmsg::Rollout& r) {
        DriverState& s = self->state;
        const int64_t step = r.r->step;
        const size_t k = static_cast<size_t>(step) % s.rewards.size();
        maybe_arm(self, s, s.rewards[k], false, static_cast<int>(k), step);
        to_actor(self, s, s.rewards[k], rlmsg::score_atom::value, std::move(r), s.buffer);
      },
      [self](rlmsg::admitted_atom, int64_t step, bool ok) {
        DriverState& s = self->state;
        if (ok) s.admitted.insert(step);
        else deal(self, s, step, true);  // refused by admission: sample it again
      },
      [self](rlmsg::take_atom, int64_t step, const caf::actor& trainer) {
        DriverState& s = self->state;
        s.take_step = step;
        s.take_from = trainer;
        self->send(s.buffer, rlmsg::take_atom::value, step, trainer);
      },
  };
}

// The trainer actor: the one RL loop (rl::run_rl_loop) where each step
// takes its rollouts from the buffer, trains on them with the existing
// in-process update (rl::RlTrainer::train_on) and publishes the new version.
void trainer_actor(caf::blocking_actor* self, std::shared_ptr<const RlShared> sh, std::shared_ptr<RunContext> ctx,
                   caf::actor driver) {
  const RlActorOptions& o = *sh->opt;
  try {
    rl::RlTrainer tr(o.train, o.make_task ? o.make_task() : nullptr);
    // The versions a checkpoint must carry (fixed_lag resumes re-publish them).
    std::map<int64_t, std::shared_ptr<const std::vector<float>>> kept;
    const int64_t eta = o.train.rl.max_staleness;
    auto publish_params = [&](int64_t version, std::shared_ptr<const std::vector<float>> params) {
      kept[version] = params;
      kept.erase(kept.begin(), kept.lower_bound(version - eta));
      self->send(driver, rlmsg::publish_atom::value, rlmsg::Weights::of(version, std::move(params)));
    };
    auto publish = [&](int64_t version) {
      publish_params(version, std::make_shared<const std::vector<float>>(tr.parameters()));
    };
    for (const auto& [v, params] : sh->resume_versions) publish_params(v, params);
    publish(tr.steps_done());
    auto after_save = [&](const std::string& dir) {
      rl::save_versions(dir, o.train.model, o.train.seed, rl::versions_to_keep(tr.steps_done(), eta), kept);
    };
    RlActorReport& rep = ctx->report;
    double gen_busy = 0.0;
    auto step_fn = [&]() -> rl::RlStepMetrics {
      const int64_t step = tr.steps_done();
      const auto tw = Clock::now();
      self->send(driver, rlmsg::take_atom::value, step, caf::actor_cast<caf::actor>(self));
      rlmsg::Scored got;
      int64_t depth = 0, discarded = 0, duplicates = 0;
      self->receive([&](rlmsg::batch_atom, rlmsg::Scored& sc, int64_t d, int64_t disc, int64_t dup) {
        got = std::move(sc);
        depth = d;
        discarded = disc;
        duplicates = dup;
      });
      if (!got.scored) {
        std::lock_guard<std::mutex> lock(ctx->mu);
        throw std::runtime_error(ctx->error);
      }
      const double wait = seconds_since(tw);
      const rl::RlStepMetrics m = tr.train_on(*got.rollout.r, *got.scored, got.reward_seconds);
      publish(step + 1);
      RlActorStepMetrics am;
      am.step = m.step;
      am.sampled_version = got.rollout.r->version;
      for (const model::Completion& c : got.rollout.r->completions) {
        rl::add_version_lags(am.staleness, c.versions, step);
        am.mixed_completions += rl::distinct_versions(c.versions) > 1;
      }
      am.paused_seconds = got.rollout.paused_seconds;
      rep.paused_seconds += got.rollout.paused_seconds;
      rep.mixed_completions += am.mixed_completions;
      for (const auto& [lag, n] : am.staleness) rep.staleness[lag] += n;
      am.buffer_depth = depth;
      am.discarded = discarded;
      am.duplicates = duplicates;
      am.trainer_wait_seconds = wait;
      am.weight_sync_seconds = got.rollout.sync_seconds;
      am.weight_sync_bytes = got.rollout.sync_bytes;
      gen_busy += got.rollout.busy_seconds;
      rep.trainer_wait_seconds += wait;
      rep.generator_busy_seconds = gen_busy;
      rep.weight_sync_seconds += got.rollout.sync_seconds;
      rep.weight_sync_bytes += got.rollout.sync_bytes;
      rep.weight_syncs += got.rollout.loads;
      rep.max_buffer_depth = std::max(rep.max_buffer_depth, depth);
      const double wall = seconds_since(ctx->t0);
      const double gens = static_cast<double>(o.train.rl.generators);
      am.trainer_idle = wall > 0 ? rep.trainer_wait_seconds / wall : 0.0;
      am.generator_idle = wall > 0 ? std::max(0.0, 1.0 - gen_busy / (gens * wall)) : 0.0;
      std::vector<RestartEvent> news;
      {
        std::lock_guard<std::mutex> lock(ctx->mu);
        news.swap(ctx->unreported);
      }
      for (const RestartEvent& e : news) ctx->observer->on_restart(e);
      ctx->observer->on_actor_step(am);
      return m;
    };
    ctx->summary = rl::run_rl_loop(tr, o.train, *ctx->observer, step_fn, after_save);
    rep.parameters = tr.parameters();
  } catch (const std::exception& e) {
    std::lock_guard<std::mutex> lock(ctx->mu);
    if (ctx->error.empty()) ctx->error = std::string("trainer: ") + e.what();
  }
}

}  // namespace

rl::RlSummary train_decoupled(const RlActorOptions& options, RlActorObserver& observer, RlActorReport* report) {
  const rl::RlConfig& rl = options.train.rl;
  if (!rl::decoupled(rl.sync))
    throw std::invalid_argument("train_decoupled: rl.sync must be \"fixed_lag\" or \"latest\"");
  for (const rl::ConfigProblem& p : rl::check_config(rl)) throw std::invalid_argument("rl." + p.key + ": " + p.message);
  for (const FaultSpec& f : options.faults) {
    bool gen = false;
    int k = 0;
    if (is_rl_buffer_target(f.target)) {
      if (f.kind != FaultKind::kill || f.at_message < 0 || f.at_message > kRlKillPoints)
        throw std::invalid_argument("train_decoupled: fault on rollout_buffer: only a kill at a point 0.." +
                                    std::to_string(kRlKillPoints));
      continue;
    }
    const bool ok = parse_rl_fault_target(f.target, gen, k) && k < (gen ? rl.generators : rl.reward_actors) &&
                    (gen || f.target == rl_reward_actor_name(rl.reward == rl::RewardSource::model, k)) &&
                    ((f.kind == FaultKind::kill && f.at_message >= 0 && f.at_message <= kRlKillPoints) ||
                     (f.kind == FaultKind::drop && gen && f.count >= 1) ||
                     (f.kind == FaultKind::duplicate && f.count >= 1) ||
                     (f.kind == FaultKind::delay && f.count >= 1 && f.delay_ms > 0) ||
                     (f.kind == FaultKind::pause && f.duration_ms > 0));
    if (!ok)
      throw std::invalid_argument("train_decoupled: fault target \"" + f.target + "\" (kind " + fault_kind_name(f.kind) +
                                  ") is neither a kill of an existing generator:K or reward:K (reward_model:K with rl.reward = \"model\") at a point 0.." +
                                  std::to_string(kRlKillPoints) + ", a duplicate, delay or pause of one, nor a drop of count >= 1 on a generator:K");
  }
  auto sh = std::make_shared<RlShared>();
  sh->opt = &options;
  sh->seed = options.train.seed;
  sh->steps = options.train.steps;
  if (!options.train.resume_from.empty()) {
    // The checkpoint's step, and the older versions the next eta steps are
    // sampled by (throws model::CheckpointError naming a missing one).
    const model::TrainingState st = model::load_checkpoint(options.train.resume_from);
    sh->first_step = st.step;
    for (auto& [v, params] : rl::load_versions(options.train.resume_from, options.train.model,
                                               rl::versions_to_keep(st.step, rl.max_staleness)))
      sh->resume_versions.emplace(v, std::make_shared<const std::vector<float>>(std::move(params)));
  }
  auto ctx = std::make_shared<RunContext>();
  ctx->observer = &observer;
  ctx->t0 = Clock::now();
  auto ledger = std::make_shared<RlLedger>();
  const bool multi = options.processes.comm && options.processes.comm->size() > 1;
  std::shared_ptr<RemoteGenerators> remote;
  {
    caf::actor_system_config cfg;
    register_caf_types(cfg);
    configure_scheduler(cfg);
    std::shared_ptr<void> cluster_files;
    if (multi) cluster_files = configure_rl_cluster(cfg, options.processes);
    caf::actor_system sys{cfg};
    // The hosts watch this actor: it lives until they were told the run ended.
    caf::actor anchor;
    if (multi) {
      remote = connect_generator_hosts(sys, *sh);
      anchor = sys.spawn([](caf::event_based_actor*) -> caf::behavior { return {[](int) {}}; });
      for (auto& h : remote->hosts)
        if (h) caf::anon_send(h, rlmsg::hello_atom::value, anchor);
    }
    caf::actor driver = sys.spawn(driver_actor, sh, ctx, ledger, remote);
    caf::actor trainer = sys.spawn(trainer_actor, sh, ctx, driver);
    caf::scoped_actor self{sys};
    self->wait_for(trainer);
    self->send_exit(driver, caf::exit_reason::user_shutdown);
    if (multi) {
      self->wait_for(driver);
      shutdown_generator_hosts(sys, *remote, ctx->error.empty());
      self->send_exit(anchor, caf::exit_reason::user_shutdown);
    }
  }  // the system waits for every actor to finish
  if (multi) {
    set_bulk_shm_threshold(0);
    bulk_shm_cleanup();
  }
  if (!ctx->error.empty()) throw std::runtime_error(ctx->error);
  RlActorReport& rep = ctx->report;
  if (remote) {
    const RemoteSyncStats& st = *remote->stats;
    rep.remote_syncs = st.syncs;
    rep.remote_sync_bytes = st.bytes;
    rep.remote_sync_seconds = st.round_trip;
    rep.remote_encode_seconds = st.encode;
    rep.remote_decode_seconds = st.decode;
    rep.memcpy_seconds = st.memcpy_seconds;
  }
  rep.wall_seconds = seconds_since(ctx->t0);
  rep.ledger = *ledger;
  rep.restarts = ctx->restarts;
  rep.events = ctx->events;
  rep.reward_program_restarts = sh->reward_program_restarts->load();
  const double gens = static_cast<double>(rl.generators);
  rep.generator_idle = rep.wall_seconds > 0 ? std::max(0.0, 1.0 - rep.generator_busy_seconds / (gens * rep.wall_seconds)) : 0;
  rep.trainer_idle = rep.wall_seconds > 0 ? rep.trainer_wait_seconds / rep.wall_seconds : 0;
  for (const RestartEvent& e : ctx->unreported) observer.on_restart(e);
  if (report) *report = rep;
  return ctx->summary;
}

}  // namespace troupe::runtime
