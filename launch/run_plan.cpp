// The run plan of a spec (run_plan.hpp): maps it onto the runtime's options
// and the plans the runtime computes from them (actors/plan.cpp holds every
// rule: layer split, stages per rank, expert and optimizer ranges, placement,
// names), and lists them.
#include "launch/run_plan.hpp"

#include <algorithm>
#include <sstream>

#include "launch/train_options.hpp"

namespace troupe::launch {

kernels::BackendOptions backend_options(const Spec& spec) {
  kernels::BackendOptions b;
  b.kind = spec.topology.device_kind == DeviceKind::opencl ? kernels::BackendKind::opencl : kernels::BackendKind::host;
  b.threads = static_cast<int>(spec.topology.threads_per_device);
  b.platform = static_cast<int>(spec.topology.opencl_platform);
  b.device = static_cast<int>(spec.topology.opencl_device);
  b.device_type = spec.topology.opencl_device_type;
  return b;
}

model::TrainOptions train_options(const Spec& spec) {
  model::TrainOptions o;
  o.model = spec.model;
  o.optim = spec.optim;
  o.data = spec.data;
  o.seed = static_cast<uint64_t>(spec.run.seed);
  o.steps = spec.run.steps;
  o.microbatches = spec.topology.microbatches;
  // eval_every = 0 means "only at the end"; the trainer always evaluates after its last step.
  o.eval_every = spec.run.eval_every > 0 ? spec.run.eval_every : spec.run.steps;
  o.eval_batches = spec.run.eval_batches;
  o.checkpoint_every = spec.checkpoint.every;
  o.checkpoint_dir = spec.checkpoint_dir();
  o.resume_from = spec.checkpoint.resume;
  o.backend = backend_options(spec);
  return o;
}

namespace {

// launch's one call of the plan rule.
runtime::Plan plan_of(const runtime::RuntimeOptions& o) { return runtime::make_plan(o); }

// Everything but the [chaos] faults (which need the plan this gives).
runtime::RuntimeOptions base_options(const Spec& spec) {
  runtime::RuntimeOptions r;
  r.train = train_options(spec);
  r.train.microbatches = spec.topology.microbatches * spec.topology.data_parallel;
  r.schedule = spec.topology.schedule;
  r.stages = static_cast<int>(spec.topology.stages);
  r.devices = static_cast<int>(spec.topology.devices);
  r.optimizer_shards = static_cast<int>(spec.topology.optimizer_shards);
  r.data_parallel = static_cast<int>(spec.topology.data_parallel);
  // One shard: the experts stay inside their stage (no dispatch messages).
  r.expert_shards = spec.topology.expert_shards > 1 ? static_cast<int>(spec.topology.expert_shards) : 0;
  r.trace = spec.log.trace;
  r.max_restarts = static_cast<int>(spec.run.max_restarts);
  r.restart_window = static_cast<int>(spec.run.restart_window);
  r.restart_period = spec.run.restart_period;
  r.max_restarts_stage = static_cast<int>(spec.run.max_restarts_stage);
  r.max_restarts_optimizer = static_cast<int>(spec.run.max_restarts_optimizer);
  r.max_restarts_expert = static_cast<int>(spec.run.max_restarts_expert);
  r.strategy = spec.run.supervision;
  r.step_deadline = spec.run.step_deadline;
  r.faults = spec.faults;
  r.elastic = spec.elastic;
  r.expert_policy = spec.experts.policy;
  r.rebalance_every = static_cast<int>(spec.experts.rebalance_every);
  r.load_decay = spec.experts.load_decay;
  r.imbalance_threshold = spec.experts.imbalance_threshold;
  r.expert_on_failure = spec.experts.on_failure;
  r.migration_cost_scale = spec.experts.migration_cost_scale;
  r.redundant_experts = static_cast<int>(spec.experts.redundant_experts);
  r.processes = static_cast<int>(spec.topology.processes);
  r.interface = spec.topology.interface;
  r.peer_timeout = spec.topology.peer_timeout;
  r.peer_suspicion.floor = spec.topology.heartbeat_pause;
  r.process_loss = spec.topology.process_loss;
  r.auth = spec.topology.auth;
  r.auth_dir = spec.topology.auth_dir;
  r.bulk_shm_bytes = spec.topology.bulk_shm_bytes;
  r.ring_bytes = spec.topology.ring_bytes;
  r.ring_spin_us = spec.topology.ring_spin_us;
  r.device_process = device_process_list(spec);
  return r;
}

}  // namespace

bool rl_trainer_on_actors(const Spec& spec) {
  return spec.run.mode == RunMode::rl && rl::decoupled(spec.rl_section.sync) && spec.rl_section.trainer == "actors";
}

int rl_trainer_devices(const Spec& spec) {
  if (!rl_trainer_on_actors(spec)) return 1;
  return spec.rl_section.trainer_devices > 0 ? static_cast<int>(spec.rl_section.trainer_devices)
                                             : static_cast<int>(spec.topology.stages * spec.topology.data_parallel);
}

bool is_trainer_fault_target(const std::string& target) { return runtime::parse_fault_target(target).has_value(); }

runtime::RuntimeOptions rl_trainer_runtime(const Spec& spec) {
  runtime::RuntimeOptions r = base_options(spec);
  r.devices = rl_trainer_devices(spec);
  const RlSection& rl = spec.rl_section;  // raw values: the spec checks call this before [rl] is converted
  r.train.data.batch_size = rl.prompts_per_step * rl.group_size;
  r.train.steps = spec.run.steps * rl.updates_per_batch;
  r.trace.clear();
  r.elastic.clear();
  r.faults.clear();
  // The trainer's actors run in process 0; other processes hold generators.
  r.processes = 1;
  r.device_process.clear();
  for (runtime::FaultSpec f : spec.faults) {
    if (!is_trainer_fault_target(f.target)) continue;  // the RL actors' own
    f.at_step = (f.at_step - 1) * rl.updates_per_batch + 1;
    r.faults.push_back(f);
  }
  return r;
}

std::vector<int> device_processes(const Spec& spec) {
  std::vector<int> out = device_process_list(spec);
  if (!out.empty()) return out;
  const int64_t d = spec.topology.devices, n = spec.topology.processes;
  for (int64_t i = 0; i < d; ++i) out.push_back(static_cast<int>(i * n / std::max<int64_t>(d, 1)));
  return out;
}

std::vector<int> rl_generator_processes(const Spec& spec) {
  if (spec.topology.processes <= 1) return {};
  const std::vector<int> dp = device_processes(spec);
  const int devices = static_cast<int>(spec.topology.devices);
  std::vector<int> out;
  for (int64_t k = 0; k < spec.rl_section.generators; ++k) {
    const int d = runtime::rl_generator_device(static_cast<int>(k), devices, rl_trainer_devices(spec));
    out.push_back(d >= 0 && d < static_cast<int>(dp.size()) ? dp[static_cast<size_t>(d)] : 0);
  }
  return out;
}

runtime::RuntimeOptions runtime_options(const Spec& spec) {
  runtime::RuntimeOptions r = base_options(spec);
  const std::vector<runtime::FaultSpec> extra = chaos_faults(spec);
  r.faults.insert(r.faults.end(), extra.begin(), extra.end());
  return r;
}

namespace {

// chaos_faults on `plan`, the plan of base_options(spec) (made when needed).
std::vector<runtime::FaultSpec> chaos_faults_on(const Spec& spec, const runtime::Plan* plan) {
  if (spec.chaos.mean_steps_between_faults <= 0) return {};
  // A decoupled RL run: the nemesis aims at its generators and reward actors.
  if (spec.run.mode == RunMode::rl) {
    if (!rl::decoupled(spec.rl.sync) || spec.topology.device_kind == DeviceKind::sim) return {};
    return runtime::rl_chaos_schedule(chaos_options(spec), static_cast<int>(spec.rl.generators),
                                      static_cast<int>(spec.rl.reward_actors),
                                      spec.rl.reward == rl::RewardSource::model, spec.run.steps, spec.faults);
  }
  if (spec.topology.processes != 1 || !uses_runtime(spec) || spec.topology.device_kind == DeviceKind::sim) return {};
  const runtime::RuntimeOptions r = base_options(spec);
  runtime::ChaosOptions c = chaos_options(spec);
  // [[elastic]] changes the expert shards from step to step, and the
  // schedule is drawn on the static plan: leave the expert shards out
  // (check_chaos rejects naming them explicitly).
  if (!spec.elastic.empty()) {
    if (c.roles.empty()) c.roles = {runtime::Role::Rank, runtime::Role::Optimizer};
    c.roles.erase(std::remove(c.roles.begin(), c.roles.end(), runtime::Role::Expert), c.roles.end());
    if (c.roles.empty()) return {};
  }
  return runtime::chaos_schedule(c, plan ? *plan : plan_of(r), spec.run.steps, r.faults);
}

}  // namespace

std::vector<runtime::FaultSpec> chaos_faults(const Spec& spec) { return chaos_faults_on(spec, nullptr); }

RunPlan make_run_plan(const Spec& spec) {
  RunPlan rp;
  rp.runtime = base_options(spec);
  rp.plan = plan_of(rp.runtime);
  rp.chaos = chaos_faults_on(spec, &rp.plan);
  rp.runtime.faults.insert(rp.runtime.faults.end(), rp.chaos.begin(), rp.chaos.end());
  if (rl_trainer_on_actors(spec)) {
    rp.rl_trainer = rl_trainer_runtime(spec);
    rp.rl_trainer_plan = plan_of(*rp.rl_trainer);
  }
  rp.generator_process = rl_generator_processes(spec);
  if (spec.run.mode == RunMode::rl && rl::decoupled(spec.rl.sync))
    rp.plan.rl_actors = runtime::plan_rl_actors(spec.rl, static_cast<int>(spec.topology.devices),
                                                rl_trainer_on_actors(spec) ? rl_trainer_devices(spec) : 0,
                                                rp.generator_process);
  return rp;
}

runtime::Plan plan_at_step(const Spec& spec, int64_t step) {
  runtime::RuntimeOptions ro = base_options(spec);
  ro.expert_shards = runtime::expert_shards_at(ro, step);
  return plan_of(ro);
}

runtime::Plan rl_trainer_plan(const Spec& spec) { return plan_of(rl_trainer_runtime(spec)); }

runtime::ChaosOptions chaos_options(const Spec& spec) {
  runtime::ChaosOptions c;
  c.seed = static_cast<uint64_t>(spec.chaos.seed);
  c.mean_steps_between_faults = spec.chaos.mean_steps_between_faults;
  auto split = [](const std::string& text) {
    std::vector<std::string> out;
    size_t from = 0;
    while (from <= text.size()) {
      size_t to = text.find(',', from);
      if (to == std::string::npos) to = text.size();
      std::string item = text.substr(from, to - from);
      item.erase(0, item.find_first_not_of(" \t"));
      item.erase(item.find_last_not_of(" \t") + 1);
      if (!item.empty()) out.push_back(item);
      from = to + 1;
    }
    return out;
  };
  std::string names;
  for (runtime::FaultKind fk : runtime::kFaultKinds) names += std::string(names.empty() ? "" : ", ") + runtime::fault_kind_name(fk);
  for (const std::string& k : split(spec.chaos.kinds)) {
    bool known = false;
    for (runtime::FaultKind fk : runtime::kFaultKinds)
      if (k == runtime::fault_kind_name(fk)) c.kinds.push_back(fk), known = true;
    if (!known) throw std::invalid_argument("kinds: \"" + k + "\" is not a fault kind (" + names + ")");
  }
  for (const std::string& r : split(spec.chaos.roles)) {
    const auto role = runtime::parse_role(r);
    if (!role) throw std::invalid_argument("roles: \"" + r + "\" is not a role (stage, optimizer, expert; in an RL run generator, reward)");
    c.roles.push_back(*role);
  }
  return c;
}

std::vector<std::pair<int64_t, int64_t>> split_even(int64_t n, int64_t parts) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t p = 0; p < parts; ++p) out.emplace_back(p * n / parts, (p + 1) * n / parts);
  return out;
}

