// Messages of the decoupled RL actors (internal to actors/rl/*.cpp). They
// stay in one process, so payloads travel by reference: a shared pointer to
// an immutable value (weights of one version, a step's rollouts, their
// scores), never copied or encoded. Across processes they would need a Cap'n
// Proto schema; that is not built (docs/rl.md).
//
// Protocol (step s, generator k = s % K, reward actor r = s % R, eta =
// max_staleness, v0 = max(0, s - eta)):
//   trainer -> coordinator      (publish, Weights v)       after each update, and v = 0 at start
//   coordinator -> generator:k  (sync, Weights, incarnation)  fixed_lag: version v0 before step s's
//                               job; latest: every publication, to every generator
//   generator:k -> coordinator  (synced, k, incarnation, version)  the confirmation; without it by
//                               rl.sync_deadline_ms the sync is sent again, then the generator restarted
//   coordinator -> generator:k  [(arm, point) | (arm_drop, n)] (job, s, v0): the generator
//                               starts it once it holds version v0 (fixed_lag: exactly v0;
//                               latest: its newest, >= v0), paused until then
//   generator:k -> generator:k  (decode) one decode step per message: a fence, so a sync that
//                               arrives mid-rollout is taken between two decode steps (latest)
//   generator:k -> coordinator  (rollout, Rollout)
//   coordinator -> reward:r     [(arm, point)] (score, Rollout)
//   reward:r -> buffer          (admit, Scored)
//   buffer -> coordinator       (admitted, s, ok)          the ledger took step s's groups (or refused them)
//   trainer -> coordinator      (take, s, trainer)        forwarded to the buffer; then blocks for
//   buffer -> trainer           (batch, Scored, depth, discarded, duplicates): the
//                               ledger's counts so far ride along (an empty Scored: the run failed)
#pragma once

#include <caf/all.hpp>

#include <atomic>
#include <cstdint>
#include <map>
#include <set>
#include <memory>
#include <span>
#include <vector>

#include "rl/rollout.hpp"
#include "actors/test_hooks.hpp"
#include "rl/rollout_step.hpp"

namespace troupe::runtime::rlmsg {

using publish_atom = caf::atom_constant<caf::atom("rl_publish")>;
using job_atom = caf::atom_constant<caf::atom("rl_job")>;
using rollout_atom = caf::atom_constant<caf::atom("rl_rollout")>;
using score_atom = caf::atom_constant<caf::atom("rl_score")>;
using admit_atom = caf::atom_constant<caf::atom("rl_admit")>;
using admitted_atom = caf::atom_constant<caf::atom("rl_admtd")>;
using take_atom = caf::atom_constant<caf::atom("rl_take")>;
using batch_atom = caf::atom_constant<caf::atom("rl_batch")>;
using arm_atom = caf::atom_constant<caf::atom("rl_arm")>;
using arm_drop_atom = caf::atom_constant<caf::atom("rl_armdrop")>;
using sync_atom = caf::atom_constant<caf::atom("rl_sync")>;
using synced_atom = caf::atom_constant<caf::atom("rl_synced")>;
using deadline_atom = caf::atom_constant<caf::atom("rl_dline")>;
using decode_atom = caf::atom_constant<caf::atom("rl_decode")>;

// One published policy version (immutable once published). `data` keeps
// whatever owns the values alive: the trainer's vector in one process, the
// received envelope (no copy) across processes.
struct Weights {
  int64_t version = 0;
  std::shared_ptr<const float> data;
  size_t size = 0;
  std::span<const float> values() const { return {data.get(), size}; }
  static Weights of(int64_t version, std::shared_ptr<const std::vector<float>> v) {
    const size_t n = v->size();
    const float* p = v->data();
    return Weights{version, std::shared_ptr<const float>(std::move(v), p), n};
  }
};

// A generator's result for one step, with what it cost.
struct Rollout {
  std::shared_ptr<const rl::StepRollouts> r;
  int generator = 0;
  double busy_seconds = 0.0;       // the generator's busy time since its previous delivery (sampling, weight copies; overlapping steps counted once)
  double sync_seconds = 0.0;       // the weight copies at the fences (0 when it had the version)
  int64_t sync_bytes = 0;
  int64_t loads = 0;               // weight copies in (at the start and mid-rollout)
  double paused_seconds = 0.0;     // idle before this job: no admissible job, or its weights not yet in
  int64_t switches = 0;            // latest: versions taken mid-rollout, between decode steps
};

// A reward actor's verdicts on a step's rollouts.
struct Scored {
  Rollout rollout;
  std::shared_ptr<const rl::ScoredBatch> scored;
  double reward_seconds = 0.0;
};

}  // namespace troupe::runtime::rlmsg

CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::runtime::rlmsg::Weights)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::runtime::rlmsg::Rollout)
CAF_ALLOW_UNSAFE_MESSAGE_TYPE(troupe::runtime::rlmsg::Scored)

namespace troupe::runtime {

struct RlActorOptions;
struct RlLedger;

// The rollout buffer's state, kept outside the actor and written as it
// changes (its snapshot), so that a respawned buffer goes on where the dead
// one stopped: the admitted steps not yet trained, the groups admitted and
// trained, and the step the trainer waits for. Only the live buffer touches
// it (a dead one touches nothing more).
struct BufferStore {
  std::map<int64_t, rlmsg::Scored> ready;  // admitted, not yet trained, by step
  std::set<rl::GroupId> admitted, trained;
  int64_t want = -1;  // the step the trainer waits for (-1: none)
  caf::actor trainer;
};

// The options every actor reads (immutable after start).
struct RlShared {
  const RlActorOptions* opt = nullptr;
  std::shared_ptr<const TestHooks> hooks = current_test_hooks();  // test_hooks.hpp: null outside tests
  uint64_t seed = 0;
  int64_t steps = 0;
  // Resume: the first step to run (the checkpoint's) and the older versions
  // steps first .. first + eta - 1 are sampled by (rl/version_store.hpp).
  int64_t first_step = 0;
  std::map<int64_t, std::shared_ptr<const std::vector<float>>> resume_versions;
  // Reward programs restarted by the reward actors (rl.reward = "command"),
  // summed over actors and their incarnations, for the fault summary.
  std::shared_ptr<std::atomic<int64_t>> reward_program_restarts = std::make_shared<std::atomic<int64_t>>(0);
};

// Behaviours (actors/rl/rl_roles.cpp); the coordinator spawns them. `driver` receives results; a kill
// point armed with (arm, k) fires on the next job: 1 before computing, 2
// after computing (the result is lost), 3 after sending it.
// `incarnation` counts the generator's restarts; it rides on each
// confirmation so a late one from a dead incarnation is ignored. An armed
// (arm_drop, n) makes it lose the next n syncs (a lost transfer: no copy, no
// confirmation).
caf::behavior generator_actor(caf::event_based_actor* self, std::shared_ptr<const RlShared> sh, int index,
                              int64_t incarnation, caf::actor driver);
// A reward actor sends its verdicts to the buffer each (score) message names
// (the buffer may have been respawned since).
caf::behavior reward_actor(caf::event_based_actor* self, std::shared_ptr<const RlShared> sh, int index);
// The buffer writes the ledger (read by the facade after the buffer is gone)
// and keeps its state in `store`. A kill point armed with (arm, k) fires on
// its next admission: 1 before it (the rollouts are lost with the actor), 2
// after storing them, before telling the coordinator, 3 after telling it.
caf::behavior buffer_actor(caf::event_based_actor* self, std::shared_ptr<const RlShared> sh,
                           std::shared_ptr<RlLedger> ledger, std::shared_ptr<BufferStore> store, caf::actor driver);

}  // namespace troupe::runtime
