// Placement: which process and which device every runtime actor lives on.
// A pure function of the topology (no CAF, no devices), shared by the runtime
// (which spawns only its own process's actors) and by `troupe validate`
// (launch/topology.cpp), so the listing and the run agree.
//
// Default rules: devices are split into contiguous blocks over the processes
// (device d on process d * processes / devices); pipeline rank k of replica r
// runs on device (r * stages + k) mod devices; optimizer shard i on device
// i mod devices; an actor lives on its device's process; the coordinator
// (driver and data loader) on process 0.
#pragma once

#include <string>
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
  int data_parallel = 1;

  int coordinator_process() const { return 0; }
  int shard_process(int i) const { return device_process[static_cast<size_t>(shard_device[static_cast<size_t>(i)])]; }
  int rank_process(int r, int k) const {
    return device_process[static_cast<size_t>(rank_device[static_cast<size_t>(r)][static_cast<size_t>(k)])];
  }
  // Every actor, coordinator first, then optimizer shards, then pipeline
  // ranks (replica-major): the runtime's spawn order.
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

std::string shard_name(int shard);
std::string rank_name(int replica, int rank, int data_parallel);

}  // namespace troupe::runtime
