// What the elastic-expert tests share: the 2-stage, 3-device topology
// (3 devices, so a layer's shards move between devices when their count
// changes), and one run that records what they check step by step.
#pragma once

#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "actors/runtime.hpp"
#include "tests/actors/runtime_test_options.hpp"

namespace troupe::test {

// 2 stages on 3 devices, 2 optimizer shards, `dp` replicas of 4
// micro-batches each (DualPipe needs 2 x ranks), `shards` expert shards per
// MoE layer. The balancing method is each test's choice.
inline runtime::RuntimeOptions elastic_options(const std::string& schedule, int dp, int shards, uint64_t seed,
                                               int64_t steps = 5) {
  runtime::RuntimeOptions o = tiny_moe_options(seed, steps);
  o.schedule = troupe::sched::parse_kind(schedule);
  o.stages = 2;
  o.devices = 3;
  o.optimizer_shards = 2;
  o.data_parallel = dp;
  o.train.microbatches = 4 * dp;
  o.train.data.batch_size = 8 * dp;
  o.expert_shards = shards;
  return o;
}

struct ElasticOutcome {
  model::TrainingState state;
  std::vector<double> losses, norms;
  std::vector<std::vector<std::vector<int64_t>>> loads;        // [step][layer][expert]
  std::vector<std::vector<std::vector<int64_t>>> shard_loads;  // [step][layer][shard]
  std::vector<int> shards;                                     // [step] expert shards per layer after it
  std::vector<runtime::RestartEvent> restarts;
  std::vector<runtime::RescaleReport> rescales;
  std::vector<std::string> names;  // the live actors' names at the end
  // The live expert shards' names at the end.
  std::set<std::string> experts() const {
    std::set<std::string> out;
    for (const std::string& n : names)
      if (n.rfind("expert:", 0) == 0) out.insert(n);
    return out;
  }
};

// Runs the steps; `before(rt, s)` may act between steps (s = steps done).
template <class F>
ElasticOutcome run_elastic(const runtime::RuntimeOptions& o, F&& before) {
  runtime::Runtime rt(o);
  ElasticOutcome out;
  for (int64_t s = 0; s < o.train.steps; ++s) {
    before(rt, s);
    const model::StepMetrics m = rt.step();
    out.losses.push_back(m.loss);
    out.norms.push_back(m.grad_norm);
    out.loads.push_back(m.expert_load);
    out.shard_loads.push_back(m.shard_load);
    out.shards.push_back(rt.expert_shards());
  }
  out.state = rt.state();
  out.restarts = rt.restarts();
  out.rescales = rt.rescales();
  out.names = rt.actor_names();
  return out;
}
inline ElasticOutcome run_elastic(const runtime::RuntimeOptions& o) {
  return run_elastic(o, [](runtime::Runtime&, int64_t) {});
}

}  // namespace troupe::test
