// The shared-memory rings between the two ranks of a bench (bench_ring,
// bench_moe), brought up as the runtime does (actors/cluster/runtime_cluster.cpp):
// rank 0 names the run, each rank makes its inbound ring, then opens the
// other's, and the names leave /dev/shm once both have mapped them.
#pragma once

#include <mpi.h>

#include <cstdlib>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/node_id.hpp>

#include "actors/transport/ring_transport.hpp"

namespace troupe::bench {

// TROUPE_RING_SPIN_US overrides the receivers' spin.
inline RingOptions ring_options_from_env() {
  RingOptions ro;
  if (const char* s = std::getenv("TROUPE_RING_SPIN_US")) ro.spin_ns = std::atoll(s) * 1000;
  return ro;
}

// Collective over MPI_COMM_WORLD (2 ranks). `other`: the other rank's CAF node.
inline std::unique_ptr<RingTransport> rings_between_ranks(caf::actor_system& sys, int rank, const caf::node_id& other,
                                                          const RingOptions& ro) {
  uint64_t nonce = rank == 0 ? std::random_device{}() : 0;
  MPI_Bcast(&nonce, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
  auto ring = std::make_unique<RingTransport>(sys, rank, 2, std::to_string(nonce), ro);
  MPI_Barrier(MPI_COMM_WORLD);
  std::vector<caf::node_id> nodes(2);
  nodes[static_cast<size_t>(rank)] = sys.node();
  nodes[static_cast<size_t>(1 - rank)] = other;
  ring->connect(nodes);
  MPI_Barrier(MPI_COMM_WORLD);
  ring->unlink_names();
  return ring;
}

}  // namespace troupe::bench
