// The facade's implementation (actors/runtime.hpp): validates a topology,
// brings up this process's devices and the supervision tree (the
// coordinator first, then optimizer shards, pipeline ranks, expert shards),
// asks the coordinator for steps, and tears it all down.
#include "actors/runtime.hpp"

#include "actors/degrees.hpp"

#include <algorithm>
#include <chrono>
#include <deque>
#if defined(__GLIBC__)
#include <malloc.h>
#endif
#include <limits>
#include <mutex>
#include <optional>
#include <set>
#include <stdexcept>

#include <caf/scheduler/test_coordinator.hpp>

#include "actors/experts/expert_shard.hpp"
#include "actors/transport/caf_scheduler.hpp"
#include "actors/cluster/runtime_cluster_internal.hpp"
#include "actors/context.hpp"
#include "actors/device/trace.hpp"
#include "actors/supervision/fault_injector.hpp"
#include "model/data.hpp"
#include "model/training_loop.hpp"
#include "model/stage.hpp"
#include "model/weights.hpp"
#include "moe/placement.hpp"

namespace troupe::runtime {

namespace {

void require(bool ok, const std::string& what) {
  if (!ok) throw std::invalid_argument("topology: " + what);
}

// Every step each optimizer shard builds three ParamSlices of its range (the
// new parameters for the ranks; m and v for the kill-and-replay snapshot),
// 14 MB each at the quickstart, and frees the previous step's. glibc's
// defaults hand blocks that large back to the kernel when freed (munmap, heap
// trim), so each step page-faults them in again: measured +32-40 ms of system
// time per step of the sequential runtime (bench_pipeline_real "sys ms", 1.4
// with this). So the process keeps freed memory for reuse: blocks up to 32 MB
// (glibc's maximum threshold) come from the heap and the heap is not trimmed
// below 1 GB of free space. That covers the main arena only: a thread's
// arena lives in 64 MB heaps that glibc unmaps as soon as one is empty, which
// a 14 MB block freed every step makes happen, so the faults came back (sys
// 19-22 ms per step of the sequential runtime on a quiet machine; 1.7 with
// MALLOC_ARENA_MAX=1). So every thread allocates from the main arena.
// Process-wide, set once a runtime is built (before its threads start).
void keep_freed_memory() {
#if defined(__GLIBC__)
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  mallopt(M_ARENA_MAX, 1);
#endif
}

}  // namespace

namespace {

// validate(o), returning the plan it checked the faults against: the
// runtime's plan, made once at bring-up, or the caller's (`given`, made from
// the same options by launch/run_plan.cpp) when it made it already.
Plan validated_plan(const RuntimeOptions& o, const Plan* given = nullptr) {
  require(o.stages >= 1, "stages must be >= 1");
  require(o.devices >= 1, "devices must be >= 1");
  require(o.optimizer_shards >= 1, "optimizer_shards must be >= 1");
  require(o.data_parallel >= 1, "data_parallel must be >= 1");
  const auto& t = o.train;
  require(t.microbatches >= 1 && t.microbatches % o.data_parallel == 0,
          "microbatches (" + std::to_string(t.microbatches) + ") must be a multiple of data_parallel (" +
              std::to_string(o.data_parallel) + ")");
  require(o.expert_shards >= 0, "expert_shards must be >= 0");
  require(o.processes >= 1, "processes must be >= 1");
  // The degree rules, shared with the spec checks (degrees.hpp).
  Degrees d;
  d.schedule = o.schedule;
  d.stages = o.stages;
  d.devices = o.devices;
  d.microbatches = t.microbatches / o.data_parallel;
  d.data_parallel = o.data_parallel;
  d.optimizer_shards = o.optimizer_shards;
  d.expert_shards = o.expert_shards > 0 ? o.expert_shards : 1;
  d.expert_actors = o.expert_shards > 0;
  d.processes = o.processes;
  d.batch_size = t.data.batch_size;
  if (const auto problems = degree_problems(d, t.model); !problems.empty())
    throw std::invalid_argument(problems.front().message);
  require(t.checkpoint_every >= 0, "checkpoint_every must be >= 0");
  require(t.steps >= 0, "steps must be >= 0");
  require(t.optim.lr > 0.0, "lr must be positive");
  const int64_t P = model::build_param_layout(t.model).total();
  require(o.max_restarts >= 0, "max_restarts must be >= 0");
  require(o.restart_window >= 1, "restart_window must be >= 1");
  require(o.restart_period >= 0, "restart_period must be >= 0");
  require(o.max_restarts_stage >= -1 && o.max_restarts_optimizer >= -1 && o.max_restarts_expert >= -1,
          "per-role max_restarts must be >= -1 (-1: none of its own)");
  require(o.processes == 1 || (o.comm && o.comm->size() == o.processes),
          "processes = " + std::to_string(o.processes) + " needs a launcher with as many processes (mpirun -np " +
              std::to_string(o.processes) + ")");
  require(o.peer_timeout > 0.0, "peer_timeout must be positive");
  require(o.step_deadline >= 0.0, "step_deadline must be >= 0 (0: adaptive)");
  make_placement(o.devices, o.processes, o.stages, o.data_parallel, o.optimizer_shards, o.device_process);  // throws
  // A fault target exists when the plan has the actor (the one naming
  // scheme); the message says which count leaves it out.
  // [[elastic]] scale events: a run with expert shards, steps inside the run
  // and increasing, counts the experts can be split into. Across processes
  // the new shards are spawned where the placement puts them (elastic.cpp).
  int64_t prev_step = 0;
  for (const ElasticEvent& e : o.elastic) {
    const std::string ev = "[[elastic]] at_step " + std::to_string(e.at_step) + ": ";
    require(o.expert_shards > 0, ev + "scale events need a run with expert-shard actors (expert_shards > 0)");
    require(e.at_step >= 1 && e.at_step <= t.steps,
            ev + "at_step is outside the run's steps 1.." + std::to_string(t.steps));
    require(e.at_step > prev_step, ev + "at_step must be greater than the previous event's (" + std::to_string(prev_step) + ")");
    require(e.expert_shards >= 1 && e.expert_shards <= t.model.n_experts,
            ev + "expert_shards (" + std::to_string(e.expert_shards) + ") must be in 1..n_experts (" +
                std::to_string(t.model.n_experts) + ")");
    prev_step = e.at_step;
  }
  if (o.expert_on_failure == ExpertOnFailure::shrink) {
    require(o.expert_shards > 0, "expert on_failure shrink needs expert-shard actors (expert_shards > 0)");
    require(o.processes == 1 || (o.processes == 2 && o.process_loss == ProcessLoss::recover),
            "expert on_failure shrink runs in one process, or on 2 with process_loss = recover (it shrinks around a lost "
            "process 1)");
  }
  if (o.expert_policy == ExpertPolicy::eplb) {
    require(o.expert_shards > 0, "expert policy eplb needs expert-shard actors (expert_shards > 0)");
    require(o.rebalance_every >= 1, "expert policy eplb needs rebalance_every >= 1");
  }
  require(o.redundant_experts >= 0, "redundant_experts must be >= 0");
  require(o.load_decay >= 0.0 && o.load_decay < 1.0, "load_decay must be in [0, 1)");
  require(o.imbalance_threshold == 0.0 || o.imbalance_threshold >= 1.0, "imbalance_threshold must be 0 (off) or >= 1");
  if (o.redundant_experts > 0) {
    require(o.expert_policy == ExpertPolicy::eplb, "redundant_experts needs expert policy eplb (the copies follow its loads)");
    require(o.expert_shards >= 2, "redundant_experts needs expert_shards >= 2 (a copy lives on another shard)");
    require(o.redundant_experts <= t.model.n_experts,
            "redundant_experts (" + std::to_string(o.redundant_experts) + ") must be at most n_experts (" +
                std::to_string(t.model.n_experts) + "): each expert gets at most one second copy");
  }
  if (given && (given->sl.num_ranks != o.stages || given->data_parallel != o.data_parallel ||
                given->num_shards() != o.optimizer_shards || static_cast<int>(given->devices.size()) != o.devices ||
                given->parameters != model::build_param_layout(t.model).total()))
    throw std::logic_error("runtime: the plan given was not made from these options");
  const Plan plan = given ? *given : make_plan(o);
  for (const FaultSpec& f : o.faults) {
    if (int proc = -1; parse_process_target(f.target, proc)) {  // checked below
      require(f.at_step >= 1 && f.at_step <= t.steps, "fault at_step " + std::to_string(f.at_step) +
                                                         " is outside the run's steps 1.." + std::to_string(t.steps));
      continue;
    }
    require(f.kind != FaultKind::stop, "fault kind stop applies to a whole process (target \"process:P\")");
    const std::optional<FaultTarget> target = parse_fault_target(f.target);
    require(target.has_value(), "fault target \"" + f.target +
                                    "\" must be stage:K, stage:K/replica:R, optimizer:K or expert:L/S[/replica:R]");
    require(f.at_step >= 1 && f.at_step <= t.steps, "fault at_step " + std::to_string(f.at_step) +
                                                       " is outside the run's steps 1.." + std::to_string(t.steps));
    require(f.at_message >= 0, "fault at_message must be >= 0");
    require(f.count >= 1, "fault count must be >= 1");
    require(f.kind != FaultKind::delay || f.delay_ms > 0, "fault kind delay needs delay_ms > 0");
    require(f.kind != FaultKind::pause || f.duration_ms > 0, "fault kind pause needs duration_ms > 0");
    require(f.kind != FaultKind::partition || f.duration_ms > 0, "fault kind partition needs duration_ms > 0");
    require(f.kind != FaultKind::slow || (f.factor > 1 && f.steps >= 1), "fault kind slow needs factor > 1 and steps >= 1");
    // An expert shard must exist in the step the fault hits (after the
    // scale events before it).
    RuntimeOptions at = o;
    at.expert_shards = f.at_step >= 1 && f.at_step <= t.steps ? expert_shards_at(o, f.at_step) : o.expert_shards;
    const Plan step_plan = at.expert_shards == o.expert_shards ? plan : make_plan(at);
    if (step_plan.target(*target)) continue;
    const std::string gone = "fault target " + f.target + " does not exist: ";
    if (target->role == Role::Expert) {
      const bool moe_layer =
          std::find(plan.moe_layers.begin(), plan.moe_layers.end(), target->index) != plan.moe_layers.end();
      require(plan.expert_parallel(), gone + "the run has no expert shards (expert_shards > 1 puts the experts in their own actors)");
      require(moe_layer, gone + "there are " + std::to_string(plan.moe_layers.size()) + " MoE layer(s)");
      require(target->shard < step_plan.expert_shards,
              gone + "there are " + std::to_string(step_plan.expert_shards) + " expert shard(s) per layer in step " +
                  std::to_string(f.at_step));
    } else {
      const bool rank = target->role == Role::Rank;
      const int n = rank ? plan.sl.num_ranks : plan.num_shards();
      require(target->index < n, gone + "there are " + std::to_string(n) + (rank ? " stage(s)" : " optimizer shard(s)"));
    }
    require(false, gone + "there are " + std::to_string(plan.data_parallel) + " data-parallel replica(s)");
  }
  // Across processes only whole processes are hit ("process:P"): process 1
  // of 2, recovered on process 0 (coordinator.cpp, on_process_lost).
  for (const FaultSpec& f : o.faults) {
    int proc = -1;
    if (parse_process_target(f.target, proc)) {
      require(o.processes == 2 && proc == 1 && o.process_loss == ProcessLoss::recover &&
                  (f.kind == FaultKind::kill || f.kind == FaultKind::stop),
              "fault on " + f.target + ": only kill or stop of process 1 of 2, with process_loss = recover, is supported");
      continue;
    }
    require(o.processes == 1,
            "failure injection ([[faults]]) on actors runs in one process only: the supervisor restarts actors on its "
            "own devices (processes = " + std::to_string(o.processes) + "); a whole process can be hit (\"process:1\")");
  }
  if (o.loss_head) {
    require(o.processes == 1, "a loss head (the RL policy update on the runtime) runs in one process only");
    require(o.loss_head->columns() >= 1 && o.loss_head->report_columns() >= 0, "a loss head needs >= 1 input column");
  }
  if (o.start_state) {
    require(o.train.resume_from.empty(), "start_state and train.resume_from are exclusive");
    require(static_cast<int64_t>(o.start_state->params.size()) == P,
            "start_state has " + std::to_string(o.start_state->params.size()) + " parameters, the model " +
                std::to_string(P));
    const auto& st = *o.start_state;
    require((st.adam_m.empty() && st.adam_v.empty()) ||
                (static_cast<int64_t>(st.adam_m.size()) == P && static_cast<int64_t>(st.adam_v.size()) == P),
            "start_state's AdamW moments must both be empty or both have one entry per parameter");
    require(o.start_state->step >= 0, "start_state has a negative step");
  }
  return plan;
}

}  // namespace

void validate(const RuntimeOptions& o) { (void)validated_plan(o); }

struct Runtime::Impl {
  // Declared first so they are destroyed last: every buffer the actors hold
  // belongs to a device's backend.
  std::vector<std::unique_ptr<Device>> devices;
  std::shared_ptr<Shared> sh;
  std::unique_ptr<caf::actor_system_config> cfg;
  std::shared_ptr<void> cluster_files;  // the TLS identity CAF reads (configure_cluster)
  std::unique_ptr<caf::actor_system> sys;
  std::unique_ptr<Cluster> cluster;  // processes > 1 (runtime_cluster.cpp)
  int64_t steps_done = 0;
  std::shared_ptr<StaleReplay> stale;  // TestHooks::replay_stale: the last step's messages
  // state() of step `cached_step`: an evaluation and a save after the same
  // step gather the shards' state once.
  std::optional<model::TrainingState> cached;
  int64_t cached_step = -1;
  mutable std::mutex restarts_mu;
  std::vector<RestartEvent> restarts;
  std::vector<RescaleReport> rescales;  // driver thread only
  // [layer][expert] moving average of the routed loads (the eplb policy's
  // input): avg = load_decay * avg + (1 - load_decay) * this step's.
  std::vector<std::vector<double>> load_avg;
  std::optional<RescaleReport> plan_change(int64_t next);
  // The count in force was checked against the events once (a resumed run
  // catches up then); after that only events change it, so a shrink
  // (on_failure = "shrink") holds until the next event.
  bool caught_up = false;
  // eplb's migration-cost gate: what past placement changes cost (their
  // loaded bytes and the seconds until the new shards had them), and the
  // recent step times without a change (the gain's time scale).
  double migrated_seconds = 0.0;
  int64_t migrated_bytes = 0;
  std::deque<double> quiet_steps;  // the last few step times without a placement change
  double last_step_seconds = 0.0;

