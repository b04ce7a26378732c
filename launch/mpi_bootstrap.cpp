// MPI bootstrap implementation: fixed-size records all-gathered over
// MPI_COMM_WORLD, then CAF publish / remote_actor.
#include "launch/mpi_bootstrap.hpp"

#include <mpi.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>

#include <caf/actor_system.hpp>
#include <caf/io/middleman.hpp>
#include <caf/sec.hpp>

namespace troupe::mpi {
namespace {

// One rank's record on the wire: NUL-padded host, port, ok flag.
struct Record {
  char host[kMaxHostLength + 1];
  uint16_t port;
  uint8_t ok;
  uint8_t pad;
};

caf::error mpi_error(const char* what, int code) {
  char text[MPI_MAX_ERROR_STRING] = {};
  int len = 0;
  MPI_Error_string(code, text, &len);
  return caf::make_error(caf::sec::runtime_error, std::string(what) + ": " + text);
}

}  // namespace

Session::Session(int& argc, char**& argv) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    MPI_Init_thread(&argc, &argv, MPI_THREAD_FUNNELED, &provided);
    owns_ = true;
  }
  // Errors come back as codes (turned into caf::error), never abort the job.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &rank_);
  MPI_Comm_size(MPI_COMM_WORLD, &size_);
}

Session::~Session() {
  int finalized = 0;
  MPI_Finalized(&finalized);
  if (owns_ && !finalized) MPI_Finalize();
}

void Session::abort(int code) {
  MPI_Abort(MPI_COMM_WORLD, code);
  std::_Exit(code);  // MPI_Abort does not return; this is for the type system
}

bool launched_by_mpirun() {
  return std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMIX_RANK") != nullptr ||
         std::getenv("PMI_RANK") != nullptr;
}

caf::expected<std::vector<Endpoint>> exchange_endpoints(const Endpoint& mine, bool ok) {
  Record rec{};
  // A host that does not fit is reported as a failure of this rank, through
  // the exchange itself, so the other ranks do not wait for it.
  const bool host_fits = mine.host.size() <= kMaxHostLength;
  if (host_fits) std::memcpy(rec.host, mine.host.data(), mine.host.size());
  rec.port = mine.port;
  rec.ok = (ok && host_fits) ? 1 : 0;
  int size = 0;
  MPI_Comm_size(MPI_COMM_WORLD, &size);
  std::vector<Record> all(static_cast<size_t>(size));
  int rc = MPI_Allgather(&rec, sizeof(Record), MPI_BYTE, all.data(), sizeof(Record), MPI_BYTE, MPI_COMM_WORLD);
  if (rc != MPI_SUCCESS) return mpi_error("MPI_Allgather of endpoints", rc);
  if (!host_fits)
    return caf::make_error(caf::sec::invalid_argument,
                           "host name longer than " + std::to_string(kMaxHostLength) + " characters");
  std::vector<Endpoint> out;
  for (int r = 0; r < size; ++r) {
    const Record& x = all[static_cast<size_t>(r)];
    if (!x.ok) return caf::make_error(caf::sec::runtime_error, "rank " + std::to_string(r) + " failed to publish");
    out.push_back(Endpoint{std::string(x.host, strnlen(x.host, sizeof(x.host))), x.port});
  }
  return out;
}

caf::expected<std::vector<Endpoint>> publish_and_exchange(caf::actor_system& sys, const caf::actor& a,
                                                          const std::string& host) {
  auto port = sys.middleman().publish(a, 0, host.c_str());
  Endpoint mine{host, port ? *port : uint16_t{0}};
  auto all = exchange_endpoints(mine, static_cast<bool>(port));
  if (!port) return std::move(port.error());
  return all;
}

caf::expected<caf::actor> connect(caf::actor_system& sys, const Endpoint& peer, int attempts,
                                  std::chrono::milliseconds backoff) {
  if (peer.port == 0) return caf::make_error(caf::sec::invalid_argument, "peer published no port");
  caf::error last;
  for (int i = 0; i < attempts; ++i) {
    auto h = sys.middleman().remote_actor(peer.host, peer.port);
    if (h) return h;
    last = std::move(h.error());
    std::this_thread::sleep_for(backoff);
  }
  return last;
}

void barrier() { MPI_Barrier(MPI_COMM_WORLD); }

bool all_ok(bool mine) {
  int in = mine ? 1 : 0, out = 0;
  if (MPI_Allreduce(&in, &out, 1, MPI_INT, MPI_LAND, MPI_COMM_WORLD) != MPI_SUCCESS) return false;
  return out != 0;
}

caf::expected<std::string> broadcast(const std::string& text) {
  constexpr int kMax = 1 << 20;
  int n = static_cast<int>(std::min<size_t>(text.size(), kMax + 1));
  if (int rc = MPI_Bcast(&n, 1, MPI_INT, 0, MPI_COMM_WORLD); rc != MPI_SUCCESS) return mpi_error("MPI_Bcast", rc);
  if (n < 0 || n > kMax) return caf::make_error(caf::sec::runtime_error, "broadcast: " + std::to_string(n) + " bytes, more than 1 MiB");
  std::string out = text;
  out.resize(static_cast<size_t>(n));
  if (n > 0)
    if (int rc = MPI_Bcast(out.data(), n, MPI_CHAR, 0, MPI_COMM_WORLD); rc != MPI_SUCCESS) return mpi_error("MPI_Bcast", rc);
  return out;
}

}  // namespace troupe::mpi
