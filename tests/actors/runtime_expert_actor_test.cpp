// The expert-shard actor driven standalone: a real tiny MoE layer's dispatch
// plan (random router ids, 4 experts, top-2, 2 shards, 2 micro-batches) is cut
// into per-shard Dispatches; every Combine must equal moe::experts_forward /
// combine_backward + experts_backward run over ALL experts in one process,
// bitwise, and so must the GradSlices the shards send at step end. The test
// plays the stage, the optimizer shards and the coordinator (a scoped actor),
// sends ParamSlices back and checks the shards load them and report stepok.
// Malformed dispatches (foreign expert, wrong width, truncated bytes, backward
// without forward) are rejected with a (fail) report while the shards keep
// serving; duplicates are dropped. Real actor system, no sleeps.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <deque>
#include <map>
#include <numeric>
#include <random>
#include <set>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/scoped_actor.hpp>

#include "actors/experts/expert_shard.hpp"
#include "actors/transport/moe_messages.hpp"
#include "actors/schedule/schedule.hpp"
#include "moe/dispatch.hpp"
#include "moe/experts.hpp"

namespace troupe::runtime {
namespace {

struct TestConfig : caf::actor_system_config {
  TestConfig() {
    register_caf_types(*this);
    set("scheduler.max-threads", 2);
    set("logger.console", caf::atom("none"));
  }
};

constexpr int kLayer = 1, kShards = 2, kMbs = 2;

model::ModelConfig tiny() {
  model::ModelConfig c;
  c.vocab_size = 16;
  c.d_model = 16;
  c.n_layers = 2;
  c.n_heads = 2;
  c.seq_len = 8;
  c.ffn = troupe::model::Ffn::moe;
  c.n_experts = 4;
  c.top_k = 2;
  c.expert_hidden = 8;
  return c;
}

std::vector<float> randn(size_t n, std::mt19937_64& rng, float scale) {
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(rng);
  return v;
}

bool same_bits(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size_bytes()) == 0;
}

// One micro-batch of the layer: router output, plan, and the single-process
// expert math over all experts.
struct Micro {
  int64_t T = 0;
  std::vector<int32_t> ids;           // [T*k]
  std::vector<float> weights, x, dout;  // [T*k], [T*D], [T*D]
  moe::DispatchPlan plan;
  std::vector<int64_t> row_choice;    // [N] t*k+j of each permuted row
  std::vector<float> y, dxs, dweights;  // reference: [N*D], [N*D], [T*k]
};

struct Fixture : ::testing::Test {
  TestConfig cfg;
  caf::actor_system sys{cfg};
  caf::scoped_actor self{sys};
  model::ModelConfig c = tiny();
  std::shared_ptr<Shared> sh;
  std::unique_ptr<kernels::Backend> be = kernels::make_backend({});
  std::unique_ptr<Device> dev0, dev1;
  std::vector<caf::actor> shards;
  std::vector<Micro> mbs;
  std::vector<float> dw_ref;  // [3 * E*F*D] gate|up|down of all experts, summed over micro-batches
  std::vector<std::vector<float>> dw_mb;  // [mb] the same, of one micro-batch alone
  std::vector<uint32_t> chunk_of_mb = {0, 0};  // DualPipe copy each micro-batch is dispatched from
  std::array<Range, 3> all_ranges;

  void SetUp() override {
    std::mt19937_64 rng(7);
    sh = std::make_shared<Shared>();
    sh->opt.train.model = c;
    sh->layout = model::build_param_layout(c);
    sh->plan.chunks = kMbs;
    sh->plan.mb_batch = 2;
    sh->init = randn(static_cast<size_t>(sh->layout.total()), rng, 0.2f);
    // Two optimizer shards splitting the buffer inside the layer's gate_proj
    // block, so the experts' ranges are cut across them.
    all_ranges = expert_param_ranges(sh->layout, c, kLayer, {0, c.n_experts});
    const int64_t cut = all_ranges[0].offset + all_ranges[0].count / 2 + 3;
    sh->plan.shard_ranges = {{0, cut}, {cut, sh->layout.total() - cut}};
    sh->peers.coordinator = caf::actor_cast<caf::actor>(self);
    sh->peers.shards = {sh->peers.coordinator, sh->peers.coordinator};
    dev0 = std::make_unique<Device>(0, kernels::BackendOptions{});
    dev1 = std::make_unique<Device>(1, kernels::BackendOptions{});
    for (int s = 0; s < kShards; ++s) {
      ExpertShardSpec spec;
      spec.layer = kLayer;
      spec.shard = s;
      spec.shards = kShards;
      spec.producer = s;
      shards.push_back(spawn_expert_shard(sys, sh, s == 0 ? *dev0 : *dev1, spec));
    }
    reference(rng);
  }

