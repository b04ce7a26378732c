// Multi-process bring-up and failure watch of the runtime (CAF; include only
// from actors/*.cpp). The protocol is described in runtime_cluster.hpp; the
// hooks in runtime.cpp are: configure_cluster() before the actor system is
// made, Cluster's constructor after the coordinator is spawned (process 0) and
// before the other actors are (so they know the coordinator), connect() after
// every local actor is spawned, before_step() at each step, shutdown() when
// process 0's runtime goes away, and serve() on the other processes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <caf/all.hpp>

#include "actors/placement.hpp"
#include "actors/cluster/runtime_cluster.hpp"
#include "actors/context.hpp"
#include "actors/transport/ring_transport.hpp"

namespace troupe::runtime {

// Loads the middleman and sets heartbeats and the connection timeout (both
// off by default in CAF 0.17) from o.peer_timeout.
// Returns what must outlive the actor system (the TLS identity files when
// o.auth is tls; null otherwise). Collective when a key is made for the run.
std::shared_ptr<void> configure_cluster(caf::actor_system_config& cfg, const RuntimeOptions& o);

// The host name or address a process advertises for `interface` (its own
// host name when it binds every interface).
std::string advertised_host(const std::string& interface);
// Whether every process advertised the same host (process 0's included):
// only then may large envelopes take the shared-memory path.
bool all_on_one_host(const std::vector<std::pair<std::string, uint16_t>>& endpoints);
// Records that this process survived the loss of a peer (survived_process_loss()).
void note_survived_process_loss();

struct LostSet;

class Cluster {
 public:
  // Steps 1-2 of the bring-up; fills sh->peers.coordinator on processes > 0.
  // Throws std::runtime_error (on every process alike) when it fails.
  Cluster(caf::actor_system& sys, std::shared_ptr<Shared> sh, Placement place);
  ~Cluster();
  Cluster(const Cluster&) = delete;
  Cluster& operator=(const Cluster&) = delete;

  // Step 3: registers the local actors (taken from sh->peers), resolves and
  // watches the remote ones, fills sh->peers. Collective.
  void connect();
  // Process 0, before step `step` (1-based) starts: the fault-injection tick.
  void before_step(int64_t step);
  // Process 0: tells the others to stop (ok = false: the run failed) and
  // stops reporting lost peers.
  void shutdown(bool ok);
  // Processes > 0: blocks until process 0 ends the run or is lost.
  void serve();

  // Placement changes across processes (actors/supervision/elastic.cpp).
  // Process 0: spawns expert shard `producer` of `replica` as `plan` places
  // it on `process` (its directory spawns it there, waiting for its
  // restore), watches it, and returns its handle. Throws std::runtime_error
  // when that process does not answer.
  caf::actor spawn_expert(int process, const Plan& plan, int replica, int producer);
  // Process 0, after a placement change: every other process still running
  // makes `plan` its live plan and `experts` ([replica][producer]) its peer
  // table of expert shards, and answers; returns once all did (the next
  // step may then dispatch). Throws when one that is not lost fails.
  void publish_experts(const Plan& plan, const std::vector<std::vector<caf::actor>>& experts);
  // Stops watching remote actor `a` (see Shared::forget_remote): queued to
  // the directory before the caller stops `a`.
  void forget(const caf::actor& a);
  // Whether process p was found lost.
  bool lost(int p) const;

 private:
  void bring_up();  // the constructor's work

  // One host: opens the shared-memory rings between every pair of processes
  // (collective); on any failure every process keeps CAF's TCP stream.
  void start_rings(ClusterComm& comm);

  caf::actor_system& sys_;
  std::shared_ptr<Shared> sh_;
  Placement place_;
  int me_ = 0;
  std::chrono::milliseconds timeout_;
  std::shared_ptr<LostSet> lost_;  // processes the directory found lost
  caf::actor dir_;                 // this process's directory
  std::vector<caf::actor> dirs_;   // [process] its directory (dirs_[me_] == dir_)
  bool shut_ = false;
  bool bulk_shm_ = false;  // this run uses the shared-memory bulk path
  std::unique_ptr<RingTransport> ring_;  // step messages through shared-memory rings (one host); null: TCP
};

}  // namespace troupe::runtime
