// bench_messaging: what an Envelope costs.
//  - in-process (any rank count; rank 0 only): one-way throughput into a sink
//    actor, actor-to-actor hop latency (ping-pong), and request/response from
//    a scoped_actor, each for an Envelope and for a bare uint64_t baseline in
//    the same run, plus a 16 MiB Envelope hop (shared, so as cheap as a small one);
//  - cross-process (mpirun -np 2): payloads of 1 KiB .. 64 MiB sent from rank
//    1 to rank 0 and acknowledged, through CAF (Envelope over the middleman;
//    random bytes, and compressible floats that take the zstd path) next to
//    MPI_Send/MPI_Recv of the same bytes with the same 8-byte ack, and the
//    random bytes again on the shared-memory bulk path (actors/transport/envelope_shm.hpp),
//    and the TCP round trip again from an event-based actor (as stages and
//    expert shards talk) rather than a scoped_actor's blocking receive.
// Both ranks use the runtime's CAF settings (work-sharing scheduler,
// actors/transport/caf_scheduler.hpp; middleman, actors/transport/caf_middleman.hpp;
// TCP_NODELAY, actors/transport/tcp_nodelay.hpp); their environment
// overrides give CAF's defaults back for before/after runs.
// Prints a table; --json PATH writes the figures.
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>

#include "actors/transport/caf_types.hpp"
#include "actors/transport/envelope_shm.hpp"
#include "actors/transport/tcp_nodelay.hpp"
#include "actors/transport/caf_middleman.hpp"
#include "actors/transport/caf_scheduler.hpp"
#include "bench/two_ranks.hpp"
#include "launch/mpi_bootstrap.hpp"

using namespace troupe;
using Clock = std::chrono::steady_clock;