runtime::Plan resolve_topology(const Spec& spec) { return plan_of(base_options(spec)); }

std::string format_topology(const Spec& spec, const runtime::Plan& plan) {
  const auto& t = spec.topology;
  std::ostringstream os;
  os << "topology of " << spec.source << ": " << t.processes << " process(es), " << t.devices << " "
     << device_kind_name(t.device_kind) << " device(s), " << t.stages << " pipeline rank(s), schedule "
     << sched::to_string(t.schedule) << ", "
     << t.microbatches << " microbatch(es), " << t.expert_shards << " expert shard(s)/MoE layer, "
     << t.optimizer_shards << " optimizer shard(s), " << t.data_parallel << " replica(s); "
     << plan.parameters << " parameters; " << plan.actors.size() << " actors\n";
  size_t width = 0;
  for (const auto& a : plan.actors) width = std::max(width, a.name.size());
  for (int64_t p = 0; p < t.processes; ++p) {
    os << "process " << p << "\n";
    auto print = [&](const runtime::ActorPlan& a) {
      os << "    " << a.name << std::string(width + 2 - a.name.size(), ' ') << a.detail << "\n";
    };
    os << "  control\n";
    for (const auto& a : plan.actors)
      if (a.process == p && a.device < 0) print(a);
    for (const auto& d : plan.devices) {
      if (d.process != p) continue;
      os << "  device " << d.index << " (" << device_kind_name(t.device_kind) << ")\n";
      for (const auto& a : plan.actors)
        if (a.device == d.index) print(a);
    }
  }
  return os.str();
}

