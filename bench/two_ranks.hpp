// What the two-rank benches (bench_messaging, bench_moe, bench_ring) share:
// the runtime's CAF settings, a barrier that sleeps, and the shared-memory
// rings between the two ranks, brought up as the runtime does
// (actors/cluster/runtime_cluster.cpp).
#pragma once

#include <mpi.h>

#include <chrono>
#include <cstdlib>
#include <thread>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/io/middleman.hpp>
#include <caf/node_id.hpp>

#include "actors/transport/caf_middleman.hpp"
#include "actors/transport/caf_scheduler.hpp"
#include "actors/transport/caf_types.hpp"
#include "actors/transport/ring_transport.hpp"

namespace troupe::bench {

// The runtime's CAF settings: work-sharing scheduler, middleman without BASP
// workers (their environment overrides give CAF's defaults back), loopback
// heartbeats every 500 ms, a dead connection after `timeout`.
struct RuntimeCafConfig : caf::actor_system_config {
  explicit RuntimeCafConfig(std::chrono::seconds timeout = std::chrono::seconds(30)) {
    register_caf_types(*this);
    load<caf::io::middleman>();
    set("logger.console", caf::atom("none"));
    set("middleman.heartbeat-interval", caf::timespan{std::chrono::milliseconds(500)});
    set("middleman.connection-timeout", caf::timespan{timeout});
    runtime::configure_scheduler(*this);
    runtime::configure_middleman(*this);
  }
};

// MPI_Barrier busy-polls and would steal a core from what is measured.
inline void quiet_barrier() {
  MPI_Request req;
  MPI_Ibarrier(MPI_COMM_WORLD, &req);
  for (int done = 0; !done;) {
    MPI_Test(&req, &done, MPI_STATUS_IGNORE);
    if (!done) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
}

// The rings: rank 0 names the run, each rank makes its inbound ring, then
// opens the other's, and the names leave /dev/shm once both have mapped them.

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
  quiet_barrier();
  std::vector<caf::node_id> nodes(2);
  nodes[static_cast<size_t>(rank)] = sys.node();
  nodes[static_cast<size_t>(1 - rank)] = other;
  ring->connect(nodes);
  quiet_barrier();
  ring->unlink_names();
  return ring;
}

}  // namespace troupe::bench