namespace {

double secs_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

using Config = bench::RuntimeCafConfig;
using bench::quiet_barrier;

// A Snapshot whose state is `bytes` long: random (incompressible) or a few
// distinct floats (compressible), to pick the raw or the zstd path.
Envelope payload(size_t bytes, bool compressible, uint64_t seed) {
  std::vector<uint8_t> data(bytes);
  std::mt19937_64 rng(seed);
  if (compressible) {
    for (size_t i = 0; i + 4 <= bytes; i += 4) {
      float f = static_cast<float>(rng() % 16) * 0.25f;
      std::memcpy(&data[i], &f, 4);
    }
  } else {
    for (size_t i = 0; i + 8 <= bytes; i += 8) {
      uint64_t w = rng();
      std::memcpy(&data[i], &w, 8);
    }
  }
  return Envelope::build<schemas::Snapshot>(
      [&](schemas::Snapshot::Builder s) {
        s.setSnapshotId(seed);
        s.setActor("bench");
        auto d = s.initState(static_cast<unsigned>(bytes));
        std::memcpy(d.begin(), data.data(), bytes);
      },
      static_cast<unsigned>(bytes / 8 + 256));
}

Envelope small_envelope() {
  return Envelope::build<schemas::StatusRequest>([](schemas::StatusRequest::Builder b) { b.setRequestId(1); });
}

// -- in-process -----------------------------------------------------------------------------

struct InProc {
  std::string what;
  double envelope_us = 0, baseline_us = 0;  // per message
};

template <class T>
caf::behavior sink(caf::event_based_actor*) {
  auto count = std::make_shared<uint64_t>(0);
  return {[=](const T&) { ++*count; }, [=](caf::get_atom) { return *count; }};
}

// Passes (payload, left) back and forth with `peer`; tells `origin` when done.
template <class T>
caf::behavior relay(caf::event_based_actor* self) {
  return {[=](const T& x, uint64_t left, const caf::actor& peer, const caf::actor& origin) {
    if (left == 0)
      self->send(origin, caf::ok_atom::value);
    else
      self->send(peer, x, left - 1, caf::actor_cast<caf::actor>(self), origin);
  }};
}

template <class T>
caf::behavior echo(caf::event_based_actor*) {
  return {[](const T&) { return uint64_t{1}; }};
}

template <class T>
double one_way_us(caf::actor_system& sys, const T& x, uint64_t n) {
  auto s = sys.spawn(sink<T>);
  caf::scoped_actor self{sys};
  auto t0 = Clock::now();
  for (uint64_t i = 0; i < n; ++i) self->send(s, x);
  uint64_t got = 0;
  self->request(s, caf::infinite, caf::get_atom::value).receive([&](uint64_t c) { got = c; }, [](caf::error&) {});
  double us = secs_since(t0) * 1e6 / static_cast<double>(n);
  self->send_exit(s, caf::exit_reason::user_shutdown);
  return got == n ? us : -1;
}

template <class T>
double hop_us(caf::actor_system& sys, const T& x, uint64_t hops) {
  auto a = sys.spawn(relay<T>);
  auto b = sys.spawn(relay<T>);
  caf::scoped_actor self{sys};
  auto t0 = Clock::now();
  self->send(a, x, hops, b, caf::actor_cast<caf::actor>(self));
  self->receive([](caf::ok_atom) {});
  double us = secs_since(t0) * 1e6 / static_cast<double>(hops);
  self->send_exit(a, caf::exit_reason::user_shutdown);
  self->send_exit(b, caf::exit_reason::user_shutdown);
  return us;
}

template <class T>
double request_us(caf::actor_system& sys, const T& x, uint64_t n) {
  auto e = sys.spawn(echo<T>);
  caf::scoped_actor self{sys};
  auto t0 = Clock::now();
  for (uint64_t i = 0; i < n; ++i) self->request(e, caf::infinite, x).receive([](uint64_t) {}, [](caf::error&) {});
  double us = secs_since(t0) * 1e6 / static_cast<double>(n);
  self->send_exit(e, caf::exit_reason::user_shutdown);
  return us;
}

// Median of `reps` runs; envelope and baseline alternate so load drift on a
// shared machine hits both alike.
template <class F, class G>
InProc measure(std::string what, F envelope, G baseline, int reps = 5) {
  std::vector<double> a, b;
  for (int i = 0; i < reps; ++i) {
    a.push_back(envelope());
    b.push_back(baseline());
  }
  std::sort(a.begin(), a.end());
  std::sort(b.begin(), b.end());
  return {std::move(what), a[a.size() / 2], b[b.size() / 2]};
}

std::vector<InProc> run_in_process(caf::actor_system& sys) {
  const Envelope env = small_envelope();
  const Envelope big = payload(16u << 20, false, 7);
  const uint64_t base = 42;
  std::vector<InProc> out;
  out.push_back(measure("one-way send into a sink", [&] { return one_way_us(sys, env, 100000); },
                        [&] { return one_way_us(sys, base, 100000); }));
  out.push_back(measure("actor -> actor hop (ping-pong)", [&] { return hop_us(sys, env, 100000); },
                        [&] { return hop_us(sys, base, 100000); }));
  out.push_back(measure("request/response (scoped_actor)", [&] { return request_us(sys, env, 5000); },
                        [&] { return request_us(sys, base, 5000); }));
  out.push_back(measure("hop with a 16 MiB envelope", [&] { return hop_us(sys, big, 100000); },
                        [&] { return hop_us(sys, env, 100000); }));
  return out;
}

// -- cross-process ----------------------------------------------------------------------------

struct Cross {
  size_t bytes = 0;
  int iters = 0;
  // Seconds per transfer (payload + ack): random bytes (sent raw), compressible
  // floats (zstd), the same compressible floats from a system with zstd off, MPI.
  double caf_raw_s = 0, caf_zstd_s = 0, caf_off_s = 0, mpi_s = 0;
  // Random bytes again, on the shared-memory bulk path (actors/transport/envelope_shm.hpp).
  double caf_shm_s = 0;
  // Random bytes, TCP, from an event-based actor instead of a scoped_actor.
  double caf_actor_s = 0;
};

int iterations_for(size_t bytes) {
  const size_t budget = 256u << 20;
  return static_cast<int>(std::clamp<size_t>(budget / bytes, 5, 1000));
}

// Acks with the body size and whether the frame came compressed.
caf::behavior receiver(caf::event_based_actor*) {
  return {[](const Envelope& env) {
    return caf::make_message(static_cast<uint64_t>(env.ok() ? env.flat_size() : 0),
                             static_cast<uint32_t>(env.arrived_compressed()));
  }};
}

// Rank 1: sends `env` iters times (after one warm-up), waits for each ack.
// -1 if an ack is wrong or the frame was (not) compressed against `want_zstd`.
double caf_transfer_s(caf::actor_system& sys, const caf::actor& peer, const Envelope& env, int iters,
                      bool want_zstd) {
  caf::scoped_actor self{sys};
  bool ok = true;
  auto once = [&] {
    self->request(peer, std::chrono::seconds(120), env)
        .receive([&](uint64_t n, uint32_t zstd) { ok &= (n == env.flat_size() && (zstd != 0) == want_zstd); },
                 [&](caf::error&) { ok = false; });
  };
  once();
  auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) once();
  const double s = secs_since(t0) / iters;
  return ok ? s : -1;
}

