// A rogue peer for tests/actors/runtime_mpi_test.sh and runtime_netns_test.sh: knocks on a troupe process's
// CAF port while a run goes on, first with TLS and a key of its own, then
// with CAF's plain protocol, and reports whether either got an actor handle.
// usage: tls_rogue_client PORT [HOST]   (HOST: 127.0.0.1 by default)
// exit: 0 both refused during the handshake, 1 one got through,
//       3 the port was closed (the run ended before the knock: no verdict).
#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/io/middleman.hpp>
#include <caf/openssl/remote_actor.hpp>
#include <caf/sec.hpp>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "actors/cluster/cluster_tls.hpp"

int main(int argc, char** argv) {
  if (argc != 2 && argc != 3) {
    std::fprintf(stderr, "usage: tls_rogue_client PORT [HOST]\n");
    return 2;
  }
  const auto port = static_cast<uint16_t>(std::atoi(argv[1]));
  const std::string host = argc == 3 ? argv[2] : "127.0.0.1";
  int through = 0, closed = 0;
  for (const bool tls : {true, false}) {
    troupe::runtime::IdentityFiles own(troupe::runtime::make_cluster_identity());
    caf::actor_system_config cfg;
    cfg.load<caf::io::middleman>();
    if (tls) troupe::runtime::configure_tls(cfg, own);
    caf::actor_system sys{cfg};
    auto h = tls ? caf::openssl::remote_actor(sys, host, port) : sys.middleman().remote_actor(host, port);
    const std::string how = tls ? "TLS with another key" : "plain CAF";
    if (h) {
      std::printf("rogue (%s): GOT THROUGH\n", how.c_str());
      ++through;
    } else if (h.error() == caf::sec::cannot_connect_to_node) {
      std::printf("rogue (%s): port closed: %s\n", how.c_str(), sys.render(h.error()).c_str());
      ++closed;
    } else {
      std::printf("rogue (%s): refused: %s\n", how.c_str(), sys.render(h.error()).c_str());
    }
  }
  return through > 0 ? 1 : closed > 0 ? 3 : 0;
}
