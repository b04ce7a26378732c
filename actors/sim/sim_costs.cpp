// Cost models of sim devices (see sim_costs.hpp).
//
// FLOPs of one micro-batch (T tokens, sequences of S tokens, width D) at a
// stage with layers L, counted as model::train_flops_per_token counts them:
//   weight matmuls, forward  2 x (weights touched per token) x T, where a
//                            layer touches 4 D^2 (attention projections) +
//                            its FFN (dense 3 D H; MoE: router E D + k routed
//                            and the shared experts' 3 D F each), and the
//                            last stage the LM head V D
//   attention core, forward  2 x 2 x D x (S+1)/2 per token (QK^T and AV over
//                            the causal half)
//   backward (inputs)        the weight matmuls once more + the attention
//                            core twice (it has no weights)
//   backward (weights)       the weight matmuls once more
// so the full backward is twice the forward, as usual.
//
// Bytes (float32): every op reads the stage's parameters (all experts: with
// many tokens per micro-batch every expert is hit), the weight part also
// writes the gradients; the forward writes the activations a layer keeps for
// its backward — per token 6 D + 3 H_eff floats (norm/attention/residual
// tensors and the FFN's gate, up and product; H_eff = k F + shared F for MoE,
// the dense hidden width otherwise) — the input backward reads them and
// writes their gradients, the weight backward reads them once.
#include "actors/sim/sim_costs.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "model/params.hpp"
#include "model/stage.hpp"

