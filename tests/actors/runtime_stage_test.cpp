// The pipeline-stage split of the decoder (model/stage.hpp): running the
// stages of a split one after the other, with several micro-batches in flight
// in separate activation slots, gives BITWISE the loss and gradients of the
// whole-model Decoder. Bitwise is expected because every parameter's gradient
// receives the same float additions in the same order (micro-batch 0's full
// backward, then micro-batch 1's), and every op runs with the same shapes.
#include <cstring>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backend.hpp"
#include "model/decoder.hpp"
#include "model/params.hpp"
#include "model/stage.hpp"
#include "model/weights.hpp"
#include "tests/model/model_test_util.hpp"

namespace troupe::test {
namespace {

model::ModelConfig small_config(const std::string& ffn, bool tied) {
  model::ModelConfig c;
  c.vocab_size = 16;
  c.d_model = 8;
  c.n_layers = 4;
  c.n_heads = 2;
  c.seq_len = 6;
  c.ffn = troupe::model::parse_ffn(ffn);
  c.dense_hidden = 12;
  c.n_experts = 4;
  c.top_k = 2;
  c.expert_hidden = 6;
  c.shared_experts = ffn == "moe" ? 1 : 0;
  c.aux_loss_alpha = 0.1;
  c.tie_embeddings = tied;
  c.init_std = 0.3;
  return c;
}

struct Params {
  std::string ffn;
  bool tied;
  int stages;
};

class StageSplit : public ::testing::TestWithParam<Params> {};

TEST_P(StageSplit, MatchesDecoderBitwise) {
  const Params p = GetParam();
  const model::ModelConfig c = small_config(p.ffn, p.tied);
  kernels::BackendOptions bo;
  auto be = kernels::make_backend(bo);
  const model::ParamLayout L = model::build_param_layout(c);
  const int64_t batch = 2, T = batch * c.seq_len, D = c.d_model, M = 3;
  const double loss_scale = 1.0 / 25.0, aux_scale = 1.0 / static_cast<double>(M);
  kernels::Tensor params = be->from_f32({L.total()}, model::init_params(L, c, 7));
  kernels::Tensor g_ref = be->zeros({L.total()}), g_pipe = be->zeros({L.total()});
  const model::ModelWeights w = model::bind_weights(L, c, params);
  const model::ModelWeights gr = model::bind_weights(L, c, g_ref);
  const model::ModelWeights gp = model::bind_weights(L, c, g_pipe);

  std::vector<std::vector<int32_t>> ins(M), tgs(M);
  for (int mb = 0; mb < M; ++mb) pattern_tokens(ins[mb], tgs[mb], T, c.vocab_size, mb);

  // Reference: forward + backward per micro-batch.
  model::Decoder dec(*be, c, batch);
  std::vector<double> ref_loss, ref_aux;
  for (int mb = 0; mb < M; ++mb) {
    const auto r = dec.forward(w, ins[mb], tgs[mb]);
    dec.backward(w, gr, loss_scale, aux_scale);
    ref_loss.push_back(r.loss_sum);
    ref_aux.push_back(r.aux_loss);
  }

  // Pipeline: every forward first (one slot per micro-batch), then every
  // backward in micro-batch order, each through all stages.
  const auto ranges = model::split_layers(c.n_layers, p.stages);
  std::vector<std::unique_ptr<model::Stage>> st;
  for (int s = 0; s < p.stages; ++s)
    st.push_back(std::make_unique<model::Stage>(*be, c, batch, ranges[s].first, ranges[s].second,
                                                s == 0, s == p.stages - 1, M));
  std::vector<float> hidden(static_cast<size_t>(T * D)), grad(static_cast<size_t>(T * D));
  std::vector<double> loss(M, 0.0), aux(M, 0.0);
  for (int mb = 0; mb < M; ++mb) {
    for (int s = 0; s < p.stages; ++s) {
      const bool last = s == p.stages - 1;
      const std::span<const int32_t> tg = last ? std::span<const int32_t>(tgs[mb]) : std::span<const int32_t>();
      const model::ForwardResult r = s == 0 ? st[s]->forward_tokens(mb, w, ins[mb], tg)
                                            : st[s]->forward_hidden(mb, w, hidden, tg);
      aux[mb] += r.aux_loss;
      if (last) loss[mb] = r.loss_sum;
      else st[s]->read_output(mb, hidden);
    }
  }
  for (int mb = 0; mb < M; ++mb) {
    for (int s = p.stages - 1; s >= 0; --s) {
      const bool last = s == p.stages - 1;
      st[s]->backward(mb, w, gp, last ? std::span<const float>() : std::span<const float>(grad),
                      loss_scale, aux_scale);
      if (s > 0) st[s]->read_input_grad(grad);
    }
  }
  for (int mb = 0; mb < M; ++mb) {
    EXPECT_EQ(loss[mb], ref_loss[mb]) << "mb " << mb;
    // The aux loss is summed per stage, then over stages: bitwise only for one stage.
    EXPECT_NEAR(aux[mb], ref_aux[mb], 1e-12 + 1e-12 * std::abs(ref_aux[mb])) << "mb " << mb;
  }
  const auto a = be->download_f32(g_ref), b = be->download_f32(g_pipe);
  ASSERT_TRUE(bitwise_equal(a, b));
  double norm = 0.0;
  for (float v : a) norm += static_cast<double>(v) * v;
  EXPECT_GT(norm, 0.0);  // the comparison is not between two zero buffers
}

INSTANTIATE_TEST_SUITE_P(Splits, StageSplit,
                         ::testing::Values(Params{"moe", true, 1}, Params{"moe", true, 2},
                                           Params{"moe", false, 4}, Params{"dense", true, 4},
                                           Params{"dense", false, 3}),
                         [](const auto& info) {
                           return info.param.ffn + (info.param.tied ? "_tied_" : "_untied_") +
                                  std::to_string(info.param.stages);
                         });

TEST(StageSplit, RejectsBadInput) {
  const model::ModelConfig c = small_config("moe", true);
  auto be = kernels::make_backend({});
  EXPECT_THROW(model::split_layers(4, 5), std::invalid_argument);
  EXPECT_THROW(model::split_layers(4, 0), std::invalid_argument);
  EXPECT_THROW(model::Stage(*be, c, 1, 3, 2, true, true), std::invalid_argument);
  EXPECT_THROW(model::Stage(*be, c, 1, 0, 5, true, true), std::invalid_argument);
  model::Stage mid(*be, c, 1, 1, 2, false, false, 2);
  const model::ParamLayout L = model::build_param_layout(c);
  kernels::Tensor params = be->from_f32({L.total()}, model::init_params(L, c, 1));
  const model::ModelWeights w = model::bind_weights(L, c, params);
  std::vector<float> short_hidden(3);
  EXPECT_THROW(mid.forward_hidden(0, w, short_hidden, {}), std::invalid_argument);
  std::vector<float> hidden(static_cast<size_t>(c.seq_len * c.d_model), 0.5f);
  EXPECT_THROW(mid.forward_hidden(2, w, hidden, {}), std::out_of_range);
  std::vector<int32_t> ids(static_cast<size_t>(c.seq_len), 1);
  EXPECT_THROW(mid.forward_tokens(0, w, ids, {}), std::logic_error);
  const auto ranges = model::split_layers(7, 3);
  ASSERT_EQ(ranges.size(), 3u);
  EXPECT_EQ(ranges[0], (std::pair<int64_t, int64_t>{0, 3}));
  EXPECT_EQ(ranges[2], (std::pair<int64_t, int64_t>{5, 7}));
}

}  // namespace
}  // namespace troupe::test
