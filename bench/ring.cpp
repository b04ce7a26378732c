// bench_ring: step messages between two processes on one host through the
// shared-memory ring (actors/transport/ring_transport.hpp) against MPI's
// shared-memory path and CAF's TCP middleman, in one run, alternating.
//  - round trip: rank 1 sends an Envelope of N bytes (a Snapshot of random
//    bytes) to an actor on rank 0, which answers with an 8+4-byte ack; ring:
//    both directions anonymous through the rings (as post() sends), event-
//    based actors at both ends; TCP: a request from an event-based actor
//    (today's path for every step message); MPI: MPI_Send/MPI_Recv of the
//    same bytes and an 8-byte ack;
//  - payloads 64 B .. 64 MiB; at 64 KiB and above the ring carries the bulk
//    path's 64-byte record (the runtime's default threshold), as runs do;
//  - idle CPU: each process's CPU time over 2 s with the rings up and nothing
//    sent (receivers asleep on their doorbells).
// Run: mpirun --allow-run-as-root --oversubscribe -np 2 --mca btl self,vader bench_ring [--json PATH] [--reps N]
// TROUPE_RING_SPIN_US sets the receivers' spin (default: RingOptions).
#include <mpi.h>
#include <sys/resource.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/binary_serializer.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>

#include "actors/transport/caf_middleman.hpp"
#include "actors/transport/caf_scheduler.hpp"
#include "actors/transport/caf_types.hpp"
#include "actors/transport/envelope_shm.hpp"
#include "actors/transport/ring_transport.hpp"
#include "actors/transport/shm_ring.hpp"
#include "actors/transport/tcp_nodelay.hpp"
#include "bench/bench_stats.hpp"
#include "bench/two_ranks.hpp"
#include "launch/mpi_bootstrap.hpp"

using namespace troupe;
using Clock = std::chrono::steady_clock;

namespace {

double secs_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

using bench::quiet_barrier;
using Config = bench::RuntimeCafConfig;

double cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) + 1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

// A Snapshot carrying about `bytes` of random state (its flat size is a few
// dozen bytes more).
Envelope payload(size_t bytes) {
  std::vector<uint8_t> data(bytes);
  std::mt19937_64 rng(bytes);
  for (auto& b : data) b = static_cast<uint8_t>(rng());
  return Envelope::build<schemas::Snapshot>(
      [&](schemas::Snapshot::Builder s) {
        s.setSnapshotId(bytes);
        s.setActor("bench");
        auto d = s.initState(static_cast<unsigned>(bytes));
        std::memcpy(d.begin(), data.data(), bytes);
      },
      static_cast<unsigned>(bytes / 8 + 256));
}

// Rank 0: acks every Envelope with its size; through the ring to `reply_to`
// when it came anonymously (the ring), else as the request's response.
caf::behavior echo(caf::event_based_actor* self, std::shared_ptr<caf::actor> reply_to) {
  return {
      [self, reply_to](const Envelope& env) {
        auto ack = caf::make_message(static_cast<uint64_t>(env.ok() ? env.flat_size() : 0), uint32_t{0});
        if (!self->current_sender() && *reply_to) send_anon(*reply_to, ack);
        return ack;
      },
      // Streaming: a window of envelopes, acked once, at its last.
      [reply_to](const Envelope& env, bool last) {
        if (last) send_anon(*reply_to, caf::make_message(static_cast<uint64_t>(env.ok() ? env.flat_size() : 0), uint32_t{0}));
      },
      [reply_to](const caf::actor& a) {
        *reply_to = a;
        return true;
      },
  };
}

struct Ping {
  int left = 0;
  bool ok = true;
  Envelope env;
  caf::actor client;
  int window = 0;  // > 0: streaming, this many envelopes per ack
};

