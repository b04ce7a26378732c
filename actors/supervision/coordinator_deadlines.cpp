// The coordinator's deadlines and its replays of lost messages (see
// coordinator_state.hpp and docs/faults.md "Adaptive deadlines"): the
// explicit or adaptive step deadline, the message deadline that watches the
// run fall silent, and the one replay path that the step deadline, the
// message deadline, a sequence gap and a damaged message share.
#include "actors/supervision/coordinator_state.hpp"

namespace troupe::runtime::coord {

// Seconds as the delayed_send duration.
std::chrono::microseconds seconds(double t) {
  return std::chrono::duration_cast<std::chrono::microseconds>(std::chrono::duration<double>(t));
}

// The running attempt's step deadline: the explicit one, or the adaptive one
// (RuntimeOptions::step_deadline), doubled by each replay of the step.
double step_deadline(const CoordState& s) {
  const RuntimeOptions& o = s.sh->opt;
  if (o.step_deadline > 0) return o.step_deadline;
  const double base = s.step_times.ready() ? s.step_times.deadline()
                      : s.slowest > 0      ? std::max(3.0, 4.0 * s.slowest)
                                           : 120.0;  // first step: OpenCL kernels may compile
  return std::ldexp(base, static_cast<int>(std::min<uint32_t>(s.deadline_replays, 16)));
}

// The running attempt's message deadline: how long the run may stay silent
// (RuntimeOptions::step_deadline); 0: none (an explicit step_deadline, more
// than one process, or the first step).
double message_deadline(const CoordState& s) {
  const RuntimeOptions& o = s.sh->opt;
  if (o.step_deadline > 0 || !s.sh->activity) return 0.0;
  const double base =
      s.silences.ready() ? s.silences.deadline() : std::max(o.message_suspicion.floor, 2.0 * s.slowest);
  return std::ldexp(base, static_cast<int>(std::min<uint32_t>(s.quiet_replays, 16)));
}

namespace {

// The actors that have not reported the running step done.
std::string waiting_for(const CoordState& s) {
  const auto& sh = *s.sh;
  std::string waiting;
  const auto plan = live_plan(sh);
  for (int r = 0; r < sh.opt.data_parallel; ++r) {
    for (int k = 0; k < sh.plan.sl.num_ranks; ++k)
      if (!s.finished.count(std::make_pair(static_cast<uint32_t>(r), static_cast<uint32_t>(k))))
        waiting += (waiting.empty() ? "" : ", ") + sh.plan.rank(r, k).name;
    for (int x = 0; x < plan->num_producers(); ++x)
      if (!s.finished.count(std::make_pair(static_cast<uint32_t>(r), kExpertProducerBase + static_cast<uint32_t>(x))))
        waiting += (waiting.empty() ? "" : ", ") + plan->expert(r, x).name;
  }
  return waiting.empty() ? "the optimizer shards" : waiting;
}

std::string milliseconds_text(double seconds) {
  char b[32];
  std::snprintf(b, sizeof b, "%.3g ms", 1e3 * seconds);
  return b;
}

// A message of the running attempt is lost for sure, or taken for lost (no
// actor died): fail the step if `counted` and the step has used up
// max_restarts such replays (the error: `failure` + " in N attempt(s)..."),
// else discard the attempt and replay the step from its snapshot now
// (messages of the old attempt are dropped wherever they arrive). `ev`
// says why (its flags and cause); `role` is the role the repair is
// attributed to ("" for the step's first lost-message fault's).
void replay_lost(Self* self, bool counted, const std::string& failure, RestartEvent ev, const std::string& role) {
  auto& s = self->state;
  const auto& sh = *s.sh;
  const int64_t step1 = static_cast<int64_t>(s.step) + 1;
  if (counted && static_cast<int>(++s.deadline_replays) > sh.opt.max_restarts) {
    s.error = "step " + std::to_string(step1) + " " + failure;
    s.error.replace(s.error.find("{N}"), 3, std::to_string(s.deadline_replays));
    s.running = false;
    s.reply.deliver(caf::make_error(caf::sec::runtime_error, s.error));
    return;
  }
  if (!counted) ++s.quiet_replays;
  update_stats(sh, [&](FaultSummary& st) {
    ++st.replays;
    st.suspicions += ev.deadline;
    st.gaps += ev.gap;
  });
  repair_starts(s, role.empty() ? s.message_fault_role : role);
  if (ev.actor.empty()) ev.actor = waiting_for(s);
  ++s.attempt;
  s.sup->restore_all(self, s.step, s.attempt);
  start_step(self);
  ev.step = step1;
  ev.attempt = static_cast<int>(s.attempt) + 1;
  ev.replayed = true;
  try {
    if (sh.on_restart) sh.on_restart(ev);
  } catch (const std::exception&) {
  }
}

}  // namespace

// The running attempt missed its step deadline: no actor died, but a
// message was lost or an actor is frozen (or computes forever).
void on_deadline(Self* self, uint64_t step, uint32_t attempt, double limit) {
  auto& s = self->state;
  if (!s.running || step != s.step || attempt != s.attempt || !s.error.empty()) return;  // it finished
  char secs[32];
  std::snprintf(secs, sizeof secs, "%.3g s", limit);
  RestartEvent ev;
  ev.deadline = true;
  ev.cause = std::string("no progress within ") + secs;
  replay_lost(self, true, "made " + ev.cause + " in {N} attempt(s); waiting for " + waiting_for(s), ev, "");
}

// The message deadline's check: has the run been silent (nothing posted, no
// device with work) for as long as the deadline allows? If not, look again
// when it could first have been. Its replays double the next deadline and
// are not counted against max_restarts (a long pause is waited out).
void on_quiet_check(Self* self, uint64_t step, uint32_t attempt) {
  auto& s = self->state;
  if (!s.running || step != s.step || attempt != s.attempt || !s.error.empty()) return;
  const double limit = message_deadline(s);
  const double silent = 1e-9 * static_cast<double>(s.sh->activity->silent_ns());
  if (silent >= limit) {
    RestartEvent ev;
    ev.deadline = true;
    ev.cause = "no message for " + milliseconds_text(silent) + " (adaptive message deadline " + milliseconds_text(limit) + ")";
    replay_lost(self, false, "", ev, "");
    return;
  }
  self->delayed_send(self, seconds(std::max(limit - silent, 1e-4)), rt::quiet_atom_v, step, attempt);
}

// The loss detector saw a sequence gap in a message of attempt `epoch`
// (interposer.hpp): a message of that attempt is lost for sure, so replay it
// now, as for a damaged message; other attempts' gaps are history.
void on_gap(Self* self, uint64_t epoch) {
  auto& s = self->state;
  if (!s.running || !s.error.empty() || epoch != LossDetector::epoch_of(s.step, s.attempt)) return;
  RestartEvent ev;
  ev.gap = true;
  ev.cause = "a gap in a message stream's sequence numbers";
  replay_lost(self, true,
              "lost messages in {N} attempt(s), more than max_restarts = " + std::to_string(s.sh->opt.max_restarts) +
                  " (last: a sequence gap)",
              ev, "");
}

// A receiver dropped a message damaged in flight (actors/context.hpp,
// drop_if_damaged): that message is lost for sure, so the running attempt
// cannot finish. Replay the step now rather than at its deadline, exactly
// as the deadline would. The damaged message may have been a stale one of
// an older attempt; the replay is then wasted, never wrong. Replays of one
// step count against max_restarts like deadline replays.
void on_damaged(Self* self, const std::string& who, const std::string& why) {
  auto& s = self->state;
  const auto& sh = *s.sh;
  ++s.damaged;
  update_stats(sh, [](FaultSummary& st) { ++st.damaged; });
  if (!s.running || !s.error.empty()) return;  // between steps no step message is waited for
  const ActorPlan* a = sh.plan.find(who);
  RestartEvent ev;
  ev.damaged = true;
  ev.actor = who;
  ev.cause = why;
  replay_lost(self, true,
              "lost messages in {N} attempt(s), more than max_restarts = " + std::to_string(sh.opt.max_restarts) +
                  " (last: " + who + " dropped one as damaged: " + why + ")",
              ev, a ? role_name(a->role) : "unattributed");
}

}  // namespace troupe::runtime::coord
