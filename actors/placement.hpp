// Placement: which process and which device every runtime actor lives on.
// A pure function of the topology (no CAF, no devices), shared by the runtime
// (which spawns only its own process's actors) and by `troupe validate`
// (launch/run_plan.cpp), so the listing and the run agree.
//
// Default rules: devices are split into contiguous blocks over the processes
// (device d on process d * processes / devices); pipeline rank k of replica r
// runs on device (r * stages + k) mod devices; optimizer shard i on device
// i mod devices; expert shards next to their layer's stage (place_experts);
// an actor lives on its device's process; the coordinator
// (driver and data loader) on process 0.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace troupe::runtime {

struct PlacedActor {
  std::string name;   // "coordinator", "optimizer:<i>", "stage:<k>" or "stage:<k>/replica:<r>"
  int device = -1;    // -1: a control actor with no device
  int process = 0;
};

struct Placement {
  int processes = 1;
  std::vector<int> device_process;            // [device] -> process
  std::vector<int> shard_device;              // [optimizer shard] -> device
  std::vector<std::vector<int>> rank_device;  // [replica][pipeline rank] -> device
  // Expert shards (place_experts; empty without them): producer p = MoE layer
  // index * shards + shard.
  std::vector<std::pair<int, int>> expert_ids;  // [producer] (global layer, shard)
  std::vector<std::vector<int>> expert_device;  // [replica][producer] -> device
  int data_parallel = 1;

  int coordinator_process() const { return 0; }
  int shard_process(int i) const { return device_process[static_cast<size_t>(shard_device[static_cast<size_t>(i)])]; }
  int rank_process(int r, int k) const {
    return device_process[static_cast<size_t>(rank_device[static_cast<size_t>(r)][static_cast<size_t>(k)])];
  }
  int expert_process(int r, int producer) const {
    return device_process[static_cast<size_t>(expert_device[static_cast<size_t>(r)][static_cast<size_t>(producer)])];
  }
  // Every actor, coordinator first, then optimizer shards, then pipeline
  // ranks, then expert shards (both replica-major): the runtime's spawn order.
  std::vector<PlacedActor> actors() const;
  // Names of the actors placed on `process`, in spawn order.
  std::vector<std::string> actors_on(int process) const;
};

// Throws std::invalid_argument when the numbers cannot be placed (processes
// outside [1, devices], non-positive counts, a bad explicit list).
// `device_process`, when not empty, is the explicit process of each device
// (one entry per device, each in [0, processes), every process used).
Placement make_placement(int devices, int processes, int stages, int data_parallel, int optimizer_shards,
                         const std::vector<int>& device_process = {});

// Adds expert shards: `shards` per MoE layer; layer_rank[i] is the pipeline
// rank whose first-copy stage holds layers[i]. Shard k of a layer runs on
// device (device of that rank in the replica + k) mod devices, so a layer's
// shards start next to the stage that dispatches to them.
void place_experts(Placement& p, const std::vector<int>& layers, const std::vector<int>& layer_rank, int shards);

std::string shard_name(int shard);
// "expert:L/S", with "/replica:R" when data_parallel > 1 (the actor's own name).
std::string expert_name(int replica, int layer, int shard, int data_parallel);
std::string rank_name(int replica, int rank, int data_parallel);

}  // namespace troupe::runtime