// Rank 1: sends the envelope `n` times through the ring, each after the last
// ack; tells its client whether every ack was right.
caf::behavior ring_pinger(caf::event_based_actor* self, caf::actor peer) {
  auto st = std::make_shared<Ping>();
  return {
      [=](int n, const Envelope& env, const caf::actor& client) {
        *st = Ping{n, true, env, client};
        send_anon(peer, caf::make_message(env));
      },
      [=](int windows, int window, const Envelope& env, const caf::actor& client) {
        *st = Ping{windows, true, env, client, window};
        for (int i = 0; i < window; ++i) send_anon(peer, caf::make_message(env, i + 1 == window));
      },
      [=](uint64_t got, uint32_t) {
        st->ok = st->ok && got == st->env.flat_size();
        if (--st->left <= 0) self->send(st->client, st->ok);
        else if (st->window == 0) send_anon(peer, caf::make_message(st->env));
        else
          for (int i = 0; i < st->window; ++i) send_anon(peer, caf::make_message(st->env, i + 1 == st->window));
      },
  };
}

// The same from an event-based actor through CAF (request / response).
caf::behavior tcp_pinger(caf::event_based_actor* self, caf::actor peer) {
  auto st = std::make_shared<Ping>();
  auto next = std::make_shared<std::function<void()>>();
  *next = [=] {
    if (st->left-- == 0) {
      self->send(st->client, st->ok);
      return;
    }
    self->request(peer, std::chrono::seconds(120), st->env)
        .then([=](uint64_t got, uint32_t) { st->ok = st->ok && got == st->env.flat_size(); (*next)(); },
              [=](caf::error&) { st->ok = false; st->left = 0; (*next)(); });
  };
  return {[=](int n, const Envelope& env, const caf::actor& client) {
    *st = Ping{n, true, env, client};
    (*next)();
  }};
}

// Rank 1: seconds per round trip of `n` pings by `pinger`; -1 on a wrong ack.
double pings(caf::actor_system& sys, const caf::actor& pinger, const Envelope& env, int n) {
  caf::scoped_actor self{sys};
  bool ok = false;
  const auto t0 = Clock::now();
  self->send(pinger, n, env, caf::actor_cast<caf::actor>(self));
  self->receive([&](bool good) { ok = good; });
  return ok ? secs_since(t0) / n : -1.0;
}

// Rank 1: seconds per envelope, streaming `windows` windows of `window`
// envelopes, each window acked once (as osu_bw measures); -1 on a wrong ack.
double streams(caf::actor_system& sys, const caf::actor& pinger, const Envelope& env, int windows, int window) {
  caf::scoped_actor self{sys};
  bool ok = false;
  const auto t0 = Clock::now();
  self->send(pinger, windows, window, env, caf::actor_cast<caf::actor>(self));
  self->receive([&](bool good) { ok = good; });
  return ok ? secs_since(t0) / (static_cast<double>(windows) * window) : -1.0;
}