  bool tracing() const { return sh->opt.record_trace || !sh->opt.trace.empty(); }

  // Tells the fault injector (when the run has one) that `a` runs on plan
  // device `d`: a partition fault decides which messages cross by it.
  caf::actor placed(caf::actor a, int d) {
    if (sh->injector) sh->injector->place(a, d);
    return a;
  }

  // The device an actor of device `d` runs on here. Another process's device
  // is asked for only when that process was lost and its actors are
  // respawned on this one (coordinator.cpp, on_process_lost): the recomputed
  // placement puts lost device d on this process's (d mod n)-th device.
  // Placement never changes the math, so the run stays bitwise equal.
  Device& device_for(int d) {
    if (Device* mine = devices[static_cast<size_t>(d)].get()) return *mine;
    std::vector<Device*> here;
    for (auto& x : devices)
      if (x) here.push_back(x.get());
    if (here.empty()) throw std::logic_error("runtime: no device on this process to respawn an actor on");
    return *here[static_cast<size_t>(d) % here.size()];
  }

  // deterministic: CAF's test coordinator schedules the actors and the
  // devices step manually (testing::DeterministicRuntime); one process only.
  bool deterministic = false;

  explicit Impl(const RuntimeOptions& o, const Plan* given = nullptr, bool on_test_coordinator = false)
      : deterministic(on_test_coordinator) {
    if (deterministic && o.processes != 1)
      throw std::invalid_argument("testing::DeterministicRuntime runs one process (processes = 1)");
    Plan plan = validated_plan(o, given);
    keep_freed_memory();
    sh = std::make_shared<Shared>();
    Shared& s = *sh;
    s.opt = o;
    const auto& t = o.train;
    s.layout = model::build_param_layout(t.model);
    s.plan = std::move(plan);
    s.live = std::make_shared<const Plan>(s.plan);
    // Test hooks (duplicate_sends, corrupt_combine, replay_stale) act through the seam only.
    s.hooks = current_test_hooks();
    // A gap goes to the coordinator (the Shared outlives its interposers).
    auto on_gap = [&s](uint64_t epoch) {
      caf::actor coordinator;
      {
        std::lock_guard<std::mutex> lock(s.peers_mu);
        coordinator = s.peers.coordinator;
      }
      if (coordinator) caf::anon_send(coordinator, rt::gap_atom_v, epoch);
    };
    Interposers seam =
        make_interposer(o, s.hooks.get(), s.plan.moe_layers.empty() ? -1 : s.plan.moe_layers.front(), on_gap);
    s.interposer = std::move(seam.chain);
    s.injector = std::move(seam.injector);
    s.loss = std::move(seam.loss);
    stale = std::move(seam.stale);
    if (!t.resume_from.empty()) {
      resume(s);
    } else if (o.start_state) {  // a policy being post-trained (RL), or its resumed run
      s.start_step = static_cast<uint64_t>(o.start_state->step);
      steps_done = o.start_state->step;
      s.init = o.start_state->params;
      s.init_m = o.start_state->adam_m;
      s.init_v = o.start_state->adam_v;
    } else {
      s.init = model::init_params(s.layout, t.model, t.seed);
    }
    if (!o.loss_head) {  // with a loss head the batches are fed (step_on)
      auto data = model::make_data_source(t.data, s.opt.train.seed, t.model.seq_len);
      if (data->vocab_size() > t.model.vocab_size)
        throw std::invalid_argument("data source '" + data->describe() + "' needs vocab_size >= " +
                                    std::to_string(data->vocab_size()) + ", model has " +
                                    std::to_string(t.model.vocab_size));
    }
    // Only this process's devices and actors are made here (null elsewhere).
    const Placement& place = s.plan.placement;
    const int me = o.processes > 1 ? o.comm->rank() : 0;
    for (int d = 0; d < o.devices; ++d)
      devices.push_back(place.device_process[d] == me
                            ? std::make_unique<Device>(d, t.backend, deterministic ? Device::Stepping::manual
                                                                                   : Device::Stepping::thread)
                            : nullptr);
    if (tracing())
      for (auto& d : devices)
        if (d) d->enable_trace(4096);
    for (auto& d : devices) s.devices.push_back(d.get());
    if (o.processes == 1) {  // the adaptive message deadline (coordinator.cpp) watches one process's activity
      s.activity = std::make_shared<ActivityClock>();
      for (auto& d : devices) d->watch_activity(s.activity);
    }

    cfg = std::make_unique<caf::actor_system_config>();
    register_caf_types(*cfg);
    if (deterministic) {
      cfg->set("scheduler.policy", caf::atom("testing"));
      cfg->set("scheduler.max-throughput", size_t{1});  // one message per run_once
      cfg->set("logger.file-verbosity", caf::atom("quiet"));
    } else {
      configure_scheduler(*cfg);
    }
    if (o.processes > 1) cluster_files = configure_cluster(*cfg, o);
    sys = std::make_unique<caf::actor_system>(*cfg);
    // One placement rule, used at start and by the supervisor's respawns:
    // the devices the plan gives them.
    s.spawn = [this, place](caf::actor_system& as, Role role, int replica, int index) {
      if (role == Role::Optimizer) {
        const int d = place.shard_device[static_cast<size_t>(index)];
        return placed(spawn_shard(as, sh, device_for(d), index), d);
      }
      if (role == Role::Expert) return sh->spawn_expert(as, *live_plan(*sh), replica, index, false);
      const int d = place.rank_device[static_cast<size_t>(replica)][static_cast<size_t>(index)];
      return placed(spawn_rank(as, sh, device_for(d), replica, index), d);
    };
    // Expert shards as a plan places them: the initial one, the live one
    // after [[elastic]] events (which change only the expert shards).
    s.spawn_expert = [this, me](caf::actor_system& as, const Plan& plan, int replica, int index, bool await_restore) {
      const Placement& pl = plan.placement;
      // Another process's shard (a placement change made on process 0) is
      // spawned there, unless that process was lost: then here (device_for).
      const int d = pl.expert_device[static_cast<size_t>(replica)][static_cast<size_t>(index)];
      const int p = pl.device_process[static_cast<size_t>(d)];
      if (p != me && cluster && !cluster->lost(p) && !((sh->lost_processes >> p) & 1u)) {
        try {
          return cluster->spawn_expert(p, plan, replica, index);
        } catch (const std::exception&) {
          if (!cluster->lost(p)) throw;  // lost meanwhile (it did not answer): here, as its other actors
        }
      }
      ExpertShardSpec spec;
      spec.replica = replica;
      spec.layer = pl.expert_ids[static_cast<size_t>(index)].first;
      spec.shard = pl.expert_ids[static_cast<size_t>(index)].second;
      spec.shards = plan.expert_shards;
      spec.experts = plan.experts_of(spec.layer, spec.shard);
      spec.copies = plan.copies_of(spec.layer, spec.shard);
      spec.producer = index;
      spec.microbatches = plan.chunks;
      spec.start_step = sh->start_step;  // resumed (a respawn is restored to the running step after)
      spec.await_restore = await_restore;
      return placed(spawn_expert_shard(as, sh, device_for(d), spec), d);
    };
    s.on_restart = [this, user = o.on_restart](const RestartEvent& ev) {
      {
        std::lock_guard<std::mutex> lock(restarts_mu);
        restarts.push_back(ev);
      }
      if (user) user(ev);
    };
    // The coordinator first: actors report device errors to it from the start.
    if (place.coordinator_process() == me) s.peers.coordinator = spawn_coordinator(*sys, sh);
    if (o.processes > 1) s.forget_remote = [this](const caf::actor& a) { if (cluster) cluster->forget(a); };
    try {
      if (o.processes > 1) cluster = std::make_unique<Cluster>(*sys, sh, place);  // a remote coordinator's handle
      spawn_local(place, me);
      if (cluster) cluster->connect();
    } catch (...) {
      // No ~Impl after a throw here: stop the actors, or the actor system waits for them forever.
      for (const caf::actor& a : local_actors()) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
      if (deterministic) settle();  // no scheduler thread runs the exits otherwise
      cluster.reset();
      throw;
    }
  }

