// The coordinator's state and what its two files share (coordinator.cpp:
// steps, supervision, placement changes; coordinator_deadlines.cpp: the
// deadlines and the replays of lost messages). Private to them: include
// nowhere else.
#pragma once

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <map>
#include <set>
#include <tuple>

#include "actors/context.hpp"
#include "actors/experts/expert_shard.hpp"
#include "actors/supervision/supervisor.hpp"
#include "model/data.hpp"

namespace troupe::runtime::coord {

using StepReply = caf::typed_response_promise<double, double, double, double>;

struct CoordState {
  std::shared_ptr<const Shared> sh;
  std::unique_ptr<model::DataSource> data;
  uint64_t step = 0;
  uint32_t attempt = 0;  // replay generation of the running step
  bool running = false;
  StepReply reply;
  std::map<std::tuple<int, int>, std::pair<double, double>> losses;  // (global mb, stage) -> loss, aux
  std::map<uint32_t, double> partials;                               // shard -> sum of squares
  std::set<std::pair<uint32_t, uint32_t>> finished;                  // (replica, rank or expert producer)
  std::map<int, std::vector<int64_t>> loads;                         // stage -> summed (load) reports of the step
  std::set<std::tuple<uint32_t, uint32_t, uint32_t>> load_from;      // (replica, mb, stage) reports counted
  std::vector<int64_t> last_loads;                                   // the last finished step's, in stage order
  std::map<int, std::vector<double>> head;                           // global mb -> loss head report (loss_head)
  double loss_scale = 0.0, aux_scale = 0.0, norm = 0.0;
  bool clipped = false;  // (clip) sent for the step
  std::string error;
  uint64_t dropped = 0;
  std::unique_ptr<Supervisor> sup;
  std::vector<bool> fault_armed;                 // [fault] armed once
  std::map<std::string, std::string> last_phase;  // actor -> phase it died in
  std::map<caf::actor_addr, caf::response_promise> kill_waiters;  // Runtime::kill callers
  std::chrono::steady_clock::time_point started;  // of the running attempt
  double slowest = 0.0;          // seconds of the slowest finished step
  uint32_t deadline_replays = 0;  // of the running step
  uint32_t quiet_replays = 0;     // of those, on the message deadline (not counted against max_restarts)
  // Adaptive deadlines (RuntimeOptions::step_deadline = 0; suspicion.hpp):
  // the fault-free steps' lengths and longest silences.
  Suspicion step_times, silences;
  bool first_finished = false;  // the runtime's first step (warm-up, kernel compiles) is not a sample
  uint64_t damaged = 0;           // Envelopes receivers dropped as damaged in flight
  // The fault summary's bookkeeping for the running step.
  std::chrono::steady_clock::time_point first_started;  // its first attempt
  int64_t armed = 0;                 // faults armed in it
  std::string message_fault_role;    // role of its first fault on messages (a deadline's suspect)
  bool repairing = false;            // a failure was noticed in it
  std::chrono::steady_clock::time_point repair_from;
  std::string repair_role;
  // A placement change waiting for its new expert shards' weights (the
  // rescale request's answer): the slots (replica, producer) still loading.
  // A shard that dies while loading is respawned and asked again; a shrink
  // meanwhile replaces the whole set; an escalation fails the change.
  struct Loading {
    caf::response_promise rp;
    std::map<std::pair<int, int>, caf::actor> left;
    uint64_t bytes = 0;
  };
  std::shared_ptr<Loading> loading;
  int kill_loading_left = -1;  // TestHooks::kill_while_loading_times not yet spent (-1: not read yet)
};

// Under the summary's lock (Runtime::fault_summary reads it from another thread).
template <class F>
void update_stats(const Shared& sh, F&& f) {
  std::lock_guard<std::mutex> lock(sh.stats_mu);
  f(sh.stats);
}

// A failure was noticed in the running step: its repair starts now (the
// first failure of a step counts; what follows is the same repair).
inline void repair_starts(CoordState& s, const std::string& role) {
  if (s.repairing) return;
  s.repairing = true;
  s.repair_from = std::chrono::steady_clock::now();
  s.repair_role = role.empty() ? "unattributed" : role;
}

using Self = caf::stateful_actor<CoordState>;

// coordinator.cpp: starts (or restarts, after a replay) the running step.
void start_step(Self* self);

// coordinator_deadlines.cpp. Seconds as the delayed_send duration.
std::chrono::microseconds seconds(double t);
// The running attempt's step and message deadlines (RuntimeOptions::step_deadline).
double step_deadline(const CoordState& s);
double message_deadline(const CoordState& s);
// A lost or suspected-lost message of the running attempt: the step
// deadline fired, the message deadline's check, a sequence gap, a damaged
// message.
void on_deadline(Self* self, uint64_t step, uint32_t attempt, double limit);
void on_quiet_check(Self* self, uint64_t step, uint32_t attempt);
void on_gap(Self* self, uint64_t epoch);
void on_damaged(Self* self, const std::string& who, const std::string& why);

}  // namespace troupe::runtime::coord
