// How troupe processes prove to each other that they belong to one run
// ([topology] auth; the mechanism is in cluster_tls.hpp).
#pragma once

#include <string>

namespace troupe::runtime {

enum class ClusterAuth {
  tls,   // mutual TLS with the cluster key on every CAF connection (default)
  none,  // plain CAF connections: anyone who reaches the port can talk to the actors
};

inline std::string cluster_auth_name(ClusterAuth a) { return a == ClusterAuth::tls ? "tls" : "none"; }

}  // namespace troupe::runtime
