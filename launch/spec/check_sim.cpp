// The spec checks of sim devices: [sim], measured costs and the
// expert-parallel sim.
#include "launch/spec/parser.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>

#include "actors/names.hpp"
#include "actors/schedule/schedule.hpp"
#include "launch/phases.hpp"
#include "launch/spec/keys.hpp"
#include "launch/run_plan.hpp"
#include "model/checkpoint.hpp"
#include "model/data.hpp"
#include "model/params.hpp"
#include "rl/task.hpp"


namespace troupe::launch::spec_detail {

// The expert-parallel sim model: one EP rank per device, FLOPs over rates.
void check_ep_sim(const Spec& s, SpecSites& p) {
  const auto& t = s.topology;
  auto v = [](int64_t x) { return std::to_string(x); };
  const std::string why = " for the expert-parallel sim model ([topology] device_kind = \"sim\" with expert_shards = " + v(t.expert_shards) + ")";
  if (s.run.mode != RunMode::pretrain) p.error(p.where("run.mode"), "[run] mode must be \"pretrain\"" + why);
  if (s.model.ffn != model::Ffn::moe) return;  // expert_shards > 1 with a dense model is reported by the cross-field rules
  if (t.devices != t.expert_shards)
    p.error(p.where("topology.devices"), "[topology] devices = " + v(t.devices) + " must equal expert_shards = " + v(t.expert_shards) + why + " (one EP rank per device)");
  if (t.stages != 1 || t.data_parallel != 1)
    p.error(p.where(t.stages != 1 ? "topology.stages" : "topology.data_parallel"), "[topology] stages and data_parallel must be 1" + why);
  if (s.sim.model != sim::CostModel::flops)
    p.error(p.set_at("sim.cost_model") ? p.where("sim.cost_model") : p.where("topology.expert_shards"),
            "[sim] cost_model must be \"flops\"" + why + ": expert time is FLOPs over gflops");
  const int64_t slots = s.sim.ep_slots_per_device;
  if (slots > 0 && slots * t.devices < s.model.n_experts)
    p.error(p.where("sim.ep_slots_per_device"), "[sim] ep_slots_per_device = " + v(slots) + " gives " + v(slots * t.devices) +
                                                    " slots on " + v(t.devices) + " devices, fewer than [model] n_experts = " + v(s.model.n_experts));
  if (slots > s.model.n_experts)
    p.error(p.where("sim.ep_slots_per_device"), "[sim] ep_slots_per_device = " + v(slots) + " is more than [model] n_experts = " +
                                                    v(s.model.n_experts) + " (a device holds distinct experts)");
  if (s.experts.policy != runtime::ExpertPolicy::static_split || !s.elastic.empty())
    p.error(p.where(s.elastic.empty() ? "experts.policy" : "topology.expert_shards"),
            "[experts] and [[elastic]] drive the actor runtime's expert shards; the sim model places by [sim] ep_rebalance_every" + why);
}

// cost_model = "measured": one forward and backward time per stage of the
// schedule's layout (as `troupe calibrate` writes them), weights within them.
void check_measured_costs(const Spec& s, SpecSites& p) {
  const auto& c = s.sim;
  const auto& t = s.topology;
  int64_t stages = 0;
  try {
    stages = sched::make_layout(t.schedule, static_cast<int>(t.stages), static_cast<int>(t.microbatches)).num_stages;
  } catch (const std::invalid_argument&) {
    return;  // the topology rules report it
  }
  const std::string need = " must have one value per pipeline stage: " + std::to_string(stages) + " (schedule \"" +
                           std::string(sched::to_string(t.schedule)) + "\", stages = " + std::to_string(t.stages) + ")";
  auto count = [&](const char* key, const std::vector<double>& v, bool may_be_empty) {
    if ((v.empty() && may_be_empty) || static_cast<int64_t>(v.size()) == stages) return true;
    p.error(p.where(std::string("sim.") + key), std::string("[sim] ") + key + " has " + std::to_string(v.size()) +
                                                     " value(s); with cost_model = \"measured\" it" + need);
    return false;
  };
  count("stage_forward_ms", c.stage_forward_ms, false);
  const bool b_ok = count("stage_backward_ms", c.stage_backward_ms, false);
  if (!count("stage_weight_ms", c.stage_weight_ms, true) || !b_ok) return;
  for (size_t i = 0; i < c.stage_weight_ms.size(); ++i)
    if (c.stage_weight_ms[i] > c.stage_backward_ms[i]) {
      p.error(p.where("sim.stage_weight_ms"), "[sim] stage_weight_ms[" + std::to_string(i) + "] = " + num_text(c.stage_weight_ms[i]) +
                                                  " must be <= stage_backward_ms[" + std::to_string(i) + "] = " +
                                                  num_text(c.stage_backward_ms[i]) + " (W is part of the full backward)");
      return;
    }
}

// Sim devices: one simulated device per pipeline rank of each replica, and
// [sim] keys only where they mean something.
void check_sim(const Spec& s, SpecSites& p) {
  const auto& t = s.topology;
  auto v = [](int64_t x) { return std::to_string(x); };
  if (t.device_kind != DeviceKind::sim) {
    if (const Pos* at = p.first_set_in("sim"))
      p.error(*at, std::string("[sim] keys apply only to [topology] device_kind = \"sim\" (this spec has device_kind = \"") +
                       device_kind_name(t.device_kind) + "\")");
    return;
  }
  // A key of another cost model would be ignored: say so instead.
  const std::pair<const char*, sim::CostModel> model_keys[] = {
      {"forward_ms", sim::CostModel::fixed},        {"backward_ms", sim::CostModel::fixed},
      {"weight_ms", sim::CostModel::fixed},         {"gflops", sim::CostModel::flops},
      {"gbps", sim::CostModel::flops},              {"stage_forward_ms", sim::CostModel::measured},
      {"stage_backward_ms", sim::CostModel::measured}, {"stage_weight_ms", sim::CostModel::measured}};
  for (const auto& [key, model] : model_keys) {
    if (model == s.sim.model) continue;
    if (const Pos* at = p.set_at(std::string("sim.") + key))
      p.error(*at, std::string("[sim] ") + key + " applies only to cost_model = \"" + sim::cost_model_name(model) +
                       "\" (this spec has cost_model = \"" + sim::cost_model_name(s.sim.model) + "\")");
  }
  if (s.sim.model == sim::CostModel::measured) check_measured_costs(s, p);
  if (s.sim.weight_ms > s.sim.backward_ms)
    p.error(p.where("sim.weight_ms"), "[sim] weight_ms = " + num_text(s.sim.weight_ms) +
                                          " must be <= backward_ms = " + num_text(s.sim.backward_ms) +
                                          " (W is the weight-gradient part of the full backward)");
  if (is_ep_sim(s)) {
    check_ep_sim(s, p);
    return;
  }
  if (const Pos* at = p.first_set_with_prefix("sim.ep_"))
    p.error(*at, "[sim] ep_* keys apply only to the expert-parallel sim model ([topology] expert_shards > 1)");
  // RL on sim devices splits the devices into generators and trainers itself.
  if (s.run.mode == RunMode::pretrain && t.devices > t.stages * t.data_parallel)
    p.error(p.where("topology.devices"), "[topology] devices = " + v(t.devices) + " must equal stages * data_parallel = " +
                                             v(t.stages * t.data_parallel) +
                                             " with device_kind = \"sim\" (one simulated device per pipeline rank)");
}

}  // namespace troupe::launch::spec_detail
