// bench_moe: MoE all-to-all dispatch + combine through Envelopes
// (actors/transport/moe_messages.hpp), next to raw MPI_Alltoallv of the same bytes.
//
// Workload: a stage holds T tokens routed top-k over E experts (seeded
// uniform routing, dispatch plan of moe/dispatch.hpp), experts split over 2
// expert shards. One exchange = the stage builds one Dispatch per shard
// (rows [n, D] + expert ids, combine weights, token indices), each shard
// checks it (check_dispatch) and answers a Combine of the same rows
// (make_combine: an echo, no expert compute: this measures the messaging
// path), the stage checks both Combines (check_combine).
//  - in-process (1 rank): the stage is a scoped actor, the 2 shards are
//    detached actors (own threads);
//  - cross-process (mpirun -np 2): each rank is a stage AND hosts one shard;
//    rank r sends the rows of its own shard's experts to its local shard
//    (in-process, shared segments) and the rest to the other rank's shard
//    (CAF middleman, ports exchanged over MPI); both ranks run at once.
//    The same forward exchanges again through the shared-memory rings
//    (actors/transport/ring_transport.hpp: anonymous dispatches, combines
//    sent back to the stage, as a one-host run sends step messages).
//    Next to it, in the same run: MPI_Alltoallv of the same payload bytes
//    (dispatch, then combine), between the same two ranks.
// tokens/s = all stages' tokens / time; GB/s = payload bytes of all
// dispatches + combines (rows, ids, weights, indices) / time.
// Then the same forward + backward exchanges through echo shards and through
// real expert-shard actors (actors/experts/expert_shard.hpp: grouped-GEMM SwiGLU,
// F = D/2, one device thread each): their ratio is the messaging share of an
// expert round trip when nothing overlaps it. Step time with and without
// overlap needs the integrated runtime (stage actors at MoE layers) and is
// not measured here.
// Both ranks use the runtime's CAF settings (work-sharing scheduler, middleman
// without BASP workers, TCP_NODELAY) and, across processes, its shared-memory
// bulk path at its default threshold (64 KiB), as a one-host run would.
// Run: bench_moe [--json PATH]   or   mpirun -np 2 bench_moe [--json PATH]
#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>

#include "kernels/blas_core.hpp"
#include "actors/transport/caf_types.hpp"
#include "actors/experts/expert_shard.hpp"
#include "actors/transport/moe_messages.hpp"
#include "actors/transport/caf_middleman.hpp"
#include "actors/transport/caf_scheduler.hpp"
#include "actors/transport/envelope_shm.hpp"
#include "actors/transport/ring_transport.hpp"
#include "actors/transport/tcp_nodelay.hpp"
#include "bench/two_ranks.hpp"
#include "launch/mpi_bootstrap.hpp"
#include "moe/dispatch.hpp"

using namespace troupe;
using namespace troupe::runtime;
using Clock = std::chrono::steady_clock;

