// Expert shard across processes, run as `mpirun -np 2 experts_two_process`.
// Rank 0 hosts expert shard 0 of 2 of a tiny MoE layer (its Device, and a
// collector standing in for the coordinator) and publishes it; rank 1 plays
// the stage: it connects through the middleman, sends the Dispatches of a
// real routing plan and checks that every Combine equals moe::experts_forward /
// combine_backward + experts_backward over ALL experts computed locally,
// bitwise. Malformed dispatches (wrong width, foreign expert id, rows tensor
// cut short) cross the wire too: the shard rejects each with a (fail) report,
// answers nothing, and serves the next good dispatch. Exit code 0 only if
// both ranks agree everything held.
#include <chrono>
#include <cstdio>
#include <cstring>
#include <numeric>
#include <random>
#include <string>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/io/middleman.hpp>
#include <caf/scoped_actor.hpp>
#include <caf/stateful_actor.hpp>

#include "actors/experts/expert_shard.hpp"
#include "actors/transport/moe_messages.hpp"
#include "launch/mpi_bootstrap.hpp"
#include "moe/dispatch.hpp"
#include "moe/experts.hpp"

using namespace troupe;
using namespace troupe::runtime;

namespace {

constexpr auto kTimeout = std::chrono::seconds(30);
constexpr int kLayer = 1, kShards = 2, kShard = 0;

struct Config : caf::actor_system_config {
  Config() {
    register_caf_types(*this);
    load<caf::io::middleman>();
    set("logger.console", caf::atom("none"));
    set("middleman.heartbeat-interval", caf::timespan{std::chrono::milliseconds(200)});
    set("middleman.connection-timeout", caf::timespan{std::chrono::seconds(10)});
  }
};

// The same Shared on both ranks (same seed, same initial weights).
std::shared_ptr<Shared> make_shared_state() {
  auto sh = std::make_shared<Shared>();
  model::ModelConfig& c = sh->opt.train.model;
  c.vocab_size = 16;
  c.d_model = 16;
  c.n_layers = 2;
  c.n_heads = 2;
  c.seq_len = 8;
  c.ffn = troupe::model::Ffn::moe;
  c.n_experts = 4;
  c.top_k = 2;
  c.expert_hidden = 8;
  sh->layout = model::build_param_layout(c);
  sh->plan.chunks = 2;
  sh->plan.mb_batch = 2;
  std::mt19937_64 rng(7);
  std::normal_distribution<float> nd(0.0f, 0.2f);
  sh->init.resize(static_cast<size_t>(sh->layout.total()));
  for (float& v : sh->init) v = nd(rng);
  sh->plan.shard_ranges = {{0, sh->layout.total()}};
  return sh;
}

struct CollectorState {
  uint64_t fails = 0, rejected_dispatches = 0;
};

// Rank 0's coordinator stand-in: counts (fail) reports.
caf::behavior collector(caf::stateful_actor<CollectorState>* self) {
  return {
      [=](rt::fail_atom, const std::string& what) {
        ++self->state.fails;
        if (what.find("rejected dispatch") != std::string::npos) ++self->state.rejected_dispatches;
        std::printf("rank 0: shard reported: %s\n", what.c_str());
      },
      [=](caf::get_atom) { return caf::make_message(self->state.fails, self->state.rejected_dispatches); },
  };
}

int run_rank0(caf::actor_system& sys) {
  auto sh = make_shared_state();
  auto coll = sys.spawn(collector);
  sh->peers.coordinator = coll;
  sh->peers.shards = {coll};
  Device dev(0, kernels::BackendOptions{});
  ExpertShardSpec spec;
  spec.layer = kLayer;
  spec.shard = kShard;
  spec.shards = kShards;
  auto shard = spawn_expert_shard(sys, sh, dev, spec);
  auto eps = mpi::publish_and_exchange(sys, shard, "127.0.0.1");
  if (!eps) {
    std::fprintf(stderr, "rank 0: %s\n", sys.render(eps.error()).c_str());
    mpi::barrier();
    caf::anon_send_exit(shard, caf::exit_reason::user_shutdown);
    caf::anon_send_exit(coll, caf::exit_reason::user_shutdown);
    dev.drain();
    return 1;
  }
  mpi::barrier();  // rank 1 has sent everything and checked the answers
  int rc = 0;
  caf::scoped_actor self{sys};
  self->request(coll, kTimeout, caf::get_atom::value)
      .receive(
          [&](uint64_t fails, uint64_t rejected) {
            std::printf("rank 0: %llu fail reports, %llu rejected dispatches\n", static_cast<unsigned long long>(fails),
                        static_cast<unsigned long long>(rejected));
            if (fails != 3 || rejected != 3) rc = 1;
          },
          [&](caf::error& e) {
            std::fprintf(stderr, "rank 0: %s\n", sys.render(e).c_str());
            rc = 1;
          });
  self->send_exit(shard, caf::exit_reason::user_shutdown);
  self->send_exit(coll, caf::exit_reason::user_shutdown);
  dev.drain();
  return rc;
}

// One micro-batch: routing, plan, and the reference over all experts.
struct Micro {
  std::vector<float> x, dout, weights;  // [T*D], [T*D], [T*k]
  moe::DispatchPlan plan;
  std::vector<int64_t> row_choice;     // [N]
  std::vector<float> y, dxs, dweights;  // [N*D], [N*D], [T*k]
};

Micro reference(const Shared& sh, kernels::Backend& be, uint64_t seed) {
  const model::ModelConfig& c = sh.opt.train.model;
  const int64_t T = sh.plan.mb_batch * c.seq_len, k = c.top_k, E = c.n_experts, D = c.d_model, F = c.expert_hidden;
  std::mt19937_64 rng(seed);
  Micro mb;
  std::vector<int32_t> ids;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> e(static_cast<size_t>(E));
    std::iota(e.begin(), e.end(), 0);
    std::shuffle(e.begin(), e.end(), rng);
    ids.insert(ids.end(), e.begin(), e.begin() + k);
  }
  std::uniform_real_distribution<float> u(0.05f, 1.0f);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  for (int64_t i = 0; i < T * k; ++i) mb.weights.push_back(u(rng));
  for (int64_t i = 0; i < T * D; ++i) mb.x.push_back(nd(rng));
  for (int64_t i = 0; i < T * D; ++i) mb.dout.push_back(0.1f * nd(rng));
  mb.plan = moe::build_dispatch_plan(ids, T, k, E, 0.0);
  const int64_t N = mb.plan.rows();
  mb.row_choice.assign(static_cast<size_t>(N), -1);
  for (int64_t i = 0; i < T * k; ++i)
    if (mb.plan.slots[i] >= 0) mb.row_choice[static_cast<size_t>(mb.plan.slots[i])] = i;
  std::vector<float> all;
  for (const Range& r : expert_param_ranges(sh.layout, c, kLayer, {0, E}))
    all.insert(all.end(), sh.init.begin() + r.offset, sh.init.begin() + r.offset + r.count);
  const int64_t per = E * F * D;
  const kernels::Tensor wb = be.from_f32({3 * per}, all), gb = be.zeros({3 * per});
  const moe::ExpertWeights w{wb.view(0, {E, F, D}), wb.view(per, {E, F, D}), wb.view(2 * per, {E, D, F})};
  const moe::ExpertWeights dw{gb.view(0, {E, F, D}), gb.view(per, {E, F, D}), gb.view(2 * per, {E, D, F})};
  std::vector<int64_t> counts;
  for (int64_t e = 0; e < E; ++e) counts.push_back(mb.plan.count(e));
  const kernels::Tensor x = be.from_f32({T, D}, mb.x), idx = be.from_i32({N}, mb.plan.token_index);
  const kernels::Tensor xs = be.zeros({N, D}), y = be.zeros({N, D});
  be.gather_rows(xs, x, idx);
  const moe::ExpertActs acts{be.zeros({N, F}), be.zeros({N, F}), be.zeros({N, F})};
  moe::experts_forward(be, y, acts, xs, w, counts);
  mb.y = be.download_f32(y);
  const kernels::Tensor dout = be.from_f32({T, D}, mb.dout), slots = be.from_i32({T, k}, mb.plan.slots);
  const kernels::Tensor wt = be.from_f32({T, k}, mb.weights);
  const kernels::Tensor dy = be.zeros({N, D}), dwt = be.zeros({T, k}), dxs = be.zeros({N, D});
  be.combine_backward(dy, dwt, dout, y, slots, wt);
  const moe::ExpertActs scratch{be.zeros({N, F}), be.zeros({N, F}), be.zeros({N, F})};
  moe::experts_backward(be, dxs, dw, scratch, dy, xs, acts, w, counts);
  mb.dxs = be.download_f32(dxs);
  mb.dweights = be.download_f32(dwt);
  return mb;
}

