// CAF scheduler and middleman settings of the runtime
// (actors/transport/caf_scheduler.hpp, caf_middleman.hpp): the work-sharing
// default, no BASP worker hop, the environment overrides and their errors,
// and that the cluster's middleman settings (runtime_cluster.cpp) sit beside them.
#include <gtest/gtest.h>

#include <cstdlib>
#include <stdexcept>

#include "actors/transport/caf_middleman.hpp"
#include "actors/transport/caf_scheduler.hpp"
#include "actors/cluster/runtime_cluster_internal.hpp"

using namespace troupe::runtime;

namespace {

// Sets (or with nullptr unsets) an environment variable for one test.
struct EnvVar {
  const char* name;
  EnvVar(const char* n, const char* value) : name(n) {
    if (value) ::setenv(name, value, 1);
    else ::unsetenv(name);
  }
  ~EnvVar() { ::unsetenv(name); }
};

std::string policy(const caf::actor_system_config& cfg) {
  return caf::to_string(caf::get_or(cfg, "scheduler.policy", caf::atom("none")));
}

}  // namespace

TEST(CafScheduler, DefaultIsWorkSharingWithTwoWorkers) {
  EnvVar p("TROUPE_CAF_SCHEDULER", nullptr), t("TROUPE_CAF_THREADS", nullptr);
  caf::actor_system_config cfg;
  configure_scheduler(cfg);
  EXPECT_EQ(policy(cfg), "sharing");
  EXPECT_EQ(caf::get_or(cfg, "scheduler.max-threads", size_t{0}), 2u);
}

TEST(CafScheduler, StealingLeavesCafDefaults) {
  EnvVar p("TROUPE_CAF_SCHEDULER", "stealing"), t("TROUPE_CAF_THREADS", nullptr);
  caf::actor_system_config cfg;
  configure_scheduler(cfg);
  EXPECT_EQ(policy(cfg), "none");  // not set: CAF uses its own default
  EXPECT_EQ(caf::get_or(cfg, "scheduler.max-threads", size_t{0}), 0u);
}

TEST(CafScheduler, ThreadCountOverride) {
  EnvVar p("TROUPE_CAF_SCHEDULER", nullptr), t("TROUPE_CAF_THREADS", "3");
  caf::actor_system_config cfg;
  configure_scheduler(cfg);
  EXPECT_EQ(policy(cfg), "sharing");
  EXPECT_EQ(caf::get_or(cfg, "scheduler.max-threads", size_t{0}), 3u);
}

TEST(CafScheduler, BadValuesAreClearErrors) {
  {
    EnvVar p("TROUPE_CAF_SCHEDULER", "fast"), t("TROUPE_CAF_THREADS", nullptr);
    caf::actor_system_config cfg;
    EXPECT_THROW(configure_scheduler(cfg), std::invalid_argument);
  }
  for (const char* bad : {"0", "-1", "two", "4x", "", "100000"}) {
    EnvVar p("TROUPE_CAF_SCHEDULER", nullptr), t("TROUPE_CAF_THREADS", bad);
    caf::actor_system_config cfg;
    EXPECT_THROW(configure_scheduler(cfg), std::invalid_argument) << "TROUPE_CAF_THREADS=" << bad;
  }
}

TEST(CafScheduler, ClusterSettingsStayBesideIt) {
  EnvVar p("TROUPE_CAF_SCHEDULER", nullptr), t("TROUPE_CAF_THREADS", nullptr);
  caf::actor_system_config cfg;
  configure_scheduler(cfg);
  RuntimeOptions o;
  o.peer_timeout = 10.0;
  o.auth = ClusterAuth::none;  // tls needs a ClusterComm to hand the run's key around
  configure_cluster(cfg, o);
  EXPECT_EQ(policy(cfg), "sharing");
  EXPECT_EQ(caf::get_or(cfg, "middleman.connection-timeout", caf::timespan{0}),
            caf::timespan{std::chrono::seconds(10)});
  EXPECT_EQ(caf::get_or(cfg, "middleman.heartbeat-interval", caf::timespan{0}),
            caf::timespan{std::chrono::seconds(1)});
  // The cluster takes the middleman latency settings too (no BASP worker hop).
  EXPECT_EQ(caf::get_or(cfg, "middleman.workers", size_t{99}), 0u);
}

TEST(CafMiddleman, NoBaspWorkersByDefault) {
  EnvVar w("TROUPE_CAF_MM_WORKERS", nullptr);
  caf::actor_system_config cfg;
  configure_middleman(cfg);
  EXPECT_EQ(caf::get_or(cfg, "middleman.workers", size_t{99}), 0u);
}

TEST(CafMiddleman, WorkerOverrideAndBadValues) {
  {
    EnvVar w("TROUPE_CAF_MM_WORKERS", "1");
    caf::actor_system_config cfg;
    configure_middleman(cfg);
    EXPECT_EQ(caf::get_or(cfg, "middleman.workers", size_t{99}), 1u);
  }
  for (const char* bad : {"-1", "one", "2x", "", "65"}) {
    EnvVar w("TROUPE_CAF_MM_WORKERS", bad);
    caf::actor_system_config cfg;
    EXPECT_THROW(configure_middleman(cfg), std::invalid_argument) << "TROUPE_CAF_MM_WORKERS=" << bad;
  }
}
