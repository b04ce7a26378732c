// Gradient checks of the whole decoder: our float32 forward loss against a
// float64 reference forward (tests/model/model_reference.cpp), and every parameter's
// analytic gradient (router included) against central finite differences of
// that float64 reference. Dense and MoE configs, both balancing methods, with
// and without capacity dropping, on the host backend and on OpenCL when
// available.
//
// Tolerances (stated, not tuned per case):
//   loss:     |L32 - L64| <= 2e-5 * |L64|
//   gradient: |g32 - g_fd| <= 1e-6 + 1e-3 * |g_fd| for every element, and per
//             named entry ||g32 - g_fd|| <= 1e-4 * ||g_fd|| + 1e-7.
// The FD step is h = 1e-5 in float64: truncation (~h^2) and rounding
// (~1e-16/h) errors are both far below the float32 error being measured.
// Top-k routing is piecewise constant: a seed is used only if every token's
// k-th and (k+1)-th selection scores differ by > 1e-3, and each FD evaluation
// asserts that the routing did not change.
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "model/decoder.hpp"
#include "model/params.hpp"
#include "model/weights.hpp"
#include "tests/model/model_reference.hpp"
#include "tests/model/model_test_util.hpp"

namespace troupe::test {
namespace {

using model::ModelConfig;

struct Case {
  std::string name;
  ModelConfig cfg;
  int64_t batch = 2;
  bool random_bias = false;   // give the selection bias non-zero values
  bool expect_drops = false;  // the case must actually drop assignments
};

std::vector<Case> cases() {
  std::vector<Case> cs;
  {
    Case c{"dense_tied", tiny_config("dense")};
    cs.push_back(c);
  }
  {
    Case c{"dense_untied", tiny_config("dense")};
    c.cfg.tie_embeddings = false;
    c.cfg.n_layers = 1;
    cs.push_back(c);
  }
  {
    Case c{"moe_aux_dropless_shared_untied", tiny_config("moe")};
    c.cfg.shared_experts = 1;
    c.cfg.tie_embeddings = false;
    cs.push_back(c);
  }
  {
    Case c{"moe_bias_dropless", tiny_config("moe")};
    c.cfg.balance = troupe::moe::Balance::bias;
    c.random_bias = true;
    cs.push_back(c);
  }
  {
    Case c{"moe_aux_capacity", tiny_config("moe")};
    c.cfg.capacity_factor = 0.75;
    c.expect_drops = true;
    cs.push_back(c);
  }
  {
    Case c{"moe_bias_capacity", tiny_config("moe")};
    c.cfg.balance = troupe::moe::Balance::bias;
    c.cfg.capacity_factor = 0.75;
    c.random_bias = true;
    c.expect_drops = true;
    cs.push_back(c);
  }
  {
    Case c{"moe_none_top1", tiny_config("moe")};
    c.cfg.balance = troupe::moe::Balance::none;
    c.cfg.top_k = 1;
    cs.push_back(c);
  }
  return cs;
}

struct OursResult {
  double loss = 0.0;
  std::vector<float> grads;
};

// Our forward + backward of mean CE + aux on the given backend.
OursResult run_ours(kernels::Backend& be, const ModelConfig& cfg, const model::ParamLayout& L,
                    const std::vector<float>& params, const std::vector<int32_t>& inputs,
                    const std::vector<int32_t>& targets, int64_t batch) {
  kernels::Tensor p = be.from_f32({L.total()}, params);
  kernels::Tensor g = be.zeros({L.total()});
  const model::ModelWeights w = model::bind_weights(L, cfg, p);
  const model::ModelWeights gw = model::bind_weights(L, cfg, g);
  model::Decoder dec(be, cfg, batch);
  const model::ForwardResult r = dec.forward(w, inputs, targets);
  dec.backward(w, gw, 1.0 / static_cast<double>(r.counted), 1.0);
  OursResult out;
  out.loss = r.loss_sum / static_cast<double>(r.counted) + r.aux_loss;
  out.grads = be.download_f32(g);
  return out;
}

double ref_loss(const test::RefResult& r) {
  return r.loss_sum / static_cast<double>(r.counted) + r.aux_loss;
}

class GradCheck : public ::testing::TestWithParam<std::string> {};

TEST_P(GradCheck, EveryParameterMatchesFloat64FiniteDifferences) {
  std::string why;
  auto be = try_backend(GetParam(), &why);
  if (!be) GTEST_SKIP() << "no " << GetParam() << " backend: " << why;

  for (const Case& cs : cases()) {
    SCOPED_TRACE(cs.name);
    const ModelConfig& cfg = cs.cfg;
    const model::ParamLayout L = model::build_param_layout(cfg);
    std::vector<int32_t> inputs, targets;
    random_tokens(inputs, targets, cs.batch * cfg.seq_len, cfg.vocab_size, 7);

    // Pick the first seed whose routing has clear margins (and drops, if required).
    std::vector<float> params;
    std::vector<double> p64;
    test::RefResult base;
    bool found = false;
    for (uint64_t seed = 1; seed <= 50 && !found; ++seed) {
      params = model::init_params(L, cfg, seed);
      if (cs.random_bias) {
        std::mt19937_64 rng(seed * 1000 + 17);
        std::uniform_real_distribution<float> u(-0.08f, 0.08f);
        for (const auto& e : L.entries())
          if (!e.trainable)
            for (int64_t i = 0; i < e.numel; ++i) params[e.offset + i] = u(rng);
      }
      p64.assign(params.begin(), params.end());
      base = test::reference_forward(cfg, L, p64, inputs, targets, cs.batch);
      found = base.min_margin > 1e-3 && (!cs.expect_drops || base.dropped > 0);
    }
    ASSERT_TRUE(found) << "no seed with clear routing margins";

    const OursResult ours = run_ours(*be, cfg, L, params, inputs, targets, cs.batch);
    const double l64 = ref_loss(base);
    EXPECT_NEAR(ours.loss, l64, 2e-5 * std::fabs(l64)) << "forward loss vs float64 reference";

    const double h = 1e-5;
    int64_t checked = 0;
    double worst_rel = 0.0;
    for (const auto& e : L.entries()) {
      if (!e.trainable) {
        for (int64_t i = 0; i < e.numel; ++i)
          ASSERT_EQ(ours.grads[e.offset + i], 0.0f) << e.name << " is not trainable";
        continue;
      }
      double diff2 = 0.0, ref2 = 0.0;
      for (int64_t i = 0; i < e.numel; ++i) {
        const size_t idx = static_cast<size_t>(e.offset + i);
        const double keep = p64[idx];
        p64[idx] = keep + h;
        const test::RefResult rp = test::reference_forward(cfg, L, p64, inputs, targets, cs.batch);
        p64[idx] = keep - h;
        const test::RefResult rm = test::reference_forward(cfg, L, p64, inputs, targets, cs.batch);
        p64[idx] = keep;
        ASSERT_EQ(rp.routing, base.routing) << e.name << "[" << i << "]: routing changed under +h";
        ASSERT_EQ(rm.routing, base.routing) << e.name << "[" << i << "]: routing changed under -h";
        const double fd = (ref_loss(rp) - ref_loss(rm)) / (2.0 * h);
        const double g = static_cast<double>(ours.grads[idx]);
        EXPECT_LE(std::fabs(g - fd), 1e-6 + 1e-3 * std::fabs(fd))
            << e.name << "[" << i << "]: analytic " << g << " vs FD " << fd;
        diff2 += (g - fd) * (g - fd);
        ref2 += fd * fd;
        ++checked;
      }
      const double rel = std::sqrt(diff2) / (std::sqrt(ref2) + 1e-30);
      if (ref2 > 1e-24) worst_rel = std::max(worst_rel, rel);
      EXPECT_LE(std::sqrt(diff2), 1e-4 * std::sqrt(ref2) + 1e-7) << e.name << " relative error " << rel;
    }
    EXPECT_GT(checked, 0);
    std::printf("[gradcheck %s/%s] %lld params, loss32 %.8f loss64 %.8f, worst entry rel err %.2e, dropped %lld\n",
                GetParam().c_str(), cs.name.c_str(), static_cast<long long>(checked), ours.loss, l64,
                worst_rel, static_cast<long long>(base.dropped));
  }
}

INSTANTIATE_TEST_SUITE_P(Backends, GradCheck, ::testing::Values("host", "opencl"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace troupe::test