MoeKey key_of(uint32_t mb, bool backward) {
  MoeKey k;
  k.microbatch = mb;
  k.layer = kLayer;
  k.shard = kShard;
  k.backward = backward;
  k.dispatch_id = mb * 2 + (backward ? 1 : 0);
  return k;
}

Envelope dispatch_of(const Shared& sh, const Micro& mb, uint32_t m, bool backward) {
  const model::ModelConfig& c = sh.opt.train.model;
  const ExpertRange er = expert_split(c.n_experts, kShards, kShard);
  const int64_t D = c.d_model;
  std::vector<float> rows, cw;
  std::vector<uint32_t> ex, ti;
  for (int64_t e = er.begin; e < er.end; ++e)
    for (int64_t r = mb.plan.offsets[e]; r < mb.plan.offsets[e + 1]; ++r) {
      const int64_t t = mb.plan.token_index[r];
      const float* src = (backward ? mb.dout.data() : mb.x.data()) + t * D;
      rows.insert(rows.end(), src, src + D);
      ex.push_back(static_cast<uint32_t>(e));
      ti.push_back(static_cast<uint32_t>(t));
      cw.push_back(mb.weights[static_cast<size_t>(mb.row_choice[static_cast<size_t>(r)])]);
    }
  return make_dispatch(key_of(m, backward), static_cast<uint32_t>(D), rows, ex, cw, ti);
}

