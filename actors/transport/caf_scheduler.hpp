// CAF scheduler settings for the real runtime (actors/runtime.cpp).
//
// Why not CAF 0.17's defaults: its work-stealing policy starts
// max(cores, 4) worker threads, and an idle worker polls its queue (100
// spins, then 500 polls 50 us apart, i.e. 25 ms of wake-ups every 50 us)
// after every job before it blocks. Here the compute runs on the device
// threads and the actors only hand work around (a few dozen messages per
// step), so each worker goes idle after every message and spends ~25 ms
// waking up 20,000 times a second: 4 such threads take CPU from the device
// threads on a 2-core machine (measured in bench/results/pipeline_runtime.md, "Pipeline
// runtime (real)"). The work-sharing policy blocks idle workers on a
// condition variable instead; 2 workers are enough for actors that never
// compute.
//
// TROUPE_CAF_SCHEDULER=stealing restores CAF's defaults (policy and thread
// count), for before/after measurements; TROUPE_CAF_THREADS=N sets the
// worker count. Middleman settings (runtime_cluster.cpp) are separate keys
// and are left alone.
#pragma once

#include <caf/actor_system_config.hpp>
#include <caf/atom.hpp>

#include <cstdlib>
#include <stdexcept>
#include <string>

namespace troupe::runtime {

inline void configure_scheduler(caf::actor_system_config& cfg) {
  const char* policy = std::getenv("TROUPE_CAF_SCHEDULER");
  const std::string p = policy ? policy : "sharing";
  if (p != "sharing" && p != "stealing")
    throw std::invalid_argument("TROUPE_CAF_SCHEDULER must be \"sharing\" or \"stealing\", got \"" + p + "\"");
  size_t threads = 2;
  if (const char* t = std::getenv("TROUPE_CAF_THREADS")) {
    char* end = nullptr;
    const long n = std::strtol(t, &end, 10);
    if (end == t || *end != '\0' || n < 1 || n > 256)
      throw std::invalid_argument(std::string("TROUPE_CAF_THREADS must be an integer in [1, 256], got \"") + t + "\"");
    threads = static_cast<size_t>(n);
  } else if (p == "stealing") {
    return;  // CAF's defaults, untouched
  }
  if (p == "sharing") cfg.set("scheduler.policy", caf::atom("sharing"));
  else cfg.set("scheduler.policy", caf::atom("stealing"));
  cfg.set("scheduler.max-threads", threads);
}

}  // namespace troupe::runtime
