// The step-wise (resumable) Stage passes of model/stage.hpp, as expert
// parallelism uses them: every pass stops at each MoE layer, the experts are
// computed OUTSIDE the stage in 1, 2 or 4 groups (contiguous expert ranges,
// as expert shards hold them), each group with its own copy of its experts'
// weights, its own activations and its own gradient accumulator, and the pass
// resumes. Loss, aux loss, stage outputs, input gradients and every
// parameter gradient must equal the single-call path BITWISE: the same ops
// run in the same order, and a grouped GEMM computes each expert on its own.
// The `split` cases run the step-wise backward as a B (defer_weights) with
// each micro-batch's W after the next micro-batch's B, as ZB-H1 does.
#include <cstring>
#include <map>
#include <ostream>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backend.hpp"
#include "model/params.hpp"
#include "model/stage.hpp"
#include "model/weights.hpp"
#include "moe/experts.hpp"
#include "tests/model/model_test_util.hpp"

namespace troupe::test {
namespace {

using kernels::Tensor;

struct Case {
  std::string name;
  std::string balance;
  double capacity;  // 0 = dropless
  int64_t shared;
  int stages;
  int groups;
  bool split = false;
};

void PrintTo(const Case& k, std::ostream* os) { *os << k.name; }

model::ModelConfig config_for(const Case& k) {
  model::ModelConfig c;
  c.vocab_size = 16;
  c.d_model = 8;
  c.n_layers = 4;
  c.n_heads = 2;
  c.seq_len = 6;
  c.ffn = troupe::model::Ffn::moe;
  c.n_experts = 4;
  c.top_k = 2;
  c.expert_hidden = 6;
  c.shared_experts = k.shared;
  c.balance = troupe::moe::parse_balance(k.balance);
  c.aux_loss_alpha = 0.1;
  c.capacity_factor = k.capacity;
  c.tie_embeddings = false;
  c.init_std = 0.3;
  return c;
}

// The experts [e0, e1) of every MoE layer, computed apart from the stage
// (what an expert-shard actor does), with host copies in between.
class ExpertGroup {
 public:
  ExpertGroup(kernels::Backend& be, const model::ModelConfig& c, const model::ModelWeights& w,
              int64_t e0, int64_t e1)
      : be_(be), c_(c), e0_(e0), e1_(e1) {
    const int64_t n = e1 - e0, F = c.expert_hidden, D = c.d_model;
    for (const model::LayerWeights& L : w.layers) {
      auto copy = [&](const Tensor& all, kernels::Shape shape) {
        const int64_t per = all.numel() / c.n_experts;
        return be.from_f32(shape, be.download_f32(all.view(e0 * per, shape)));
      };
      moe::ExpertWeights own{copy(L.moe.experts.gate, {n, F, D}), copy(L.moe.experts.up, {n, F, D}),
                             copy(L.moe.experts.down, {n, D, F})};
      moe::ExpertWeights grad{be.zeros({n, F, D}), be.zeros({n, F, D}), be.zeros({n, D, F})};
      w_.push_back(own);
      g_.push_back(grad);
    }
  }

  // Serves the group's rows of `ex` for micro-batch `mb`.
  void serve(const model::MoeExchange& ex, int mb) {
    const moe::DispatchPlan& p = *ex.plan;
    const int64_t r0 = p.offsets[e0_], r1 = p.offsets[e1_], n = r1 - r0;
    const int64_t D = c_.d_model, F = c_.expert_hidden;
    std::vector<int64_t> counts;
    for (int64_t e = e0_; e < e1_; ++e) counts.push_back(p.count(e));
    const size_t L = static_cast<size_t>(ex.layer);
    if (n == 0) return;  // nothing routed here: the rows stay as they are
    std::vector<float> in(static_cast<size_t>(n * D));
    be_.download(in.data(), ex.in.rows(r0, r1), in.size() * sizeof(float));
    Tensor out = be_.zeros({n, D});
    if (!ex.backward) {
      Saved s{be_.from_f32({n, D}, in), {be_.zeros({n, F}), be_.zeros({n, F}), be_.zeros({n, F})}};
      moe::experts_forward(be_, out, s.acts, s.xs, w_[L], counts);
      saved_[{mb, ex.layer}] = s;
    } else {
      const Saved& s = saved_.at({mb, ex.layer});
      const Tensor dy = be_.from_f32({n, D}, in);
      const moe::ExpertActs scratch{be_.zeros({n, F}), be_.zeros({n, F}), be_.zeros({n, F})};
      moe::experts_backward(be_, out, g_[L], scratch, dy, s.xs, s.acts, w_[L], counts);
    }
    be_.upload_f32(ex.out.rows(r0, r1), be_.download_f32(out));
  }

