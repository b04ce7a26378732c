// CAF middleman (TCP transport between processes) settings for the runtime
// (actors/cluster/runtime_cluster.cpp), the benches and the two-process tests,
// so that all of them measure and test the same transport.
//
// middleman.workers = 0: CAF 0.17 hands every received message to a pool of
// BASP workers (1 on a 2-core machine) that deserialize it and enqueue it to
// the receiving actor: one more thread wake-up per message, in each
// direction. With 0 the multiplexer thread that read the bytes deserializes
// them itself. bench_messaging, 2 processes on one host: 1 KiB round trip
// ~320 -> ~240 us alone, ~185 -> ~155 us on top of the work-sharing scheduler
// (bench/results/messaging.md).
//
// TROUPE_CAF_MM_WORKERS=N restores a worker pool (N=1 is CAF's default here),
// for before/after measurements. Heartbeats and timeouts are set by the
// cluster (configure_cluster), not here.
#pragma once

#include <caf/actor_system_config.hpp>

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace troupe::runtime {

inline void configure_middleman(caf::actor_system_config& cfg) {
  size_t workers = 0;
  if (const char* w = std::getenv("TROUPE_CAF_MM_WORKERS")) {
    char* end = nullptr;
    const long n = std::strtol(w, &end, 10);
    if (end == w || *end != '\0' || n < 0 || n > 64)
      throw std::invalid_argument(std::string("TROUPE_CAF_MM_WORKERS must be an integer in [0, 64], got \"") + w + "\"");
    workers = static_cast<size_t>(n);
  }
  cfg.set("middleman.workers", workers);
}

}  // namespace troupe::runtime
