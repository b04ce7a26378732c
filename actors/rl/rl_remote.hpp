// Generators on other processes (internal to actors/rl/*.cpp; see
// RlProcesses in rl_actors.hpp).
//
// Process 0 holds, for each remote generator, a local proxy actor that the
// coordinator deals with exactly as with a local generator; the proxy
// encodes what it is sent (weights as an RlWeights envelope; jobs and arms
// as they are) for an outbox actor on the generator's process, which decodes
// for the real generator actor there and encodes its rollouts back
// (RlRollout). Each pair watches the other: a generator that dies takes its
// outbox and then its proxy down with the same reason (the coordinator's
// supervision restarts it: a new proxy asks the host for a new generator);
// a proxy that dies (restart, end of run) makes its outbox kill the
// generator. A process that is lost makes its proxies go down with
// remote_link_unreachable; the coordinator then places their generators on
// process 0.
//
// Across processes:
//   coordinator -> host:p   (rl_hello, coordinator)      once, after connecting
//   proxy -> host:p         (rl_spawn, k, incarnation, proxy) -> outbox handle
//   proxy -> outbox         (rl_sync, Envelope RlWeights) | (rl_job, s, v) | (rl_arm, point) | (rl_armdrop, n)
//   outbox -> proxy         (rl_rcvd, v, decode seconds) as a version arrives (the transfer's round trip);
//                           (rl_synced, k, incarnation, v) the generator's confirmation | (rl_rollout, Envelope RlRollout)
//   coordinator -> host:p   (rl_shut, ok) -> true          at the end of the run
#pragma once

#include <caf/all.hpp>

#include <chrono>
#include <memory>
#include <mutex>
#include <set>
#include <vector>

#include "actors/rl/rl_actors.hpp"
#include "actors/rl/rl_messages.hpp"
#include "actors/rl/rl_wire.hpp"

namespace troupe::runtime {

namespace rlmsg {
using hello_atom = caf::atom_constant<caf::atom("rl_hello")>;
using spawn_atom = caf::atom_constant<caf::atom("rl_spawn")>;
using shut_atom = caf::atom_constant<caf::atom("rl_shut")>;
using received_atom = caf::atom_constant<caf::atom("rl_rcvd")>;
}  // namespace rlmsg

// Weight syncs across processes (written by the proxies).
struct RemoteSyncStats {
  std::mutex mu;
  int64_t syncs = 0, bytes = 0;
  double round_trip = 0.0, encode = 0.0, decode = 0.0;
  double memcpy_seconds = 0.0;  // a plain copy of one version, timed at bring-up
};

// Process 0's view of the generator hosts.
struct RemoteGenerators {
  std::vector<caf::actor> hosts;       // [process]; hosts[0] is empty
  std::vector<int> generator_process;  // [generator]
  std::set<int> lost;                  // processes found lost (their generators run on process 0); the coordinator's thread only
  std::shared_ptr<RemoteSyncStats> stats = std::make_shared<RemoteSyncStats>();
  std::chrono::milliseconds timeout{10000};
  size_t parameters = 0;
  rlwire::RolloutBounds bounds;
  std::unique_ptr<rl::Task> task;  // the prompts rollouts must carry (bounds.task)
  // Where generator k runs now: its process, or 0 once that process is lost.
  int process_of(int k) const;
};

// Loads the middleman (and TLS) for a multi-process run; what it returns
// must outlive the actor system. Collective when process 0 makes the key.
std::shared_ptr<void> configure_rl_cluster(caf::actor_system_config& cfg, const RlProcesses& p);

// Process 0: connects to every other process's generator host (collective
// with serve_generators). Throws std::runtime_error on every process alike.
std::shared_ptr<RemoteGenerators> connect_generator_hosts(caf::actor_system& sys, const RlShared& sh);
// Process 0, at the end: tells every host still there that the run ended.
void shutdown_generator_hosts(caf::actor_system& sys, const RemoteGenerators& r, bool ok);

// Process 0: the stand-in of generator `index` on `process` (> 0; the
// coordinator's process_of(index) when it spawned the proxy: the proxy does
// not read `lost`, which only the coordinator's thread may touch).
caf::behavior generator_proxy(caf::event_based_actor* self, std::shared_ptr<RemoteGenerators> remote, int index,
                              int process, int64_t incarnation, caf::actor driver);

}  // namespace troupe::runtime
