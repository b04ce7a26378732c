// The generator, reward and rollout-buffer actors of decoupled RL (see
// rl_actors.hpp and the protocol in rl_messages.hpp).
#include <chrono>
#include <deque>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "actors/rl/rl_actors.hpp"
#include "actors/rl/rl_messages.hpp"
#include "rl/rm_reward.hpp"
#include "rl/staleness.hpp"
#include "rl/task.hpp"
#include "model/clock.hpp"

namespace troupe::runtime {

namespace {

using model::Clock;
using model::seconds_since;


// `log_name` names a reward program's stderr lines in the run's log.
std::unique_ptr<rl::Task> task_for(const RlShared& sh, const std::string& log_name = "reward") {
  const rl::RlTrainOptions& o = sh.opt->train;
  if (sh.opt->make_task) return sh.opt->make_task();
  rl::RlConfig rl = o.rl;
  rl.reward_log_name = log_name;
  return rl::make_task(rl, o.data, sh.seed);
}

// An exception in a handler ends the actor with its text as the exit reason,
// so the coordinator's restart report (and the run's error) says what broke.
void report_exceptions(caf::scheduled_actor* self) {
  self->set_exception_handler([](caf::scheduled_actor*, std::exception_ptr& e) -> caf::error {
    try {
      std::rethrow_exception(e);
    } catch (const std::exception& x) {
      return caf::make_error(caf::sec::runtime_error, std::string(x.what()));
    } catch (...) {
      return caf::make_error(caf::sec::runtime_error, std::string("unknown exception"));
    }
  });
}

}  // namespace

caf::behavior generator_actor(caf::event_based_actor* self, std::shared_ptr<const RlShared> sh, int index,
                              int64_t incarnation, caf::actor driver) {
  report_exceptions(self);
  struct Job {
    int64_t step = 0, version = 0;  // fixed_lag: exactly `version`; latest: at least
    uint32_t kill = 0;              // the kill point armed for it
  };
  struct Running {
    Job job;
    rlmsg::Rollout out;  // its figures
  };
  struct State {
    std::unique_ptr<rl::Task> task;
    std::unique_ptr<rl::PolicyCopy> copy;    // this generator's weights, versions and running steps
    std::map<int64_t, rlmsg::Weights> have;  // confirmed versions not yet needed or superseded
    std::deque<Job> jobs;                    // dealt, not started (no room in the slots yet, or no weights)
    std::map<int64_t, Running> running;      // by the copy's ticket: at most two, side by side in the slots
    Clock::time_point idle_since = Clock::now();
    // Busy time is split between delivered rollouts: each gets the time since
    // the previous delivery (or since the generator last went busy), so
    // overlapping steps are not counted twice.
    Clock::time_point accounted_until = Clock::now();
    bool decoding = false;  // a decode message is on its way
    uint32_t armed = 0;     // kill point for the next job (0: none)
    int64_t drop = 0;       // syncs still to lose
  };
  auto st = std::make_shared<State>();
  const rl::RlConfig& rl = sh->opt->train.rl;
  st->task = task_for(*sh);
  st->copy = std::make_unique<rl::PolicyCopy>(sh->opt->train.model, sh->opt->train.backend, rl::generation_slots(rl));
  const bool latest = rl.sync == rl::SyncMode::latest;
  // Copies `w` in (the fence) and counts it against `r`.
  auto load = [st](const rlmsg::Weights& w, Running& r) {
    const auto ts = Clock::now();
    st->copy->load(w.values(), w.version);
    r.out.sync_seconds += seconds_since(ts);
    r.out.sync_bytes += static_cast<int64_t>(w.size * sizeof(float));
    ++r.out.loads;
  };
  // Starts dealt jobs while the slots have room for one (the running step
  // has every sequence in a slot) and the weights it needs are in.
  auto try_start = [self, st, sh, index, latest, load]() {
    while (st->copy->can_begin() && !st->jobs.empty()) {
      const Job j = st->jobs.front();
      const rlmsg::Weights* w = nullptr;
      if (latest) {
        if (!st->have.empty() && st->have.rbegin()->first >= j.version) w = &st->have.rbegin()->second;
      } else if (auto it = st->have.find(j.version); it != st->have.end()) {
        w = &it->second;
      }
      if (!w) break;  // paused until the sync arrives
      st->jobs.pop_front();
      Running r;
      r.job = j;
      r.out.generator = index;
      if (st->running.empty()) {
        r.out.paused_seconds = seconds_since(st->idle_since);
        st->accounted_until = Clock::now();
      }
      if (st->copy->version() != w->version) load(*w, r);
      if (!latest) st->have.erase(st->have.begin(), st->have.lower_bound(j.version));
      const int64_t ticket = st->copy->begin(*st->task, sh->opt->train.rl, sh->seed, j.step);
      st->running.emplace(ticket, std::move(r));
    }
    if (!st->decoding && st->copy->generating()) {
      st->decoding = true;
      self->send(self, rlmsg::decode_atom::value);
    }
  };
  return {
      [st](rlmsg::arm_atom, uint32_t point) { st->armed = point; },
      [st](rlmsg::arm_drop_atom, int64_t n) { st->drop = n; },
      [self, st, index, incarnation, driver, latest, try_start](rlmsg::sync_atom, rlmsg::Weights& w) {
        if (st->drop > 0) {  // the transfer is lost: no copy, no confirmation
          --st->drop;
          return;
        }
        const int64_t v = w.version;
        st->have[v] = std::move(w);
        // latest needs only the newest version; fixed_lag keeps what its
        // queued jobs may need (pruned as jobs start).
        if (latest) st->have.erase(st->have.begin(), st->have.lower_bound(st->have.rbegin()->first));
        self->send(driver, rlmsg::synced_atom::value, index, incarnation, v);
        try_start();
      },
      [self, st, try_start](rlmsg::job_atom, int64_t step, int64_t version) {
        const uint32_t kill = std::exchange(st->armed, 0);
        if (kill == 1) return self->quit(caf::exit_reason::kill);
        st->jobs.push_back({step, version, kill});
        try_start();
      },
      [self, st, sh, driver, latest, load, try_start](rlmsg::decode_atom) {
        st->decoding = false;
        // The fence: between two decode steps. latest takes the newest
        // version received since the last one, for every running step;
        // fixed_lag never switches inside a rollout (tests/rl/rl_protocol_test.cpp
        // drives it message by message on CAF's test coordinator).
        if (latest && !st->have.empty() && st->have.rbegin()->first > st->copy->version() && !st->running.empty()) {
          load(st->have.rbegin()->second, st->running.begin()->second);
          st->copy->adopt_newest(sh->opt->train.rl.recompute_kv);
          for (auto& [ticket, r] : st->running) ++r.out.switches;
        }
        st->copy->decode();
        while (std::optional<rl::PolicyCopy::Finished> done = st->copy->take_finished()) {
          const auto it = st->running.find(done->ticket);
          Running r = std::move(it->second);
          st->running.erase(it);
          r.out.busy_seconds = seconds_since(st->accounted_until);
          st->accounted_until = Clock::now();
          r.out.r = std::make_shared<const rl::StepRollouts>(std::move(done->rollouts));
          if (st->running.empty()) st->idle_since = Clock::now();
          if (r.job.kill == 2) return self->quit(caf::exit_reason::kill);  // the work is lost with the actor
          self->send(driver, rlmsg::rollout_atom::value, std::move(r.out));
          if (r.job.kill == 3) return self->quit(caf::exit_reason::kill);  // died after delivering
        }
        try_start();
      },
  };
}

caf::behavior reward_actor(caf::event_based_actor* self, std::shared_ptr<const RlShared> sh, int index) {
  report_exceptions(self);
  struct State {
    std::unique_ptr<rl::Task> task;
    // rl.reward = "model" (reward_model:K): its own backend and the frozen
    // RM, which scores all of a step's completions in one batch.
    std::unique_ptr<kernels::Backend> be;
    std::unique_ptr<rl::ModelReward> rm;
    uint32_t armed = 0;
    int64_t program_restarts = 0;  // of this incarnation's reward program, already counted
  };
  auto st = std::make_shared<State>();
  st->task = task_for(*sh, rl_reward_actor_name(false, index));
  const rl::RlTrainOptions& o = sh->opt->train;
  if (o.rl.reward == rl::RewardSource::model) {
    st->be = kernels::make_backend(o.backend);
    const int64_t rows = o.rl.prompts_per_step * o.rl.group_size;
    const int64_t longest = static_cast<int64_t>(st->task->train_prompt(0).tokens.size()) + o.rl.max_new_tokens + 1;
    st->rm = std::make_unique<rl::ModelReward>(*st->be, o.model, o.rl.reward_model, *st->task, rows, longest);
  }
  return {
      [st](rlmsg::arm_atom, uint32_t point) { st->armed = point; },
      [self, st, sh](rlmsg::score_atom, const rlmsg::Rollout& r, const caf::actor& buffer) {
        const uint32_t kill = std::exchange(st->armed, 0);
        if (kill == 1) return self->quit(caf::exit_reason::kill);
        const auto t0 = Clock::now();
        rlmsg::Scored out;
        out.rollout = r;
        out.scored = std::make_shared<const rl::ScoredBatch>(
            st->rm ? st->rm->score_step(sh->opt->train.rl, *r.r) : rl::score_step(*st->task, sh->opt->train.rl, *r.r));
        out.reward_seconds = seconds_since(t0);
        if (!st->rm) {  // a reward program's restarts during this batch
          const int64_t now = st->task->verifier().program_restarts();
          sh->reward_program_restarts->fetch_add(now - st->program_restarts);
          st->program_restarts = now;
        }
        if (kill == 2) return self->quit(caf::exit_reason::kill);
        self->send(buffer, rlmsg::admit_atom::value, std::move(out));
        if (kill == 3) self->quit(caf::exit_reason::kill);
      },
  };
}

caf::behavior buffer_actor(caf::event_based_actor* self, std::shared_ptr<const RlShared> sh,
                           std::shared_ptr<RlLedger> ledger, std::shared_ptr<BufferStore> st, caf::actor driver) {
  report_exceptions(self);
  auto armed = std::make_shared<uint32_t>(0);
  const int64_t eta = sh->opt->train.rl.max_staleness;
  const rl::SyncMode mode = sh->opt->train.rl.sync;
  // Hands step `want` to the trainer once it is in; the ledger records it as
  // trained exactly once.
  auto deliver = [self, st, ledger]() {
    auto it = st->ready.find(st->want);
    if (st->want < 0 || it == st->ready.end()) return;
    const int64_t depth = static_cast<int64_t>(st->ready.size());
    for (const rl::GroupId& id : it->second.rollout.r->ids) {
      if (!st->trained.insert(id).second) ++ledger->double_trained;
      ledger->trained.push_back(id);
    }
    self->send(st->trainer, rlmsg::batch_atom::value, std::move(it->second), depth, ledger->discarded,
               ledger->duplicates);
    st->ready.erase(it);
    st->want = -1;
  };
  return {
      [armed](rlmsg::arm_atom, uint32_t point) { *armed = point; },
      [self, st, ledger, eta, mode, deliver, driver, armed](rlmsg::admit_atom, rlmsg::Scored& s) {
        const uint32_t kill = std::exchange(*armed, 0);
        if (kill == 1) return self->quit(caf::exit_reason::kill);
        const rl::StepRollouts& r = *s.rollout.r;
        const int64_t n = static_cast<int64_t>(r.ids.size());
        // Exactly once: a group the ledger has seen (a generator or reward
        // actor restarted after it delivered, and its job was re-run; or the
        // buffer died before it told the coordinator) is dropped, and the
        // coordinator hears again that its step is in.
        bool seen = false;
        for (const rl::GroupId& id : r.ids) seen = seen || st->admitted.count(id) > 0;
        if (seen) {
          ledger->duplicates += n;
          self->send(driver, rlmsg::admitted_atom::value, r.step, true);
          return;
        }
        // Admission (rl/staleness.hpp): the trainer trains step s at version
        // s; fixed_lag wants every token of version max(0, s - eta) exactly,
        // latest any version in [s - eta, s]. Anything else is refused (and
        // dealt again); generators are paused, not discarded, so this stays 0.
        const rl::VersionWindow window = rl::admissible_versions(mode, r.step, eta);
        bool ok = true;
        for (const model::Completion& c : r.completions) ok = ok && rl::within(c.versions, window);
        if (!ok) {
          ledger->discarded += n;
          self->send(driver, rlmsg::admitted_atom::value, r.step, false);
          return;
        }
        for (const rl::GroupId& id : r.ids) {
          st->admitted.insert(id);
          ledger->admitted.push_back(id);
        }
        const int64_t step = r.step;
        st->ready.emplace(step, std::move(s));
        if (kill == 2) return self->quit(caf::exit_reason::kill);  // stored; the coordinator never heard
        self->send(driver, rlmsg::admitted_atom::value, step, true);
        deliver();
        if (kill == 3) self->quit(caf::exit_reason::kill);
      },
      [st, deliver](rlmsg::take_atom, int64_t step, const caf::actor& trainer) {
        st->trainer = trainer;
        st->want = step;
        deliver();
      },
  };
}

}  // namespace troupe::runtime