  void TearDown() override {
    for (auto& a : shards) self->send_exit(a, caf::exit_reason::user_shutdown);
    dev0->drain();
    dev1->drain();
  }

  // The single-process math: experts over all E, micro-batch by micro-batch.
  void reference(std::mt19937_64& rng) {
    const int64_t T = sh->plan.mb_batch * c.seq_len, k = c.top_k, E = c.n_experts, D = c.d_model, F = c.expert_hidden;
    std::vector<float> all;
    for (const Range& r : all_ranges) all.insert(all.end(), sh->init.begin() + r.offset, sh->init.begin() + r.offset + r.count);
    const kernels::Tensor wbuf = be->from_f32({static_cast<int64_t>(all.size())}, all);
    const int64_t per = E * F * D;
    const moe::ExpertWeights w{wbuf.view(0, {E, F, D}), wbuf.view(per, {E, F, D}), wbuf.view(2 * per, {E, D, F})};
    const kernels::Tensor gbuf = be->zeros({3 * per});
    const moe::ExpertWeights dw{gbuf.view(0, {E, F, D}), gbuf.view(per, {E, F, D}), gbuf.view(2 * per, {E, D, F})};
    for (int m = 0; m < kMbs; ++m) {
      Micro mb;
      mb.T = T;
      for (int64_t t = 0; t < T; ++t) {  // k distinct experts per token
        std::vector<int32_t> e(static_cast<size_t>(E));
        std::iota(e.begin(), e.end(), 0);
        std::shuffle(e.begin(), e.end(), rng);
        for (int64_t j = 0; j < k; ++j) mb.ids.push_back(e[static_cast<size_t>(j)]);
      }
      std::uniform_real_distribution<float> u(0.05f, 1.0f);
      for (int64_t i = 0; i < T * k; ++i) mb.weights.push_back(u(rng));
      mb.x = randn(static_cast<size_t>(T * D), rng, 1.0f);
      mb.dout = randn(static_cast<size_t>(T * D), rng, 0.1f);
      mb.plan = moe::build_dispatch_plan(mb.ids, T, k, E, 0.0);
      const int64_t N = mb.plan.rows();
      mb.row_choice.assign(static_cast<size_t>(N), -1);
      for (int64_t i = 0; i < T * k; ++i)
        if (mb.plan.slots[i] >= 0) mb.row_choice[static_cast<size_t>(mb.plan.slots[i])] = i;
      std::vector<int64_t> counts;
      for (int64_t e = 0; e < E; ++e) counts.push_back(mb.plan.count(e));
      const kernels::Tensor x = be->from_f32({T, D}, mb.x), idx = be->from_i32({N}, mb.plan.token_index);
      const kernels::Tensor xs = be->zeros({N, D}), y = be->zeros({N, D});
      be->gather_rows(xs, x, idx);
      const moe::ExpertActs acts{be->zeros({N, F}), be->zeros({N, F}), be->zeros({N, F})};
      moe::experts_forward(*be, y, acts, xs, w, counts);
      mb.y = be->download_f32(y);
      const kernels::Tensor dout = be->from_f32({T, D}, mb.dout), slots = be->from_i32({T, k}, mb.plan.slots);
      const kernels::Tensor wt = be->from_f32({T, k}, mb.weights);
      const kernels::Tensor dy = be->zeros({N, D}), dwt = be->zeros({T, k}), dxs = be->zeros({N, D});
      be->combine_backward(dy, dwt, dout, y, slots, wt);
      const moe::ExpertActs scratch{be->zeros({N, F}), be->zeros({N, F}), be->zeros({N, F})};
      moe::experts_backward(*be, dxs, dw, scratch, dy, xs, acts, w, counts);
      const kernels::Tensor one = be->zeros({3 * per});
      const moe::ExpertWeights dw1{one.view(0, {E, F, D}), one.view(per, {E, F, D}), one.view(2 * per, {E, D, F})};
      moe::experts_backward(*be, dxs, dw1, scratch, dy, xs, acts, w, counts);
      dw_mb.push_back(be->download_f32(one));
      mb.dxs = be->download_f32(dxs);
      mb.dweights = be->download_f32(dwt);
      mbs.push_back(std::move(mb));
    }
    dw_ref = be->download_f32(gbuf);
  }

  MoeKey key(int shard, int m, bool backward) const {
    MoeKey k;
    k.step = 0;
    k.microbatch = static_cast<uint32_t>(m);
    k.layer = kLayer;
    k.shard = static_cast<uint32_t>(shard);
    k.backward = backward;
    k.chunk = chunk_of_mb[static_cast<size_t>(m)];
    k.dispatch_id = static_cast<uint64_t>(m * 10 + shard + (backward ? 100 : 0));
    return k;
  }

