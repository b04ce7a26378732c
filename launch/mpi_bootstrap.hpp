// MPI bootstrap: processes launched by mpirun exchange the host:port on which
// each one published its CAF actor, so they can connect through the
// middleman. MPI is used only for this exchange (and barriers); actor
// traffic goes through CAF. The header does not include <mpi.h>.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include <caf/actor.hpp>
#include <caf/expected.hpp>
#include <caf/fwd.hpp>

namespace troupe::mpi {

// Owns MPI for the life of the process: initializes it (thread level
// FUNNELED: only the thread that made the Session calls MPI) unless something
// already did, and finalizes it on destruction if it initialized it.
class Session {
 public:
  Session(int& argc, char**& argv);
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  int rank() const { return rank_; }
  int size() const { return size_; }
  // Ends the whole job with `code` (MPI_Abort): for a failed run, where a
  // finalize could wait forever on a lost or hung peer. Does not return.
  [[noreturn]] void abort(int code);

 private:
  int rank_ = 0;
  int size_ = 1;
  bool owns_ = false;
};

// True when this process was started by mpirun (Open MPI's or PMIx's
// environment is set), i.e. a Session is wanted.
bool launched_by_mpirun();

// Where a rank's actor can be reached. port 0 = nothing published.
struct Endpoint {
  std::string host;
  uint16_t port = 0;
};

inline constexpr size_t kMaxHostLength = 63;

// Collective over MPI_COMM_WORLD: every rank passes its endpoint and gets
// all of them, element i being rank i's. Errors (same on every rank, so no
// rank is left waiting): a host longer than kMaxHostLength, an MPI failure,
// or a rank that reported `ok = false` (e.g. its publish failed).
caf::expected<std::vector<Endpoint>> exchange_endpoints(const Endpoint& mine, bool ok = true);

// Collective: publishes `a` on `host` with a port chosen by the OS (port 0),
// then exchanges endpoints. If any rank fails to publish, every rank gets an
// error naming it.
caf::expected<std::vector<Endpoint>> publish_and_exchange(caf::actor_system& sys, const caf::actor& a,
                                                          const std::string& host = "127.0.0.1");

// Connects to a peer's published actor, retrying up to `attempts` times with
// `backoff` between tries (the peer publishes before the exchange, so the
// first try normally succeeds).
caf::expected<caf::actor> connect(caf::actor_system& sys, const Endpoint& peer, int attempts = 10,
                                  std::chrono::milliseconds backoff = std::chrono::milliseconds(100));

// Collective: MPI_Barrier on MPI_COMM_WORLD.
void barrier();

// Collective: true on every rank iff `mine` is true on every rank (also a
// barrier). Lets all ranks of a test agree on one exit code. An MPI failure
// counts as false.
bool all_ok(bool mine);

// Collective: process 0's `text` on every process (MPI_Bcast of the length,
// then the bytes; at most 1 MiB).
caf::expected<std::string> broadcast(const std::string& text);

}  // namespace troupe::mpi