  int64_t e0() const { return e0_; }
  int64_t e1() const { return e1_; }
  const moe::ExpertWeights& grad(size_t layer) const { return g_[layer]; }

 private:
  struct Saved {
    Tensor xs;
    moe::ExpertActs acts;
  };
  kernels::Backend& be_;
  model::ModelConfig c_;
  int64_t e0_, e1_;
  std::vector<moe::ExpertWeights> w_, g_;  // [layer]
  std::map<std::pair<int, int64_t>, Saved> saved_;
};

class StageResume : public ::testing::TestWithParam<Case> {};

TEST_P(StageResume, ExpertGroupsMatchSingleCallBitwise) {
  const Case k = GetParam();
  model::ModelConfig c = config_for(k);
  kernels::BackendOptions bo;
  auto be = kernels::make_backend(bo);
  const model::ParamLayout lay = model::build_param_layout(c);
  const int64_t batch = 2, T = batch * c.seq_len, D = c.d_model, M = 3;
  const double loss_scale = 1.0 / 25.0, aux_scale = 1.0 / static_cast<double>(M);
  std::vector<float> init = model::init_params(lay, c, 11);
  if (k.balance == "bias")  // a non-zero selection bias, so it matters
    for (const model::ParamEntry& e : lay.entries())
      if (e.name.find("e_score_correction_bias") != std::string::npos)
        for (int64_t i = 0; i < e.numel; ++i) init[e.offset + i] = 0.05f * static_cast<float>((i * 3) % 4);
  Tensor params = be->from_f32({lay.total()}, init);
  Tensor g_ref = be->zeros({lay.total()}), g_res = be->zeros({lay.total()});
  const model::ModelWeights w = model::bind_weights(lay, c, params);
  const model::ModelWeights gr = model::bind_weights(lay, c, g_ref);
  const model::ModelWeights gs = model::bind_weights(lay, c, g_res);
  std::vector<std::vector<int32_t>> ins(M), tgs(M);
  for (int mb = 0; mb < M; ++mb) pattern_tokens(ins[mb], tgs[mb], T, c.vocab_size, mb);

  const auto ranges = model::split_layers(c.n_layers, k.stages);
  auto make_stages = [&] {
    std::vector<std::unique_ptr<model::Stage>> st;
    for (int s = 0; s < k.stages; ++s)
      st.push_back(std::make_unique<model::Stage>(*be, c, batch, ranges[s].first, ranges[s].second,
                                                  s == 0, s == k.stages - 1, M));
    return st;
  };
  auto tg_of = [&](int s, int mb) {
    return s == k.stages - 1 ? std::span<const int32_t>(tgs[mb]) : std::span<const int32_t>();
  };
  const size_t HD = static_cast<size_t>(T * D);

  // Reference: the single-call passes, all forwards then the backwards in
  // micro-batch order (as runtime_stage_test does).
  auto ref = make_stages();
  std::vector<model::ForwardResult> ref_r(M * k.stages);
  std::vector<std::vector<float>> ref_out(M * k.stages, std::vector<float>(HD)), ref_din = ref_out;
  for (int mb = 0; mb < M; ++mb)
    for (int s = 0; s < k.stages; ++s) {
      ref_r[mb * k.stages + s] = s == 0 ? ref[s]->forward_tokens(mb, w, ins[mb], tg_of(s, mb))
                                        : ref[s]->forward_hidden(mb, w, ref_out[mb * k.stages + s - 1], tg_of(s, mb));
      if (s < k.stages - 1) ref[s]->read_output(mb, ref_out[mb * k.stages + s]);
    }
  for (int mb = 0; mb < M; ++mb)
    for (int s = k.stages - 1; s >= 0; --s) {
      const bool last = s == k.stages - 1;
      ref[s]->backward(mb, w, gr, last ? std::span<const float>() : std::span<const float>(ref_din[mb * k.stages + s + 1]),
                       loss_scale, aux_scale);
      if (s > 0) ref[s]->read_input_grad(ref_din[mb * k.stages + s]);
    }

  // Step-wise: per stage, the forwards of all micro-batches are interleaved
  // (each suspended at its MoE layers while the others advance), the experts
  // computed by the groups; the backwards run one at a time.
  std::vector<std::unique_ptr<ExpertGroup>> groups;
  for (int i = 0; i < k.groups; ++i)
    groups.push_back(std::make_unique<ExpertGroup>(*be, c, w, c.n_experts * i / k.groups,
                                                   c.n_experts * (i + 1) / k.groups));
  auto serve = [&](const model::MoeExchange& ex, int mb) {
    EXPECT_GE(ex.layer, 0);
    EXPECT_EQ(ex.plan->n_experts, c.n_experts);
    for (auto& g : groups) g->serve(ex, mb);
  };
  auto res = make_stages();
  std::vector<model::ForwardResult> res_r(M * k.stages);
  std::vector<std::vector<float>> res_out(M * k.stages, std::vector<float>(HD)), res_din = res_out;
  int suspensions = 0;
  for (int s = 0; s < k.stages; ++s) {
    std::vector<const model::MoeExchange*> pending(M);
    for (int mb = 0; mb < M; ++mb)
      pending[mb] = s == 0 ? res[s]->begin_forward_tokens(mb, w, ins[mb], tg_of(s, mb))
                           : res[s]->begin_forward_hidden(mb, w, res_out[mb * k.stages + s - 1], tg_of(s, mb));
    for (bool any = true; any;) {
      any = false;
      for (int mb = M - 1; mb >= 0; --mb) {  // reverse order: interleaving must not matter
        if (!pending[mb]) continue;
        any = true;
        ++suspensions;
        EXPECT_FALSE(pending[mb]->backward);
        serve(*pending[mb], mb);
        pending[mb] = res[s]->resume_forward(mb, w);
      }
    }
    for (int mb = 0; mb < M; ++mb) {
      res_r[mb * k.stages + s] = res[s]->forward_result(mb);
      if (s < k.stages - 1) res[s]->read_output(mb, res_out[mb * k.stages + s]);
    }
  }
  EXPECT_EQ(suspensions, M * c.n_layers);  // every MoE layer of every micro-batch
  for (int mb = 0; mb < M; ++mb) {
    for (int s = k.stages - 1; s >= 0; --s) {
      const bool last = s == k.stages - 1;
      const model::MoeExchange* ex = res[s]->begin_backward(
          mb, w, gs, last ? std::span<const float>() : std::span<const float>(res_din[mb * k.stages + s + 1]),
          loss_scale, aux_scale, k.split);
      for (; ex; ex = res[s]->resume_backward(mb, w, gs)) {
        EXPECT_TRUE(ex->backward);
        serve(*ex, mb);
      }
      if (s > 0) res[s]->read_input_grad(res_din[mb * k.stages + s]);
      EXPECT_EQ(res[s]->weights_pending(mb), k.split);
    }
    if (k.split && mb > 0)
      for (int s = 0; s < k.stages; ++s) res[s]->backward_weights(mb - 1);
  }
  if (k.split)
    for (int s = 0; s < k.stages; ++s) res[s]->backward_weights(M - 1);

  for (size_t i = 0; i < ref_r.size(); ++i) {
    EXPECT_EQ(res_r[i].loss_sum, ref_r[i].loss_sum) << i;
    EXPECT_EQ(res_r[i].aux_loss, ref_r[i].aux_loss) << i;
    EXPECT_EQ(res_r[i].counted, ref_r[i].counted) << i;
    EXPECT_TRUE(bitwise_equal(res_out[i], ref_out[i])) << "stage output " << i;
    EXPECT_TRUE(bitwise_equal(res_din[i], ref_din[i])) << "input gradient " << i;
  }
  // Parameter gradients: the stage's own entries equal the reference; the
  // expert entries were left alone by the stage and each group's
  // accumulator equals the reference's slice of its experts.
  const std::vector<float> a = be->download_f32(g_ref), b = be->download_f32(g_res);
  bool saw_drop = false, saw_expert_grad = false;
  for (const model::ParamEntry& e : lay.entries()) {
    const std::span<const float> ra(a.data() + e.offset, static_cast<size_t>(e.numel));
    const std::span<const float> rb(b.data() + e.offset, static_cast<size_t>(e.numel));
    if (e.name.find(".mlp.experts.") != std::string::npos) {
      for (float v : rb) ASSERT_EQ(v, 0.0f) << e.name << " touched by the step-wise stage";
    } else {
      EXPECT_TRUE(bitwise_equal(ra, rb)) << e.name;
    }
  }
  for (size_t l = 0; l < static_cast<size_t>(c.n_layers); ++l) {
    for (const auto& g : groups) {
      const int64_t n = g->e1() - g->e0();
      const moe::ExpertWeights& gg = g->grad(l);
      const Tensor* refs[3] = {&gr.layers[l].moe.experts.gate, &gr.layers[l].moe.experts.up,
                               &gr.layers[l].moe.experts.down};
      const Tensor* mine[3] = {&gg.gate, &gg.up, &gg.down};
      for (int m = 0; m < 3; ++m) {
        const int64_t per = refs[m]->numel() / c.n_experts;
        const auto want = be->download_f32(refs[m]->view(g->e0() * per, {n * per}));
        const auto got = be->download_f32(*mine[m]);
        EXPECT_TRUE(bitwise_equal(want, got)) << "layer " << l << " experts [" << g->e0() << "," << g->e1()
                                              << ") matrix " << m;
        for (float v : got) saw_expert_grad |= v != 0.0f;
      }
    }
  }
  for (int s = 0; s < k.stages; ++s)
    for (int mb = 0; mb < M; ++mb)
      for (int64_t d : res[s]->dropped(mb)) saw_drop |= d > 0;
  EXPECT_TRUE(saw_expert_grad);
  EXPECT_EQ(saw_drop, k.capacity > 0.0) << "the capacity case must actually drop assignments";
}

INSTANTIATE_TEST_SUITE_P(
    Groups, StageResume,
    ::testing::Values(Case{"aux_1stage_1group", "aux_loss", 0.0, 0, 1, 1},
                      Case{"aux_1stage_2groups", "aux_loss", 0.0, 0, 1, 2},
                      Case{"aux_drop_shared_1stage_4groups", "aux_loss", 0.6, 1, 1, 4},
                      Case{"aux_drop_shared_2stages_2groups", "aux_loss", 0.6, 1, 2, 2},
                      Case{"bias_2stages_4groups", "bias", 0.0, 0, 2, 4},
                      Case{"bias_drop_shared_1stage_2groups", "bias", 0.6, 1, 1, 2},
                      Case{"none_drop_2stages_1group", "none", 0.6, 0, 2, 1},
                      Case{"split_aux_drop_shared_2stages_2groups", "aux_loss", 0.6, 1, 2, 2, true},
                      Case{"split_bias_shared_1stage_4groups", "bias", 0.0, 1, 1, 4, true}),
    [](const auto& info) { return info.param.name; });

// The gradient scratch is shared by the slots: a second backward may not
// start while one is suspended at its experts, and resuming what is not
// suspended is refused. The suspended backward still finishes correctly.
TEST(StageResume, OneSuspendedBackwardAtATime) {
  Case k{"x", "aux_loss", 0.0, 0, 1, 1};
  const model::ModelConfig c = config_for(k);
  kernels::BackendOptions bo;
  auto be = kernels::make_backend(bo);
  const model::ParamLayout lay = model::build_param_layout(c);
  Tensor params = be->from_f32({lay.total()}, model::init_params(lay, c, 3));
  Tensor grads = be->zeros({lay.total()});
  const model::ModelWeights w = model::bind_weights(lay, c, params), g = model::bind_weights(lay, c, grads);
  model::Stage st(*be, c, 1, 0, c.n_layers, true, true, 2);
  std::vector<int32_t> in, tg;
  pattern_tokens(in, tg, c.seq_len, c.vocab_size, 0);
  for (int slot = 0; slot < 2; ++slot) st.forward_tokens(slot, w, in, tg);
  EXPECT_THROW(st.resume_backward(0, w, g), std::logic_error);
  EXPECT_THROW(st.resume_forward(0, w), std::logic_error);
  const model::MoeExchange* ex = st.begin_backward(0, w, g, {}, 1.0, 1.0);
  ASSERT_NE(ex, nullptr);
  EXPECT_THROW(st.begin_backward(1, w, g, {}, 1.0, 1.0), std::logic_error);
  // A forward of another slot may run meanwhile (it uses no backward scratch)...
  EXPECT_NO_THROW(st.forward_tokens(1, w, in, tg));
  // ...but not a new pass on the suspended slot.
  EXPECT_THROW(st.begin_forward_tokens(0, w, in, tg), std::logic_error);
  int n = 0;
  for (; ex; ex = st.resume_backward(0, w, g)) ++n;  // outputs left as they are: only the protocol
  EXPECT_EQ(n, c.n_layers);
  EXPECT_NO_THROW(st.backward(1, w, g, {}, 1.0, 1.0));
}

}  // namespace
}  // namespace troupe::test
