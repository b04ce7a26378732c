// The B/W split of model::Stage (backward_input = B, backward_weights = W):
// input gradients and every parameter gradient must equal the unsplit
// backward BITWISE (the same ops on the same operands, per gradient buffer in
// the same order), with the W of a micro-batch deferred past other
// micro-batches' F and B, as ZB-H1 and DualPipe run them. The B alone must
// leave the weight-GEMM gradients untouched (so a W that did nothing would
// fail here), and the slot's protocol is enforced.
#include <cstring>
#include <memory>
#include <ostream>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backend.hpp"
#include "model/params.hpp"
#include "model/stage.hpp"
#include "model/weights.hpp"
#include "tests/model/model_test_util.hpp"

namespace troupe::test {
namespace {

using kernels::Tensor;

struct Case {
  std::string name;
  std::string ffn;  // dense / moe
  int64_t shared;   // MoE shared experts
  std::string balance;
  double capacity;
  bool tied;
  int stages;
  bool head;  // last stage: a custom loss head's d total / d logits instead of the cross-entropy
};

void PrintTo(const Case& k, std::ostream* os) { *os << k.name; }

model::ModelConfig config_for(const Case& k) {
  model::ModelConfig c = tiny_config(k.ffn);
  c.n_layers = 4;
  c.shared_experts = k.shared;
  c.balance = troupe::moe::parse_balance(k.balance);
  c.capacity_factor = k.capacity;
  c.tie_embeddings = k.tied;
  return c;
}

// Entries whose gradient only W writes (weight GEMMs and the embedding
// scatter); the RMSNorm gains are B's.
bool w_only(const std::string& name) { return name.find("norm") == std::string::npos; }

class StageSplit : public ::testing::TestWithParam<Case> {};

TEST_P(StageSplit, BThenDeferredWMatchesUnsplitBitwise) {
  const Case k = GetParam();
  const model::ModelConfig c = config_for(k);
  auto be = kernels::make_backend(kernels::BackendOptions{});
  const model::ParamLayout lay = model::build_param_layout(c);
  const int64_t batch = 2, T = batch * c.seq_len, D = c.d_model, V = c.vocab_size;
  const int M = 3, S = k.stages;
  const double loss_scale = 1.0 / 25.0, aux_scale = 1.0 / M;
  const Tensor params = be->from_f32({lay.total()}, model::init_params(lay, c, 5));
  const Tensor g_ref = be->zeros({lay.total()}), g_spl = be->zeros({lay.total()});
  const model::ModelWeights w = model::bind_weights(lay, c, params);
  const model::ModelWeights gr = model::bind_weights(lay, c, g_ref), gs = model::bind_weights(lay, c, g_spl);
  std::vector<std::vector<int32_t>> ins(M), tgs(M);
  for (int mb = 0; mb < M; ++mb) pattern_tokens(ins[mb], tgs[mb], T, V, mb);
  // A loss head's d total / d logits: any fixed values do.
  std::vector<std::vector<float>> head(M, std::vector<float>(static_cast<size_t>(T * V)));
  for (int mb = 0; mb < M; ++mb)
    for (size_t i = 0; i < head[mb].size(); ++i) head[mb][i] = 0.01f * static_cast<float>((i * 13 + mb * 7) % 17) - 0.08f;

  const auto ranges = model::split_layers(c.n_layers, S);
  const size_t HD = static_cast<size_t>(T * D);
  struct Run {
    std::vector<std::unique_ptr<model::Stage>> st;
    std::vector<std::vector<float>> out, din;  // [mb * S + s]
  };
  auto make = [&] {
    Run r;
    for (int s = 0; s < S; ++s)
      r.st.push_back(std::make_unique<model::Stage>(*be, c, batch, ranges[s].first, ranges[s].second, s == 0,
                                                    s == S - 1, M));
    r.out.assign(M * S, std::vector<float>(HD));
    r.din = r.out;
    return r;
  };
  auto forward = [&](Run& r, int mb) {
    for (int s = 0; s < S; ++s) {
      const auto tg = s == S - 1 ? std::span<const int32_t>(tgs[mb]) : std::span<const int32_t>();
      if (s == 0) r.st[s]->forward_tokens(mb, w, ins[mb], tg);
      else r.st[s]->forward_hidden(mb, w, r.out[mb * S + s - 1], tg);
      if (s < S - 1) r.st[s]->read_output(mb, r.out[mb * S + s]);
    }
  };
  auto dout = [&](Run& r, int mb, int s) {
    if (s < S - 1) return std::span<const float>(r.din[mb * S + s + 1]);
    return k.head ? std::span<const float>(head[mb]) : std::span<const float>();
  };
  // B (or the full backward) of mb through every stage, top down.
  auto backward = [&](Run& r, int mb, const model::ModelWeights& g, bool split) {
    for (int s = S - 1; s >= 0; --s) {
      if (split) r.st[s]->backward_input(mb, w, g, dout(r, mb, s), loss_scale, aux_scale);
      else r.st[s]->backward(mb, w, g, dout(r, mb, s), loss_scale, aux_scale);
      if (s > 0) r.st[s]->read_input_grad(r.din[mb * S + s]);
    }
  };

  // Reference: forwards, then the unsplit backwards in micro-batch order.
  Run ref = make();
  for (int mb = 0; mb < M; ++mb) forward(ref, mb);
  for (int mb = 0; mb < M; ++mb) backward(ref, mb, gr, false);

  // Split, W deferred: F0 F1 | B0 F2 B1 W0 B2 W1 W2 on every stage.
  Run spl = make();
  for (int mb = 0; mb < M - 1; ++mb) forward(spl, mb);
  backward(spl, 0, gs, true);
  for (int s = 0; s < S; ++s) EXPECT_TRUE(spl.st[s]->weights_pending(0));
  {  // B alone: the weight-GEMM gradients are still zero, the norm gains are not.
    const std::vector<float> g = be->download_f32(g_spl);
    bool saw_norm = false;
    for (const model::ParamEntry& e : lay.entries()) {
      const std::span<const float> v(g.data() + e.offset, static_cast<size_t>(e.numel));
      bool nonzero = false;
      for (float x : v) nonzero |= x != 0.0f;
      if (w_only(e.name)) EXPECT_FALSE(nonzero) << e.name << " written by the B pass";
      else saw_norm |= nonzero;
    }
    EXPECT_TRUE(saw_norm);
  }
  forward(spl, M - 1);
  for (int mb = 1; mb < M; ++mb) {
    backward(spl, mb, gs, true);
    for (int s = 0; s < S; ++s) spl.st[s]->backward_weights(mb - 1);
  }
  for (int s = 0; s < S; ++s) {
    spl.st[s]->backward_weights(M - 1);
    for (int mb = 0; mb < M; ++mb) EXPECT_FALSE(spl.st[s]->weights_pending(mb));
  }

  for (size_t i = 0; i < ref.din.size(); ++i)
    EXPECT_TRUE(bitwise_equal(ref.din[i], spl.din[i])) << "input gradient " << i;
  const std::vector<float> a = be->download_f32(g_ref), b = be->download_f32(g_spl);
  bool saw_w = false;
  for (const model::ParamEntry& e : lay.entries()) {
    const std::span<const float> ra(a.data() + e.offset, static_cast<size_t>(e.numel));
    const std::span<const float> rb(b.data() + e.offset, static_cast<size_t>(e.numel));
    EXPECT_TRUE(bitwise_equal(ra, rb)) << e.name;
    if (w_only(e.name))
      for (float x : rb) saw_w |= x != 0.0f;
  }
  EXPECT_TRUE(saw_w);
}

INSTANTIATE_TEST_SUITE_P(
    Models, StageSplit,
    ::testing::Values(Case{"dense_1stage_tied", "dense", 0, "aux_loss", 0.0, true, 1, false},
                      Case{"dense_2stages", "dense", 0, "aux_loss", 0.0, false, 2, false},
                      Case{"dense_4stages_head", "dense", 0, "aux_loss", 0.0, false, 4, true},
                      Case{"moe_aux_2stages", "moe", 0, "aux_loss", 0.0, false, 2, false},
                      Case{"moe_shared_drop_1stage_tied", "moe", 1, "aux_loss", 0.6, true, 1, false},
                      Case{"moe_bias_shared_3stages_head", "moe", 1, "bias", 0.0, false, 3, true}),
    [](const auto& info) { return info.param.name; });

// The slot of a pending W takes no new pass (it would overwrite what W
// reads); a W while its B is suspended at experts is refused; an abandoned
// step drops the pending W.
TEST(StageSplit, SlotProtocol) {
  const model::ModelConfig c = config_for(Case{"", "moe", 0, "aux_loss", 0.0, false, 1, false});
  auto be = kernels::make_backend(kernels::BackendOptions{});
  const model::ParamLayout lay = model::build_param_layout(c);
  const Tensor params = be->from_f32({lay.total()}, model::init_params(lay, c, 3));
  const Tensor grads = be->zeros({lay.total()});
  const model::ModelWeights w = model::bind_weights(lay, c, params), g = model::bind_weights(lay, c, grads);
  model::Stage st(*be, c, 1, 0, c.n_layers, true, true, 2);
  std::vector<int32_t> in, tg;
  pattern_tokens(in, tg, c.seq_len, c.vocab_size, 0);
  st.forward_tokens(0, w, in, tg);
  st.forward_tokens(1, w, in, tg);
  st.backward_input(0, w, g, {}, 1.0, 1.0);
  EXPECT_TRUE(st.weights_pending(0));
  EXPECT_THROW(st.forward_tokens(0, w, in, tg), std::logic_error);
  EXPECT_THROW(st.backward_input(0, w, g, {}, 1.0, 1.0), std::logic_error);
  // Another slot runs meanwhile, its B suspended at the experts.
  const model::MoeExchange* ex = st.begin_backward(1, w, g, {}, 1.0, 1.0, true);
  ASSERT_NE(ex, nullptr);
  EXPECT_THROW(st.backward_weights(1), std::logic_error);
  EXPECT_NO_THROW(st.backward_weights(0));  // slot 0's W needs no backward scratch
  EXPECT_FALSE(st.weights_pending(0));
  EXPECT_NO_THROW(st.forward_tokens(0, w, in, tg));
  st.abandon_passes();
  EXPECT_FALSE(st.weights_pending(1));
  EXPECT_NO_THROW(st.forward_tokens(1, w, in, tg));
}

}  // namespace
}  // namespace troupe::test
