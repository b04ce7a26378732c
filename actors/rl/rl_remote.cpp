// Generators on other processes: the proxy on process 0, the host and the
// outbox on the generator's process, and the bring-up (see rl_remote.hpp).
#include "actors/rl/rl_remote.hpp"

#include <signal.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstring>
#include <map>
#include <stdexcept>
#include <thread>

#include <caf/io/middleman.hpp>
#include <caf/openssl/publish.hpp>
#include <caf/openssl/remote_actor.hpp>

#include "actors/cluster/interface_address.hpp"
#include "actors/cluster/runtime_cluster_internal.hpp"
#include "actors/transport/caf_scheduler.hpp"
#include "actors/transport/caf_types.hpp"
#include "actors/transport/envelope_shm.hpp"
#include "actors/transport/tcp_nodelay.hpp"
#include "model/params.hpp"
#include "rl/trainer.hpp"
#include "model/clock.hpp"

namespace troupe::runtime {

namespace {

using model::Clock;
using model::seconds_since;


RuntimeOptions cluster_options(const RlProcesses& p) {
  RuntimeOptions o;
  o.comm = p.comm;
  o.auth = p.auth;
  o.auth_dir = p.auth_dir;
  o.interface = p.interface;
  o.peer_timeout = p.peer_timeout;
  o.peer_suspicion.floor = p.heartbeat_pause;
  return o;
}

std::chrono::milliseconds bring_up_timeout(const RlProcesses& p) {
  return std::chrono::milliseconds(static_cast<int64_t>(p.peer_timeout * 3000.0) + 10000);
}

// The generator's side of a proxy: decodes for the generator, encodes its
// results, and goes down with it.
struct OutboxState {
  caf::actor gen, proxy;
};

caf::behavior outbox_actor(caf::stateful_actor<OutboxState>* self, std::shared_ptr<const RlShared> sh, int index,
                           int64_t incarnation, caf::actor proxy, size_t parameters, int64_t kill_at_step) {
  auto& s = self->state;
  s.proxy = proxy;
  self->monitor(proxy);
  s.gen = self->spawn<caf::detached + caf::monitored>(generator_actor, sh, index, incarnation,
                                                      caf::actor_cast<caf::actor>(self));
  // However the outbox ends (an exit from the host at the end of the run or
  // when process 0 is lost may come before the proxy's down), its generator
  // ends with it: a detached generator left behind would keep this process's
  // actor system, and so the process, from ever finishing.
  self->attach_functor([gen = s.gen](const caf::error&) { caf::anon_send_exit(gen, caf::exit_reason::kill); });
  self->set_down_handler([self](caf::down_msg& dm) {
    auto& s = self->state;
    if (dm.source == s.gen.address()) return self->quit(dm.reason);  // the proxy sees the same reason
    // The proxy restarted, the run ended, or process 0 is gone (the
    // attached functor then ends the generator).
    if (dm.source == s.proxy.address()) self->quit(caf::exit_reason::user_shutdown);
  });
  return {
      [self, parameters](rlmsg::sync_atom, const Envelope& env) {
        const auto t0 = Clock::now();
        auto w = rlwire::decode_weights(env, parameters);
        // A damaged or malformed transfer counts as lost: no confirmation,
        // so the coordinator's deadline sends it again.
        if (!w) {
          std::fprintf(stderr, "troupe: weight sync dropped: %s\n", caf::to_string(w.error()).c_str());
          return;
        }
        const int64_t v = w->version;
        self->send(self->state.gen, rlmsg::sync_atom::value, std::move(*w));
        // The transfer's end, for the proxy's round trip (the generator's own
        // confirmation waits for its current decode step).
        self->send(self->state.proxy, rlmsg::received_atom::value, v, seconds_since(t0));
      },
      [self, kill_at_step](rlmsg::job_atom a, int64_t step, int64_t version) {
        // A lost process ([[faults]] process:P, or the test hook): its first
        // job of at_step or later, as the steps of at_step may all go to
        // generators on other processes.
        if (kill_at_step > 0 && step + 1 >= kill_at_step) ::raise(SIGKILL);
        self->send(self->state.gen, a, step, version);
      },
      [self](rlmsg::arm_atom a, uint32_t point) { self->send(self->state.gen, a, point); },
      [self](rlmsg::arm_drop_atom a, int64_t n) { self->send(self->state.gen, a, n); },
      [self](rlmsg::synced_atom a, int k, int64_t inc, int64_t v) { self->send(self->state.proxy, a, k, inc, v); },
      [self](rlmsg::rollout_atom a, const rlmsg::Rollout& r) { self->send(self->state.proxy, a, rlwire::encode_rollout(r)); },
  };
}

// One per process > 0: spawns outboxes for process 0's proxies, and ends
// when process 0 says the run is over (or is lost).
struct HostState {
  caf::actor coordinator;
  std::vector<caf::actor> outboxes;
};

caf::behavior host_actor(caf::stateful_actor<HostState>* self, std::shared_ptr<const RlShared> sh,
                         std::shared_ptr<std::atomic<int>> outcome) {
  const size_t parameters = static_cast<size_t>(model::build_param_layout(sh->opt->train.model).total());
  // The spec's [[faults]] on this process, or the test hook's kill (test_hooks.hpp).
  int64_t kill_at = sh->opt->processes.kill_at_step;
  if (const TestHooks* h = sh->hooks.get(); h && h->process_fault.kind == "kill" && sh->opt->processes.comm &&
                                            h->process_fault.process == sh->opt->processes.comm->rank())
    kill_at = h->process_fault.step;
  self->set_down_handler([self, outcome](caf::down_msg& dm) {
    auto& s = self->state;
    if (dm.source != s.coordinator.address()) return;
    int none = 0;
    outcome->compare_exchange_strong(none, 3);  // process 0 went away without ending the run
    for (auto& o : s.outboxes) self->send_exit(o, caf::exit_reason::kill);
    self->quit(dm.reason);
  });
  return {
      [self](rlmsg::hello_atom, const caf::actor& coordinator) {
        self->state.coordinator = coordinator;
        self->monitor(coordinator);
      },
      [self, sh, parameters, kill_at](rlmsg::spawn_atom, int index, int64_t incarnation,
                                      const caf::actor& proxy) -> caf::result<caf::actor> {
        if (index < 0 || index >= sh->opt->train.rl.generators || incarnation < 0 || !proxy)
          return caf::make_error(caf::sec::invalid_argument,
                                 "this process has no generator:" + std::to_string(index) + " (rl.generators = " +
                                     std::to_string(sh->opt->train.rl.generators) + " here): do all processes run the same spec?");
        auto& s = self->state;
        s.outboxes.erase(std::remove_if(s.outboxes.begin(), s.outboxes.end(),
                                        [](const caf::actor& a) { return !a || a->getf(caf::abstract_actor::is_terminated_flag); }),
                         s.outboxes.end());
        caf::actor out = self->spawn(outbox_actor, sh, index, incarnation, proxy, parameters, kill_at);
        s.outboxes.push_back(out);
        return out;
      },
      [self, outcome](rlmsg::shut_atom, bool ok) {
        int none = 0;
        outcome->compare_exchange_strong(none, ok ? 1 : 2);
        for (auto& o : self->state.outboxes) self->send_exit(o, caf::exit_reason::user_shutdown);
        self->quit();
        return true;
      },
  };
}

// Proxy state: the outbox once the host answered, what was sent before,
// and the syncs awaiting their confirmation (round trips).
struct ProxyState {
  caf::actor outbox;
  std::vector<caf::message> queued;
  std::map<int64_t, Clock::time_point> sent;  // version -> when it was sent
};

}  // namespace

int RemoteGenerators::process_of(int k) const {
  const int p = generator_process.empty() ? 0 : generator_process[static_cast<size_t>(k)];
  return lost.count(p) ? 0 : p;
}

std::shared_ptr<void> configure_rl_cluster(caf::actor_system_config& cfg, const RlProcesses& p) {
  return configure_cluster(cfg, cluster_options(p));
}

caf::behavior generator_proxy(caf::event_based_actor* self, std::shared_ptr<RemoteGenerators> remote, int index,
                              int process, int64_t incarnation, caf::actor driver) {
  auto st = std::make_shared<ProxyState>();
  auto forward = [self, st](caf::message m) {
    if (st->outbox) self->send(st->outbox, std::move(m));
    else st->queued.push_back(std::move(m));
  };
  self->set_down_handler([self, st](caf::down_msg& dm) {
    if (dm.source == st->outbox.address()) self->quit(dm.reason);
  });
  self->request(remote->hosts[static_cast<size_t>(process)], remote->timeout, rlmsg::spawn_atom::value, index, incarnation,
                caf::actor_cast<caf::actor>(self))
      .then(
          [self, st](caf::actor& out) {
            st->outbox = out;
            self->monitor(out);
            for (auto& m : st->queued) self->send(out, std::move(m));
            st->queued.clear();
          },
          [self, process, index](caf::error& e) {
            std::fprintf(stderr, "troupe: generator:%d cannot start on process %d: %s\n", index, process,
                         self->system().render(e).c_str());
            // A host that does not answer (gone, or hung past the timeout)
            // is treated like a lost process; one that refuses (e.g. a
            // spec that differs between the processes) fails this proxy
            // with its reason, which the coordinator's restarts and their
            // budget then report.
            const bool gone = e == caf::sec::request_timeout || e == caf::sec::request_receiver_down;
            if (gone) self->quit(caf::exit_reason::remote_link_unreachable);
            else self->quit(e);
          });
  return {
      [remote, st, forward](rlmsg::sync_atom, const rlmsg::Weights& w) {
        const auto t0 = Clock::now();
        Envelope env = rlwire::encode_weights(w);
        const double enc = seconds_since(t0);
        {
          std::lock_guard<std::mutex> lock(remote->stats->mu);
          remote->stats->encode += enc;
        }
        st->sent[w.version] = t0;
        forward(caf::make_message(rlmsg::sync_atom::value, std::move(env)));
      },
      [forward](rlmsg::job_atom a, int64_t step, int64_t version) { forward(caf::make_message(a, step, version)); },
      [forward](rlmsg::arm_atom a, uint32_t point) { forward(caf::make_message(a, point)); },
      [forward](rlmsg::arm_drop_atom a, int64_t n) { forward(caf::make_message(a, n)); },
      [self, driver](rlmsg::synced_atom a, int k, int64_t inc, int64_t v) { self->send(driver, a, k, inc, v); },
      [remote, st](rlmsg::received_atom, int64_t v, double decode) {
        if (auto it = st->sent.find(v); it != st->sent.end()) {
          RemoteSyncStats& s = *remote->stats;
          std::lock_guard<std::mutex> lock(s.mu);
          ++s.syncs;
          s.bytes += static_cast<int64_t>(remote->parameters * sizeof(float));
          s.round_trip += seconds_since(it->second);
          s.decode += decode;
          st->sent.erase(it);
        }
      },
      [self, remote, driver, index, process](rlmsg::rollout_atom a, const Envelope& env) {
        auto r = rlwire::decode_rollout(env, remote->bounds);
        if (r && r->generator != index)
          r = make_error(envelope_errc::schema_violation, "rlRollout.generator: " + std::to_string(r->generator) +
                                                              " from the proxy of generator:" + std::to_string(index));
        if (!r) {
          // A malformed rollout is the generator's failure: it is restarted
          // and its step dealt again (the ledger keeps it exactly once).
          std::fprintf(stderr, "troupe: generator:%d on process %d sent a bad rollout: %s\n", index, process,
                       self->system().render(r.error()).c_str());
          return self->quit(r.error());
        }
        self->send(driver, a, std::move(*r));
      },
  };
}

std::shared_ptr<RemoteGenerators> connect_generator_hosts(caf::actor_system& sys, const RlShared& sh) {
  const RlProcesses& p = sh.opt->processes;
  ClusterComm& comm = *p.comm;
  auto out = std::make_shared<RemoteGenerators>();
  out->generator_process = p.generator_process;
  out->timeout = bring_up_timeout(p);
  out->parameters = static_cast<size_t>(model::build_param_layout(sh.opt->train.model).total());
  // The syncs' baseline, timed once here rather than on a sync's path: a
  // plain copy of one version's bytes, the fastest of 5.
  {
    const std::vector<float> src(out->parameters, 1.0f);
    std::vector<float> dst(out->parameters, 0.0f);
    double best = 1e30;
    for (int i = 0; i < 5; ++i) {
      const auto tc = Clock::now();
      std::memcpy(dst.data(), src.data(), src.size() * sizeof(float));
      best = std::min(best, seconds_since(tc));
    }
    out->stats->memcpy_seconds = best;
  }
  out->bounds = rlwire::rollout_bounds(sh.opt->train.model, sh.opt->train.rl, sh.seed, sh.first_step, sh.steps);
  const rl::RlTrainOptions& o = sh.opt->train;
  out->task = sh.opt->make_task ? sh.opt->make_task() : rl::make_task(o.rl, o.data, sh.seed);
  out->bounds.task = out->task.get();
  // Process 0 publishes nothing: it connects to the others' hosts. It
  // advertises its address as they do (a subnet resolved to its own), so
  // that the shared-memory path is taken only when process 0 is on their host.
  std::string me, why;
  try {
    me = advertised_host(resolve_interface(p.interface));
  } catch (const std::exception& e) {
    why = e.what();
  }
  std::vector<std::pair<std::string, uint16_t>> endpoints;
  try {
    endpoints = comm.exchange(me, 0, why.empty());
  } catch (...) {
    if (!why.empty()) throw std::runtime_error("process 0: " + why);
    throw;
  }
  set_bulk_shm_threshold(all_on_one_host(endpoints) && p.bulk_shm_bytes > 0 ? static_cast<size_t>(p.bulk_shm_bytes) : 0);
  out->hosts.resize(endpoints.size());
  std::string err;
  for (size_t q = 1; q < endpoints.size() && err.empty(); ++q) {
    const auto& [host, port] = endpoints[q];
    for (int attempt = 0; attempt < 20; ++attempt) {
      auto h = p.auth == ClusterAuth::tls ? caf::openssl::remote_actor(sys, host, port) : sys.middleman().remote_actor(host, port);
      if (h) {
        out->hosts[q] = *h;
        break;
      }
      err = sys.render(h.error());
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (!out->hosts[q]) err = "process 0 cannot connect to the generator host of process " + std::to_string(q) + " at " + host + ":" +
                              std::to_string(port) + ": " + err;
    else err.clear();
  }
  if (!comm.all_ok(err.empty())) throw std::runtime_error(err.empty() ? "a generator process failed to start" : err);
  set_tcp_nodelay_on_all_sockets();
  return out;
}

void shutdown_generator_hosts(caf::actor_system& sys, const RemoteGenerators& r, bool ok) {
  caf::scoped_actor self{sys};
  for (size_t q = 1; q < r.hosts.size(); ++q) {
    if (!r.hosts[q] || r.lost.count(static_cast<int>(q))) continue;
    self->request(r.hosts[q], std::chrono::seconds(5), rlmsg::shut_atom::value, ok)
        .receive([](bool) {}, [q](caf::error&) { std::fprintf(stderr, "troupe: generator process %zu did not answer the end of the run\n", q); });
  }
}

void serve_generators(const RlActorOptions& options) {
  const RlProcesses& p = options.processes;
  if (!p.comm || p.comm->rank() == 0) throw std::invalid_argument("serve_generators: runs on processes > 0 of a multi-process run");
  auto sh = std::make_shared<RlShared>();
  sh->opt = &options;
  sh->seed = options.train.seed;
  sh->steps = options.train.steps;
  auto outcome = std::make_shared<std::atomic<int>>(0);
  const int me = p.comm->rank();
  {
    caf::actor_system_config cfg;
    register_caf_types(cfg);
    configure_scheduler(cfg);
    auto files = configure_rl_cluster(cfg, p);
    caf::actor_system sys{cfg};
    caf::actor host = sys.spawn(host_actor, sh, outcome);
    std::string why;
    std::string bind_addr;
    caf::expected<uint16_t> port{caf::sec::cannot_publish_invalid_actor};
    try {
      bind_addr = resolve_interface(p.interface);
      port = p.auth == ClusterAuth::tls ? caf::openssl::publish(host, 0, bind_addr.c_str())
                                        : sys.middleman().publish(host, 0, bind_addr.c_str());
      if (!port) why = sys.render(port.error());
    } catch (const std::exception& e) {
      why = e.what();
    }
    set_tcp_nodelay_on_all_sockets();
    std::vector<std::pair<std::string, uint16_t>> endpoints;
    try {
      endpoints = p.comm->exchange(advertised_host(bind_addr), port ? *port : uint16_t{0}, why.empty());
    } catch (...) {
      caf::anon_send_exit(host, caf::exit_reason::user_shutdown);
      if (!why.empty()) throw std::runtime_error("process " + std::to_string(me) + " cannot publish its generator host: " + why);
      throw;
    }
    set_bulk_shm_threshold(all_on_one_host(endpoints) && p.bulk_shm_bytes > 0 ? static_cast<size_t>(p.bulk_shm_bytes) : 0);
    if (!p.comm->all_ok(true)) {
      caf::anon_send_exit(host, caf::exit_reason::user_shutdown);
      throw std::runtime_error("process 0 could not connect to the generator hosts");
    }
    std::fprintf(stderr, "troupe[process %d]: generator host listening on %s:%u (%s)\n", me, bind_addr.c_str(),
                 static_cast<unsigned>(*port), p.auth == ClusterAuth::tls ? "mutual TLS" : "plain, auth = \"none\"");
    caf::scoped_actor self{sys};
    self->wait_for(host);
  }
  set_bulk_shm_threshold(0);
  bulk_shm_cleanup();
  const int o = outcome->load();
  if (o == 2) throw std::runtime_error("process 0 ended the run with a failure");
  if (o != 1) throw std::runtime_error("process 0 was lost before it ended the run");
}

}  // namespace troupe::runtime
