// ParamLayout and the decoder's parameter layout (HF/Mixtral/DeepSeek names).
//
// Order in the flat buffer: embed_tokens, then per layer: input_layernorm,
// q/k/v/o_proj, post_attention_layernorm, then the FFN: dense gate/up/down,
// or MoE router (mlp.gate.weight), router bias (balance == "bias" only, not
// trainable), every expert's gate_proj (E consecutive [F,D] matrices = one
// [E,F,D] region for grouped GEMM), every expert's up_proj, every expert's
// down_proj ([E,D,F]), then shared experts (merged, hidden S*F); finally
// model.norm and lm_head (untied only).
#include <stdexcept>
#include <string>

#include "model/params.hpp"

namespace troupe::model {

const ParamEntry& ParamLayout::add(std::string name, kernels::Shape shape, bool trainable,
                                   bool decay, ParamTag tag) {
  if (find(name)) throw std::invalid_argument("ParamLayout: duplicate entry " + name);
  for (int64_t d : shape)
    if (d <= 0) throw std::invalid_argument("ParamLayout: entry " + name + " has empty shape " +
                                            kernels::shape_str(shape));
  ParamEntry e;
  e.name = std::move(name);
  e.numel = kernels::shape_numel(shape);
  e.shape = std::move(shape);
  e.offset = total_;
  e.trainable = trainable;
  e.decay = decay && trainable;
  e.tag = tag;
  total_ += e.numel;
  index_.emplace(e.name, entries_.size());
  entries_.push_back(std::move(e));
  return entries_.back();
}

const ParamEntry* ParamLayout::find(const std::string& name) const {
  auto it = index_.find(name);
  return it == index_.end() ? nullptr : &entries_[it->second];
}

const ParamEntry& ParamLayout::at(const std::string& name) const {
  const ParamEntry* e = find(name);
  if (!e) throw std::out_of_range("parameter '" + name + "' is not in the layout");
  return *e;
}

static void validate(const ModelConfig& c) {
  auto req = [](bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument("model config: " + what);
  };
  req(c.vocab_size > 0 && c.d_model > 0 && c.n_layers > 0 && c.n_heads > 0 && c.seq_len > 0,
      "vocab_size, d_model, n_layers, n_heads and seq_len must be positive");
  req(c.d_model % c.n_heads == 0, "d_model must be a multiple of n_heads");
  req((c.d_model / c.n_heads) % 2 == 0, "head dim (d_model / n_heads) must be even for RoPE");
  if (c.ffn == Ffn::dense) {
    req(c.dense_hidden > 0, "dense_hidden must be positive");
  } else {
    req(c.n_experts > 0 && c.expert_hidden > 0, "n_experts and expert_hidden must be positive");
    req(c.top_k >= 1 && c.top_k <= c.n_experts, "top_k must be in [1, n_experts]");
    req(c.shared_experts >= 0, "shared_experts must be >= 0");
    req(c.capacity_factor >= 0.0, "capacity_factor must be >= 0");
  }
}

ParamLayout build_param_layout(const ModelConfig& c) {
  validate(c);
  const int64_t V = c.vocab_size, D = c.d_model;
  ParamLayout L;
  L.add("model.embed_tokens.weight", {V, D}, true, true, {ParamRole::Embedding});
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    const int l = static_cast<int>(i);
    L.add(p + "input_layernorm.weight", {D}, true, false, {ParamRole::Norm, l});
    for (const char* m : {"q_proj", "k_proj", "v_proj", "o_proj"})
      L.add(p + "self_attn." + m + ".weight", {D, D}, true, true, {ParamRole::Attention, l});
    L.add(p + "post_attention_layernorm.weight", {D}, true, false, {ParamRole::Norm, l});
    if (c.ffn == Ffn::dense) {
      const int64_t H = c.dense_hidden;
      L.add(p + "mlp.gate_proj.weight", {H, D}, true, true, {ParamRole::Dense, l});
      L.add(p + "mlp.up_proj.weight", {H, D}, true, true, {ParamRole::Dense, l});
      L.add(p + "mlp.down_proj.weight", {D, H}, true, true, {ParamRole::Dense, l});
      continue;
    }
    const int64_t E = c.n_experts, F = c.expert_hidden;
    L.add(p + "mlp.gate.weight", {E, D}, true, true, {ParamRole::Router, l});
    if (c.balance == moe::Balance::bias)
      L.add(p + "mlp.gate.e_score_correction_bias", {E}, false, false, {ParamRole::RouterBias, l});
    int part = 0;
    for (const char* m : {"gate_proj", "up_proj"}) {
      for (int64_t e = 0; e < E; ++e)
        L.add(p + "mlp.experts." + std::to_string(e) + "." + m + ".weight", {F, D}, true, true,
              {ParamRole::Expert, l, static_cast<int>(e), part});
      ++part;
    }
    for (int64_t e = 0; e < E; ++e)
      L.add(p + "mlp.experts." + std::to_string(e) + ".down_proj.weight", {D, F}, true, true,
            {ParamRole::Expert, l, static_cast<int>(e), 2});
    if (c.shared_experts > 0) {
      const int64_t S = c.shared_experts * F;
      L.add(p + "mlp.shared_experts.gate_proj.weight", {S, D}, true, true, {ParamRole::SharedExpert, l});
      L.add(p + "mlp.shared_experts.up_proj.weight", {S, D}, true, true, {ParamRole::SharedExpert, l});
      L.add(p + "mlp.shared_experts.down_proj.weight", {D, S}, true, true, {ParamRole::SharedExpert, l});
    }
  }
  L.add("model.norm.weight", {D}, true, false, {ParamRole::FinalNorm});
  if (!c.tie_embeddings) L.add("lm_head.weight", {V, D}, true, true, {ParamRole::Head});
  return L;
}

std::vector<OptimizerRange> optimizer_ranges(const ParamLayout& layout) {
  std::vector<OptimizerRange> out;
  for (const ParamEntry& e : layout.entries()) {
    if (!e.trainable) continue;
    if (!out.empty() && out.back().decay == e.decay && out.back().offset + out.back().numel == e.offset) {
      out.back().numel += e.numel;
    } else {
      out.push_back({e.offset, e.numel, e.decay});
    }
  }
  return out;
}

}  // namespace troupe::model
