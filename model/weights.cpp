// Parameter views and deterministic initialisation.
#include "model/weights.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

namespace troupe::model {

using kernels::Tensor;

namespace {

Tensor entry_view(const ParamLayout& L, const Tensor& flat, const std::string& name) {
  const ParamEntry& e = L.at(name);
  return flat.view(e.offset, e.shape);
}

// A view of `n` consecutive entries named prefix{0..n-1}suffix as one [n, ...] tensor.
Tensor stacked_view(const ParamLayout& L, const Tensor& flat, const std::string& prefix,
                    const std::string& suffix, int64_t n) {
  const ParamEntry& first = L.at(prefix + "0" + suffix);
  for (int64_t i = 1; i < n; ++i) {
    const ParamEntry& e = L.at(prefix + std::to_string(i) + suffix);
    if (e.offset != first.offset + i * first.numel || e.shape != first.shape)
      throw std::logic_error("layout: " + e.name + " is not consecutive with expert 0");
  }
  kernels::Shape s{n};
  s.insert(s.end(), first.shape.begin(), first.shape.end());
  return flat.view(first.offset, s);
}

uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

uint64_t fnv1a(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

bool ends_with(const std::string& s, const std::string& suf) {
  return s.size() >= suf.size() && s.compare(s.size() - suf.size(), suf.size(), suf) == 0;
}

}  // namespace

ModelWeights bind_weights(const ParamLayout& L, const ModelConfig& c, const Tensor& flat) {
  if (flat.numel() != L.total())
    throw std::invalid_argument("bind_weights: buffer has " + std::to_string(flat.numel()) +
                                " elements, layout needs " + std::to_string(L.total()));
  ModelWeights w;
  w.embed = entry_view(L, flat, "model.embed_tokens.weight");
  w.norm = entry_view(L, flat, "model.norm.weight");
  w.lm_head = c.tie_embeddings ? w.embed : entry_view(L, flat, "lm_head.weight");
  for (int64_t i = 0; i < c.n_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    LayerWeights lw;
    lw.ln1 = entry_view(L, flat, p + "input_layernorm.weight");
    lw.wq = entry_view(L, flat, p + "self_attn.q_proj.weight");
    lw.wk = entry_view(L, flat, p + "self_attn.k_proj.weight");
    lw.wv = entry_view(L, flat, p + "self_attn.v_proj.weight");
    lw.wo = entry_view(L, flat, p + "self_attn.o_proj.weight");
    lw.ln2 = entry_view(L, flat, p + "post_attention_layernorm.weight");
    if (c.ffn == Ffn::dense) {
      lw.dense.gate = entry_view(L, flat, p + "mlp.gate_proj.weight");
      lw.dense.up = entry_view(L, flat, p + "mlp.up_proj.weight");
      lw.dense.down = entry_view(L, flat, p + "mlp.down_proj.weight");
    } else {
      const std::string x = p + "mlp.experts.";
      lw.moe.router = entry_view(L, flat, p + "mlp.gate.weight");
      if (c.balance == moe::Balance::bias) lw.moe.bias = entry_view(L, flat, p + "mlp.gate.e_score_correction_bias");
      lw.moe.experts.gate = stacked_view(L, flat, x, ".gate_proj.weight", c.n_experts);
      lw.moe.experts.up = stacked_view(L, flat, x, ".up_proj.weight", c.n_experts);
      lw.moe.experts.down = stacked_view(L, flat, x, ".down_proj.weight", c.n_experts);
      if (c.shared_experts > 0) {
        lw.moe.shared.gate = entry_view(L, flat, p + "mlp.shared_experts.gate_proj.weight");
        lw.moe.shared.up = entry_view(L, flat, p + "mlp.shared_experts.up_proj.weight");
        lw.moe.shared.down = entry_view(L, flat, p + "mlp.shared_experts.down_proj.weight");
      }
    }
    w.layers.push_back(std::move(lw));
  }
  return w;
}

std::vector<float> init_params(const ParamLayout& L, const ModelConfig& c, uint64_t seed) {
  std::vector<float> out(static_cast<size_t>(L.total()), 0.0f);
  const double out_scale = 1.0 / std::sqrt(2.0 * static_cast<double>(c.n_layers));
  for (const ParamEntry& e : L.entries()) {
    float* p = out.data() + e.offset;
    if (ends_with(e.name, "layernorm.weight") || e.name == "model.norm.weight") {
      for (int64_t i = 0; i < e.numel; ++i) p[i] = 1.0f;
      continue;
    }
    if (!e.trainable) continue;  // router bias starts at 0
    double std = c.init_std;
    if (ends_with(e.name, "o_proj.weight") || ends_with(e.name, "down_proj.weight"))
      std *= out_scale;
    uint64_t state = seed * 0x9E3779B97F4A7C15ull ^ fnv1a(e.name);
    // Box-Muller on 53-bit uniforms from splitmix64 (no std:: distributions,
    // whose output differs between standard libraries).
    for (int64_t i = 0; i < e.numel; i += 2) {
      const double u1 = (static_cast<double>(splitmix64(state) >> 11) + 1.0) * 0x1.0p-53;
      const double u2 = static_cast<double>(splitmix64(state) >> 11) * 0x1.0p-53;
      const double r = std::sqrt(-2.0 * std::log(u1));
      p[i] = static_cast<float>(std * r * std::cos(2.0 * M_PI * u2));
      if (i + 1 < e.numel) p[i + 1] = static_cast<float>(std * r * std::sin(2.0 * M_PI * u2));
    }
  }
  return out;
}

}  // namespace troupe::model