  // The rows of micro-batch m that go to `shard`, as its Dispatch.
  Envelope dispatch(int shard, int m, bool backward) const {
    const Micro& mb = mbs[static_cast<size_t>(m)];
    const ExpertRange er = expert_split(c.n_experts, kShards, shard);
    const int64_t D = c.d_model;
    std::vector<float> rows;
    std::vector<uint32_t> ex, ti;
    std::vector<float> cw;
    for (int64_t e = er.begin; e < er.end; ++e)
      for (int64_t r = mb.plan.offsets[e]; r < mb.plan.offsets[e + 1]; ++r) {
        const int64_t t = mb.plan.token_index[r];
        const float* src = (backward ? mb.dout.data() : mb.x.data()) + t * D;
        rows.insert(rows.end(), src, src + D);
        ex.push_back(static_cast<uint32_t>(e));
        ti.push_back(static_cast<uint32_t>(t));
        cw.push_back(mb.weights[static_cast<size_t>(mb.row_choice[static_cast<size_t>(r)])]);
      }
    return make_dispatch(key(shard, m, backward), static_cast<uint32_t>(D), rows, ex, cw, ti);
  }

  // Next message to the probe: an Envelope, a (fail), a (corrupt) report or a (stepok).
  struct Got {
    Envelope env;
    std::string fail;
    std::string damaged;  // (corrupt, name, why): a message dropped as damaged in flight
    bool stepok = false;
    uint32_t rank = 0;
    Envelope::Kind kind() const {
      auto k = env.kind();
      return k ? *k : Envelope::Kind::STOP;
    }
  };
  std::deque<Got> pending;  // arrived, not asked for yet (shards run concurrently)
  Got receive_one() {
    Got g;
    bool got = false;
    self->receive([&](const Envelope& e) { g.env = e, got = true; },
                  [&](rt::fail_atom, const std::string& what) { g.fail = what, got = true; },
                  [&](rt::corrupt_atom, const std::string& who, const std::string& why) { g.damaged = who + ": " + why, got = true; },
                  [&](rt::stepok_atom, uint64_t, uint32_t, uint32_t, uint32_t rank) { g.stepok = true, g.rank = rank, got = true; },
                  caf::after(std::chrono::seconds(60)) >> [&] {});
    EXPECT_TRUE(got) << "no message from the expert shards";
    return g;
  }
  // The next message `want` accepts; others wait in `pending`. A (fail)
  // is always accepted, so a rejection is never mistaken for silence.
  template <class P>
  Got next_where(P want) {
    for (auto it = pending.begin(); it != pending.end(); ++it)
      if (!it->fail.empty() || want(*it)) {
        Got g = std::move(*it);
        pending.erase(it);
        return g;
      }
    for (int i = 0; i < 1000; ++i) {
      Got g = receive_one();
      if (!g.fail.empty() || want(g) || (g.env.empty() && !g.stepok && g.damaged.empty())) return g;
      pending.push_back(std::move(g));
    }
    return {};
  }
  Got next() { return next_where([](const Got&) { return true; }); }
  Got next_kind(Envelope::Kind k) {
    return next_where([k](const Got& g) { return !g.env.empty() && g.kind() == k; });
  }
  Got next_stepok() { return next_where([](const Got& g) { return g.stepok; }); }

  // Checks a Combine against the reference rows of (shard, m).
  void expect_combine(const Got& g, bool backward, int* shard_out, int* mb_out) {
    ASSERT_TRUE(g.fail.empty()) << g.fail;
    auto r = g.env.read<schemas::Combine>();
    ASSERT_TRUE(r) << to_string(r.error());
    const MoeKey id = read_moe_key((*r)->getId());
    ASSERT_EQ(id.backward, backward);
    const int s = static_cast<int>(id.shard), m = static_cast<int>(id.microbatch);
    *shard_out = s;
    *mb_out = m;
    const Micro& mb = mbs[static_cast<size_t>(m)];
    const ExpertRange er = expert_split(c.n_experts, kShards, s);
    const int64_t r0 = mb.plan.offsets[er.begin], r1 = mb.plan.offsets[er.end], D = c.d_model;
    std::vector<uint32_t> ti(mb.plan.token_index.begin() + r0, mb.plan.token_index.begin() + r1);
    ASSERT_TRUE(check_combine(g.env, key(s, m, backward), static_cast<uint32_t>(D), ti));
    const auto rows = tensor_f32((*r)->getRows());
    const auto& want = backward ? mb.dxs : mb.y;
    EXPECT_TRUE(same_bits(rows, std::span<const float>(want.data() + r0 * D, static_cast<size_t>((r1 - r0) * D))))
        << (backward ? "dInput" : "output") << " rows of shard " << s << " mb " << m << " differ from experts over all E";
    if (backward) {
      const auto wg = (*r)->getWeightGrads();
      for (int64_t i = r0; i < r1; ++i) {
        const float want_g = mb.dweights[static_cast<size_t>(mb.row_choice[static_cast<size_t>(i)])];
        const float got_g = wg[static_cast<unsigned>(i - r0)];
        EXPECT_EQ(std::memcmp(&want_g, &got_g, 4), 0) << "weight grad of row " << i;
      }
    }
  }

