// The runtime across processes: directory actors, bring-up through a
// ClusterComm, peer resolution, failure watch and shutdown. See
// runtime_cluster.hpp for the protocol.
#include "actors/cluster/runtime_cluster_internal.hpp"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <random>
#include <set>
#include <stdexcept>
#include <thread>

#include <algorithm>
#include <caf/io/middleman.hpp>
#include <caf/openssl/publish.hpp>
#include <caf/openssl/remote_actor.hpp>

#include "actors/cluster/cluster_tls.hpp"
#include "actors/cluster/interface_address.hpp"
#include "actors/names.hpp"
#include "actors/supervision/suspicion.hpp"
#include "actors/transport/caf_middleman.hpp"
#include "actors/transport/envelope_shm.hpp"
#include "actors/transport/tcp_nodelay.hpp"

namespace troupe::runtime {

namespace {

using Fault = ProcessFault;

// The process faults of this run: the test hook's (test_hooks.hpp), then the
// spec's [[faults]] on "process:P" (kill: SIGKILL, stop: SIGSTOP, as `hang`).
std::vector<Fault> process_faults(const RuntimeOptions& o, const TestHooks* hooks) {
  std::vector<Fault> out;
  if (hooks && !hooks->process_fault.kind.empty()) out.push_back(hooks->process_fault);
  for (const FaultSpec& spec : o.faults) {
    Fault f;
    if (!parse_process_target(spec.target, f.process)) continue;
    f.kind = spec.kind == FaultKind::stop ? "hang" : "kill";
    f.step = spec.at_step;
    out.push_back(f);
  }
  return out;
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

}  // namespace

namespace {
std::atomic<bool> g_survived_loss{false};  // survived_process_loss()
}  // namespace

bool survived_process_loss() { return g_survived_loss.load(); }
void note_survived_process_loss() { g_survived_loss = true; }

bool all_on_one_host(const std::vector<std::pair<std::string, uint16_t>>& endpoints) {
  for (const auto& e : endpoints)
    if (e.first != endpoints.front().first) return false;
  return true;
}

std::string advertised_host(const std::string& interface) {
  if (!interface.empty() && interface != "0.0.0.0" && interface != "::") return interface;
  char name[256] = {};
  if (::gethostname(name, sizeof(name) - 1) != 0) return "127.0.0.1";
  return name;
}


// Processes found lost, shared by the directory and its Cluster (which must
// not wait on them when it shuts down).
struct LostSet {
  std::mutex m;
  std::set<int> lost;
  void add(int p) {
    std::lock_guard<std::mutex> g(m);
    lost.insert(p);
  }
  bool has(int p) {
    std::lock_guard<std::mutex> g(m);
    return lost.count(p) > 0;
  }
};

namespace {

struct DirState {
  std::shared_ptr<Shared> sh;  // this process's runtime (placement changes)
  std::shared_ptr<LostSet> lost;
  int me = 0;
  Placement place;
  std::vector<Fault> faults;  // process faults (test hook and spec)
  bool recover = false;       // process 0 of 2 with process_loss = recover: survive losing process 1
  std::map<int, int32_t> pids;  // process 0: the others' pids (to SIGKILL a hung one)
  bool one_host = false;        // every process on this host (pids mean something here)
  caf::timespan grace{};
  std::map<std::string, caf::actor> local;                  // name -> actor on this process
  std::map<caf::actor_addr, std::pair<int, std::string>> watched;  // remote actor -> (process, name)
  caf::actor coordinator;                                   // process 0: where failures go
  caf::actor waiter;                                        // processes > 0: serve()'s scoped actor
  caf::message event;                                       // shutdown or lost, kept until a waiter asks
  bool closing = false, failed = false;
  // Heartbeats (RuntimeOptions::heartbeat_interval): a process p > 0 sends
  // them to beat_to (process 0's directory); process 0 learns each
  // process's gaps and suspects one whose heartbeats stop.
  caf::actor beat_to;
  struct Beats {
    std::chrono::steady_clock::time_point last;
    Suspicion gaps;
  };
  std::map<int, Beats> beats;
  bool checking = false;
};

using Dir = caf::stateful_actor<DirState>;

void notify(Dir* self, caf::message m) {
  auto& s = self->state;
  if (s.event.empty()) s.event = m;
  if (s.waiter) self->send(s.waiter, std::move(m));
}

// Process p is lost: `how` it was found, `noticed` at which of its actors
// (or by its heartbeats).
void lose_process(Dir* self, int p, std::string how, const std::string& noticed) {
  auto& s = self->state;
  const bool known = s.lost->has(p);
  s.lost->add(p);
  if (s.closing || s.failed) return;
  if (s.me == 0 && p != 0 && s.recover) {
    if (known) return;  // one report per lost process
    g_survived_loss = true;
    // Dead, or hung (a stopped process is found by its heartbeats): make
    // sure it is dead, so a stopped one cannot come back half-way with
    // messages of an abandoned step. Its pid means something only here.
    if (auto pid = s.pids.find(p); pid != s.pids.end() && s.one_host && ::kill(pid->second, SIGKILL) == 0)
      how += "; SIGKILLed pid " + std::to_string(pid->second);
    const std::string what = "process " + std::to_string(p) + " lost (" + how + ", noticed at " + noticed + ")";
    std::fprintf(stderr, "troupe[process 0]: %s; recovering its actors on process 0: %s\n", what.c_str(),
                 join(s.place.actors_on(p)).c_str());
    if (s.coordinator) self->send(s.coordinator, rt::lost_atom_v, what);
    return;
  }
  // Processes > 0 leave lost siblings to process 0, which ends the run.
  if (s.me != 0 && p != 0) return;
  s.failed = true;
  const std::string what = "process " + std::to_string(p) + " lost (" + how + ", noticed at " + noticed +
                           "); its actors are gone: " + join(s.place.actors_on(p));
  std::fprintf(stderr, "troupe[process %d]: %s\n", s.me, what.c_str());
  if (s.me == 0 && s.coordinator) self->send(s.coordinator, rt::fail_atom_v, what);
  notify(self, caf::make_message(rt::lost_atom_v, what));
  // Backstop: the process must end even if some request never returns.
  self->delayed_send(self, s.grace, rt::abort_atom_v, what);
}

// A watched remote actor went down outside a shutdown: its process is lost.
void on_down(Dir* self, const caf::down_msg& dm) {
  auto& s = self->state;
  auto it = s.watched.find(dm.source);
  if (it == s.watched.end()) return;
  lose_process(self, it->second.first, self->system().render(dm.reason), it->second.second);
}

// Process 0, every half heartbeat interval: has a process's silence grown
// past what its heartbeat gaps so far allow (phi-accrual)?
void check_heartbeats(Dir* self) {
  auto& s = self->state;
  if (s.closing || s.failed) {
    s.checking = false;
    return;
  }
  const auto now = std::chrono::steady_clock::now();
  for (auto& [p, b] : s.beats) {
    if (s.lost->has(p) || !b.gaps.ready()) continue;
    const double silent = std::chrono::duration<double>(now - b.last).count();
    const double limit = b.gaps.deadline();
    if (silent < limit) continue;
    char how[160];
    std::snprintf(how, sizeof how, "no heartbeat for %.0f ms; adaptive deadline %.0f ms after %zu heartbeat gaps of %.0f ms mean",
                  1e3 * silent, 1e3 * limit, b.gaps.samples(), 1e3 * b.gaps.mean());
    lose_process(self, p, how, "its heartbeats");
  }
  const double interval = s.sh->opt.heartbeat_interval;
  self->delayed_send(self, std::chrono::duration_cast<caf::timespan>(std::chrono::duration<double>(interval / 2)),
                     rt::beat_atom_v, rt::tick_atom_v);
}

// Makes (on this process) the plan of the expert layout `x`.
Plan plan_of(const Shared& sh, const ExpertLayout& x) {
  return make_plan(with_expert_layout(sh.opt, x, sh.plan.moe_layers.size()));
}

caf::behavior directory(Dir* self, std::shared_ptr<Shared> sh, std::shared_ptr<LostSet> lost, int me, Placement place,
                        caf::timespan grace, std::vector<Fault> faults, bool recover) {
  auto& s = self->state;
  s.sh = std::move(sh);
  s.lost = std::move(lost);
  s.me = me;
  s.place = std::move(place);
  s.faults = std::move(faults);
  s.recover = recover && me == 0;
  s.grace = grace;
  self->set_down_handler([self](caf::down_msg& dm) { on_down(self, dm); });
  return {
      [self](rt::register_atom, const std::string& name, const caf::actor& a) {
        self->state.local[name] = a;
        if (name == "coordinator") self->state.coordinator = a;
      },
      [self](rt::lookup_atom, const std::string& name) -> caf::result<caf::actor> {
        auto it = self->state.local.find(name);
        if (it == self->state.local.end())
          return caf::make_error(caf::sec::runtime_error,
                                 "process " + std::to_string(self->state.me) + " has no actor " + name);
        return it->second;
      },
      [self](rt::watch_atom, int32_t process, const std::string& name, const caf::actor& a) {
        self->state.watched[a.address()] = {process, name};
        self->monitor(a);
      },
      // Unwatch (Cluster::forget): a remote actor stopped on purpose.
      [self](rt::watch_atom, const caf::actor& a, bool watch) {
        if (watch) return false;
        self->state.watched.erase(a.address());
        self->demonitor(a);
        return true;
      },
      // Process 0's placement change, on this process (elastic.cpp): spawn
      // expert shard `producer` of `replica` of the plan with the expert
      // layout given, waiting for its restore messages.
      [self](rt::rescale_atom, int32_t shards, const std::vector<int64_t>& bounds, const std::vector<int64_t>& copies,
             const std::vector<int64_t>& shares, int32_t replica, int32_t producer) -> caf::result<caf::actor> {
        const Shared& sh = *self->state.sh;
        try {
          const Plan plan = plan_of(sh, ExpertLayout{shards, bounds, copies, shares});
          if (plan.placement.expert_process(replica, producer) != self->state.me)
            throw std::invalid_argument("the plan places it on another process");
          return sh.spawn_expert(self->system(), plan, replica, producer, true);
        } catch (const std::exception& e) {
          return caf::make_error(caf::sec::runtime_error, "process " + std::to_string(self->state.me) +
                                                              " cannot spawn expert shard " + std::to_string(producer) +
                                                              ": " + e.what());
        }
      },
      // ... and once it is made: the plan in force and the expert shards'
      // handles ([replica][producer], flattened replica-major) for this
      // process's ranks and optimizer shards, before the next step.
      [self](rt::rescale_atom, int32_t shards, const std::vector<int64_t>& bounds, const std::vector<int64_t>& copies,
             const std::vector<int64_t>& shares, const std::vector<caf::actor>& experts) -> caf::result<bool> {
        const Shared& sh = *self->state.sh;
        try {
          auto plan = std::make_shared<const Plan>(plan_of(sh, ExpertLayout{shards, bounds, copies, shares}));
          const size_t n = static_cast<size_t>(plan->num_producers());
          if (experts.size() != static_cast<size_t>(plan->data_parallel) * n)
            throw std::invalid_argument(std::to_string(experts.size()) + " expert shard handles for " +
                                        std::to_string(plan->data_parallel) + " x " + std::to_string(n));
          std::vector<std::vector<caf::actor>> table;
          for (size_t i = 0; i < experts.size(); i += n)
            table.emplace_back(experts.begin() + static_cast<int64_t>(i), experts.begin() + static_cast<int64_t>(i + n));
          size_t here = 0;
          for (const caf::actor& a : experts) here += a && a->node() == self->node();
          std::fprintf(stderr, "troupe[process %d]: expert placement: %d shard(s) per MoE layer, %zu of %zu expert shard(s) here\n",
                       self->state.me, static_cast<int>(shards), here, experts.size());
          std::lock_guard<std::mutex> lock(sh.peers_mu);
          sh.peers.experts = std::move(table);
          sh.live = std::move(plan);
          return true;
        } catch (const std::exception& e) {
          return caf::make_error(caf::sec::runtime_error,
                                 "process " + std::to_string(self->state.me) + " cannot adopt the placement: " + e.what());
        }
      },
      [self](rt::wait_atom, const caf::actor& w) {
        auto& s = self->state;
        s.waiter = w;
        if (!s.event.empty()) self->send(w, s.event);
      },
      [self](rt::shutdown_atom, bool ok) {
        auto& s = self->state;
        s.closing = true;
        if (!ok) self->delayed_send(self, s.grace, rt::abort_atom_v, std::string("the run failed on process 0"));
        notify(self, caf::make_message(rt::shutdown_atom_v, ok));
        return true;
      },
      [self](rt::tick_atom, int64_t step) {
        for (const Fault& f : self->state.faults) {
          if (f.process != self->state.me || f.step != step) continue;
          std::fprintf(stderr, "troupe[process %d]: test fault: %s at step %lld\n", f.process, f.kind.c_str(),
                       static_cast<long long>(step));
          std::fflush(stderr);
          std::raise(f.kind == "kill" ? SIGKILL : SIGSTOP);
        }
      },
      // Who this process is to the OS: process 0 keeps the others' pids, to
      // SIGKILL one found hung before recovering from it.
      [](rt::name_atom) { return static_cast<int32_t>(::getpid()); },
      [self](rt::watch_atom, int32_t process, int32_t pid, bool one_host) {
        self->state.pids[process] = pid;
        self->state.one_host = one_host;
      },
      // Heartbeats. A process p > 0 starts sending them to `to` (process 0's directory) ...
      [self](rt::beat_atom, const caf::actor& to) {
        self->state.beat_to = to;
        self->send(self, rt::beat_atom_v);
      },
      // ... and sends one every heartbeat_interval until it closes.
      [self](rt::beat_atom) {
        auto& s = self->state;
        if (s.closing || !s.beat_to) return;
        self->send(s.beat_to, rt::beat_atom_v, static_cast<int32_t>(s.me));
        self->delayed_send(self, std::chrono::duration_cast<caf::timespan>(std::chrono::duration<double>(s.sh->opt.heartbeat_interval)),
                           rt::beat_atom_v);
      },
      // Process 0: one from process `from`.
      [self](rt::beat_atom, int32_t from) {
        auto& s = self->state;
        const auto now = std::chrono::steady_clock::now();
        auto it = s.beats.find(from);
        if (it == s.beats.end()) {
          SuspicionOptions o = s.sh->opt.peer_suspicion;
          o.ceiling = o.ceiling > 0 ? std::min(o.ceiling, s.sh->opt.peer_timeout) : s.sh->opt.peer_timeout;
          // Seeded as Akka seeds its detector (first-heartbeat-estimate):
          // two gaps of the interval -+ a quarter, so it judges from the first
          // heartbeat on; real gaps soon outweigh them.
          Suspicion gaps(o);
          gaps.observe(0.75 * s.sh->opt.heartbeat_interval);
          gaps.observe(1.25 * s.sh->opt.heartbeat_interval);
          s.beats.emplace(from, DirState::Beats{now, std::move(gaps)});
        } else {
          it->second.gaps.observe(std::chrono::duration<double>(now - it->second.last).count());
          it->second.last = now;
        }
        if (!s.checking) {
          s.checking = true;
          check_heartbeats(self);
        }
      },
      [self](rt::beat_atom, rt::tick_atom) { check_heartbeats(self); },
      [self](rt::abort_atom, const std::string& what) {
        std::fprintf(stderr, "troupe[process %d]: %s; still running %.0f s later, exiting now\n", self->state.me,
                     what.c_str(), std::chrono::duration<double>(self->state.grace).count());
        std::fflush(stderr);
        std::_Exit(1);
      },
  };
}

// Where this process's peers reach it: the bound address, or the host name
// when bound to every interface.

caf::actor lookup(caf::actor_system& sys, const caf::actor& dir, const std::string& name,
                  std::chrono::milliseconds timeout, int process) {
  caf::scoped_actor self{sys};
  caf::actor out;
  std::string err;
  self->request(dir, timeout, rt::lookup_atom_v, name)
      .receive([&](caf::actor& a) { out = std::move(a); }, [&](caf::error& e) { err = sys.render(e); });
  if (!out)
    throw std::runtime_error("cannot resolve " + name + " on process " + std::to_string(process) + ": " + err);
  return out;
}

}  // namespace

std::shared_ptr<void> configure_cluster(caf::actor_system_config& cfg, const RuntimeOptions& o) {
  cfg.load<caf::io::middleman>();
  std::shared_ptr<IdentityFiles> files;
  if (o.auth == ClusterAuth::tls) {
    ClusterIdentity id;
    if (!o.auth_dir.empty()) {
      id = read_cluster_identity(o.auth_dir);  // every process reads its own copy
    } else {
      // Process 0 makes the run's key; MPI hands it to the others before any
      // CAF port is open, so no connection is ever made without it.
      if (!o.comm) throw std::logic_error("configure_cluster: auth = tls without auth_dir needs a ClusterComm");
      if (o.comm->rank() == 0) id = make_cluster_identity();
      std::string both = o.comm->broadcast(id.cert_pem + '\0' + id.key_pem);
      const size_t cut = both.find('\0');
      if (cut == std::string::npos) throw std::runtime_error("the cluster identity from process 0 is malformed");
      id.cert_pem = both.substr(0, cut);
      id.key_pem = both.substr(cut + 1);
      std::fill(both.begin(), both.end(), '\0');
    }
    files = std::make_shared<IdentityFiles>(id);
    std::fill(id.key_pem.begin(), id.key_pem.end(), '\0');
    configure_tls(cfg, *files);
  }
  const auto timeout = std::chrono::duration_cast<caf::timespan>(std::chrono::duration<double>(o.peer_timeout));
  // Several heartbeats per timeout, so one late heartbeat is no failure.
  cfg.set("middleman.heartbeat-interval", caf::timespan{timeout / 10});
  cfg.set("middleman.connection-timeout", caf::timespan{timeout});
  configure_middleman(cfg);  // latency: no BASP worker hop (caf_middleman.hpp)
  return files;
}

Cluster::Cluster(caf::actor_system& sys, std::shared_ptr<Shared> sh, Placement place)
    : sys_(sys), sh_(std::move(sh)), place_(std::move(place)) {
  const RuntimeOptions& o = sh_->opt;
  ClusterComm& comm = *o.comm;
  me_ = comm.rank();
  timeout_ = std::chrono::milliseconds(static_cast<int64_t>(o.peer_timeout * 3000.0) + 10000);
  const auto grace = std::chrono::duration_cast<caf::timespan>(std::chrono::duration<double>(2.0 * o.peer_timeout + 10.0));
  lost_ = std::make_shared<LostSet>();
  dir_ = sys_.spawn(directory, sh_, lost_, me_, place_, caf::timespan{grace}, process_faults(o, sh_->hooks.get()),
                    o.processes == 2 && o.process_loss == ProcessLoss::recover);
  try {
    bring_up();
  } catch (...) {
    caf::anon_send_exit(dir_, caf::exit_reason::user_shutdown);  // or the actor system waits for it forever
    throw;
  }
}

void Cluster::bring_up() {
  const RuntimeOptions& o = sh_->opt;
  ClusterComm& comm = *o.comm;
  if (sh_->peers.coordinator) caf::anon_send(dir_, rt::register_atom_v, std::string("coordinator"), sh_->peers.coordinator);
  const bool tls = o.auth == ClusterAuth::tls;
  // A subnet ("10.77.0.0/24") becomes this host's own address in it; an error
  // here is reported through the exchange like a failed publish.
  std::string bind_addr, no_bind;
  try {
    bind_addr = resolve_interface(o.interface);
  } catch (const std::exception& e) {
    no_bind = e.what();
  }
  caf::expected<uint16_t> port{caf::sec::cannot_publish_invalid_actor};
  if (no_bind.empty())
    port = tls ? caf::openssl::publish(dir_, 0, bind_addr.c_str()) : sys_.middleman().publish(dir_, 0, bind_addr.c_str());
  // Before any peer connects: accepted connections inherit TCP_NODELAY.
  set_tcp_nodelay_on_all_sockets();
  std::string why = !no_bind.empty() ? no_bind : port ? "" : sys_.render(port.error());
  const std::string no_publish =
      "process " + std::to_string(me_) + " cannot publish its directory on " + o.interface + ": " + why;
  std::vector<std::pair<std::string, uint16_t>> endpoints;
  try {
    endpoints = comm.exchange(advertised_host(bind_addr), port ? *port : uint16_t{0}, static_cast<bool>(port));
  } catch (const std::exception&) {
    if (!port) throw std::runtime_error(no_publish);  // this process's own reason, not "rank N failed"
    throw;
  }
  if (!port) throw std::runtime_error(no_publish);
  // Where this process listens (firewalls, and tests that knock on the port).
  std::fprintf(stderr, "troupe[process %d]: listening on %s:%u (%s)\n", me_, bind_addr.c_str(), static_cast<unsigned>(*port),
               tls ? "mutual TLS" : "plain, auth = \"none\"");
  // Every process on this host (same advertised address): large envelopes
  // may take the shared-memory path.
  const bool one_host = all_on_one_host(endpoints);
  bulk_shm_ = one_host && o.bulk_shm_bytes > 0;
  set_bulk_shm_threshold(bulk_shm_ ? static_cast<size_t>(o.bulk_shm_bytes) : 0);
  // One connection per pair of processes: process p connects to every q < p
  // and hands q its own directory over that connection (two nodes connecting
  // to each other at once can make CAF drop both connections).
  dirs_.resize(endpoints.size());
  dirs_[static_cast<size_t>(me_)] = dir_;
  std::string err;
  for (int q = 0; q < me_ && err.empty(); ++q) {
    const auto& [host, qport] = endpoints[static_cast<size_t>(q)];
    for (int attempt = 0; attempt < 20; ++attempt) {
      auto h = tls ? caf::openssl::remote_actor(sys_, host, qport) : sys_.middleman().remote_actor(host, qport);
      if (h) {
        dirs_[static_cast<size_t>(q)] = *h;
        break;
      }
      err = sys_.render(h.error());
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (!dirs_[static_cast<size_t>(q)]) {
      err = "process " + std::to_string(me_) + " cannot connect to process " + std::to_string(q) + " at " + host +
            ":" + std::to_string(qport) + ": " + err;
      break;
    }
    err.clear();
    caf::anon_send(dirs_[static_cast<size_t>(q)], rt::register_atom_v, "directory:" + std::to_string(me_), dir_);
  }
  if (!comm.all_ok(err.empty()))
    throw std::runtime_error(err.empty() ? "another process could not connect to its peers" : err);
  // The directories of processes p > me arrive as registrations.
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (size_t p = static_cast<size_t>(me_) + 1; p < dirs_.size() && err.empty(); ++p) {
    while (!dirs_[p]) {
      try {
        dirs_[p] = lookup(sys_, dir_, "directory:" + std::to_string(p), timeout_, me_);
      } catch (const std::exception& e) {
        if (std::chrono::steady_clock::now() > deadline) {
          err = "process " + std::to_string(p) + " never connected to process " + std::to_string(me_);
          break;
        }
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
      }
    }
  }
  if (!comm.all_ok(err.empty()))
    throw std::runtime_error(err.empty() ? "another process could not connect to its peers" : err);
  set_tcp_nodelay_on_all_sockets();  // the connections this process opened
  if (one_host && o.ring_bytes > 0) start_rings(comm);
  for (size_t p = 0; p < dirs_.size(); ++p)
    if (static_cast<int>(p) != me_)
      caf::anon_send(dir_, rt::watch_atom_v, static_cast<int32_t>(p), std::string("its directory"), dirs_[p]);
  if (me_ == 0) {
    // The others' pids (a hung process is SIGKILLed before its actors are recovered).
    caf::scoped_actor self{sys_};
    for (size_t p = 1; p < dirs_.size(); ++p)
      self->request(dirs_[p], timeout_, rt::name_atom_v)
          .receive([&](int32_t pid) { caf::anon_send(dir_, rt::watch_atom_v, static_cast<int32_t>(p), pid, one_host); },
                   [](caf::error&) {});
  }
  if (me_ != 0) {
    sh_->peers.coordinator = lookup(sys_, dirs_[0], "coordinator", timeout_, 0);
    caf::anon_send(dir_, rt::watch_atom_v, int32_t{0}, std::string("coordinator"), sh_->peers.coordinator);
    caf::anon_send(dir_, rt::beat_atom_v, dirs_[0]);  // heartbeats to process 0
  }
}

void Cluster::start_rings(ClusterComm& comm) {
  const RuntimeOptions& o = sh_->opt;
  std::random_device rd;
  const uint64_t nonce = ((static_cast<uint64_t>(rd()) << 32) | rd()) % 1000000000000ull;
  const std::string run = comm.broadcast(std::to_string(nonce));  // names this run's rings on every process
  RingOptions ro;
  ro.capacity = static_cast<size_t>(o.ring_bytes);
  ro.spin_ns = o.ring_spin_us * 1000;
  std::string err;
  try {
    ring_ = std::make_unique<RingTransport>(sys_, me_, static_cast<int>(dirs_.size()), run, ro);
  } catch (const std::exception& e) {
    err = e.what();
  }
  if (comm.all_ok(err.empty())) {
    std::vector<caf::node_id> nodes;
    for (const caf::actor& d : dirs_) nodes.push_back(d.node());
    try {
      ring_->connect(nodes);
    } catch (const std::exception& e) {
      err = e.what();
    }
    if (comm.all_ok(err.empty())) {
      ring_->unlink_names();  // every process has mapped its rings: nothing stays in /dev/shm
      return;
    }
  }
  std::fprintf(stderr, "troupe[process %d]: no shared-memory rings (%s); step messages take CAF's TCP stream\n", me_,
               err.empty() ? "another process could not make or open its rings" : err.c_str());
  ring_.reset();
}

Cluster::~Cluster() {
  if (ring_) {
    const RingStats st = ring_->stats();
    std::fprintf(stderr, "troupe[process %d]: shared-memory rings: sent %llu, received %llu messages (%llu queued on a full ring, %llu bad, %llu for gone actors)\n",
                 me_, static_cast<unsigned long long>(st.sent), static_cast<unsigned long long>(st.received),
                 static_cast<unsigned long long>(st.queued), static_cast<unsigned long long>(st.bad_frames),
                 static_cast<unsigned long long>(st.no_actor));
    ring_.reset();
  }
  if (dir_) caf::anon_send_exit(dir_, caf::exit_reason::user_shutdown);
  if (bulk_shm_) {
    const BulkShmStats st = bulk_shm_stats();
    if (st.sent + st.received > 0)
      std::fprintf(stderr, "troupe[process %d]: shared-memory bulk path: sent %llu, received %llu envelopes (segments /troupe-bulk-%d-*)\n",
                   me_, static_cast<unsigned long long>(st.sent), static_cast<unsigned long long>(st.received),
                   static_cast<int>(::getpid()));
    set_bulk_shm_threshold(0);
    bulk_shm_cleanup();  // segments no receiver consumed
  }
}

void Cluster::connect() {
  Peers& peers = sh_->peers;
  for (size_t i = 0; i < peers.shards.size(); ++i)
    if (peers.shards[i]) caf::anon_send(dir_, rt::register_atom_v, shard_name(static_cast<int>(i)), peers.shards[i]);
  const int dp = sh_->opt.data_parallel;
  for (size_t r = 0; r < peers.ranks.size(); ++r)
    for (size_t k = 0; k < peers.ranks[r].size(); ++k)
      if (peers.ranks[r][k])
        caf::anon_send(dir_, rt::register_atom_v, rank_name(static_cast<int>(r), static_cast<int>(k), dp),
                       peers.ranks[r][k]);
  // Expert shards under the names the placement gives them.
  auto expert = [&](size_t r, size_t x) {
    return expert_name(static_cast<int>(r), place_.expert_ids[x].first, place_.expert_ids[x].second, dp);
  };
  for (size_t r = 0; r < peers.experts.size(); ++r)
    for (size_t x = 0; x < peers.experts[r].size(); ++x)
      if (peers.experts[r][x]) caf::anon_send(dir_, rt::register_atom_v, expert(r, x), peers.experts[r][x]);
  ClusterComm& comm = *sh_->opt.comm;
  if (!comm.all_ok(true)) throw std::runtime_error("another process failed to start its actors");
  std::string err;
  // watch = false: an expert shard, watched by process 0 only. A placement
  // change retires expert shards on purpose, and only process 0 (which
  // makes the change) can stop watching them before they exit; the others
  // notice process 0's loss by its coordinator, directory, ranks and shards.
  auto resolve = [&](caf::actor& slot, int process, const std::string& name, bool watch = true) {
    if (slot || !err.empty()) return;
    try {
      slot = lookup(sys_, dirs_[static_cast<size_t>(process)], name, timeout_, process);
      if (watch || me_ == 0) caf::anon_send(dir_, rt::watch_atom_v, static_cast<int32_t>(process), name, slot);
    } catch (const std::exception& e) {
      err = e.what();
    }
  };
  for (size_t i = 0; i < peers.shards.size(); ++i)
    resolve(peers.shards[i], place_.shard_process(static_cast<int>(i)), shard_name(static_cast<int>(i)));
  for (size_t r = 0; r < peers.ranks.size(); ++r)
    for (size_t k = 0; k < peers.ranks[r].size(); ++k)
      resolve(peers.ranks[r][k], place_.rank_process(static_cast<int>(r), static_cast<int>(k)),
              rank_name(static_cast<int>(r), static_cast<int>(k), dp));
  for (size_t r = 0; r < peers.experts.size(); ++r)
    for (size_t x = 0; x < peers.experts[r].size(); ++x)
      resolve(peers.experts[r][x], place_.expert_process(static_cast<int>(r), static_cast<int>(x)), expert(r, x), false);
  if (!comm.all_ok(err.empty())) throw std::runtime_error(err.empty() ? "another process failed to resolve its peers" : err);
}

void Cluster::before_step(int64_t step) {
  for (const caf::actor& d : dirs_) caf::anon_send(d, rt::tick_atom_v, step);
}

void Cluster::shutdown(bool ok) {
  if (shut_) return;
  shut_ = true;
  caf::scoped_actor self{sys_};
  // Our own directory first, so the others leaving is not reported as a loss.
  self->request(dir_, timeout_, rt::shutdown_atom_v, ok).receive([](bool) {}, [](caf::error&) {});
  const auto answer = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::duration<double>(sh_->opt.peer_timeout));
  for (size_t p = 0; p < dirs_.size(); ++p) {
    if (static_cast<int>(p) == me_ || lost_->has(static_cast<int>(p))) continue;  // a lost one never answers
    self->request(dirs_[p], answer, rt::shutdown_atom_v, ok).receive([](bool) {}, [](caf::error&) {});
  }
}

bool Cluster::lost(int p) const { return lost_->has(p); }

// No need to wait (and no blocking of the caller, the coordinator, on a
// scheduler thread the directory may need): the caller stops `a` after
// this, so its down message can only arrive behind the unwatch in the
// directory's mailbox.
void Cluster::forget(const caf::actor& a) { caf::anon_send(dir_, rt::watch_atom_v, a, false); }

caf::actor Cluster::spawn_expert(int process, const Plan& plan, int replica, int producer) {
  const ExpertLayout x = expert_layout(plan);
  caf::scoped_actor self{sys_};
  caf::actor out;
  std::string err;
  // The answer comes back as a message; meanwhile the process may be found
  // lost (a kill or a hang): then give up at once, the caller spawns here.
  self->send(dirs_.at(static_cast<size_t>(process)), rt::rescale_atom_v, x.shards, x.bounds, x.copies, x.shares,
             static_cast<int32_t>(replica), static_cast<int32_t>(producer));
  const auto deadline = std::chrono::steady_clock::now() + timeout_;
  for (bool done = false; !done;)
    self->receive([&](caf::actor& a) { out = std::move(a), done = true; },
                  [&](caf::error& e) { err = sys_.render(e), done = true; },
                  caf::after(std::chrono::milliseconds(50)) >> [&] {
                    if (lost_->has(process)) err = "process " + std::to_string(process) + " was lost", done = true;
                    else if (std::chrono::steady_clock::now() > deadline) err = "no answer", done = true;
                  });
  if (!out) throw std::runtime_error("spawning an expert shard on process " + std::to_string(process) + ": " + err);
  const auto [layer, shard] = plan.placement.expert_ids[static_cast<size_t>(producer)];
  caf::anon_send(dir_, rt::watch_atom_v, static_cast<int32_t>(process),
                 expert_name(replica, layer, shard, sh_->opt.data_parallel), out);
  return out;
}

void Cluster::publish_experts(const Plan& plan, const std::vector<std::vector<caf::actor>>& experts) {
  const ExpertLayout x = expert_layout(plan);
  std::vector<caf::actor> flat;
  for (const auto& rep : experts) flat.insert(flat.end(), rep.begin(), rep.end());
  caf::scoped_actor self{sys_};
  for (size_t p = 0; p < dirs_.size(); ++p) {
    if (static_cast<int>(p) == me_ || lost_->has(static_cast<int>(p)) || (sh_->lost_processes >> p) & 1u) continue;
    std::string err;
    self->request(dirs_[p], timeout_, rt::rescale_atom_v, x.shards, x.bounds, x.copies, x.shares, flat)
        .receive([](bool) {}, [&](caf::error& e) { err = sys_.render(e); });
    if (!err.empty() && !lost_->has(static_cast<int>(p)))  // a process lost meanwhile is recovered, not told
      throw std::runtime_error("publishing the placement to process " + std::to_string(p) + ": " + err);
  }
}

void Cluster::serve() {
  caf::scoped_actor self{sys_};
  self->send(dir_, rt::wait_atom_v, caf::actor_cast<caf::actor>(self));
  std::string err;
  self->receive(
      [&](rt::shutdown_atom, bool ok) {
        if (!ok) err = "process 0 ended the run after a failure";
      },
      [&](rt::lost_atom, const std::string& what) { err = what; });
  shut_ = true;
  if (!err.empty()) throw std::runtime_error(err);
}

}  // namespace troupe::runtime
