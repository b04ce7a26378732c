// Float64 reference decoder: embedding, RMSNorm, RoPE (rotate-half), causal
// MHA, SwiGLU dense/MoE FFN with top-k routing, selection bias, capacity
// dropping, shared experts, aux loss, cross-entropy.
#include "tests/model/model_reference.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

namespace troupe::test {

namespace {

using Mat = std::vector<double>;  // row-major

struct Ctx {
  const model::ParamLayout& L;
  const std::vector<double>& p;
  const double* at(const std::string& name) const { return p.data() + L.at(name).offset; }
};

// y[T,O] = x[T,I] W[O,I]^T
Mat linear(const Mat& x, const double* W, int64_t T, int64_t I, int64_t O) {
  Mat y(static_cast<size_t>(T * O), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t o = 0; o < O; ++o) {
      double s = 0.0;
      for (int64_t i = 0; i < I; ++i) s += x[t * I + i] * W[o * I + i];
      y[t * O + o] = s;
    }
  return y;
}

Mat rmsnorm(const Mat& x, const double* w, int64_t T, int64_t D, double eps) {
  Mat y(x.size());
  for (int64_t t = 0; t < T; ++t) {
    double ss = 0.0;
    for (int64_t i = 0; i < D; ++i) ss += x[t * D + i] * x[t * D + i];
    const double r = 1.0 / std::sqrt(ss / static_cast<double>(D) + eps);
    for (int64_t i = 0; i < D; ++i) y[t * D + i] = x[t * D + i] * r * w[i];
  }
  return y;
}

// In place on [B,S,H,hd]: pair (i, i+hd/2) rotated by s * theta^(-2i/hd).
void rope(Mat& x, int64_t B, int64_t S, int64_t H, int64_t hd, double theta) {
  const int64_t half = hd / 2;
  for (int64_t b = 0; b < B; ++b)
    for (int64_t s = 0; s < S; ++s)
      for (int64_t h = 0; h < H; ++h) {
        double* v = x.data() + ((b * S + s) * H + h) * hd;
        for (int64_t i = 0; i < half; ++i) {
          const double ang = static_cast<double>(s) *
                             std::pow(theta, -2.0 * static_cast<double>(i) / static_cast<double>(hd));
          const double c = std::cos(ang), sn = std::sin(ang);
          const double x1 = v[i], x2 = v[i + half];
          v[i] = x1 * c - x2 * sn;
          v[i + half] = x2 * c + x1 * sn;
        }
      }
}

Mat attention(const Mat& q, const Mat& k, const Mat& v, int64_t B, int64_t S, int64_t H,
              int64_t hd) {
  Mat out(q.size(), 0.0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(hd));
  std::vector<double> sc(static_cast<size_t>(S));
  auto idx = [&](int64_t b, int64_t s, int64_t h) { return ((b * S + s) * H + h) * hd; };
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h)
      for (int64_t s = 0; s < S; ++s) {
        double mx = -std::numeric_limits<double>::infinity();
        for (int64_t j = 0; j <= s; ++j) {
          double d = 0.0;
          for (int64_t i = 0; i < hd; ++i) d += q[idx(b, s, h) + i] * k[idx(b, j, h) + i];
          sc[j] = d * scale;
          mx = std::max(mx, sc[j]);
        }
        double z = 0.0;
        for (int64_t j = 0; j <= s; ++j) z += (sc[j] = std::exp(sc[j] - mx));
        for (int64_t j = 0; j <= s; ++j)
          for (int64_t i = 0; i < hd; ++i) out[idx(b, s, h) + i] += sc[j] / z * v[idx(b, j, h) + i];
      }
  return out;
}

double silu(double x) { return x / (1.0 + std::exp(-x)); }

// One SwiGLU FFN on one row: y[D] += scale * down(silu(gate x) * up x).
void swiglu_row(double* y, const double* x, const double* G, const double* U, const double* Dn,
                int64_t D, int64_t F, double scale) {
  std::vector<double> a(static_cast<size_t>(F));
  for (int64_t f = 0; f < F; ++f) {
    double g = 0.0, u = 0.0;
    for (int64_t i = 0; i < D; ++i) {
      g += G[f * D + i] * x[i];
      u += U[f * D + i] * x[i];
    }
    a[f] = silu(g) * u;
  }
  for (int64_t o = 0; o < D; ++o) {
    double s = 0.0;
    for (int64_t f = 0; f < F; ++f) s += Dn[o * F + f] * a[f];
    y[o] += scale * s;
  }
}

}  // namespace

