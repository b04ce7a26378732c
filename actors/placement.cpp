// Placement of runtime actors on processes and devices (see placement.hpp).
#include "actors/placement.hpp"

#include <stdexcept>

namespace troupe::runtime {

std::string shard_name(int shard) { return "optimizer:" + std::to_string(shard); }

std::string rank_name(int replica, int rank, int data_parallel) {
  // Same names as the actors give themselves (stage_actor.cpp).
  return "stage:" + std::to_string(rank) + (data_parallel > 1 ? "/replica:" + std::to_string(replica) : "");
}

Placement make_placement(int devices, int processes, int stages, int data_parallel, int optimizer_shards,
                         const std::vector<int>& device_process) {
  if (devices < 1 || stages < 1 || data_parallel < 1 || optimizer_shards < 1)
    throw std::invalid_argument("placement: devices, stages, data_parallel and optimizer_shards must be >= 1");
  if (processes < 1 || processes > devices)
    throw std::invalid_argument("placement: processes (" + std::to_string(processes) + ") must be in [1, devices = " +
                                std::to_string(devices) + "]");
  Placement p;
  p.processes = processes;
  p.data_parallel = data_parallel;
  if (!device_process.empty()) {
    if (device_process.size() != static_cast<size_t>(devices))
      throw std::invalid_argument("placement: " + std::to_string(device_process.size()) + " device processes for " +
                                  std::to_string(devices) + " devices");
    std::vector<bool> used(static_cast<size_t>(processes), false);
    for (int q : device_process) {
      if (q < 0 || q >= processes) throw std::invalid_argument("placement: process " + std::to_string(q) + " out of range");
      used[static_cast<size_t>(q)] = true;
    }
    for (int q = 0; q < processes; ++q)
      if (!used[static_cast<size_t>(q)]) throw std::invalid_argument("placement: process " + std::to_string(q) + " gets no device");
    p.device_process = device_process;
  } else {
    // Contiguous blocks: with processes <= devices every process gets >= 1 device.
    for (int d = 0; d < devices; ++d)
      p.device_process.push_back(static_cast<int>(static_cast<long long>(d) * processes / devices));
  }
  for (int i = 0; i < optimizer_shards; ++i) p.shard_device.push_back(i % devices);
  p.rank_device.resize(static_cast<size_t>(data_parallel));
  for (int r = 0; r < data_parallel; ++r)
    for (int k = 0; k < stages; ++k) p.rank_device[static_cast<size_t>(r)].push_back((r * stages + k) % devices);
  return p;
}

std::vector<PlacedActor> Placement::actors() const {
  std::vector<PlacedActor> out;
  out.push_back({"coordinator", -1, coordinator_process()});
  for (size_t i = 0; i < shard_device.size(); ++i)
    out.push_back({shard_name(static_cast<int>(i)), shard_device[i], shard_process(static_cast<int>(i))});
  for (size_t r = 0; r < rank_device.size(); ++r)
    for (size_t k = 0; k < rank_device[r].size(); ++k)
      out.push_back({rank_name(static_cast<int>(r), static_cast<int>(k), data_parallel), rank_device[r][k],
                     rank_process(static_cast<int>(r), static_cast<int>(k))});
  return out;
}

std::vector<std::string> Placement::actors_on(int process) const {
  std::vector<std::string> out;
  for (const PlacedActor& a : actors())
    if (a.process == process) out.push_back(a.name);
  return out;
}

}  // namespace troupe::runtime