double mpi_streams(int rank, std::vector<char>& buf, int windows, int window) {
  uint64_t ack = 0;
  const int bytes = static_cast<int>(buf.size());
  std::vector<MPI_Request> req(static_cast<size_t>(window));
  const auto t0 = Clock::now();
  for (int w = 0; w < windows; ++w) {
    for (int i = 0; i < window; ++i) {
      if (rank == 1) MPI_Isend(buf.data(), bytes, MPI_BYTE, 0, 4, MPI_COMM_WORLD, &req[static_cast<size_t>(i)]);
      else MPI_Irecv(buf.data(), bytes, MPI_BYTE, 1, 4, MPI_COMM_WORLD, &req[static_cast<size_t>(i)]);
    }
    MPI_Waitall(window, req.data(), MPI_STATUSES_IGNORE);
    if (rank == 1) MPI_Recv(&ack, 1, MPI_UINT64_T, 0, 5, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    else MPI_Send(&ack, 1, MPI_UINT64_T, 1, 5, MPI_COMM_WORLD);
  }
  return secs_since(t0) / (static_cast<double>(windows) * window);
}

double mpi_pings(int rank, std::vector<char>& buf, int n) {
  uint64_t ack = 0;
  const int bytes = static_cast<int>(buf.size());
  const auto t0 = Clock::now();
  for (int i = 0; i < n; ++i) {
    if (rank == 1) {
      MPI_Send(buf.data(), bytes, MPI_BYTE, 0, 1, MPI_COMM_WORLD);
      MPI_Recv(&ack, 1, MPI_UINT64_T, 0, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
    } else {
      MPI_Recv(buf.data(), bytes, MPI_BYTE, 1, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
      ack = static_cast<uint64_t>(bytes);
      MPI_Send(&ack, 1, MPI_UINT64_T, 1, 2, MPI_COMM_WORLD);
    }
  }
  return secs_since(t0) / n;
}

constexpr int kWindow = 64;  // streaming: envelopes per ack (osu_bw's window)

// The pieces of a ring round trip, for the breakdown below the table.
// Raw rings, no CAF: rank 1 puts `bytes`, rank 0's thread (spinning as the
// transport's receivers do, then sleeping) answers 12 bytes; seconds per
// round trip. Collective.
double raw_ring_rt(int rank, size_t bytes, int iters, uint64_t nonce, int64_t spin_ns) {
  int pids[2] = {0, 0};
  const int me = static_cast<int>(::getpid());
  MPI_Allgather(&me, 1, MPI_INT, pids, 1, MPI_INT, MPI_COMM_WORLD);
  auto name = [&](int owner) {
    return "/troupe-ring-" + std::to_string(pids[owner]) + "-" + std::to_string(nonce + 1) + "-" + std::to_string(owner);
  };
  ring::Reader in(name(rank), size_t{1} << 22);
  MPI_Barrier(MPI_COMM_WORLD);
  ring::Writer out(name(1 - rank));
  MPI_Barrier(MPI_COMM_WORLD);
  in.unlink();
  std::vector<uint8_t> msg(bytes, 7), ack(12, 1), got;
  auto put = [&](const std::vector<uint8_t>& b) {
    const ring::Writer::Part part{b.data(), b.size()};
    while (!out.try_put(&part, 1)) out.wait_space(10);
  };
  auto take = [&] {
    while (in.next(got) != ring::Reader::Got::frame) in.wait(spin_ns, 100);
  };
  quiet_barrier();
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) {
    if (rank == 1) {
      put(msg);
      take();
    } else {
      take();
      put(ack);
    }
  }
  const double s = secs_since(t0) / iters;
  quiet_barrier();
  return s;
}

// In one process: serializing a message (Envelope of `bytes`) for the ring
// and decoding it as the receiver does; seconds per message.
double codec_s(caf::actor_system& sys, size_t bytes, int iters) {
  const Envelope env = payload(bytes);
  const MemoryFrames raw;
  std::vector<char> buf;
  const auto t0 = Clock::now();
  for (int i = 0; i < iters; ++i) {
    buf.clear();
    caf::binary_serializer sink{sys, buf};
    uint64_t id = 1;
    auto m = caf::make_message(env);
    if (sink(id, m)) return -1;
    caf::message back;
    if (!RingTransport::decode(sys, reinterpret_cast<const uint8_t*>(buf.data()), buf.size(), id, back)) return -1;
  }
  return secs_since(t0) / iters;
}

int iterations_for(size_t bytes) { return static_cast<int>(std::clamp<size_t>((64u << 20) / bytes, 4, 2000)); }

struct Row {
  size_t bytes = 0;
  int iters = 0;
  std::vector<double> ring, tcp, mpi;  // seconds per round trip, one per rep
  std::vector<double> ring_bw, mpi_bw;  // streaming: seconds per message, one per rep
  uint64_t bulk = 0;                    // envelopes rank 1 sent through bulk slots at this size
};

std::string human(size_t b) {
  if (b >= (1u << 20)) return std::to_string(b >> 20) + " MiB";
  if (b >= 1024) return std::to_string(b >> 10) + " KiB";
  return std::to_string(b) + " B";
}

}  // namespace

int main(int argc, char** argv) {
  std::string json_path;
  int reps = 5;
  for (int i = 1; i < argc; ++i) {
    if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) json_path = argv[++i];
    else if (std::strcmp(argv[i], "--reps") == 0 && i + 1 < argc) reps = std::max(1, std::atoi(argv[++i]));
    else {
      std::fprintf(stderr, "usage: mpirun -np 2 bench_ring [--json PATH] [--reps N]\n");
      return 2;
    }
  }
  mpi::Session session(argc, argv);
  const int rank = session.rank();
  if (session.size() != 2) {
    if (rank == 0) std::fprintf(stderr, "bench_ring: run with 2 ranks (mpirun -np 2)\n");
    return 2;
  }
  const RingOptions ro = bench::ring_options_from_env();
  std::vector<Row> rows;
  double idle_cpu[2] = {0, 0};
  double raw_rt = 0, codec = 0;  // the 1 KiB breakdown
  RingStats stats[2];
  {
    Config cfg;
    caf::actor_system sys{cfg};
    set_bulk_shm_threshold(size_t{1} << 16);  // the runtime's default: large envelopes as bulk records
    auto reply_to = std::make_shared<caf::actor>();
    caf::actor peer, ring_ping, tcp_ping, echoer;
    caf::node_id other;
    if (rank == 0) {
      echoer = sys.spawn(echo, reply_to);
      auto e = mpi::publish_and_exchange(sys, echoer);
      if (!e) return 1;
      set_tcp_nodelay_on_all_sockets();
    } else {
      auto e = mpi::exchange_endpoints(mpi::Endpoint{"", 0});
      if (!e) return 1;
      auto p = mpi::connect(sys, (*e)[0]);
      if (!p) {
        std::fprintf(stderr, "connect: %s\n", sys.render(p.error()).c_str());
        MPI_Abort(MPI_COMM_WORLD, 1);
      }
      peer = *p;
      set_tcp_nodelay_on_all_sockets();
      ring_ping = sys.spawn(ring_pinger, peer);
      tcp_ping = sys.spawn(tcp_pinger, peer);
      caf::scoped_actor self{sys};
      self->request(peer, std::chrono::seconds(30), ring_ping).receive([](bool) {}, [](caf::error&) {});
      other = peer.node();
    }
    quiet_barrier();
    if (rank == 0) other = reply_to->node();
    auto rings = bench::rings_between_ranks(sys, rank, other, ro);
    RingTransport& ring = *rings;

    // Idle: rings up, nothing sent.
    {
      const double c0 = cpu_seconds();
      const auto t0 = Clock::now();
      std::this_thread::sleep_for(std::chrono::seconds(2));
      double mine = (cpu_seconds() - c0) / secs_since(t0);
      MPI_Gather(&mine, 1, MPI_DOUBLE, idle_cpu, 1, MPI_DOUBLE, 0, MPI_COMM_WORLD);
    }
    for (size_t bytes : {size_t{64}, size_t{1} << 10, size_t{16} << 10, size_t{64} << 10, size_t{1} << 20,
                         size_t{16} << 20, size_t{64} << 20}) {
      Row r;
      r.bytes = bytes;
      r.iters = iterations_for(bytes);
      const Envelope env = rank == 1 ? payload(bytes) : Envelope{};
      std::vector<char> buf(bytes, 1);
      if (rank == 1) (void)pings(sys, ring_ping, env, std::min(r.iters, 200));  // warm-up: slots, pages, scheduler
      const uint64_t bulk0 = bulk_shm_stats().sent;
      for (int k = 0; k < reps; ++k) {
        double ring_s = 0, tcp_s = 0;
        if (rank == 1) ring_s = pings(sys, ring_ping, env, r.iters);
        quiet_barrier();
        if (rank == 1) tcp_s = pings(sys, tcp_ping, env, std::max(2, r.iters / 4));
        quiet_barrier();
        const double mpi_s = mpi_pings(rank, buf, r.iters);
        quiet_barrier();
        const int windows = std::max(2, r.iters / kWindow);
        double stream_s = 0;
        if (rank == 1) stream_s = streams(sys, ring_ping, env, windows, kWindow);
        quiet_barrier();
        const double mpi_stream_s = mpi_streams(rank, buf, windows, kWindow);
        quiet_barrier();
        double v[3] = {ring_s, tcp_s, stream_s};
        if (rank == 1) MPI_Send(v, 3, MPI_DOUBLE, 0, 3, MPI_COMM_WORLD);
        else MPI_Recv(v, 3, MPI_DOUBLE, 1, 3, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
        r.ring.push_back(v[0]);
        r.tcp.push_back(v[1]);
        r.mpi.push_back(mpi_s);
        r.ring_bw.push_back(v[2]);
        r.mpi_bw.push_back(mpi_stream_s);
      }
      uint64_t bulk = bulk_shm_stats().sent - bulk0;
      MPI_Bcast(&bulk, 1, MPI_UINT64_T, 1, MPI_COMM_WORLD);
      r.bulk = bulk;
      rows.push_back(std::move(r));
      if (rank == 0) std::fprintf(stderr, "bench_ring: %s done\n", human(bytes).c_str());
    }
    // The breakdown at 1 KiB: raw rings alone, and the CAF codec alone.
    {
      uint64_t nonce = rank == 0 ? std::random_device{}() : 0;
      MPI_Bcast(&nonce, 1, MPI_UINT64_T, 0, MPI_COMM_WORLD);
      std::vector<double> raws;
      for (int k = 0; k < reps; ++k) raws.push_back(raw_ring_rt(rank, 1024, 2000, nonce + static_cast<uint64_t>(k), ro.spin_ns));
      raw_rt = bench::median(raws);
      if (rank == 0) {
        std::vector<double> cs;
        for (int k = 0; k < reps; ++k) cs.push_back(codec_s(sys, 1024, 20000));
        codec = bench::median(cs);
      }
    }
    quiet_barrier();
    const RingStats mine = ring.stats();
    uint64_t v[7] = {mine.sent, mine.queued, mine.received, mine.no_actor, mine.bad_frames, mine.lost_peer, mine.sleeps};
    uint64_t all[14] = {};
    MPI_Gather(v, 7, MPI_UINT64_T, all, 7, MPI_UINT64_T, 0, MPI_COMM_WORLD);
    for (int p = 0; p < 2; ++p)
      stats[p] = {all[7 * p], all[7 * p + 1], all[7 * p + 2], all[7 * p + 3], all[7 * p + 4], all[7 * p + 5], all[7 * p + 6]};
    quiet_barrier();
    if (rank == 1) {
      caf::anon_send_exit(ring_ping, caf::exit_reason::user_shutdown);
      caf::anon_send_exit(tcp_ping, caf::exit_reason::user_shutdown);
    } else {
      caf::anon_send_exit(echoer, caf::exit_reason::user_shutdown);  // or the actor system waits for it
    }
  }
  bulk_shm_cleanup();
  if (rank != 0) return 0;

  using bench::median;
  std::printf("\nRound trip rank 1 -> rank 0 -> rank 1, one host; medians of %d reps, ring / CAF TCP / MPI alternating\n", reps);
  std::printf("load %s, receivers spin %lld us\n", bench::load_average().c_str(), static_cast<long long>(ro.spin_ns / 1000));
  std::printf("%-8s %6s %10s %10s %10s %10s %10s %9s %9s\n", "payload", "iters", "ring us", "TCP us", "MPI us",
              "ring GB/s", "MPI GB/s", "ring/MPI", "TCP/ring");
  for (const Row& r : rows) {
    const double ring = median(r.ring), tcp = median(r.tcp), mpi = median(r.mpi);
    const double b = static_cast<double>(r.bytes);
    std::printf("%-8s %6d %10.1f %10.1f %10.2f %10.3f %10.3f %8.0f%% %9.2f\n", human(r.bytes).c_str(), r.iters,
                ring * 1e6, tcp * 1e6, mpi * 1e6, b / ring / 1e9, b / mpi / 1e9, 100.0 * mpi / ring, tcp / ring);
  }
  std::printf("(ring/MPI: MPI time / ring time = the ring's bandwidth as a share of MPI's; GB/s = payload / round trip)\n");
  std::printf("\nStreaming rank 1 -> rank 0, windows of %d messages, one ack per window (as osu_bw), same run\n", kWindow);
  std::printf("%-8s %10s %10s %9s %12s\n", "payload", "ring GB/s", "MPI GB/s", "ring/MPI", "bulk slots");
  for (const Row& r : rows) {
    const double ring = median(r.ring_bw), mpi = median(r.mpi_bw);
    const double b = static_cast<double>(r.bytes);
    std::printf("%-8s %10.3f %10.3f %8.0f%% %12llu\n", human(r.bytes).c_str(), b / ring / 1e9, b / mpi / 1e9,
                100.0 * mpi / ring, static_cast<unsigned long long>(r.bulk));
  }
  std::printf("(bulk slots: envelopes of this size rank 1 sent through a bulk slot, of all it sent, round trips included)\n");
  {
    const Row& k1 = rows[1];
    std::printf("\n1 KiB round trip, per part (medians): whole %.1f us = raw rings, no CAF (2 hops, spinning receivers) %.1f us\n"
                " + CAF codec (serialize + decode a 1 KiB envelope message, in one process) 2 x %.1f us\n"
                " + the rest, %.1f us: the receivers' enqueue and the CAF worker wake-up and dispatch at each end\n",
                median(k1.ring) * 1e6, raw_rt * 1e6, codec * 1e6, (median(k1.ring) - raw_rt - 2 * codec) * 1e6);
  }
  std::printf("idle CPU with the rings up (2 s, nothing sent): process 0 %.2f%%, process 1 %.2f%% of one core\n",
              100 * idle_cpu[0], 100 * idle_cpu[1]);
  for (int p = 0; p < 2; ++p)
    std::printf("process %d ring: sent %llu, received %llu, queued %llu, bad %llu, receiver sleeps %llu\n", p,
                static_cast<unsigned long long>(stats[p].sent), static_cast<unsigned long long>(stats[p].received),
                static_cast<unsigned long long>(stats[p].queued), static_cast<unsigned long long>(stats[p].bad_frames),
                static_cast<unsigned long long>(stats[p].sleeps));
  if (!json_path.empty()) {
    std::ofstream j(json_path);
    j << "{\n  \"bench\": \"ring\",\n  \"load\": \"" << bench::load_average() << "\",\n  \"spin_us\": " << ro.spin_ns / 1000
      << ",\n  \"reps\": " << reps << ",\n  \"kib_raw_ring_rt_s\": " << raw_rt << ",\n  \"kib_codec_s\": " << codec << ",\n  \"idle_cpu\": [" << idle_cpu[0] << ", " << idle_cpu[1] << "],\n  \"rows\": [\n";
    for (size_t i = 0; i < rows.size(); ++i) {
      const Row& r = rows[i];
      j << "    {\"bytes\": " << r.bytes << ", \"iters\": " << r.iters << ", \"ring_s\": " << median(r.ring)
        << ", \"tcp_s\": " << median(r.tcp) << ", \"mpi_s\": " << median(r.mpi)
        << ", \"ring_stream_s\": " << median(r.ring_bw) << ", \"mpi_stream_s\": " << median(r.mpi_bw) << "}" << (i + 1 < rows.size() ? "," : "")
        << "\n";
    }
    j << "  ]\n}\n";
    std::printf("wrote %s\n", json_path.c_str());
  }
  return 0;
}