// Receives the Combine for (m, backward) and compares it with the reference.
bool check_reply(caf::scoped_actor& self, const Shared& sh, const Micro& mb, uint32_t m, bool backward) {
  const model::ModelConfig& c = sh.opt.train.model;
  const ExpertRange er = expert_split(c.n_experts, kShards, kShard);
  const int64_t D = c.d_model, r0 = mb.plan.offsets[er.begin], r1 = mb.plan.offsets[er.end];
  bool ok = false;
  self->receive(
      [&](const Envelope& e) {
        std::vector<uint32_t> ti(mb.plan.token_index.begin() + r0, mb.plan.token_index.begin() + r1);
        auto r = check_combine(e, key_of(m, backward), static_cast<uint32_t>(D), ti);
        if (!r) {
          std::fprintf(stderr, "rank 1: bad combine: %s\n", to_string(r.error()).c_str());
          return;
        }
        const auto rows = tensor_f32((*r)->getRows());
        const auto& want = backward ? mb.dxs : mb.y;
        ok = rows.size() == static_cast<size_t>((r1 - r0) * D) &&
             std::memcmp(rows.data(), want.data() + r0 * D, rows.size_bytes()) == 0;
        if (backward)
          for (int64_t i = r0; ok && i < r1; ++i) {
            const float a = (*r)->getWeightGrads()[static_cast<unsigned>(i - r0)];
            const float b = mb.dweights[static_cast<size_t>(mb.row_choice[static_cast<size_t>(i)])];
            ok = std::memcmp(&a, &b, 4) == 0;
          }
        std::printf("rank 1: %s combine of mb %u: %s\n", backward ? "backward" : "forward", m,
                    ok ? "bitwise equal to the local reference" : "DIFFERS");
      },
      caf::after(kTimeout) >> [&] { std::fprintf(stderr, "rank 1: no combine for mb %u\n", m); });
  return ok;
}

