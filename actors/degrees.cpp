// The degree rules (degrees.hpp).
#include "actors/degrees.hpp"

#include <stdexcept>

#include "model/params.hpp"

namespace troupe::runtime {

std::vector<DegreeProblem> degree_problems(const Degrees& d, const model::ModelConfig& m) {
  std::vector<DegreeProblem> out;
  auto v = [](int64_t x) { return std::to_string(x); };
  auto add = [&](DegreeKey k, std::string msg) { out.push_back({k, std::move(msg)}); };
  const std::string sched_name(sched::to_string(d.schedule));
  if (d.stages > m.n_layers)
    add(DegreeKey::stages, "[topology] stages = " + v(d.stages) + " must be <= [model] n_layers = " + v(m.n_layers));
  if ((d.schedule == sched::Kind::dualpipe || d.schedule == sched::Kind::dualpipev) && d.stages % 2 != 0) {
    add(DegreeKey::schedule, "[topology] schedule = \"" + sched_name + "\" needs an even number of stages, got stages = " +
                                 v(d.stages));
  } else {
    try {
      const sched::Layout layout =
          sched::make_layout(d.schedule, static_cast<int>(d.stages), static_cast<int>(d.microbatches));
      if (layout.num_stages > m.n_layers && d.stages <= m.n_layers)  // else the stages rule fired
        add(DegreeKey::stages, "[topology] schedule = \"" + sched_name + "\" with stages = " + v(d.stages) +
                                   " cuts the model into " + v(layout.num_stages) + " stages, more than [model] n_layers = " +
                                   v(m.n_layers));
    } catch (const std::invalid_argument& e) {
      add(DegreeKey::microbatches, "[topology] microbatches = " + v(d.microbatches) + " does not fit schedule = \"" +
                                       sched_name + "\" with stages = " + v(d.stages) + ": " + e.what());
    }
  }
  const int64_t per_step = d.microbatches * d.data_parallel;
  if (per_step > 0 && d.batch_size % per_step != 0)
    add(DegreeKey::batch_size, "[data] batch_size = " + v(d.batch_size) +
                                   " must be divisible by [topology] microbatches * data_parallel = " + v(per_step));
  if (m.ffn == model::Ffn::moe && d.expert_shards > m.n_experts)
    add(DegreeKey::expert_shards,
        "[topology] expert_shards = " + v(d.expert_shards) + " must be <= [model] n_experts = " + v(m.n_experts));
  if (m.ffn == model::Ffn::dense && d.expert_actors)
    add(DegreeKey::expert_shards, "[topology] expert_shards = " + v(d.expert_shards) + " needs [model] ffn = \"moe\"");
  if (d.processes > d.devices)
    add(DegreeKey::processes, "[topology] processes = " + v(d.processes) + " must be <= devices = " + v(d.devices));
  if (d.optimizer_shards > 1) {
    int64_t params = 0;
    try {
      params = model::build_param_layout(m).total();
    } catch (const std::exception&) {
      params = 0;  // the model's own problems are reported on its keys
    }
    if (params > 0 && d.optimizer_shards > params)
      add(DegreeKey::optimizer_shards, "[topology] optimizer_shards = " + v(d.optimizer_shards) +
                                           " is more than the model's " + v(params) + " parameters");
  }
  return out;
}

}  // namespace troupe::runtime