// Rank 1: the same round trip from an event-based actor (as a stage talks to
// an expert shard) instead of a scoped_actor's blocking receive: `iters`
// request/ack pairs back to back; seconds per pair, -1 on a wrong ack.
double caf_actor_rt_s(caf::actor_system& sys, const caf::actor& peer, const Envelope& env, int iters) {
  auto pinger = sys.spawn([=](caf::event_based_actor* self) -> caf::behavior {
    auto left = std::make_shared<int>(0);
    auto ok = std::make_shared<bool>(true);
    auto client = std::make_shared<caf::actor>();
    auto next = std::make_shared<std::function<void()>>();
    *next = [=] {
      if (*left == 0) {
        self->send(*client, *ok);
        return;
      }
      --*left;
      self->request(peer, std::chrono::seconds(120), env)
          .then([=](uint64_t n, uint32_t) { *ok = *ok && n == env.flat_size(); (*next)(); },
                [=](caf::error&) { *ok = false; *left = 0; (*next)(); });
    };
    return {[=](int n, const caf::actor& c) {
      *left = n;
      *client = c;
      (*next)();
    }};
  });
  caf::scoped_actor self{sys};
  bool ok = false;
  auto run = [&](int n) {
    self->send(pinger, n, caf::actor_cast<caf::actor>(self));
    self->receive([&](bool good) { ok = good; });
  };
  run(1);  // warm-up
  auto t0 = Clock::now();
  run(iters);
  const double s = secs_since(t0) / iters;
  self->send_exit(pinger, caf::exit_reason::user_shutdown);
  return ok ? s : -1;
}