int run_rank1(caf::actor_system& sys) {
  auto sh = make_shared_state();
  auto be = kernels::make_backend({});
  auto eps = mpi::exchange_endpoints(mpi::Endpoint{"", 0});
  if (!eps) {
    std::fprintf(stderr, "rank 1: %s\n", sys.render(eps.error()).c_str());
    mpi::barrier();
    return 1;
  }
  auto peer = mpi::connect(sys, (*eps)[0]);
  if (!peer) {
    std::fprintf(stderr, "rank 1: connect: %s\n", sys.render(peer.error()).c_str());
    mpi::barrier();
    return 1;
  }
  int failures = 0;
  {
    caf::scoped_actor self{sys};
    const Micro mb0 = reference(*sh, *be, 11), mb1 = reference(*sh, *be, 12);
    self->send(*peer, dispatch_of(*sh, mb0, 0, false));
    failures += !check_reply(self, *sh, mb0, 0, false);
    self->send(*peer, dispatch_of(*sh, mb0, 0, true));
    failures += !check_reply(self, *sh, mb0, 0, true);
    // Malformed: wrong width, a foreign expert (shard 1's expert 3), and a
    // rows tensor shorter than numRows (fails envelope validation on rank 0).
    const std::vector<float> row17(17, 1.0f), row16(16, 1.0f), w1{1.0f};
    const std::vector<uint32_t> e0{0}, e3{3}, t0{0};
    self->send(*peer, make_dispatch(key_of(1, false), 17, row17, e0, w1, t0));
    self->send(*peer, make_dispatch(key_of(1, false), 16, row16, e3, w1, t0));
    self->send(*peer, Envelope::build<schemas::Dispatch>([](schemas::Dispatch::Builder d) {
      write_moe_key(d.initId(), key_of(1, false));
      d.setNumRows(2);
      d.setWidth(16);
      const int64_t shape[2] = {1, 16};
      set_tensor_f32(d.initRows(), shape, std::vector<float>(16, 1.0f));
      d.initExpertIds(2);
      d.initCombineWeights(2);
      d.initTokenIndex(2);
    }));
    // The shard keeps serving: the next good dispatch is answered exactly.
    self->send(*peer, dispatch_of(*sh, mb1, 1, false));
    failures += !check_reply(self, *sh, mb1, 1, false);
    self->request(*peer, kTimeout, rt::dropped_atom_v)
        .receive(
            [&](uint64_t n) {
              std::printf("rank 1: the shard dropped %llu dispatches\n", static_cast<unsigned long long>(n));
              failures += n != 3;
            },
            [&](caf::error& e) {
              std::fprintf(stderr, "rank 1: %s\n", sys.render(e).c_str());
              ++failures;
            });
  }
  mpi::barrier();
  return failures == 0 ? 0 : 1;
}

}  // namespace

int main(int argc, char** argv) {
  mpi::Session session(argc, argv);
  if (session.size() != 2) {
    std::fprintf(stderr, "run with mpirun -np 2 (got %d ranks)\n", session.size());
    return 2;
  }
  int rc = 0;
  {
    Config cfg;
    caf::actor_system sys{cfg};
    rc = session.rank() == 0 ? run_rank0(sys) : run_rank1(sys);
  }
  const bool ok = mpi::all_ok(rc == 0);
  if (session.rank() == 0) std::printf("two-process expert shard: %s\n", ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
