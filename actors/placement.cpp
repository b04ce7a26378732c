// Placement of runtime actors on processes and devices (see placement.hpp).
#include "actors/placement.hpp"

#include <stdexcept>

namespace troupe::runtime {

std::string shard_name(int shard) { return "optimizer:" + std::to_string(shard); }

std::string rank_name(int replica, int rank, int data_parallel) {
  // Same names as the actors give themselves (pipeline/rank_actor.cpp).
  return "stage:" + std::to_string(rank) + (data_parallel > 1 ? "/replica:" + std::to_string(replica) : "");
}

std::string expert_name(int replica, int layer, int shard, int data_parallel) {
  return "expert:" + std::to_string(layer) + "/" + std::to_string(shard) +
         (data_parallel > 1 ? "/replica:" + std::to_string(replica) : "");
}

void place_experts(Placement& p, const std::vector<int>& layers, const std::vector<int>& layer_rank, int shards) {
  if (layers.size() != layer_rank.size() || shards < 1)
    throw std::invalid_argument("placement: expert layers and their ranks do not match");
  const int devices = static_cast<int>(p.device_process.size());
  p.expert_ids.clear();
  for (size_t i = 0; i < layers.size(); ++i)
    for (int k = 0; k < shards; ++k) p.expert_ids.emplace_back(layers[i], k);
  p.expert_device.assign(p.rank_device.size(), {});
  for (size_t r = 0; r < p.rank_device.size(); ++r)
    for (size_t i = 0; i < layers.size(); ++i) {
      const int rank = layer_rank[i];
      if (rank < 0 || static_cast<size_t>(rank) >= p.rank_device[r].size())
        throw std::invalid_argument("placement: MoE layer " + std::to_string(layers[i]) + " on no pipeline rank");
      for (int k = 0; k < shards; ++k) p.expert_device[r].push_back((p.rank_device[r][static_cast<size_t>(rank)] + k) % devices);
    }
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
  for (size_t r = 0; r < expert_device.size(); ++r)
    for (size_t x = 0; x < expert_device[r].size(); ++x)
      out.push_back({expert_name(static_cast<int>(r), expert_ids[x].first, expert_ids[x].second, data_parallel),
                     expert_device[r][x], expert_process(static_cast<int>(r), static_cast<int>(x))});
  return out;
}

std::vector<std::string> Placement::actors_on(int process) const {
  std::vector<std::string> out;
  for (const PlacedActor& a : actors())
    if (a.process == process) out.push_back(a.name);
  return out;
}

}  // namespace troupe::runtime