  uint64_t dropped(const caf::actor& a) {
    uint64_t n = 0;
    self->request(a, caf::infinite, rt::dropped_atom_v).receive([&](uint64_t d) { n = d; }, [&](caf::error&) {});
    return n;
  }
  // Sends the dispatches of `order` micro-batches (forward or backward) to
  // both shards and checks every Combine against the reference.
  void run_pass(bool backward, const std::vector<int>& order) {
    for (int m : order)
      for (int s = 0; s < kShards; ++s) self->send(shards[static_cast<size_t>(s)], dispatch(s, m, backward));
    std::set<std::pair<int, int>> seen;
    for (size_t i = 0; i < order.size() * kShards; ++i) {
      int s = -1, m = -1;
      expect_combine(next_kind(Envelope::Kind::COMBINE), backward, &s, &m);
      seen.emplace(s, m);
    }
    EXPECT_EQ(seen.size(), order.size() * kShards);
  }

  // Step end: the GradSlices of both shards (cut at the optimizer shards'
  // boundary), assembled as [gate | up | down] of all experts.
  std::vector<float> collect_grads() {
    std::vector<float> got(dw_ref.size(), std::nanf(""));
    std::map<uint32_t, int64_t> covered;  // producer -> elements
    const int64_t per = all_ranges[0].count;
    for (int received = 0; received < 64; ++received) {
      int64_t total = 0;
      for (auto& [p, n] : covered) total += n;
      if (total == static_cast<int64_t>(dw_ref.size())) break;
      Got g = next_kind(Envelope::Kind::GRAD_SLICE);
      EXPECT_TRUE(g.fail.empty()) << g.fail;
      auto r = g.env.read<schemas::GradSlice>();
      if (!r) {
        ADD_FAILURE() << "not a GradSlice: " << to_string(r.error());
        break;
      }
      EXPECT_EQ((*r)->getStep(), 0u);
      EXPECT_EQ((*r)->getMicrobatches(), static_cast<uint32_t>(kMbs));
      const int64_t off = static_cast<int64_t>((*r)->getRange().getOffset());
      const int64_t cnt = static_cast<int64_t>((*r)->getRange().getCount());
      const Range osr = sh->plan.shard_ranges[(*r)->getShard()];
      EXPECT_GE(off, osr.offset);
      EXPECT_LE(off + cnt, osr.offset + osr.count);
      int which = -1;
      for (int i = 0; i < 3; ++i)
        if (off >= all_ranges[i].offset && off + cnt <= all_ranges[i].offset + all_ranges[i].count) which = i;
      if (which < 0) {
        ADD_FAILURE() << "slice outside the layer's expert ranges";
        break;
      }
      const auto gv = tensor_f32((*r)->getGrads());
      std::memcpy(got.data() + which * per + (off - all_ranges[which].offset), gv.data(), gv.size_bytes());
      covered[(*r)->getStage()] += cnt;
    }
    EXPECT_EQ(covered.size(), static_cast<size_t>(kShards));
    EXPECT_TRUE(covered.count(kExpertProducerBase + 0) && covered.count(kExpertProducerBase + 1));
    return got;
  }
};

TEST_F(Fixture, CombinesAndGradientsEqualExpertsOverAllExperts) {
  // Forward of both micro-batches, then backward (a pipeline's order).
  run_pass(false, {0, 1});
  run_pass(true, {0, 1});
  const std::vector<float> got = collect_grads();
  EXPECT_TRUE(same_bits(got, dw_ref)) << "expert weight gradients differ from the single-process sums";

  // The optimizer answers: new parameters = init + 1 on each optimizer shard's range.
  std::vector<float> fresh = sh->init;
  for (float& v : fresh) v += 1.0f;
  for (uint32_t o = 0; o < 2; ++o) {
    const Range r = sh->plan.shard_ranges[o];
    Envelope p = Envelope::build<schemas::ParamSlice>([&](schemas::ParamSlice::Builder b) {
      b.setStep(0);
      b.setShard(o);
      b.initRange().setOffset(static_cast<uint64_t>(r.offset));
      b.getRange().setCount(static_cast<uint64_t>(r.count));
      const int64_t shape[1] = {r.count};
      set_tensor_f32(b.initParams(), shape, std::span<const float>(fresh.data() + r.offset, static_cast<size_t>(r.count)));
    });
    for (auto& a : shards) self->send(a, p);
  }
  std::set<uint32_t> ok;
  for (int i = 0; i < kShards; ++i) {
    Got g = next_stepok();
    ASSERT_TRUE(g.stepok) << g.fail;
    ok.insert(g.rank);
  }
  EXPECT_EQ(ok, (std::set<uint32_t>{kExpertProducerBase, kExpertProducerBase + 1}));
  for (int s = 0; s < kShards; ++s) {
    const auto ranges = expert_param_ranges(sh->layout, c, kLayer, expert_split(c.n_experts, kShards, s));
    self->request(shards[static_cast<size_t>(s)], caf::infinite, rt::params_atom_v)
        .receive([&](const Envelope& g, const Envelope& u, const Envelope& d) {
                   const Envelope* es[3] = {&g, &u, &d};
                   for (int i = 0; i < 3; ++i) {
                     auto r = es[i]->read<schemas::ParamSlice>();
                     ASSERT_TRUE(r);
                     EXPECT_EQ((*r)->getStep(), 1u);
                     EXPECT_TRUE(same_bits(tensor_f32((*r)->getParams()),
                                           std::span<const float>(fresh.data() + ranges[i].offset,
                                                                  static_cast<size_t>(ranges[i].count))));
                   }
                 },
                 [&](caf::error& e) { FAIL() << sys.render(e); });
  }
}

TEST_F(Fixture, MalformedDispatchesRejectedWhileServing) {
  const caf::actor& a = shards[0];
  const int64_t D = c.d_model;
  // A foreign expert id (shard 1's expert 3 sent to shard 0).
  std::vector<float> row(static_cast<size_t>(D), 1.0f);
  const std::vector<uint32_t> e3{3}, t0{0};
  const std::vector<float> w1{1.0f};
  self->send(a, make_dispatch(key(0, 0, false), static_cast<uint32_t>(D), row, e3, w1, t0));
  Got g = next();
  EXPECT_NE(g.fail.find("expert:1/0: rejected dispatch"), std::string::npos) << g.fail;
  EXPECT_NE(g.fail.find("expert id 3 is not owned by shard 0"), std::string::npos) << g.fail;
  // A wrong width.
  const std::vector<uint32_t> e0{0};
  std::vector<float> wide(static_cast<size_t>(D + 1), 1.0f);
  self->send(a, make_dispatch(key(0, 0, false), static_cast<uint32_t>(D + 1), wide, e0, w1, t0));
  g = next();
  EXPECT_NE(g.fail.find("width 17 != d_model 16"), std::string::npos) << g.fail;
  // Truncated bytes: what the transport delivers for a frame that fails to
  // decode. Damaged in flight, so a loss (dropped, counted, reported to the
  // coordinator as such; the step deadline recovers it), not a failure.
  const auto frame = dispatch(0, 0, false).encode();
  auto cut = Envelope::decode(frame.data(), frame.size() - 9);
  ASSERT_FALSE(cut);
  self->send(a, Envelope::invalid(cut.error()));
  g = next();
  EXPECT_TRUE(g.fail.empty()) << g.fail;
  EXPECT_NE(g.damaged.find("expert:1/0: "), std::string::npos) << g.damaged;
  EXPECT_NE(g.damaged.find("checksum_mismatch"), std::string::npos) << g.damaged;
  // A backward before its forward.
  self->send(a, dispatch(0, 1, true));
  g = next();
  EXPECT_NE(g.fail.find("without its forward"), std::string::npos) << g.fail;
  EXPECT_EQ(dropped(a), 4u);

  // The shard still serves good dispatches, with the exact results; a
  // duplicate is dropped without a reply.
  self->send(a, dispatch(0, 0, false));
  self->send(a, dispatch(0, 0, false));
  int s = -1, m = -1;
  expect_combine(next(), false, &s, &m);
  EXPECT_EQ(s, 0);
  EXPECT_EQ(m, 0);
  // A backward whose rows do not match its forward is rejected, state untouched...
  {
    const Micro& mb = mbs[0];
    const ExpertRange er = expert_split(c.n_experts, kShards, 0);
    const int64_t n = mb.plan.offsets[er.end];
    ASSERT_GT(n, 1);
    std::vector<float> rows(static_cast<size_t>((n - 1) * D), 0.5f);
    std::vector<uint32_t> ex, ti;
    std::vector<float> cw;
    for (int64_t r = 0; r < n - 1; ++r) {
      ex.push_back(static_cast<uint32_t>(r < mb.plan.offsets[1] ? 0 : 1));
      ti.push_back(static_cast<uint32_t>(mb.plan.token_index[r]));
      cw.push_back(1.0f);
    }
    self->send(a, make_dispatch(key(0, 0, true), static_cast<uint32_t>(D), rows, ex, cw, ti));
    g = next();
    EXPECT_NE(g.fail.find("do not match the forward"), std::string::npos) << g.fail;
  }
  // A backward with the forward's rows but other combine weights: rejected too.
  {
    Envelope good = dispatch(0, 0, true);
    auto r = good.read<schemas::Dispatch>();
    ASSERT_TRUE(r);
    const auto d = r->get();
    std::vector<uint32_t> ex, ti;
    std::vector<float> cw;
    for (uint32_t i = 0; i < d.getNumRows(); ++i) {
      ex.push_back(d.getExpertIds()[i]);
      ti.push_back(d.getTokenIndex()[i]);
      cw.push_back(d.getCombineWeights()[i] * (i == 0 ? 2.0f : 1.0f));
    }
    self->send(a, make_dispatch(key(0, 0, true), static_cast<uint32_t>(D), tensor_f32(d.getRows()), ex, cw, ti));
    g = next();
    EXPECT_NE(g.fail.find("combine weights"), std::string::npos) << g.fail;
  }
  // ...so the real backward still gives the reference dInput rows.
  self->send(a, dispatch(0, 0, true));
  expect_combine(next(), true, &s, &m);
  EXPECT_EQ(dropped(a), 7u);  // 4 malformed + 1 duplicate + 2 mismatched backwards
}


// The two DualPipe copies of a layer dispatch to the same shard: each copy's
// gradients accumulate apart and are summed copy 0 then copy 1 at step end,
// so the result does not depend on which copy's backward arrives first.
TEST_F(Fixture, DualPipeCopiesSummedInChunkOrder) {
  chunk_of_mb = {0, 1};
  run_pass(false, {0, 1});
  run_pass(true, {1, 0});  // copy 1's backward arrives first
  const std::vector<float> got = collect_grads();
  std::vector<float> want(dw_ref.size());
  for (size_t i = 0; i < want.size(); ++i) want[i] = dw_mb[0][i] + dw_mb[1][i];
  EXPECT_TRUE(same_bits(got, want)) << "expert gradients are not copy 0 + copy 1";
}

// With the real (unmodified) ZeRO-1 optimizer-shard actors: the expert shards
// are gradient producers like ranks (Shared::rank_owned lists their ranges so
// the optimizer shards expect their slices), the optimizer shards report
// their squared norms, the test answers (clip), and the updated parameters
// they send back are what the expert shards then hold.
TEST_F(Fixture, WorksWithTheOptimizerShards) {
  for (int s = 0; s < kShards; ++s) {
    const auto r = expert_param_ranges(sh->layout, c, kLayer, expert_split(c.n_experts, kShards, s));
    sh->plan.rank_owned.push_back(std::vector<Range>(r.begin(), r.end()));
  }
  sh->peers.ranks = {shards};
  std::vector<caf::actor> opt;
  for (int o = 0; o < 2; ++o) opt.push_back(spawn_shard(sys, sh, o == 0 ? *dev0 : *dev1, o));
  sh->peers.shards = opt;  // set before any message: the actors read peers when they send

  run_pass(false, {0, 1});
  run_pass(true, {0, 1});
  double sq = 0;
  int partials = 0;
  while (partials < 2) {
    bool got = false;
    self->receive([&](rt::gnorm_atom, uint64_t step, uint32_t, uint32_t, double part) {
                    EXPECT_EQ(step, 0u);
                    sq += part, got = true;
                  },
                  [&](rt::fail_atom, const std::string& what) { ADD_FAILURE() << what; },
                  caf::after(std::chrono::seconds(60)) >> [&] {});
    ASSERT_TRUE(got) << "no squared norm from the optimizer shards";
    ++partials;
  }
  double want_sq = 0;
  for (float g : dw_ref) want_sq += static_cast<double>(g) * g;
  EXPECT_NEAR(sq, want_sq, 1e-6 * want_sq) << "the optimizer shards summed other gradients than the experts'";
  for (auto& o : opt) self->send(o, rt::clip_atom_v, uint64_t{0}, uint32_t{0}, std::sqrt(sq));
  std::set<uint32_t> ok;
  for (int i = 0; i < kShards; ++i) {
    Got g = next_stepok();
    ASSERT_TRUE(g.stepok) << g.fail;
    ok.insert(g.rank);
  }
  EXPECT_EQ(ok.size(), static_cast<size_t>(kShards));
  // The expert shards hold the optimizer shards' updated values, which moved.
  std::vector<float> updated(static_cast<size_t>(sh->layout.total()));
  for (int o = 0; o < 2; ++o)
    self->request(opt[static_cast<size_t>(o)], caf::infinite, rt::params_atom_v)
        .receive([&](const Envelope& e) {
                   auto r = e.read<schemas::ParamSlice>();
                   ASSERT_TRUE(r);
                   const auto v = tensor_f32((*r)->getParams());
                   std::memcpy(updated.data() + (*r)->getRange().getOffset(), v.data(), v.size_bytes());
                 },
                 [&](caf::error& e) { FAIL() << sys.render(e); });
  for (int s = 0; s < kShards; ++s) {
    const auto ranges = expert_param_ranges(sh->layout, c, kLayer, expert_split(c.n_experts, kShards, s));
    self->request(shards[static_cast<size_t>(s)], caf::infinite, rt::params_atom_v)
        .receive([&](const Envelope& g, const Envelope& u, const Envelope& d) {
                   const Envelope* es[3] = {&g, &u, &d};
                   for (int i = 0; i < 3; ++i) {
                     const auto v = tensor_f32((*es[i]->read<schemas::ParamSlice>())->getParams());
                     const std::span<const float> want(updated.data() + ranges[i].offset, static_cast<size_t>(ranges[i].count));
                     const std::span<const float> init(sh->init.data() + ranges[i].offset, static_cast<size_t>(ranges[i].count));
                     EXPECT_TRUE(same_bits(v, want)) << "shard " << s << " range " << i;
                     EXPECT_FALSE(same_bits(v, init)) << "shard " << s << " range " << i << " was not updated";
                   }
                 },
                 [&](caf::error& e) { FAIL() << sys.render(e); });
  }
  for (auto& o : opt) self->send_exit(o, caf::exit_reason::user_shutdown);
}


// A restarted shard (after a failure) starts at the given step with the given
// weights (what the optimizer shards hold), not at sh->init.
TEST_F(Fixture, RestartedShardResumesWithGivenWeights) {
  const ExpertRange er = expert_split(c.n_experts, kShards, 0);
  const auto ranges = expert_param_ranges(sh->layout, c, kLayer, er);
  auto w = std::make_shared<std::vector<float>>();
  for (const Range& r : ranges)
    for (int64_t i = 0; i < r.count; ++i) w->push_back(sh->init[static_cast<size_t>(r.offset + i)] * 0.5f + 0.01f);
  ExpertShardSpec spec;
  spec.layer = kLayer;
  spec.shard = 0;
  spec.shards = kShards;
  spec.start_step = 3;
  spec.weights = w;
  auto bad = spec;
  bad.weights = std::make_shared<std::vector<float>>(w->begin(), w->end() - 1);
  EXPECT_THROW(spawn_expert_shard(sys, sh, *dev0, bad), std::invalid_argument);
  auto no_layer = spec;
  no_layer.weights = nullptr;
  no_layer.layer = 5;  // the model has 2 layers
  EXPECT_THROW(spawn_expert_shard(sys, sh, *dev0, no_layer), std::out_of_range);
  auto too_many = no_layer;
  too_many.layer = kLayer;
  too_many.shards = 5;  // 4 experts
  EXPECT_THROW(spawn_expert_shard(sys, sh, *dev0, too_many), std::invalid_argument);
  auto fresh = spawn_expert_shard(sys, sh, *dev0, spec);

  // Reference: experts_forward over the shard's experts with those weights.
  const Micro& mb = mbs[0];
  const int64_t D = c.d_model, F = c.expert_hidden, n_e = er.size(), per = n_e * F * D;
  const int64_t N = mb.plan.offsets[er.end];
  const kernels::Tensor wb = be->from_f32({3 * per}, *w);
  const moe::ExpertWeights wv{wb.view(0, {n_e, F, D}), wb.view(per, {n_e, F, D}), wb.view(2 * per, {n_e, D, F})};
  std::vector<float> xs_host;
  for (int64_t r = 0; r < N; ++r) {
    const float* src = mb.x.data() + mb.plan.token_index[r] * D;
    xs_host.insert(xs_host.end(), src, src + D);
  }
  const kernels::Tensor xs = be->from_f32({N, D}, xs_host), y = be->zeros({N, D});
  const moe::ExpertActs acts{be->zeros({N, F}), be->zeros({N, F}), be->zeros({N, F})};
  std::vector<int64_t> counts;
  for (int64_t e = er.begin; e < er.end; ++e) counts.push_back(mb.plan.count(e));
  moe::experts_forward(*be, y, acts, xs, wv, counts);
  const std::vector<float> want = be->download_f32(y);

  auto at_step = [&](uint64_t step) {
    Envelope d = dispatch(0, 0, false);
    auto r = d.read<schemas::Dispatch>();
    MoeKey k = read_moe_key((*r)->getId());
    k.step = step;
    std::vector<uint32_t> ex, ti;
    std::vector<float> cw;
    for (uint32_t i = 0; i < (*r)->getNumRows(); ++i) {
      ex.push_back((*r)->getExpertIds()[i]);
      ti.push_back((*r)->getTokenIndex()[i]);
      cw.push_back((*r)->getCombineWeights()[i]);
    }
    return make_dispatch(k, static_cast<uint32_t>(D), tensor_f32((*r)->getRows()), ex, cw, ti);
  };
  self->send(fresh, at_step(2));  // before the restart point: stale, dropped
  self->send(fresh, at_step(3));
  Got g = next();
  ASSERT_TRUE(g.fail.empty()) << g.fail;
  auto r = g.env.read<schemas::Combine>();
  ASSERT_TRUE(r) << to_string(r.error());
  EXPECT_EQ((*r)->getId().getStep(), 3u);
  EXPECT_TRUE(same_bits(tensor_f32((*r)->getRows()), want)) << "the restarted shard does not compute with the given weights";
  EXPECT_EQ(dropped(fresh), 1u);
  self->send_exit(fresh, caf::exit_reason::user_shutdown);
}


// A shard none of whose experts got tokens still answers (empty Combines)
// and still ends the step with (zero) gradients, so nobody waits for it.
TEST_F(Fixture, EmptyDispatchesAnsweredAndStepEnds) {
  const caf::actor& a = shards[0];
  for (bool backward : {false, true})
    for (uint32_t m = 0; m < static_cast<uint32_t>(kMbs); ++m) {
      MoeKey k = key(0, static_cast<int>(m), backward);
      self->send(a, make_dispatch(k, static_cast<uint32_t>(c.d_model), {}, {}, {}, {}));
      Got g = next_kind(Envelope::Kind::COMBINE);
      ASSERT_TRUE(g.fail.empty()) << g.fail;
      ASSERT_TRUE(check_combine(g.env, k, static_cast<uint32_t>(c.d_model), {}));
    }
  int64_t elems = 0;
  const auto ranges = expert_param_ranges(sh->layout, c, kLayer, expert_split(c.n_experts, kShards, 0));
  const int64_t want = ranges[0].count * 3;
  while (elems < want) {
    Got g = next_kind(Envelope::Kind::GRAD_SLICE);
    auto r = g.env.read<schemas::GradSlice>();
    ASSERT_TRUE(r) << g.fail;
    for (float v : tensor_f32((*r)->getGrads())) ASSERT_EQ(v, 0.0f);
    elems += static_cast<int64_t>((*r)->getRange().getCount());
  }
  EXPECT_EQ(elems, want);
}


// A dispatch without a CAF sender (sent from a device thread) is answered at
// the rank holding (chunk, stage); one naming no such rank is rejected.
TEST_F(Fixture, AnonymousDispatchRoutedByStage) {
  sh->plan.sl = sched::make_layout(sched::Kind::sequential, 1, kMbs);
  sh->peers.ranks = {{caf::actor_cast<caf::actor>(self)}};
  caf::anon_send(shards[0], dispatch(0, 0, false));
  int s = -1, m = -1;
  expect_combine(next(), false, &s, &m);
  Envelope d = dispatch(0, 1, false);
  auto r = d.read<schemas::Dispatch>();
  MoeKey k = read_moe_key((*r)->getId());
  k.stage = 7;  // no such stage
  std::vector<uint32_t> ex, ti;
  std::vector<float> cw;
  for (uint32_t i = 0; i < (*r)->getNumRows(); ++i) {
    ex.push_back((*r)->getExpertIds()[i]);
    ti.push_back((*r)->getTokenIndex()[i]);
    cw.push_back((*r)->getCombineWeights()[i]);
  }
  caf::anon_send(shards[0], make_dispatch(k, static_cast<uint32_t>(c.d_model), tensor_f32((*r)->getRows()), ex, cw, ti));
  Got g = next();
  EXPECT_NE(g.fail.find("no sender and no rank"), std::string::npos) << g.fail;
}

}  // namespace
}  // namespace troupe::runtime