std::string format_elastic(const Spec& spec) {
  std::string eplb =
      spec.experts.policy == runtime::ExpertPolicy::eplb
          ? "[experts] policy = \"eplb\": every " + std::to_string(spec.experts.rebalance_every) +
                " step(s) experts move between neighbouring shards by their measured load (at run time)" +
                (spec.experts.redundant_experts > 0
                     ? "; the " + std::to_string(spec.experts.redundant_experts) +
                           " hottest expert(s) of each MoE layer get a second copy on another shard where that lowers the busier "
                           "shard's load"
                     : std::string()) +
                "\n"
          : "";
  if (spec.experts.on_failure == runtime::ExpertOnFailure::shrink)
    eplb += "[experts] on_failure = \"shrink\": an expert shard over its restart budget is removed (its experts "
            "join a neighbouring shard) and the step replayed\n";
  if (spec.elastic.empty()) return eplb;
  runtime::RuntimeOptions ro = runtime_options(spec);
  const int initial = ro.expert_shards;
  std::ostringstream os;
  // The expert shards of one plan: shard -> experts -> device, replica-major.
  auto placement = [&](int shards, int64_t from, int64_t to) {
    ro.expert_shards = shards;
    const runtime::Plan plan = plan_of(ro);
    os << "expert placement, steps " << from << ".." << to << ": " << shards << " expert shard(s) per MoE layer\n";
    size_t width = 0;
    for (const auto& a : plan.actors) width = std::max(width, a.name.size());
    for (const auto& a : plan.actors)
      if (a.role == runtime::Role::Expert)
        os << "    " << a.name << std::string(width + 2 - a.name.size(), ' ') << a.detail << " on device " << a.device
           << (ro.processes > 1 ? ", process " + std::to_string(a.process) : std::string()) << "\n";
  };
  int shards = initial;
  int64_t from = 1;
  for (const ElasticConfig& e : spec.elastic) {
    placement(shards, from, e.at_step - 1 >= from ? e.at_step - 1 : from);
    os << "[[elastic]] at step " << e.at_step << ": expert shards " << shards << " -> " << e.expert_shards
       << " per MoE layer (new shards load their experts from the optimizer shards' parameters)\n";
    shards = e.expert_shards;
    from = e.at_step;
  }
  placement(shards, from, spec.run.steps);
  return os.str() + eplb;
}

}  // namespace troupe::launch