namespace troupe::sim {

int64_t ms_to_ns(double ms) { return static_cast<int64_t>(std::llround(ms * 1e6)); }
int64_t us_to_ns(double us) { return static_cast<int64_t>(std::llround(us * 1e3)); }

int64_t message_bytes(const model::ModelConfig& c, int64_t mb_sequences) {
  return mb_sequences * c.seq_len * c.d_model * 4;
}

std::vector<StageWork> stage_work(const model::ModelConfig& c, int64_t mb_sequences, int num_stages) {
  const double D = static_cast<double>(c.d_model), V = static_cast<double>(c.vocab_size);
  const double S = static_cast<double>(c.seq_len);
  const double T = static_cast<double>(mb_sequences) * S;
  double ffn_per_token = 0, hidden_eff = 0;
  if (c.ffn == model::Ffn::dense) {
    ffn_per_token = 3.0 * D * static_cast<double>(c.dense_hidden);
    hidden_eff = static_cast<double>(c.dense_hidden);
  } else {
    const double F = static_cast<double>(c.expert_hidden);
    const double k = static_cast<double>(c.top_k + c.shared_experts);
    ffn_per_token = static_cast<double>(c.n_experts) * D + k * 3.0 * D * F;
    hidden_eff = k * F;
  }
  const double layer_weights_per_token = 4.0 * D * D + ffn_per_token;
  const double attn_core_per_token = 2.0 * 2.0 * D * (S + 1.0) / 2.0;
  const double act_floats_per_token = 6.0 * D + 3.0 * hidden_eff;

  // Parameters per layer and outside the layers, from the model's own layout.
  const model::ParamLayout layout = model::build_param_layout(c);
  std::vector<double> layer_params(static_cast<size_t>(c.n_layers), 0.0);
  double embed = 0, head = 0;  // head: final norm (+ untied LM head)
  for (const model::ParamEntry& e : layout.entries()) {
    if (e.tag.layer >= 0) {
      const size_t l = static_cast<size_t>(e.tag.layer);
      if (l < layer_params.size()) layer_params[l] += static_cast<double>(e.numel);
    } else if (e.tag.role == model::ParamRole::Embedding) {
      embed += static_cast<double>(e.numel);
    } else {
      head += static_cast<double>(e.numel);
    }
  }
  if (c.tie_embeddings) head += V * D;  // the last stage reads the shared matrix too

  std::vector<StageWork> out;
  for (const auto& [lb, le] : model::split_layers(c.n_layers, num_stages)) {
    StageWork w;
    w.layer_begin = lb;
    w.layer_end = le;
    const bool first = out.empty(), last = static_cast<int>(out.size()) == num_stages - 1;
    const double L = static_cast<double>(le - lb);
    double weights_per_token = L * layer_weights_per_token;
    for (int64_t l = lb; l < le; ++l) w.params += layer_params[static_cast<size_t>(l)];
    double acts = L * act_floats_per_token * T;
    if (first) {
      w.params += embed;
      acts += D * T;  // the embedded tokens
    }
    if (last) {
      w.params += head;
      weights_per_token += V * D;
      acts += (V + D) * T;  // normed hidden and logits
    }
    const double matmul = 2.0 * weights_per_token * T;
    const double core = L * attn_core_per_token * T;
    w.f_flops = matmul + core;
    w.bin_flops = matmul + 2.0 * core;
    w.w_flops = matmul;
    const double pbytes = 4.0 * w.params, abytes = 4.0 * acts;
    w.f_bytes = pbytes + abytes;
    w.bin_bytes = pbytes + 2.0 * abytes;
    w.w_bytes = 2.0 * pbytes + abytes;
    out.push_back(w);
  }
  return out;
}

std::vector<StageCost> stage_costs(const CostConfig& cost, const model::ModelConfig& config,
                                   int64_t mb_sequences, int num_stages) {
  if (num_stages < 1) throw std::invalid_argument("sim: num_stages must be >= 1");
  auto finite_nonneg = [](double x) { return std::isfinite(x) && x >= 0; };
  if (cost.model == CostModel::fixed) {
    if (!finite_nonneg(cost.forward_ms) || !finite_nonneg(cost.backward_ms) || !finite_nonneg(cost.weight_ms))
      throw std::invalid_argument("sim: fixed op times must be finite and >= 0");
    if (cost.weight_ms > cost.backward_ms)
      throw std::invalid_argument("sim: weight_ms (the weight part of the backward) exceeds backward_ms");
    const StageCost c{ms_to_ns(cost.forward_ms), ms_to_ns(cost.backward_ms), ms_to_ns(cost.weight_ms)};
    return std::vector<StageCost>(static_cast<size_t>(num_stages), c);
  }
  if (cost.model == CostModel::measured) {
    const size_t n = static_cast<size_t>(num_stages);
    const auto& f = cost.stage_forward_ms;
    const auto& b = cost.stage_backward_ms;
    const auto& w = cost.stage_weight_ms;
    if (f.size() != n || b.size() != n || (!w.empty() && w.size() != n))
      throw std::invalid_argument("sim: measured costs need one forward and backward time per stage (" +
                                  std::to_string(n) + " stages; got " + std::to_string(f.size()) + " and " +
                                  std::to_string(b.size()) + ", weight " + std::to_string(w.size()) + ")");
    std::vector<StageCost> out;
    for (size_t i = 0; i < n; ++i) {
      const double wi = w.empty() ? 0.0 : w[i];
      if (!finite_nonneg(f[i]) || !finite_nonneg(b[i]) || !finite_nonneg(wi))
        throw std::invalid_argument("sim: measured op times must be finite and >= 0");
      if (wi > b[i]) throw std::invalid_argument("sim: a stage's weight time exceeds its backward time");
      out.push_back(StageCost{ms_to_ns(f[i]), ms_to_ns(b[i]), ms_to_ns(wi)});
    }
    return out;
  }
  if (!(cost.gflops > 0) || !(cost.gbps > 0) || !std::isfinite(cost.gflops) || !std::isfinite(cost.gbps))
    throw std::invalid_argument("sim: gflops and gbps must be finite and > 0");
  // GFLOP/s is FLOPs per ns and GB/s bytes per ns: the quotients are ns.
  auto roofline = [&](double flops, double bytes) {
    return static_cast<int64_t>(std::llround(std::max(flops / cost.gflops, bytes / cost.gbps)));
  };
  std::vector<StageCost> out;
  for (const StageWork& w : stage_work(config, mb_sequences, num_stages)) {
    StageCost c;
    c.f = roofline(w.f_flops, w.f_bytes);
    c.w = roofline(w.w_flops, w.w_bytes);
    c.b = roofline(w.bin_flops, w.bin_bytes) + c.w;
    out.push_back(c);
  }
  return out;
}

}  // namespace troupe::sim