  // Resume (model::Trainer's rules and checks): the saved parameters and
  // moments become the state every actor starts from (and the supervisor's
  // first step-start snapshot), the saved step every actor's step counter,
  // the saved seed the run's seed (data order, kill points, later saves).
  // Every process of a multi-process run reads the checkpoint itself.
  void resume(Shared& s) {
    const model::TrainOptions& t = s.opt.train;
    model::TrainingState st = model::load_checkpoint(t.resume_from, s.layout);
    const std::string diff = model::config_difference(t.model, st.config);
    if (!diff.empty())
      throw std::invalid_argument("resume_from " + t.resume_from +
                                  ": the checkpoint's model differs from the configured one (" + diff + ")");
    if (st.data_cursor != st.step)
      throw std::invalid_argument("resume_from " + t.resume_from + ": data cursor " + std::to_string(st.data_cursor) +
                                  " does not match step " + std::to_string(st.step) + " (one batch per step)");
    if (st.step < 0) throw std::invalid_argument("resume_from " + t.resume_from + ": negative step");
    s.opt.train.seed = st.seed;
    s.start_step = static_cast<uint64_t>(st.step);
    steps_done = st.step;
    s.init = std::move(st.params);
    s.init_m = std::move(st.adam_m);
    s.init_v = std::move(st.adam_v);
  }