RefResult reference_forward(const model::ModelConfig& c, const model::ParamLayout& L,
                            const std::vector<double>& p, const std::vector<int32_t>& inputs,
                            const std::vector<int32_t>& targets, int64_t B) {
  const Ctx ctx{L, p};
  const int64_t S = c.seq_len, T = B * S, D = c.d_model, V = c.vocab_size, H = c.n_heads;
  const int64_t hd = D / H;
  RefResult r;
  r.min_margin = std::numeric_limits<double>::infinity();
  Mat x(static_cast<size_t>(T * D));
  const double* emb = ctx.at("model.embed_tokens.weight");
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < D; ++i) x[t * D + i] = emb[inputs[t] * D + i];

  for (int64_t l = 0; l < c.n_layers; ++l) {
    const std::string pre = "model.layers." + std::to_string(l) + ".";
    Mat xn = rmsnorm(x, ctx.at(pre + "input_layernorm.weight"), T, D, c.norm_eps);
    Mat q = linear(xn, ctx.at(pre + "self_attn.q_proj.weight"), T, D, D);
    Mat k = linear(xn, ctx.at(pre + "self_attn.k_proj.weight"), T, D, D);
    Mat v = linear(xn, ctx.at(pre + "self_attn.v_proj.weight"), T, D, D);
    rope(q, B, S, H, hd, c.rope_theta);
    rope(k, B, S, H, hd, c.rope_theta);
    Mat att = attention(q, k, v, B, S, H, hd);
    Mat o = linear(att, ctx.at(pre + "self_attn.o_proj.weight"), T, D, D);
    for (size_t i = 0; i < x.size(); ++i) x[i] += o[i];

    Mat xn2 = rmsnorm(x, ctx.at(pre + "post_attention_layernorm.weight"), T, D, c.norm_eps);
    if (c.ffn == troupe::model::Ffn::dense) {
      const int64_t F = c.dense_hidden;
      for (int64_t t = 0; t < T; ++t)
        swiglu_row(&x[t * D], &xn2[t * D], ctx.at(pre + "mlp.gate_proj.weight"),
                   ctx.at(pre + "mlp.up_proj.weight"), ctx.at(pre + "mlp.down_proj.weight"), D, F,
                   1.0);
      continue;
    }
    const int64_t E = c.n_experts, K = c.top_k, F = c.expert_hidden;
    Mat logits = linear(xn2, ctx.at(pre + "mlp.gate.weight"), T, D, E);
    Mat probs(logits.size());
    for (int64_t t = 0; t < T; ++t) {
      double mx = -std::numeric_limits<double>::infinity(), z = 0.0;
      for (int64_t e = 0; e < E; ++e) mx = std::max(mx, logits[t * E + e]);
      for (int64_t e = 0; e < E; ++e) z += std::exp(logits[t * E + e] - mx);
      for (int64_t e = 0; e < E; ++e) probs[t * E + e] = std::exp(logits[t * E + e] - mx) / z;
    }
    const double* bias =
        c.balance == troupe::moe::Balance::bias ? ctx.at(pre + "mlp.gate.e_score_correction_bias") : nullptr;
    // Selection: k largest of probs + bias, ties to the lower id.
    std::vector<int32_t> ids(static_cast<size_t>(T * K));
    std::vector<double> wts(static_cast<size_t>(T * K));
    std::vector<int64_t> routed(static_cast<size_t>(E), 0);
    for (int64_t t = 0; t < T; ++t) {
      std::vector<std::pair<double, int32_t>> sel;
      for (int64_t e = 0; e < E; ++e)
        sel.push_back({probs[t * E + e] + (bias ? bias[e] : 0.0), static_cast<int32_t>(e)});
      std::stable_sort(sel.begin(), sel.end(),
                       [](const auto& a, const auto& b) { return a.first > b.first; });
      if (K < E) r.min_margin = std::min(r.min_margin, sel[K - 1].first - sel[K].first);
      double sum = 0.0;
      for (int64_t j = 0; j < K; ++j) {
        ids[t * K + j] = sel[j].second;
        wts[t * K + j] = probs[t * E + sel[j].second];
        sum += wts[t * K + j];
        routed[sel[j].second]++;
      }
      if (K > 1)
        for (int64_t j = 0; j < K; ++j) wts[t * K + j] /= sum;
    }
    // Capacity: assignments beyond ceil(cf*T*K/E) per expert are dropped in token order.
    const int64_t cap = c.capacity_factor > 0
                            ? static_cast<int64_t>(std::ceil(c.capacity_factor *
                                                             static_cast<double>(T * K) /
                                                             static_cast<double>(E)))
                            : -1;
    std::vector<int64_t> kept(static_cast<size_t>(E), 0);
    const double* G = ctx.at(pre + "mlp.experts.0.gate_proj.weight");
    const double* U = ctx.at(pre + "mlp.experts.0.up_proj.weight");
    const double* Dn = ctx.at(pre + "mlp.experts.0.down_proj.weight");
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t j = 0; j < K; ++j) {
        const int32_t e = ids[t * K + j];
        r.routing.push_back(e);
        const bool keep = cap < 0 || kept[e] < cap;
        r.routing.push_back(keep ? 1 : 0);
        if (!keep) {
          r.dropped++;
          continue;
        }
        kept[e]++;
        // Experts' matrices are consecutive in the buffer (checked by the layout test).
        swiglu_row(&x[t * D], &xn2[t * D], G + e * F * D, U + e * F * D, Dn + e * D * F, D, F,
                   wts[t * K + j]);
      }
      if (c.shared_experts > 0)
        swiglu_row(&x[t * D], &xn2[t * D], ctx.at(pre + "mlp.shared_experts.gate_proj.weight"),
                   ctx.at(pre + "mlp.shared_experts.up_proj.weight"),
                   ctx.at(pre + "mlp.shared_experts.down_proj.weight"), D,
                   c.shared_experts * F, 1.0);
    }
    if (c.balance == troupe::moe::Balance::aux_loss) {
      double s = 0.0;
      for (int64_t e = 0; e < E; ++e) {
        double P = 0.0;
        for (int64_t t = 0; t < T; ++t) P += probs[t * E + e];
        s += static_cast<double>(routed[e]) / static_cast<double>(T * K) * P / static_cast<double>(T);
      }
      r.aux_loss += c.aux_loss_alpha * static_cast<double>(E) * s;
    }
  }
  Mat xf = rmsnorm(x, ctx.at("model.norm.weight"), T, D, c.norm_eps);
  const double* head = ctx.at(c.tie_embeddings ? "model.embed_tokens.weight" : "lm_head.weight");
  Mat logits = linear(xf, head, T, D, V);
  for (int64_t t = 0; t < T; ++t) {
    if (targets[t] < 0) continue;
    double mx = -std::numeric_limits<double>::infinity(), z = 0.0;
    for (int64_t i = 0; i < V; ++i) mx = std::max(mx, logits[t * V + i]);
    for (int64_t i = 0; i < V; ++i) z += std::exp(logits[t * V + i] - mx);
    r.loss_sum += mx + std::log(z) - logits[t * V + targets[t]];
    r.counted++;
  }
  r.logits = std::move(logits);
  return r;
}

}  // namespace troupe::test