// Both ranks: rank 1 sends `bytes`, rank 0 acks with 8 bytes.
double mpi_transfer_s(int rank, std::vector<char>& buf, int iters) {
  uint64_t ack = 0;
  const int n = static_cast<int>(buf.size());
  auto once = [&] {
    if (rank == 1) {
      MPI_Send(buf.data(), n, MPI_BYTE, 0, 1, MPI_COMM_WORLD);
      MPI_Recv(&ack, 1, MPI_UINT64_T, 0, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else {
      MPI_Recv(buf.data(), n, MPI_BYTE, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      ack = static_cast<uint64_t>(n);
      MPI_Send(&ack, 1, MPI_UINT64_T, 1, 2, MPI_COMM_WORLD);
    }
  };
  once();
  auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) once();
  return secs_since(t0) / iters;
}

std::vector<Cross> run_cross(caf::actor_system& sys, caf::actor_system* no_zstd, int rank) {
  std::vector<Cross> out;
  caf::actor recv;
  std::vector<mpi::Endpoint> eps;
  if (rank == 0) {
    recv = sys.spawn(receiver);
    auto e = mpi::publish_and_exchange(sys, recv);
    if (!e) return out;
    set_tcp_nodelay_on_all_sockets();
    eps = *e;
  } else {
    auto e = mpi::exchange_endpoints(mpi::Endpoint{"", 0});
    if (!e) return out;
    eps = *e;
  }
  caf::actor peer, peer_off;
  if (rank == 1) {
    auto p = mpi::connect(sys, eps[0]);
    auto q = mpi::connect(*no_zstd, eps[0]);
    if (!p || !q) {
      std::fprintf(stderr, "connect: %s\n", sys.render(p ? q.error() : p.error()).c_str());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    peer = *p;
    peer_off = *q;
    set_tcp_nodelay_on_all_sockets();
  }
  for (size_t bytes : {size_t{1} << 10, size_t{16} << 10, size_t{64} << 10, size_t{1} << 20, size_t{16} << 20, size_t{64} << 20}) {
    Cross c;
    c.bytes = bytes;
    c.iters = iterations_for(bytes);
    if (rank == 1) {
      const Envelope compressible = payload(bytes, true, bytes);
      const bool big = compressible.flat_size() > kCompressThreshold;
      c.caf_raw_s = caf_transfer_s(sys, peer, payload(bytes, false, bytes), c.iters, false);
      c.caf_actor_s = caf_actor_rt_s(sys, peer, payload(bytes, false, bytes), c.iters);
      c.caf_zstd_s = caf_transfer_s(sys, peer, compressible, c.iters, big);
      c.caf_off_s = caf_transfer_s(*no_zstd, peer_off, compressible, c.iters, false);
      set_bulk_shm_threshold(1);  // every envelope of this rank's sends
      c.caf_shm_s = caf_transfer_s(sys, peer, payload(bytes, false, bytes), c.iters, false);
      set_bulk_shm_threshold(0);
    }
    quiet_barrier();  // rank 0 slept through the CAF part (its actor did the work)
    std::vector<char> buf(bytes, 1);
    c.mpi_s = mpi_transfer_s(rank, buf, c.iters);
    quiet_barrier();
    out.push_back(c);
  }
  if (rank == 0) caf::anon_send_exit(recv, caf::exit_reason::user_shutdown);
  bulk_shm_cleanup();  // the shared-memory slots rank 1 made
  return out;
}

std::string human(size_t bytes) {
  if (bytes >= (1u << 20)) return std::to_string(bytes >> 20) + " MiB";
  return std::to_string(bytes >> 10) + " KiB";
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) json_path = argv[++i];
  mpi::Session session(argc, argv);
  const int rank = session.rank();
  if (session.size() > 2) {
    if (rank == 0) std::fprintf(stderr, "bench_messaging: run with 1 or 2 ranks\n");
    return 2;
  }
  std::vector<InProc> inproc;
  std::vector<Cross> cross;
  {
    Config cfg;
    caf::actor_system sys{cfg};
    // A second system on rank 1 with compression off: same bytes, no zstd.
    Config off_cfg;
    EncodeOptions never;
    never.compress_threshold = SIZE_MAX;
    set_encode_options(off_cfg, never);
    std::unique_ptr<caf::actor_system> no_zstd;
    if (rank == 1) no_zstd = std::make_unique<caf::actor_system>(off_cfg);
    if (rank == 0) inproc = run_in_process(sys);
    if (session.size() == 2) {
      quiet_barrier();
      cross = run_cross(sys, no_zstd.get(), rank);
      // Rank 1 measured the CAF side: hand those figures to rank 0.
      for (auto& c : cross) {
        double v[5] = {c.caf_raw_s, c.caf_zstd_s, c.caf_off_s, c.caf_shm_s, c.caf_actor_s};
        if (rank == 1) MPI_Send(v, 5, MPI_DOUBLE, 0, 3, MPI_COMM_WORLD);
        else MPI_Recv(v, 5, MPI_DOUBLE, 1, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        c.caf_actor_s = v[4];
        c.caf_raw_s = v[0];
        c.caf_zstd_s = v[1];
        c.caf_off_s = v[2];
        c.caf_shm_s = v[3];
      }
    }
  }
  if (rank != 0) return 0;

  std::printf("\nIn-process (CAF 0.17, one actor_system), microseconds per message\n");
  std::printf("%-34s %12s %12s %8s\n", "what", "Envelope", "baseline", "ratio");
  for (const auto& r : inproc)
    std::printf("%-34s %12.3f %12.3f %8.2f\n", r.what.c_str(), r.envelope_us, r.baseline_us,
                r.envelope_us / r.baseline_us);
  std::printf("(baseline: a bare uint64_t message; last row: 16 MiB envelope vs. small envelope)\n");
  if (!cross.empty()) {
    std::printf("\nCross-process, rank 1 -> rank 0 + small ack, same machine; GB/s = payload bytes / time\n");
    std::printf("%-8s %6s %11s %11s %11s %11s %8s %9s\n", "payload", "iters", "CAF random", "CAF cmp+zstd",
                "CAF cmp raw", "MPI", "MPI/CAF", "zstd gain");
    for (const auto& c : cross) {
      auto gbs = [&](double s) { return s > 0 ? static_cast<double>(c.bytes) / s / 1e9 : -1.0; };
      std::printf("%-8s %6d %11.3f %12.3f %11.3f %11.3f %8.1f %9.2f\n", human(c.bytes).c_str(), c.iters,
                  gbs(c.caf_raw_s), gbs(c.caf_zstd_s), gbs(c.caf_off_s), gbs(c.mpi_s), c.caf_raw_s / c.mpi_s,
                  c.caf_off_s / c.caf_zstd_s);
    }
    std::printf("(CAF random: incompressible bytes, sent raw after the zstd sample probe; CAF cmp: 4-bit floats,\n"
                " zstd on (default) vs. off; zstd gain = time off / time on; negative GB/s would mean a failed ack)\n");
    std::printf("(1 KiB round trip: CAF %.1f us from a scoped_actor, %.1f us from an event-based actor, MPI %.2f us;\n"
                " in-process request/response from a scoped_actor, same run: %.1f us)\n",
                cross[0].caf_raw_s * 1e6, cross[0].caf_actor_s * 1e6, cross[0].mpi_s * 1e6,
                inproc.size() > 2 ? inproc[2].envelope_us : -1.0);
    std::printf("\nShared-memory bulk path (random bytes; CAF carries a 64-byte record), same run\n");
    std::printf("%-8s %11s %11s %11s %9s %9s\n", "payload", "CAF TCP", "CAF shm", "MPI", "shm gain", "MPI/shm");
    for (const auto& c : cross) {
      auto gbs = [&](double s) { return s > 0 ? static_cast<double>(c.bytes) / s / 1e9 : -1.0; };
      std::printf("%-8s %11.3f %11.3f %11.3f %9.2f %9.2f\n", human(c.bytes).c_str(), gbs(c.caf_raw_s),
                  gbs(c.caf_shm_s), gbs(c.mpi_s), c.caf_raw_s / c.caf_shm_s, c.caf_shm_s / c.mpi_s);
    }
    std::printf("(GB/s; shm gain = CAF TCP time / CAF shm time; MPI/shm = CAF shm time / MPI time)\n");
  }
  if (!json_path.empty()) {
    std::ofstream j(json_path);
    j << "{\n  \"bench\": \"messaging\",\n  \"ranks\": " << session.size() << ",\n  \"in_process_us\": [\n";
    for (size_t i = 0; i < inproc.size(); ++i)
      j << "    {\"what\": \"" << inproc[i].what << "\", \"envelope\": " << inproc[i].envelope_us
        << ", \"baseline\": " << inproc[i].baseline_us << "}" << (i + 1 < inproc.size() ? "," : "") << "\n";
    j << "  ],\n  \"cross_process\": [\n";
    for (size_t i = 0; i < cross.size(); ++i) {
      const auto& c = cross[i];
      j << "    {\"bytes\": " << c.bytes << ", \"iters\": " << c.iters << ", \"caf_raw_s\": " << c.caf_raw_s
        << ", \"caf_zstd_s\": " << c.caf_zstd_s << ", \"caf_zstd_off_s\": " << c.caf_off_s << ", \"caf_shm_s\": " << c.caf_shm_s << ", \"caf_actor_s\": " << c.caf_actor_s << ", \"mpi_s\": " << c.mpi_s << "}"
        << (i + 1 < cross.size() ? "," : "") << "\n";
    }
    j << "  ]\n}\n";
    std::printf("wrote %s\n", json_path.c_str());
  }
  return 0;
}