  // Deterministic runs: the test coordinator's ready actors, one message at
  // a time, and the devices' queued closures (device order), until neither
  // is left; returns how many of both ran.
  caf::scheduler::test_coordinator& test_scheduler() {
    return dynamic_cast<caf::scheduler::test_coordinator&>(sys->scheduler());
  }
  size_t settle() {
    size_t n = 0;
    for (;;) {
      size_t k = test_scheduler().run();
      for (auto& d : devices)
        while (d && d->run_one()) ++k;
      if (k == 0) return n;
      n += k;
    }
  }

  // This process's optimizer shards and pipeline ranks, spawned through the
  // supervisor's placement rule (the others' stay null until
  // cluster->connect() resolves them).
  void spawn_local(const Placement& place, int me) {
    const RuntimeOptions& o = sh->opt;
    Shared& s = *sh;
    std::lock_guard<std::mutex> lock(s.peers_mu);
    for (int i = 0; i < o.optimizer_shards; ++i)
      s.peers.shards.push_back(place.shard_process(i) == me ? s.spawn(*sys, Role::Optimizer, 0, i)
                                                            : caf::actor{});
    s.peers.ranks.resize(static_cast<size_t>(o.data_parallel));
    for (int r = 0; r < o.data_parallel; ++r)
      for (int k = 0; k < o.stages; ++k)
        s.peers.ranks[r].push_back(place.rank_process(r, k) == me ? s.spawn(*sys, Role::Rank, r, k)
                                                                  : caf::actor{});
    if (!s.plan.expert_parallel()) return;
    s.peers.experts.resize(static_cast<size_t>(o.data_parallel));
    for (int r = 0; r < o.data_parallel; ++r)
      for (size_t x = 0; x < s.plan.expert_owned.size(); ++x)
        s.peers.experts[static_cast<size_t>(r)].push_back(
            place.expert_process(r, static_cast<int>(x)) == me
                ? s.spawn_expert(*sys, s.plan, r, static_cast<int>(x), false)  // not spawn(): peers_mu is held
                : caf::actor{});
  }

  // The coordinator, shards, ranks and expert shards living in this process
  // (after restarts: the current ones).
  std::vector<caf::actor> local_actors() const {
    std::vector<caf::actor> out;
    auto add = [&](const caf::actor& a) {
      if (a && a->node() == sys->node()) out.push_back(a);
    };
    std::lock_guard<std::mutex> lock(sh->peers_mu);
    add(sh->peers.coordinator);
    for (const caf::actor& a : sh->peers.shards) add(a);
    for (const auto& rep : sh->peers.ranks)
      for (const caf::actor& a : rep) add(a);
    for (const auto& rep : sh->peers.experts)
      for (const caf::actor& a : rep) add(a);
    return out;
  }