namespace {

constexpr int64_t kTokens = 2048, kTopK = 2, kExperts = 8, kShards = 2;

double secs_since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

// The runtime's CAF settings (TROUPE_CAF_SCHEDULER=stealing TROUPE_CAF_THREADS=2,
// TROUPE_CAF_MM_WORKERS=1, TROUPE_TCP_NODELAY=0 and TROUPE_BULK_SHM_BYTES=0 give
// the settings of this bench before issue 17 back).
struct Config : bench::RuntimeCafConfig {
  Config() : bench::RuntimeCafConfig(std::chrono::seconds(60)) {
    // Hidden states do not compress: skip the zstd sample probe.
    EncodeOptions never;
    never.compress_threshold = SIZE_MAX;
    set_encode_options(*this, never);
  }
};
using bench::quiet_barrier;

// One stage's routed tokens, cut per shard.
struct Part {
  std::vector<float> rows;  // [n, D]
  std::vector<uint32_t> experts, tokens;
  std::vector<float> weights;
  size_t n() const { return experts.size(); }
};

std::vector<Part> route(int64_t D, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::vector<int32_t> ids;
  for (int64_t t = 0; t < kTokens; ++t) {
    std::vector<int32_t> e(kExperts);
    for (int32_t i = 0; i < kExperts; ++i) e[static_cast<size_t>(i)] = i;
    std::shuffle(e.begin(), e.end(), rng);
    ids.insert(ids.end(), e.begin(), e.begin() + kTopK);
  }
  const moe::DispatchPlan plan = moe::build_dispatch_plan(ids, kTokens, kTopK, kExperts, 0.0);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  std::vector<float> x(static_cast<size_t>(kTokens * D));
  for (float& v : x) v = nd(rng);
  std::vector<Part> parts(kShards);
  for (int64_t e = 0; e < kExperts; ++e) {
    Part& p = parts[static_cast<size_t>(e * kShards / kExperts)];
    for (int64_t r = plan.offsets[e]; r < plan.offsets[e + 1]; ++r) {
      const int64_t t = plan.token_index[r];
      p.rows.insert(p.rows.end(), x.begin() + t * D, x.begin() + (t + 1) * D);
      p.experts.push_back(static_cast<uint32_t>(e));
      p.tokens.push_back(static_cast<uint32_t>(t));
      p.weights.push_back(0.5f);
    }
  }
  return parts;
}

// Payload bytes of a dispatch and of its combine (what MPI moves too).
size_t dispatch_bytes(size_t n, int64_t D) { return n * (static_cast<size_t>(D) * 4 + 12); }
size_t combine_bytes(size_t n, int64_t D) { return n * (static_cast<size_t>(D) * 4 + 4); }

// Echo shard: checks the dispatch, answers a Combine of the same rows: as
// the response to a request, or, for an anonymous dispatch (the ring, as
// post() sends), anonymously to the stage registered for its chunk.
caf::behavior echo_shard(caf::event_based_actor* self, ShardView v) {
  auto stages = std::make_shared<std::vector<caf::actor>>(2);
  return {
      [self, v, stages](const Envelope& e) -> caf::result<Envelope> {
        auto d = check_dispatch(e, v);
        if (!d) return d.error();
        std::vector<uint32_t> ti;
        const auto list = d->msg->getTokenIndex();
        ti.reserve(list.size());
        for (uint32_t t : list) ti.push_back(t);
        const std::vector<float> wg(d->id.backward ? ti.size() : 0, 0.0f);
        Envelope c = make_combine(d->id, v.width, tensor_f32(d->msg->getRows()), ti, wg);
        // Anonymous: the response below goes nowhere (CAF drops it).
        if (!self->current_sender() && d->id.chunk < stages->size())
          send_anon((*stages)[d->id.chunk], caf::make_message(c));
        return c;
      },
      [stages](uint32_t chunk, const caf::actor& stage) {
        if (chunk < stages->size()) (*stages)[chunk] = stage;
        return true;
      },
  };
}

ShardView view_of(int shard, int replica, int64_t D) {
  ShardView v;
  v.replica = static_cast<uint32_t>(replica);
  v.layer = 0;
  v.shard = static_cast<uint32_t>(shard);
  v.expert_begin = static_cast<uint32_t>(shard * kExperts / kShards);
  v.expert_end = static_cast<uint32_t>((shard + 1) * kExperts / kShards);
  v.width = static_cast<uint32_t>(D);
  v.tokens = static_cast<uint32_t>(kTokens);
  v.top_k = static_cast<uint32_t>(kTopK);
  return v;
}

// One exchange from a stage: dispatches to both shards, waits for both
// combines and checks them. False on any error.
bool exchange(caf::scoped_actor& self, const std::vector<caf::actor>& shards, const std::vector<Part>& parts,
              int64_t D, uint64_t it, uint32_t chunk, bool backward, bool ring = false) {
  std::vector<MoeKey> keys(kShards);
  for (int s = 0; s < kShards; ++s) {
    MoeKey& k = keys[static_cast<size_t>(s)];
    k.microbatch = static_cast<uint32_t>(it);  // unique per exchange: the shards drop repeats
    k.chunk = chunk;                            // the dispatching stage (two stages share the shards)
    k.backward = backward;
    k.shard = static_cast<uint32_t>(s);
    k.dispatch_id = (it * kShards + static_cast<uint64_t>(s)) * 2 + (backward ? 1 : 0);
    const Part& p = parts[static_cast<size_t>(s)];
    Envelope d = make_dispatch(k, static_cast<uint32_t>(D), p.rows, p.experts, p.weights, p.tokens);
    if (ring) send_anon(shards[static_cast<size_t>(s)], caf::make_message(std::move(d)));
    else self->send(shards[static_cast<size_t>(s)], std::move(d));
  }
  bool ok = true;
  for (int i = 0; i < kShards; ++i) {
    self->receive(
        [&](const Envelope& c) {
          auto r = c.read<schemas::Combine>();
          if (!r) {
            ok = false;
            return;
          }
          const uint32_t s = (*r)->getId().getShard();
          ok &= s < kShards && static_cast<bool>(check_combine(c, keys[s], static_cast<uint32_t>(D), parts[s].tokens));
        },
        [&](caf::error&) { ok = false; },
        caf::after(std::chrono::seconds(120)) >> [&] { ok = false; });
  }
  return ok;
}

// Forward exchange then backward exchange (the backward rows stand in for dOut).
bool round_trip(caf::scoped_actor& self, const std::vector<caf::actor>& shards, const std::vector<Part>& parts,
                int64_t D, uint64_t it, uint32_t chunk) {
  return exchange(self, shards, parts, D, it, chunk, false) && exchange(self, shards, parts, D, it, chunk, true);
}

// A Shared for real expert-shard actors of one MoE layer (layer 0) of width
// D, expert hidden F; random weights.
std::shared_ptr<Shared> expert_shared(int64_t D, int64_t F, caf::actor sink) {
  auto sh = std::make_shared<Shared>();
  model::ModelConfig& c = sh->opt.train.model;
  c.vocab_size = 16;
  c.d_model = D;
  c.n_layers = 1;
  c.n_heads = 4;
  c.seq_len = 128;
  c.ffn = troupe::model::Ffn::moe;
  c.n_experts = kExperts;
  c.top_k = kTopK;
  c.expert_hidden = F;
  sh->layout = model::build_param_layout(c);
  sh->plan.mb_batch = kTokens / c.seq_len;
  sh->plan.chunks = 1;
  std::mt19937_64 rng(5);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  sh->init.resize(static_cast<size_t>(sh->layout.total()));
  for (float& v : sh->init) v = nd(rng);
  sh->plan.shard_ranges = {{0, sh->layout.total()}};
  sh->peers.coordinator = sink;
  sh->peers.shards = {sink};
  return sh;
}

// Prints what the expert shards report (a rejected dispatch would show here).
caf::behavior sink_actor() {
  return {[](rt::fail_atom, const std::string& what) { std::fprintf(stderr, "expert shard: %s\n", what.c_str()); },
          [](const Envelope&) {}};
}

caf::actor spawn_expert(caf::actor_system& sys, const std::shared_ptr<Shared>& sh, Device& dev, int shard) {
  ExpertShardSpec spec;
  spec.layer = 0;
  spec.shard = shard;
  spec.shards = kShards;
  spec.producer = shard;
  spec.microbatches = 1 << 30;  // never a step end: the bench only exchanges
  return spawn_expert_shard(sys, sh, dev, spec);
}

int iterations_for(int64_t D) {
  const size_t bytes = static_cast<size_t>(kTokens * kTopK) * static_cast<size_t>(D) * 8;
  return static_cast<int>(std::clamp<size_t>((size_t{2048} << 20) / bytes, 8, 1000));
}

struct Row {
  int64_t D = 0;
  int iters = 0;
  int compute_iters = 0;
  double msg_rt_s = 0;      // echo shards: forward + backward exchange
  double expert_rt_s = 0;   // real expert shards (grouped GEMM, F = D/2): forward + backward exchange
  size_t bytes = 0;     // payload bytes per exchange, all stages
  double caf_s = 0;     // seconds per exchange through the actors
  double mpi_s = 0;     // seconds per MPI_Alltoallv pair (cross-process only)
  double ring_s = 0;    // seconds per exchange with the dispatches and combines through the rings (cross-process only)
  double remote_share = 0;  // fraction of the bytes that crossed the process boundary
};

Row run_in_process(caf::actor_system& sys, int64_t D) {
  Row row;
  row.D = D;
  row.iters = iterations_for(D);
  row.compute_iters = 3;
  const auto parts = route(D, 1);
  std::vector<caf::actor> shards;
  for (int s = 0; s < kShards; ++s) shards.push_back(sys.spawn<caf::detached>(echo_shard, view_of(s, 0, D)));
  for (const Part& p : parts) row.bytes += dispatch_bytes(p.n(), D) + combine_bytes(p.n(), D);
  caf::scoped_actor self{sys};
  bool ok = exchange(self, shards, parts, D, 0, 0, false);  // warm-up
  auto t0 = Clock::now();
  for (int i = 0; i < row.iters; ++i) ok &= exchange(self, shards, parts, D, static_cast<uint64_t>(i + 1), 0, false);
  row.caf_s = ok ? secs_since(t0) / row.iters : -1;
  t0 = Clock::now();
  for (int i = 0; i < row.iters; ++i) ok &= round_trip(self, shards, parts, D, static_cast<uint64_t>(i + 1), 0);
  row.msg_rt_s = ok ? secs_since(t0) / row.iters : -1;
  for (auto& a : shards) self->send_exit(a, caf::exit_reason::user_shutdown);
  // The same exchanges with real expert shards, one device (thread) each.
  auto sink = sys.spawn(sink_actor);
  auto sh = expert_shared(D, D / 2, sink);
  {
    Device d0(0, kernels::BackendOptions{}), d1(1, kernels::BackendOptions{});
    std::vector<caf::actor> experts = {spawn_expert(sys, sh, d0, 0), spawn_expert(sys, sh, d1, 1)};
    ok &= round_trip(self, experts, parts, D, 0, 0);  // warm-up
    t0 = Clock::now();
    for (int i = 0; i < row.compute_iters; ++i) ok &= round_trip(self, experts, parts, D, static_cast<uint64_t>(i + 1), 0);
    row.expert_rt_s = ok ? secs_since(t0) / row.compute_iters : -1;
    for (auto& a : experts) self->send_exit(a, caf::exit_reason::user_shutdown);
    d0.drain();
    d1.drain();
  }
  self->send_exit(sink, caf::exit_reason::user_shutdown);
  return row;
}

// Both ranks; rank r's stage uses routing seed 100 + r and hosts shard r.
Row run_cross(caf::actor_system& sys, int rank, int64_t D) {
  Row row;
  row.D = D;
  row.iters = iterations_for(D);
  const auto parts = route(D, 100 + static_cast<uint64_t>(rank));
  auto local = sys.spawn<caf::detached>(echo_shard, view_of(rank, 0, D));
  auto eps = mpi::publish_and_exchange(sys, local);
  if (!eps) {
    std::fprintf(stderr, "rank %d: %s\n", rank, sys.render(eps.error()).c_str());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  auto remote = mpi::connect(sys, (*eps)[static_cast<size_t>(1 - rank)]);
  set_tcp_nodelay_on_all_sockets();
  if (!remote) {
    std::fprintf(stderr, "rank %d: connect: %s\n", rank, sys.render(remote.error()).c_str());
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  std::vector<caf::actor> shards(kShards);
  shards[static_cast<size_t>(rank)] = local;
  shards[static_cast<size_t>(1 - rank)] = *remote;
  // Bytes of both ranks (each sends the same kind of workload).
  size_t mine = 0, mine_remote = 0;
  for (int s = 0; s < kShards; ++s) {
    const size_t b = dispatch_bytes(parts[static_cast<size_t>(s)].n(), D) + combine_bytes(parts[static_cast<size_t>(s)].n(), D);
    mine += b;
    if (s != rank) mine_remote += b;
  }
  unsigned long long loc[2] = {mine, mine_remote}, all[2] = {0, 0};
  MPI_Allreduce(loc, all, 2, MPI_UNSIGNED_LONG_LONG, MPI_SUM, MPI_COMM_WORLD);
  row.bytes = all[0];
  row.remote_share = static_cast<double>(all[1]) / static_cast<double>(all[0]);
  {
    caf::scoped_actor self{sys};
    quiet_barrier();
    const uint32_t chunk = static_cast<uint32_t>(rank);
    bool ok = exchange(self, shards, parts, D, 0, chunk, false);
    quiet_barrier();
    auto t0 = Clock::now();
    for (int i = 0; i < row.iters; ++i) ok &= exchange(self, shards, parts, D, static_cast<uint64_t>(i + 1), chunk, false);
    quiet_barrier();  // both ranks' exchanges are done: the slower one counts
    row.caf_s = mpi::all_ok(ok) ? secs_since(t0) / row.iters : -1;
    quiet_barrier();
    t0 = Clock::now();
    for (int i = 0; i < row.iters; ++i) ok &= round_trip(self, shards, parts, D, static_cast<uint64_t>(i + 1), chunk);
    quiet_barrier();
    row.msg_rt_s = mpi::all_ok(ok) ? secs_since(t0) / row.iters : -1;
    // The same forward exchanges through the shared-memory rings
    // (actors/transport/ring_transport.hpp): anonymous dispatches, combines
    // back to this stage, as post() sends them in a run.
    {
      const caf::actor stage = caf::actor_cast<caf::actor>(self);
      for (const caf::actor& sh : shards)
        self->request(sh, std::chrono::seconds(30), chunk, stage).receive([](bool) {}, [](caf::error&) {});
      auto rings = bench::rings_between_ranks(sys, rank, remote->node(), bench::ring_options_from_env());
      quiet_barrier();
      ok &= exchange(self, shards, parts, D, 0, chunk, false, true);
      quiet_barrier();
      t0 = Clock::now();
      for (int i = 0; i < row.iters; ++i) ok &= exchange(self, shards, parts, D, static_cast<uint64_t>(i + 1), chunk, false, true);
      quiet_barrier();
      row.ring_s = mpi::all_ok(ok) ? secs_since(t0) / row.iters : -1;
    }
    self->send_exit(local, caf::exit_reason::user_shutdown);
  }
  // Real expert shards, one per rank, published and connected the same way.
  {
    caf::scoped_actor self{sys};
    auto sink = sys.spawn(sink_actor);
    auto sh = expert_shared(D, D / 2, sink);
    Device dev(rank, kernels::BackendOptions{});
    auto mine = spawn_expert(sys, sh, dev, rank);
    auto eps2 = mpi::publish_and_exchange(sys, mine);
    auto other = eps2 ? mpi::connect(sys, (*eps2)[static_cast<size_t>(1 - rank)]) : caf::expected<caf::actor>(eps2.error());
    set_tcp_nodelay_on_all_sockets();
    if (!other) {
      std::fprintf(stderr, "rank %d: experts: %s\n", rank, sys.render(other.error()).c_str());
      MPI_Abort(MPI_COMM_WORLD, 1);
    }
    std::vector<caf::actor> experts(kShards);
    experts[static_cast<size_t>(rank)] = mine;
    experts[static_cast<size_t>(1 - rank)] = *other;
    const uint32_t chunk = static_cast<uint32_t>(rank);
    row.compute_iters = 3;
    quiet_barrier();
    bool ok = round_trip(self, experts, parts, D, 0, chunk);
    quiet_barrier();
    const auto t0 = Clock::now();
    for (int i = 0; i < row.compute_iters; ++i) ok &= round_trip(self, experts, parts, D, static_cast<uint64_t>(i + 1), chunk);
    quiet_barrier();
    row.expert_rt_s = mpi::all_ok(ok) ? secs_since(t0) / row.compute_iters : -1;
    self->send_exit(mine, caf::exit_reason::user_shutdown);
    self->send_exit(sink, caf::exit_reason::user_shutdown);
    dev.drain();
  }
  // MPI_Alltoallv of the same payload: dispatch bytes out, combine bytes back.
  int sd[kShards], sc[kShards], rd[kShards], rc[kShards], so[kShards], ro[kShards];
  for (int s = 0; s < kShards; ++s) {
    sd[s] = static_cast<int>(dispatch_bytes(parts[static_cast<size_t>(s)].n(), D));
    sc[s] = 0;
  }
  MPI_Alltoall(sd, 1, MPI_INT, rd, 1, MPI_INT, MPI_COMM_WORLD);  // what each peer sends me
  // The combine of a dispatch goes back with its row count: combine bytes per peer.
  for (int s = 0; s < kShards; ++s) {
    const size_t n_in = static_cast<size_t>(rd[s]) / (static_cast<size_t>(D) * 4 + 12);
    sc[s] = static_cast<int>(combine_bytes(n_in, D));
    rc[s] = static_cast<int>(combine_bytes(parts[static_cast<size_t>(s)].n(), D));
  }
  auto displs = [](const int* counts, int* out) {
    int acc = 0;
    for (int s = 0; s < kShards; ++s) out[s] = acc, acc += counts[s];
    return acc;
  };
  std::vector<char> send_d(static_cast<size_t>(displs(sd, so)), 1), recv_d(static_cast<size_t>(displs(rd, ro)));
  std::vector<int> sdo(so, so + kShards), rdo(ro, ro + kShards);
  std::vector<char> send_c(static_cast<size_t>(displs(sc, so)), 2), recv_c(static_cast<size_t>(displs(rc, ro)));
  std::vector<int> sco(so, so + kShards), rco(ro, ro + kShards);
  auto once = [&] {
    MPI_Alltoallv(send_d.data(), sd, sdo.data(), MPI_BYTE, recv_d.data(), rd, rdo.data(), MPI_BYTE, MPI_COMM_WORLD);
    MPI_Alltoallv(send_c.data(), sc, sco.data(), MPI_BYTE, recv_c.data(), rc, rco.data(), MPI_BYTE, MPI_COMM_WORLD);
  };
  quiet_barrier();
  once();
  quiet_barrier();
  const auto t1 = Clock::now();
  for (int i = 0; i < row.iters; ++i) once();
  quiet_barrier();
  row.mpi_s = secs_since(t1) / row.iters;
  return row;
}

void print(const char* title, const std::vector<Row>& rows, int stages, bool mpi) {
  std::printf("\n%s\n", title);
  std::printf("%6s %6s %10s %10s %12s %8s", "D", "iters", "MiB/exch", "ms/exch", "tokens/s", "GB/s");
  if (mpi) std::printf(" %9s %9s %8s %7s %9s %9s", "MPI ms", "MPI GB/s", "CAF/MPI", "remote", "ring ms", "ring/MPI");
  std::printf(" %11s %11s %7s\n", "msg fwd+bwd", "expert f+b", "msg %");
  for (const Row& r : rows) {
    const double mib = static_cast<double>(r.bytes) / (1 << 20);
    std::printf("%6lld %6d %10.2f %10.3f %12.0f %8.3f", static_cast<long long>(r.D), r.iters, mib, r.caf_s * 1e3,
                static_cast<double>(kTokens * stages) / r.caf_s, static_cast<double>(r.bytes) / r.caf_s / 1e9);
    if (mpi)
      std::printf(" %9.3f %9.3f %8.1f %6.0f%% %9.3f %9.2f", r.mpi_s * 1e3, static_cast<double>(r.bytes) / r.mpi_s / 1e9,
                  r.caf_s / r.mpi_s, r.remote_share * 100, r.ring_s * 1e3, r.ring_s / r.mpi_s);
    std::printf(" %9.2fms %9.2fms %6.1f%%\n", r.msg_rt_s * 1e3, r.expert_rt_s * 1e3, 100.0 * r.msg_rt_s / r.expert_rt_s);
  }
  std::printf("(ms/exch, tokens/s, GB/s: one forward dispatch+combine through echo shards. msg fwd+bwd: forward +\n"
              " backward exchange through echo shards; expert f+b: the same through real expert-shard actors with\n"
              " grouped-GEMM SwiGLU experts, F = D/2, one device thread per shard; msg %%: their ratio, the messaging\n"
              " share of an expert round trip when nothing overlaps it)\n");
}

}  // namespace

int main(int argc, char** argv) {
  troupe::kernels::configure_openblas(argv);  // OpenBLAS set up as `troupe` runs it
  std::string json_path;
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--json") == 0 && i + 1 < argc) json_path = argv[++i];
  mpi::Session session(argc, argv);
  const int rank = session.rank();
  if (session.size() > 2) {
    if (rank == 0) std::fprintf(stderr, "bench_moe: run with 1 or 2 ranks\n");
    return 2;
  }
  const std::vector<int64_t> widths = {128, 256, 512, 1024};
  std::vector<Row> inproc, cross;
  {
    Config cfg;
    caf::actor_system sys{cfg};
    if (rank == 0)
      for (int64_t D : widths) inproc.push_back(run_in_process(sys, D));
    // Both ranks on one host: the runtime's shared-memory bulk path and its
    // default threshold ([topology] bulk_shm_bytes), unless overridden.
    size_t bulk = 1 << 16;
    if (const char* b = std::getenv("TROUPE_BULK_SHM_BYTES")) bulk = static_cast<size_t>(std::strtoull(b, nullptr, 10));
    if (session.size() == 2) set_bulk_shm_threshold(bulk);
    if (session.size() == 2)
      for (int64_t D : widths) {
        quiet_barrier();
        cross.push_back(run_cross(sys, rank, D));
      }
  }
  if (session.size() == 2) {
    set_bulk_shm_threshold(0);
    bulk_shm_cleanup();
  }
  if (rank != 0) return 0;
  std::printf("bench_moe: T=%lld tokens x top-%lld over %lld experts in %lld shards\n",
              static_cast<long long>(kTokens), static_cast<long long>(kTopK), static_cast<long long>(kExperts),
              static_cast<long long>(kShards));
  print("In-process: 1 stage (scoped actor) -> 2 shards (detached actors); bytes = dispatch + combine payload",
        inproc, 1, false);
  if (!cross.empty())
    print("Cross-process (mpirun -np 2): 2 stages, 1 shard per rank, both ranks at once; MPI = 2 x MPI_Alltoallv of the same bytes",
          cross, 2, true);
  if (!json_path.empty()) {
    std::ofstream j(json_path);
    auto rows = [&](const std::vector<Row>& v, int stages) {
      for (size_t i = 0; i < v.size(); ++i) {
        const Row& r = v[i];
        j << "    {\"d_model\": " << r.D << ", \"iters\": " << r.iters << ", \"bytes_per_exchange\": " << r.bytes
          << ", \"caf_s\": " << r.caf_s << ", \"tokens_per_s\": " << static_cast<double>(kTokens * stages) / r.caf_s
          << ", \"caf_gb_s\": " << static_cast<double>(r.bytes) / r.caf_s / 1e9 << ", \"msg_fwd_bwd_s\": " << r.msg_rt_s
          << ", \"expert_fwd_bwd_s\": " << r.expert_rt_s << ", \"expert_hidden\": " << r.D / 2
          << ", \"expert_iters\": " << r.compute_iters;
        if (r.mpi_s > 0)
          j << ", \"ring_s\": " << r.ring_s << ", \"mpi_alltoallv_s\": " << r.mpi_s << ", \"mpi_gb_s\": " << static_cast<double>(r.bytes) / r.mpi_s / 1e9
            << ", \"remote_share\": " << r.remote_share;
        j << "}" << (i + 1 < v.size() ? "," : "") << "\n";
      }
    };
    j << "{\n  \"bench\": \"moe\",\n  \"tokens\": " << kTokens << ", \"top_k\": " << kTopK << ", \"experts\": " << kExperts
      << ", \"shards\": " << kShards << ",\n  \"in_process\": [\n";
    rows(inproc, 1);
    j << "  ],\n  \"cross_process\": [\n";
    rows(cross, 2);
    j << "  ]\n}\n";
    std::printf("wrote %s\n", json_path.c_str());
  }
  return 0;
}
