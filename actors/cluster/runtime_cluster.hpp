// The runtime across processes: what a process of a multi-process run needs
// from its launcher (MPI in launch/, a fake in tests) to find the others.
// No CAF, no MPI in this header.
//
// Bring-up (actors/cluster/runtime_cluster.cpp), the same on every process:
//   1. each process publishes a directory actor (middleman, bound to
//      RuntimeOptions::interface, port 0 = any) and the processes exchange
//      (host, port) through ClusterComm::exchange;
//   2. every process connects to every other directory; the others take the
//      coordinator's handle from process 0's directory;
//   3. each process spawns its own actors (actors/placement.hpp) and
//      registers them; after a barrier each resolves the others' actors by
//      name and watches them; a last barrier, then process 0 drives steps.
// Placement changes of expert shards ([[elastic]], eplb, shrink;
// actors/supervision/elastic.cpp) are made by process 0: a new shard placed
// on another process is spawned there by its directory, and once all new
// shards have their weights every other process takes the new plan and the
// shards' handles from process 0 before the next step starts.
// Failure detection: CAF heartbeats and a connection timeout are set
// explicitly (RuntimeOptions::peer_timeout); a dead peer closes its socket, a
// hung one stops sending heartbeats. Process 0 names the lost process and its
// actors and fails the run; the others exit when process 0 is lost or ends
// the run.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace troupe::runtime {

struct ClusterComm {
  virtual ~ClusterComm() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  // Collective: every process passes where it published (ok = false when its
  // publish failed) and gets all processes' (host, port), element i being
  // process i's. Throws std::runtime_error on the same error on every process.
  virtual std::vector<std::pair<std::string, uint16_t>> exchange(const std::string& host, uint16_t port,
                                                                 bool ok) = 0;
  // Collective: true on every process iff `mine` is true on every process.
  virtual bool all_ok(bool mine) = 0;
  // Collective: every process gets process 0's `text` (the others' is
  // ignored). Carries the per-run cluster identity (cluster_tls.hpp).
  virtual std::string broadcast(const std::string& text) = 0;
};

// True once this process has survived the loss of a peer process
// (process_loss = recover). Its launcher must then make no MPI call, not even
// MPI_Finalize: with a dead peer it can wait forever (seen under Open MPI
// 4.1 --enable-recovery, now and then). Process-wide, like the MPI world.
bool survived_process_loss();

}  // namespace troupe::runtime