  ~Impl() {
    // Process 0 ends a multi-process run (failed when unwinding an error).
    if (cluster && sh->opt.comm->rank() == 0) cluster->shutdown(std::uncaught_exceptions() == 0);
    for (auto& d : devices)
      if (d) d->drain();
    // The coordinator (the supervisor) first, and wait until it is gone, so
    // it restarts nobody; then every rank and shard it left. Actors and
    // device work of a failed step may still be running: the peer table
    // stays valid until all of them are done.
    const caf::actor coord = sh->peers.coordinator;
    if (deterministic) {  // nothing runs unless this thread runs it
      if (coord) caf::anon_send_exit(coord, caf::exit_reason::user_shutdown);
      settle();
    } else if (coord && coord->node() == sys->node()) {
      caf::scoped_actor self{*sys};
      self->monitor(coord);
      caf::anon_send_exit(coord, caf::exit_reason::user_shutdown);
      self->receive([](const caf::down_msg&) {});
    }
    for (const caf::actor& a : local_actors()) caf::anon_send_exit(a, caf::exit_reason::user_shutdown);
    if (deterministic) settle();
    cluster.reset();
    sys->await_all_actors_done();
    for (auto& d : devices)
      if (d) d->drain();
    {
      std::lock_guard<std::mutex> lock(sh->peers_mu);
      sh->peers = Peers{};  // actors and closures hold `sh`: break the cycle
    }
    sys.reset();
  }
};

Runtime::Runtime(const RuntimeOptions& options, const Plan* plan) : impl_(std::make_unique<Impl>(options, plan)) {}
Runtime::~Runtime() = default;

namespace {

// The rows each shard of MoE layer `li` of plan `p` got of one layer's
// per-expert loads: its range's, and for an expert with copies its
// Plan::expert_rows block of the expert's total.
std::vector<int64_t> shard_rows(const Plan& p, size_t li, const std::vector<int64_t>& layer) {
  std::vector<int64_t> out(static_cast<size_t>(p.expert_shards), 0);
  const int l = p.moe_layers[li];
  for (size_t e = 0; e < layer.size(); ++e) {
    const std::vector<int> h = p.holders(l, static_cast<int64_t>(e));
    for (size_t j = 0; j < h.size(); ++j) {
      const auto [a, b] = p.expert_rows(l, static_cast<int64_t>(e), static_cast<int>(h.size()), static_cast<int>(j), layer[e]);
      out[static_cast<size_t>(h[j])] += b - a;
    }
  }
  return out;
}

// max / mean of those (1 = balanced; 0 when nothing was routed).
double shard_imbalance(const Plan& p, size_t li, const std::vector<int64_t>& layer) {
  const std::vector<int64_t> per = shard_rows(p, li, layer);
  int64_t total = 0, most = 0;
  for (int64_t x : per) total += x, most = std::max(most, x);
  return total > 0 ? static_cast<double>(most) * static_cast<double>(per.size()) / static_cast<double>(total) : 0.0;
}

// The boundaries of a plan's split of MoE layer `li`.
std::vector<int64_t> bounds_of(const Plan& p, size_t li) {
  std::vector<int64_t> b{0};
  for (const ExpertRange& r : p.layer_experts[li]) b.push_back(r.end);
  return b;
}

}  // namespace

// The placement change due before step `next`, if any: an [[elastic]] event
// (or, resumed past some, the count in force), else an eplb rebalance.
std::optional<RescaleReport> Runtime::Impl::plan_change(int64_t next) {
  const RuntimeOptions& o = sh->opt;
  if (o.expert_shards <= 0) return std::nullopt;
  const auto now = live_plan(*sh);
  const int due = expert_shards_at(o, next);
  bool event = false;
  for (const ElasticEvent& ev : o.elastic) event = event || ev.at_step == next;
  RescaleReport rep;
  rep.step = next;
  rep.old_shards = now->expert_shards;
  rep.new_shards = due;
  const bool catch_up = !caught_up && due != now->expert_shards;  // resumed past events
  caught_up = true;
  if (event || catch_up) return rep;  // the even split of the new count
  rep.new_shards = now->expert_shards;  // a rebalance keeps the count in force (after a shrink: fewer than `due`)
  if (o.expert_policy != ExpertPolicy::eplb || o.rebalance_every <= 0 || steps_done == 0 || load_avg.empty() ||
      now->expert_shards < 2)
    return std::nullopt;
  // Between periodic rebalances, a layer whose max/mean shard load under the
  // moving average passed imbalance_threshold triggers one (still gated).
  if (steps_done % o.rebalance_every != 0) {
    bool over = false;
    for (size_t li = 0; o.imbalance_threshold > 0 && li < now->moe_layers.size(); ++li) {
      over = over || moe::replicated_imbalance(load_avg[static_cast<size_t>(now->moe_layers[li])], bounds_of(*now, li),
                                               now->layer_replication(li)) > o.imbalance_threshold;
    }
    if (!over) return std::nullopt;
    rep.threshold = true;
  }
  // eplb: incremental moves by the moving average of the measured loads,
  // gated per layer: a layer's moves are made only when their predicted
  // gain over the next rebalance_every steps beats their migration cost.
  // Gain: the step is taken to be paced by each layer's busiest shard, so
  // a layer saves its share (its drop in busiest-shard load over the sum of
  // the layers' busiest loads) of the recent step time, every step until
  // the next rebalance — an upper bound, as the dense part does not shrink.
  // Cost: the bytes its new shards would load (incremental: only shards
  // whose experts change) x the seconds per byte measured on this run's
  // past placement changes x migration_cost_scale. Before any change was
  // measured there is no cost to weigh: the move is made, and measured.
  // With redundant_experts, the candidate also shares experts between the
  // busiest and the least busy shards with weighted row shares
  // (moe::place_copies on the candidate split); a layer whose split, copies
  // or shares change is weighed as a whole, and every shard whose range or
  // copies change counts in its bytes (a change of shares moves no weights).
  const model::ModelConfig& c = o.train.model;
  const double expert_bytes = 3.0 * static_cast<double>(c.expert_hidden * c.d_model) * sizeof(float) * o.data_parallel;
  const size_t L = now->moe_layers.size();
  using Copies = moe::Replication;
  auto busiest = [](const std::vector<double>& avg, const std::vector<int64_t>& b, const Copies& cp) {
    double total = 0.0;
    for (double x : avg) total += x;
    return moe::replicated_imbalance(avg, b, cp) * total / static_cast<double>(b.size() - 1);
  };
  std::vector<std::vector<int64_t>> cur(L), cand(L);
  std::vector<Copies> cur_copies(L), cand_copies(L);
  std::vector<int> moves(L, 0);
  double busiest_sum = 0.0;
  for (size_t li = 0; li < L; ++li) {
    const std::vector<double>& avg = load_avg[static_cast<size_t>(now->moe_layers[li])];
    cur[li] = bounds_of(*now, li);
    cur_copies[li] = now->layer_replication(li);
    cand[li] = moe::rebalance_bounds(avg, cur[li], now->expert_shards, &moves[li]);
    cand_copies[li] = moe::place_copies(avg, cand[li], o.redundant_experts);
    busiest_sum += busiest(avg, cur[li], cur_copies[li]);
  }
  double recent = last_step_seconds;
  if (!quiet_steps.empty()) {
    recent = 0.0;
    for (double x : quiet_steps) recent += x;
    recent /= static_cast<double>(quiet_steps.size());
  }
  rep.neighbour_seconds = recent;
  rep.cost_measured = migrated_bytes > 0;
  const double per_byte = rep.cost_measured ? migrated_seconds / static_cast<double>(migrated_bytes) : 0.0;
  for (size_t li = 0; li < L; ++li) {
    const std::vector<double>& avg = load_avg[static_cast<size_t>(now->moe_layers[li])];
    bool take = false;
    if ((moves[li] > 0 || cand_copies[li] != cur_copies[li]) && busiest_sum > 0.0) {
      const double gain = o.rebalance_every * recent *
                          (busiest(avg, cur[li], cur_copies[li]) - busiest(avg, cand[li], cand_copies[li])) / busiest_sum;
      double bytes = 0.0;
      for (size_t k = 0; k + 1 < cand[li].size(); ++k)
        if (cand[li][k] != cur[li][k] || cand[li][k + 1] != cur[li][k + 1] ||
            cand_copies[li].copies[k] != cur_copies[li].copies[k])
          bytes += static_cast<double>(cand[li][k + 1] - cand[li][k] + static_cast<int64_t>(cand_copies[li].copies[k].size())) *
                   expert_bytes;
      const double cost = bytes * per_byte * o.migration_cost_scale;
      rep.predicted_gain_seconds += gain;
      rep.predicted_cost_seconds += cost;
      take = !rep.cost_measured || gain > cost;
      ++(take ? rep.layers_moved : rep.layers_skipped);
    }
    if (take) rep.moved_experts += moves[li];
    const std::vector<int64_t>& b = take ? cand[li] : cur[li];
    rep.bounds.insert(rep.bounds.end(), b.begin(), b.end());
    const Copies& cp = take ? cand_copies[li] : cur_copies[li];
    for (size_t k = 0; k < cp.copies.size(); ++k)
      for (int64_t e : cp.copies[k]) rep.copies.insert(rep.copies.end(), {static_cast<int64_t>(li), static_cast<int64_t>(k), e});
    for (size_t e = 0; e < cp.shares.size(); ++e) {
      if (cp.shares[e].empty()) continue;
      rep.shares.insert(rep.shares.end(), {static_cast<int64_t>(li), static_cast<int64_t>(e), static_cast<int64_t>(cp.shares[e].size())});
      rep.shares.insert(rep.shares.end(), cp.shares[e].begin(), cp.shares[e].end());
    }
  }
  if (rep.layers_moved == 0 && rep.layers_skipped == 0) return std::nullopt;
  rep.policy = true;
  rep.made = rep.layers_moved > 0;
  return rep;
}

model::StepMetrics Runtime::step_on(FedBatch batch) {
  const RuntimeOptions& o = impl_->sh->opt;
  if (!o.loss_head) throw std::logic_error("Runtime::step_on: the runtime has no loss head (RuntimeOptions::loss_head)");
  const auto n = static_cast<size_t>(o.train.data.batch_size * o.train.model.seq_len);
  if (batch.inputs.size() != n || batch.targets.size() != n ||
      batch.token_data.size() != n * static_cast<size_t>(o.loss_head->columns()))
    throw std::invalid_argument("Runtime::step_on: a batch of " + std::to_string(o.train.data.batch_size) + " rows of " +
                                std::to_string(o.train.model.seq_len) + " tokens needs " + std::to_string(n) +
                                " inputs and targets and " + std::to_string(n * static_cast<size_t>(o.loss_head->columns())) +
                                " token inputs; got " + std::to_string(batch.inputs.size()) + ", " +
                                std::to_string(batch.targets.size()) + " and " + std::to_string(batch.token_data.size()));
  {
    std::lock_guard<std::mutex> lock(impl_->sh->fed_mu);
    impl_->sh->fed = std::make_shared<const FedBatch>(std::move(batch));
    impl_->sh->head_report.clear();
  }
  return run_step();
}

std::vector<double> Runtime::head_report() const {
  std::lock_guard<std::mutex> lock(impl_->sh->fed_mu);
  std::vector<double> out;
  for (const auto& v : impl_->sh->head_report) out.insert(out.end(), v.begin(), v.end());
  return out;
}

model::StepMetrics Runtime::step() {
  if (impl_->sh->opt.loss_head)
    throw std::logic_error("Runtime::step: a runtime with a loss head trains on fed batches (Runtime::step_on)");
  return run_step();
}

model::StepMetrics Runtime::run_step() {
  const auto t0 = std::chrono::steady_clock::now();
  if (impl_->cluster) {
    if (impl_->sh->opt.comm->rank() != 0) throw std::logic_error("Runtime::step: only process 0 drives steps");
    impl_->cluster->before_step(impl_->steps_done + 1);
  }
  if (impl_->stale) impl_->stale->forget();  // keep this step's messages only
  caf::scoped_actor self{*impl_->sys};
  // A placement change due at this step: the plan changes at this boundary,
  // and the step's time includes the migration (its stall).
  const auto before = live_plan(*impl_->sh);
  std::optional<RescaleReport> scale = impl_->plan_change(impl_->steps_done + 1);
  if (scale && scale->made) {
    const auto m0 = std::chrono::steady_clock::now();
    std::string err;
    self->request(impl_->sh->peers.coordinator, caf::infinite, rt::rescale_atom_v,
                  static_cast<int32_t>(scale->new_shards), scale->bounds, scale->copies, scale->shares)
        .receive([&](uint64_t bytes) { scale->bytes = static_cast<int64_t>(bytes); },
                 [&](caf::error& e) { err = impl_->sys->render(e); });
    if (!err.empty())
      throw std::runtime_error("runtime: placement change before step " + std::to_string(scale->step) + " failed: " + err);
    // The other processes' ranks and optimizer shards dispatch to the new
    // shards from the next step on: they switch before it starts.
    if (impl_->cluster) {
      std::vector<std::vector<caf::actor>> table;
      {
        std::lock_guard<std::mutex> lock(impl_->sh->peers_mu);
        table = impl_->sh->peers.experts;
      }
      impl_->cluster->publish_experts(*live_plan(*impl_->sh), table);
    }
    scale->migration_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - m0).count();
    // Incremental: only the shards whose experts or device changed were replaced.
    const auto after = live_plan(*impl_->sh);
    for (int r = 0; r < impl_->sh->opt.data_parallel; ++r) {
      for (int x = 0; x < after->num_producers(); ++x) scale->spawned += !keeps_expert_shard(*before, *after, r, x);
      for (int x = 0; x < before->num_producers(); ++x) scale->retired += !keeps_expert_shard(*before, *after, r, x);
    }
    if (scale->bytes > 0) {
      impl_->migrated_bytes += scale->bytes;
      impl_->migrated_seconds += scale->migration_seconds;
    }
  }
  model::StepMetrics m;
  std::string err;
  self->request(impl_->sh->peers.coordinator, caf::infinite, rt::step_atom_v)
      .receive(
          [&](double loss, double aux, double norm, double lr) {
            m.loss = loss;
            m.aux_loss = aux;
            m.grad_norm = norm;
            m.lr = lr;
          },
          [&](caf::error& e) { err = impl_->sys->render(e); });
  if (!err.empty()) throw std::runtime_error("runtime step failed: " + err);
  m.step = ++impl_->steps_done;
  m.tokens = impl_->sh->opt.train.data.batch_size * impl_->sh->opt.train.model.seq_len;
  m.step_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  impl_->last_step_seconds = m.step_seconds;
  if (!scale || !scale->made) {  // the gate's time scale: steps without a migration in them
    impl_->quiet_steps.push_back(m.step_seconds);
    if (impl_->quiet_steps.size() > 3) impl_->quiet_steps.pop_front();
  }
  const RuntimeOptions& o = impl_->sh->opt;
  const auto plan = live_plan(*impl_->sh);
  if (o.train.model.ffn == model::Ffn::moe) {
    m.expert_load = expert_load();
    m.dropped = expert_dropped();
    for (size_t li = 0; li < plan->layer_experts.size() && li < m.expert_load.size(); ++li) {
      m.shard_load.push_back(shard_rows(*plan, li, m.expert_load[static_cast<size_t>(plan->moe_layers[li])]));
    }
    // The eplb policy's input: a moving average of the per-expert loads.
    if (impl_->load_avg.size() != m.expert_load.size()) {
      impl_->load_avg.clear();
      for (const auto& layer : m.expert_load) impl_->load_avg.emplace_back(layer.begin(), layer.end());
    } else {
      for (size_t l = 0; l < m.expert_load.size(); ++l)
        for (size_t e = 0; e < m.expert_load[l].size(); ++e)
          impl_->load_avg[l][e] = o.load_decay * impl_->load_avg[l][e] + (1.0 - o.load_decay) * static_cast<double>(m.expert_load[l][e]);
    }
  }
  if (scale) {
    scale->step_seconds = m.step_seconds;
    for (size_t li = 0; li < plan->layer_experts.size() && li < m.expert_load.size(); ++li) {
      const auto& layer = m.expert_load[static_cast<size_t>(plan->moe_layers[li])];
      scale->imbalance_before.push_back(shard_imbalance(*before, li, layer));
      scale->imbalance_after.push_back(shard_imbalance(*plan, li, layer));
      std::vector<int> holders;
      for (size_t e = 0; e < layer.size(); ++e)
        holders.push_back(static_cast<int>(plan->holders(plan->moe_layers[li], static_cast<int64_t>(e)).size()));
      scale->replicas.push_back(std::move(holders));
    }
    impl_->rescales.push_back(*scale);
    if (o.on_rescale) o.on_rescale(*scale);
  }
  return m;
}

