// The generator, reward and rollout-buffer actors of decoupled RL (see
// rl_actors.hpp and the protocol in rl_messages.hpp).
#include <chrono>
#include <set>
#include <utility>

#include "actors/rl/rl_actors.hpp"
#include "actors/rl/rl_messages.hpp"
#include "rl/task.hpp"

namespace troupe::runtime {

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

std::unique_ptr<rl::Task> task_for(const RlShared& sh) {
  const rl::RlTrainOptions& o = sh.opt->train;
  return sh.opt->make_task ? sh.opt->make_task() : rl::make_task(o.rl.task, o.data, sh.seed, o.rl.verifier);
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
                              caf::actor driver) {
  report_exceptions(self);
  struct State {
    std::unique_ptr<rl::Task> task;
    std::unique_ptr<rl::PolicyCopy> copy;  // this generator's weights and their version
    uint32_t armed = 0;                    // kill point for the next job (0: none)
  };
  auto st = std::make_shared<State>();
  st->task = task_for(*sh);
  st->copy = std::make_unique<rl::PolicyCopy>(sh->opt->train.model, sh->opt->train.backend);
  return {
      [st](rlmsg::arm_atom, uint32_t point) { st->armed = point; },
      [self, st, sh, index, driver](rlmsg::job_atom, int64_t step, const rlmsg::Weights& w) {
        const uint32_t kill = std::exchange(st->armed, 0);
        if (kill == 1) return self->quit(caf::exit_reason::kill);
        const auto t0 = Clock::now();
        rlmsg::Rollout out;
        out.generator = index;
        // The fence: a new version is copied in between generations, never
        // while a batch is being decoded.
        if (st->copy->version() != w.version) {
          const auto ts = Clock::now();
          st->copy->load(*w.params, w.version);
          out.sync_seconds = since(ts);
          out.sync_bytes = static_cast<int64_t>(w.params->size() * sizeof(float));
        }
        out.r = std::make_shared<const rl::StepRollouts>(st->copy->sample(*st->task, sh->opt->train.rl, sh->seed, step));
        out.busy_seconds = since(t0);
        if (kill == 2) return self->quit(caf::exit_reason::kill);  // the work is lost with the actor
        self->send(driver, rlmsg::rollout_atom::value, std::move(out));
        if (kill == 3) self->quit(caf::exit_reason::kill);  // died after delivering
      },
  };
}

caf::behavior reward_actor(caf::event_based_actor* self, std::shared_ptr<const RlShared> sh, int,
                           caf::actor buffer) {
  report_exceptions(self);
  struct State {
    std::unique_ptr<rl::Task> task;
    uint32_t armed = 0;
  };
  auto st = std::make_shared<State>();
  st->task = task_for(*sh);
  return {
      [st](rlmsg::arm_atom, uint32_t point) { st->armed = point; },
      [self, st, sh, buffer](rlmsg::score_atom, const rlmsg::Rollout& r) {
        const uint32_t kill = std::exchange(st->armed, 0);
        if (kill == 1) return self->quit(caf::exit_reason::kill);
        const auto t0 = Clock::now();
        rlmsg::Scored out;
        out.rollout = r;
        out.scored = std::make_shared<const rl::ScoredBatch>(rl::score_step(*st->task, sh->opt->train.rl, *r.r));
        out.reward_seconds = since(t0);
        if (kill == 2) return self->quit(caf::exit_reason::kill);
        self->send(buffer, rlmsg::admit_atom::value, std::move(out));
        if (kill == 3) self->quit(caf::exit_reason::kill);
      },
  };
}

caf::behavior buffer_actor(caf::event_based_actor* self, std::shared_ptr<const RlShared> sh,
                           std::shared_ptr<RlLedger> ledger, caf::actor driver) {
  report_exceptions(self);
  struct State {
    std::map<int64_t, rlmsg::Scored> ready;  // admitted steps not yet trained, by step
    std::set<rl::GroupId> admitted, trained;
    int64_t want = -1;  // the step the trainer waits for (-1: none)
    caf::actor trainer;
  };
  auto st = std::make_shared<State>();
  const int64_t eta = sh->opt->train.rl.max_staleness;
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
      [self, st, ledger, eta, deliver, driver](rlmsg::admit_atom, rlmsg::Scored& s) {
        const rl::StepRollouts& r = *s.rollout.r;
        const int64_t n = static_cast<int64_t>(r.ids.size());
        // Exactly once: a group the ledger has seen (a generator or reward
        // actor restarted after it delivered, and its job was re-run) is dropped.
        bool seen = false;
        for (const rl::GroupId& id : r.ids) seen = seen || st->admitted.count(id) > 0;
        if (seen) {
          ledger->duplicates += n;
          return;
        }
        // Admission: fixed lag means exactly version max(0, step - eta); a
        // rollout of any other version is refused (and dealt again).
        const int64_t expected = std::max<int64_t>(0, r.step - eta);
        if (r.version != expected) {
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
        self->send(driver, rlmsg::admitted_atom::value, step, true);
        deliver();
      },
      [st, deliver](rlmsg::take_atom, int64_t step, const caf::actor& trainer) {
        st->trainer = trainer;
        st->want = step;
        deliver();
      },
  };
}

}  // namespace troupe::runtime
