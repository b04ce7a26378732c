// The rules a topology's degrees obey (stages, schedule, micro-batches,
// replicas, devices, processes, expert and optimizer shards against the
// model and the batch), in one place. The spec checks report every broken
// rule at the key it names (launch/spec/check_topology.cpp); runtime::validate
// throws the first (actors/runtime.cpp). The messages name the spec's keys,
// which is how every user meets them. (The spec adds a policy of its own: a
// device per pipeline rank, devices >= stages x data_parallel; the runtime
// itself may place several ranks on one device.) No CAF.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "actors/schedule/schedule.hpp"
#include "model/config.hpp"

namespace troupe::runtime {

// A topology in the spec's terms.
struct Degrees {
  sched::Kind schedule = sched::Kind::sequential;
  int64_t stages = 1;            // pipeline ranks per replica
  int64_t devices = 1;
  int64_t microbatches = 1;      // per replica
  int64_t data_parallel = 1;
  int64_t optimizer_shards = 1;
  int64_t expert_shards = 1;     // per MoE layer, as the spec counts them
  bool expert_actors = false;    // the experts run in expert-shard actors (spec: expert_shards > 1)
  int64_t processes = 1;
  int64_t batch_size = 1;        // rows per optimizer step, all replicas
};

// The key a broken rule is reported at.
enum class DegreeKey { stages, schedule, microbatches, batch_size, expert_shards, processes, optimizer_shards };

struct DegreeProblem {
  DegreeKey key;
  std::string message;  // "[topology] stages = 8 must be <= [model] n_layers = 4"
};

// Every rule `d` breaks for `model`, in a fixed order (empty: none).
std::vector<DegreeProblem> degree_problems(const Degrees& d, const model::ModelConfig& model);

}  // namespace troupe::runtime