std::vector<RescaleReport> Runtime::rescales() const { return impl_->rescales; }

int Runtime::expert_shards() const { return live_plan(*impl_->sh)->expert_shards; }

int64_t Runtime::steps_done() const { return impl_->steps_done; }

namespace {

// Copies ParamSlice `e` into the flat buffer `out` at its offset; returns ""
// or what is wrong with it.
std::string place_slice(const Envelope& e, std::vector<float>& out) {
  auto r = e.read<schemas::ParamSlice>();
  if (!r) return to_string(r.error());
  const auto x = tensor_f32((*r)->getParams());
  const uint64_t off = (*r)->getRange().getOffset();
  if (off > out.size() || x.size() > out.size() - off) return "slice outside the parameter buffer";
  std::copy(x.begin(), x.end(), out.begin() + static_cast<int64_t>(off));
  return "";
}

}  // namespace

std::vector<float> Runtime::parameters() {
  std::vector<float> out(static_cast<size_t>(impl_->sh->layout.total()), 0.0f);
  caf::scoped_actor self{*impl_->sys};
  for (const caf::actor& shard : all_shards(*impl_->sh)) {
    std::string err;
    self->request(shard, caf::infinite, rt::params_atom_v)
        .receive(
            [&](const Envelope& e) { err = place_slice(e, out); },
            [&](caf::error& e) { err = impl_->sys->render(e); });
    if (!err.empty()) throw std::runtime_error("runtime: reading parameters failed: " + err);
  }
  return out;
}

model::TrainingState Runtime::state() {
  const Shared& sh = *impl_->sh;
  model::TrainingState st;
  st.config = sh.opt.train.model;
  st.seed = sh.opt.train.seed;
  st.step = impl_->steps_done;
  st.data_cursor = impl_->steps_done;  // one batch per step, as the Trainer counts it
  const size_t P = static_cast<size_t>(sh.layout.total());
  st.params.assign(P, 0.0f);
  st.adam_m.assign(P, 0.0f);
  st.adam_v.assign(P, 0.0f);
  caf::scoped_actor self{*impl_->sys};
  for (const caf::actor& shard : all_shards(sh)) {
    std::string err;
    self->request(shard, caf::infinite, rt::params_atom_v, true)
        .receive(
            [&](const Envelope& p, const Envelope& m, const Envelope& v) {
              std::vector<float>* dst[3] = {&st.params, &st.adam_m, &st.adam_v};
              const Envelope* src[3] = {&p, &m, &v};
              for (int i = 0; i < 3 && err.empty(); ++i) err = place_slice(*src[i], *dst[i]);
            },
            [&](caf::error& e) { err = impl_->sys->render(e); });
    if (!err.empty()) throw std::runtime_error("runtime: reading the optimizer state failed: " + err);
  }
  return st;
}

std::vector<std::string> Runtime::actor_names() {
  caf::scoped_actor self{*impl_->sys};
  std::vector<caf::actor> actors{impl_->sh->peers.coordinator};
  for (const auto& s : all_shards(*impl_->sh)) actors.push_back(s);
  for (const auto& r : all_ranks(*impl_->sh)) actors.push_back(r);
  for (const auto& x : all_experts(*impl_->sh)) actors.push_back(x);
  std::vector<std::string> out;
  for (const caf::actor& a : actors)
    self->request(a, caf::infinite, rt::name_atom_v)
        .receive([&](const std::string& n) { out.push_back(n); },
                 [&](caf::error& e) { out.push_back("<" + impl_->sys->render(e) + ">"); });
  return out;
}

uint64_t testing::dropped_messages(Runtime& rt) {
  auto& impl_ = rt.impl_;
  uint64_t total = 0;
  caf::scoped_actor self{*impl_->sys};
  std::vector<caf::actor> actors{impl_->sh->peers.coordinator};
  for (const auto& s : all_shards(*impl_->sh)) actors.push_back(s);
  for (const auto& r : all_ranks(*impl_->sh)) actors.push_back(r);
  for (const auto& x : all_experts(*impl_->sh)) actors.push_back(x);
  for (const caf::actor& a : actors)
    self->request(a, caf::infinite, rt::dropped_atom_v).receive([&](uint64_t n) { total += n; }, [](caf::error&) {});
  return total;
}

FaultSummary Runtime::fault_summary() const {
  FaultSummary out;
  {
    std::lock_guard<std::mutex> lock(impl_->sh->stats_mu);
    out = impl_->sh->stats;
  }
  if (impl_->sh->injector) out.partitioned = static_cast<int64_t>(impl_->sh->injector->partitioned());
  return out;
}

Runtime::Slowdown Runtime::slowdown() const {
  Slowdown out;
  for (const auto& d : impl_->devices) {
    if (!d) {
      out.per_device.emplace_back(0, 0);
      continue;
    }
    out.per_device.emplace_back(d->slowed(), d->completed());
    out.slowed += d->slowed();
    out.seconds += d->slowed_seconds();
    out.completed += d->completed();
  }
  return out;
}

uint64_t Runtime::damaged_messages() {
  uint64_t n = 0;
  caf::scoped_actor self{*impl_->sys};
  self->request(impl_->sh->peers.coordinator, caf::infinite, rt::corrupt_atom_v)
      .receive([&](uint64_t x) { n = x; }, [](caf::error&) {});
  return n;
}

namespace {

// The coordinator's (load) answer: for each MoE layer, E routed counts then
// the dropped count, summed over the last step's micro-batches.
std::vector<int64_t> last_loads(caf::actor_system& sys, const caf::actor& coord) {
  caf::scoped_actor self{sys};
  std::vector<int64_t> out;
  std::string err;
  self->request(coord, caf::infinite, rt::load_atom_v)
      .receive([&](const std::vector<int64_t>& v) { out = v; }, [&](caf::error& e) { err = sys.render(e); });
  if (!err.empty()) throw std::runtime_error("runtime: reading the expert load failed: " + err);
  return out;
}

}  // namespace

std::vector<std::vector<int64_t>> Runtime::expert_load() {
  const auto v = last_loads(*impl_->sys, impl_->sh->peers.coordinator);
  const size_t E = static_cast<size_t>(impl_->sh->opt.train.model.n_experts);
  std::vector<std::vector<int64_t>> out;
  for (size_t i = 0; i + E < v.size() + 1 && !v.empty(); i += E + 1)
    out.emplace_back(v.begin() + static_cast<int64_t>(i), v.begin() + static_cast<int64_t>(i + E));
  return out;
}

std::vector<int64_t> Runtime::expert_dropped() {
  const auto v = last_loads(*impl_->sys, impl_->sh->peers.coordinator);
  const size_t E = static_cast<size_t>(impl_->sh->opt.train.model.n_experts);
  std::vector<int64_t> out;
  for (size_t i = E; i < v.size(); i += E + 1) out.push_back(v[i]);
  return out;
}

std::vector<RestartEvent> Runtime::restarts() const {
  std::lock_guard<std::mutex> lock(impl_->restarts_mu);
  return impl_->restarts;
}

void Runtime::kill(const std::string& target) {
  caf::scoped_actor self{*impl_->sys};
  std::string err;
  self->request(impl_->sh->peers.coordinator, caf::infinite, rt::fault_atom_v, target)
      .receive([](bool) {}, [&](caf::error& e) { err = impl_->sys->render(e); });
  if (!err.empty()) throw std::runtime_error("runtime: kill " + target + ": " + err);
}

uint32_t testing::inject_stale_messages(Runtime& rt) {
  auto& impl_ = rt.impl_;
  if (!impl_->stale) throw std::logic_error("testing::inject_stale_messages: needs TestHooks::replay_stale");
  if (impl_->steps_done == 0) return 0;
  return impl_->stale->replay();
}

void Runtime::write_trace(const std::string& path) {
  write_chrome_trace(path, device_traces(), impl_->sh->plan.sl.num_dirs > 1);
}

std::vector<DeviceTrace> Runtime::device_traces() {
  if (!impl_->tracing()) throw std::logic_error("Runtime: tracing is off (set RuntimeOptions::trace or record_trace)");
  std::vector<DeviceTrace> traces;
  for (auto& d : impl_->devices) {
    if (!d) continue;  // another process's device
    d->drain();
    std::string actors;  // by the plan's names, as validate lists them
    for (const ActorPlan& a : live_plan(*impl_->sh)->actors)
      if (a.device == d->id()) actors += (actors.empty() ? "" : ", ") + a.name;
    traces.push_back(DeviceTrace{d->id(), d->trace(), actors});
  }
  return traces;
}

const model::TrainingState& Runtime::current_state() {
  if (!impl_->cached || impl_->cached_step != impl_->steps_done) {
    impl_->cached = state();
    impl_->cached_step = impl_->steps_done;
  }
  return *impl_->cached;
}

void Runtime::serve() {
  if (!impl_->cluster || impl_->sh->opt.comm->rank() == 0)
    throw std::logic_error("Runtime::serve: only processes > 0 of a multi-process run serve");
  impl_->cluster->serve();
}

model::EvalMetrics Runtime::evaluate(bool accuracy) {
  const model::TrainingState& st = current_state();
  model::TrainOptions eo = impl_->sh->opt.train;
  eo.microbatches = eo.microbatches / impl_->sh->opt.data_parallel;
  eo.resume_from.clear();
  eo.checkpoint_dir.clear();
  eo.checkpoint_every = 0;
  model::Trainer tr(eo, st);
  return tr.evaluate(accuracy);
}

void Runtime::save(const std::string& dir) {
  model::save_checkpoint(dir, current_state(), impl_->sh->layout);
}

model::TrainSummary train(const RuntimeOptions& o, model::TrainObserver& obs, const Plan* plan) {
  Runtime rt(o, plan);
  if (o.processes > 1 && o.comm->rank() != 0) {  // process 0 drives; this one serves its actors
    rt.serve();
    return {};
  }
  model::TrainSummary s;
  try {
    s = model::run_training(rt, o.train, obs);
  } catch (...) {
    if (o.on_fault_summary) o.on_fault_summary(rt.fault_summary());  // what the faults did before it failed
    throw;
  }
  if (o.on_fault_summary) o.on_fault_summary(rt.fault_summary());
  if (!o.trace.empty()) rt.write_trace(o.trace);
  return s;
}

// ---- testing::DeterministicRuntime (test_hooks.hpp) ----

namespace {
// What the test's driver actor got back.
struct DriverBox {
  bool done = false;
  testing::StepReply reply;
  std::string error;
  std::vector<float> params;
  size_t params_pending = 0;
};
}  // namespace

struct testing::DeterministicRuntime::State {
  std::unique_ptr<Runtime::Impl> impl;
  std::shared_ptr<DriverBox> box = std::make_shared<DriverBox>();
  caf::actor driver;  // asks the coordinator and the shards, as the Runtime's scoped actor would
};

testing::DeterministicRuntime::DeterministicRuntime(const RuntimeOptions& options) : st_(std::make_unique<State>()) {
  st_->impl = std::make_unique<Runtime::Impl>(options, nullptr, true);
  auto box = st_->box;
  auto sh = st_->impl->sh;
  st_->driver = st_->impl->sys->spawn([box, sh](caf::event_based_actor* self) -> caf::behavior {
    return {
        [self, box, sh](rt::step_atom) {
          caf::actor coord;
          {
            std::lock_guard<std::mutex> lock(sh->peers_mu);
            coord = sh->peers.coordinator;
          }
          self->request(coord, caf::infinite, rt::step_atom_v)
              .then(
                  [box](double loss, double aux, double norm, double lr) {
                    box->reply = {loss, aux, norm, lr};
                    box->done = true;
                  },
                  [box, self](caf::error& e) {
                    box->error = self->system().render(e);
                    box->done = true;
                  });
        },
        [self, box, sh](rt::params_atom) {
          box->params.assign(static_cast<size_t>(sh->layout.total()), 0.0f);
          const std::vector<caf::actor> shards = all_shards(*sh);
          box->params_pending = shards.size();
          for (const caf::actor& shard : shards)
            self->request(shard, caf::infinite, rt::params_atom_v)
                .then(
                    [box](const Envelope& e) {
                      const std::string err = place_slice(e, box->params);
                      if (!err.empty()) box->error = "a parameter slice: " + err;
                      else --box->params_pending;
                    },
                    [box, self](caf::error& e) { box->error = self->system().render(e); });
        },
    };
  });
  try {
    st_->impl->settle();  // bring-up: the actors' first messages and device closures
  } catch (...) {
    caf::anon_send_exit(st_->driver, caf::exit_reason::user_shutdown);  // ~Impl would wait for it
    throw;
  }
}

testing::DeterministicRuntime::~DeterministicRuntime() {
  caf::anon_send_exit(st_->driver, caf::exit_reason::user_shutdown);
  st_->impl->settle();
}

void testing::DeterministicRuntime::start_step() {
  st_->box->done = false;
  st_->box->error.clear();
  caf::anon_send(st_->driver, rt::step_atom_v);
}

bool testing::DeterministicRuntime::step_done() const { return st_->box->done; }

testing::StepReply testing::DeterministicRuntime::reply() const {
  if (!st_->box->done) throw std::logic_error("DeterministicRuntime::reply: the step has not ended");
  if (!st_->box->error.empty()) throw std::runtime_error("runtime step failed: " + st_->box->error);
  return st_->box->reply;
}

bool testing::DeterministicRuntime::run_message() { return st_->impl->test_scheduler().try_run_once(); }

bool testing::DeterministicRuntime::run_closure(int device) {
  auto& d = st_->impl->devices.at(static_cast<size_t>(device));
  return d && d->run_one();
}

int testing::DeterministicRuntime::devices() const { return static_cast<int>(st_->impl->devices.size()); }

size_t testing::DeterministicRuntime::settle() { return st_->impl->settle(); }

size_t testing::DeterministicRuntime::fire_timeouts() { return st_->impl->test_scheduler().trigger_timeouts(); }

void testing::DeterministicRuntime::kill(const std::string& target) {
  const std::optional<FaultTarget> t = parse_fault_target(target);
  const caf::actor a = t ? target_actor(*st_->impl->sh, *t) : caf::actor{};
  if (!a) throw std::invalid_argument("DeterministicRuntime::kill: no actor named \"" + target + "\"");
  caf::anon_send_exit(a, caf::exit_reason::kill);
}

std::vector<RestartEvent> testing::DeterministicRuntime::restarts() const {
  std::lock_guard<std::mutex> lock(st_->impl->restarts_mu);
  return st_->impl->restarts;
}

std::vector<float> testing::DeterministicRuntime::parameters() {
  st_->box->error.clear();
  caf::anon_send(st_->driver, rt::params_atom_v);
  settle();
  if (!st_->box->error.empty() || st_->box->params_pending != 0)
    throw std::runtime_error("DeterministicRuntime::parameters: " +
                             (st_->box->error.empty() ? std::string("a shard did not answer") : st_->box->error));
  return st_->box->params;
}

}  // namespace troupe::runtime
