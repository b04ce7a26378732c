// Decoder forward/backward over backend ops; activations in one arena.
#include "model/decoder.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

namespace troupe::model {

using kernels::Tensor;

moe::MoeOptions moe_options(const ModelConfig& c) {
  moe::MoeOptions o;
  o.n_experts = c.n_experts;
  o.top_k = c.top_k;
  o.expert_hidden = c.expert_hidden;
  o.shared_hidden = c.shared_experts * c.expert_hidden;
  o.capacity_factor = c.capacity_factor;
  o.balance = moe::parse_balance(c.balance);
  o.aux_alpha = c.aux_loss_alpha;
  return o;
}

Decoder::Decoder(kernels::Backend& be, const ModelConfig& c, int64_t batch)
    : be_(be), cfg_(c), batch_(batch), T_(batch * c.seq_len), D_(c.d_model), V_(c.vocab_size),
      is_moe_(c.ffn == "moe"), arena_(be) {
  if (batch <= 0) throw std::invalid_argument("Decoder: batch must be positive");
  build_param_layout(c);  // validates the config
  const int64_t B = batch, S = c.seq_len, H = c.n_heads, hd = c.d_model / c.n_heads;
  const kernels::Shape bshd{B, S, H, hd};
  auto& a = arena_;
  ids_ = a.i32({T_});
  targets_ = a.i32({T_});
  for (int64_t i = 0; i < 2 * c.n_layers + 1; ++i) res_.push_back(a.f32({T_, D_}));
  moe::MoeOptions mo;
  if (is_moe_) mo = moe_options(c);
  for (int64_t l = 0; l < c.n_layers; ++l) {
    LayerActs L;
    L.xn1 = a.f32({T_, D_});
    L.rstd1 = a.f32({T_});
    L.q = a.f32(bshd);
    L.k = a.f32(bshd);
    L.v = a.f32(bshd);
    L.att = a.f32(bshd);
    L.lse = a.f32({B, H, S});
    L.xn2 = a.f32({T_, D_});
    L.rstd2 = a.f32({T_});
    if (is_moe_) {
      L.moe = std::make_unique<moe::MoeLayer>(a, mo, T_, D_);
    } else {
      const int64_t F = c.dense_hidden;
      L.dense = {a.f32({T_, F}), a.f32({T_, F}), a.f32({T_, F})};
    }
    layers_.push_back(std::move(L));
  }
  xf_ = a.f32({T_, D_});
  rstdf_ = a.f32({T_});
  logits_ = a.f32({T_, V_});
  losses_ = a.f32({T_});
  dres_ = a.f32({T_, D_});
  dxn_ = a.f32({T_, D_});
  datt_ = a.f32({T_, D_});
  dq_rot_ = a.f32(bshd);
  dk_rot_ = a.f32(bshd);
  dv_ = a.f32(bshd);
  dq_ = a.f32(bshd);
  dk_ = a.f32(bshd);
  dlogits_ = a.f32({T_, V_});
  if (is_moe_) {
    moe_scratch_ = std::make_unique<moe::MoeScratch>(a, mo, T_, D_);
  } else {
    const int64_t F = c.dense_hidden;
    ddense_ = {a.f32({T_, F}), a.f32({T_, F}), a.f32({T_, F})};
  }
}

Decoder::~Decoder() = default;

ForwardResult Decoder::forward(const ModelWeights& w, std::span<const int32_t> inputs,
                               std::span<const int32_t> targets) {
  if (static_cast<int64_t>(inputs.size()) != T_ || static_cast<int64_t>(targets.size()) != T_)
    throw std::invalid_argument("Decoder::forward: expected " + std::to_string(T_) +
                                " inputs and targets, got " + std::to_string(inputs.size()) +
                                " and " + std::to_string(targets.size()));
  ForwardResult r;
  for (int64_t t = 0; t < T_; ++t) {
    if (inputs[t] < 0 || inputs[t] >= V_)
      throw std::invalid_argument("Decoder::forward: input token " + std::to_string(inputs[t]) +
                                  " outside the vocabulary of " + std::to_string(V_));
    if (targets[t] < -1 || targets[t] >= V_)
      throw std::invalid_argument("Decoder::forward: target " + std::to_string(targets[t]) +
                                  " outside the vocabulary of " + std::to_string(V_));
    if (targets[t] >= 0) r.counted++;
  }
  be_.upload_i32(ids_, inputs);
  be_.upload_i32(targets_, targets);

  const int64_t D = D_, T = T_;
  const float eps = static_cast<float>(cfg_.norm_eps), theta = static_cast<float>(cfg_.rope_theta);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D / cfg_.n_heads));
  be_.embedding_forward(res_[0], w.embed, ids_);
  for (size_t l = 0; l < layers_.size(); ++l) {
    LayerActs& A = layers_[l];
    const LayerWeights& W = w.layers[l];
    const Tensor &x = res_[2 * l], &mid = res_[2 * l + 1], &out = res_[2 * l + 2];
    // Attention block: mid = x + o_proj(attn(rope(q), rope(k), v)).
    be_.rmsnorm_forward(A.xn1, A.rstd1, x, W.ln1, eps);
    be_.gemm(false, true, T, D, D, 1.0f, A.xn1, W.wq, 0.0f, A.q);
    be_.gemm(false, true, T, D, D, 1.0f, A.xn1, W.wk, 0.0f, A.k);
    be_.gemm(false, true, T, D, D, 1.0f, A.xn1, W.wv, 0.0f, A.v);
    be_.rope_forward(A.q, A.q, 0, theta);
    be_.rope_forward(A.k, A.k, 0, theta);
    be_.attention_forward(A.att, A.lse, A.q, A.k, A.v, scale);
    be_.copy(mid, x);
    be_.gemm(false, true, T, D, D, 1.0f, A.att, W.wo, 1.0f, mid);
    // FFN block: out = mid + ffn(rmsnorm(mid)); both FFNs add into `out`.
    be_.rmsnorm_forward(A.xn2, A.rstd2, mid, W.ln2, eps);
    be_.copy(out, mid);
    if (is_moe_) {
      r.aux_loss += A.moe->forward(be_, out, A.xn2, W.moe);
    } else {
      moe::ffn_forward(be_, out, A.dense, A.xn2, W.dense);
    }
  }
  be_.rmsnorm_forward(xf_, rstdf_, res_.back(), w.norm, eps);
  be_.gemm(false, true, T, V_, D, 1.0f, xf_, w.lm_head, 0.0f, logits_);
  be_.cross_entropy_forward(losses_, logits_, targets_, -1);
  // Sum on the host in double, in token order: deterministic on every backend.
  losses_host_.resize(static_cast<size_t>(T));
  be_.download(losses_host_.data(), losses_, losses_host_.size() * sizeof(float));
  for (float v : losses_host_) r.loss_sum += static_cast<double>(v);
  return r;
}

void Decoder::backward(const ModelWeights& w, const ModelWeights& g, double loss_scale,
                       double aux_scale) {
  const int64_t D = D_, T = T_;
  const float theta = static_cast<float>(cfg_.rope_theta);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D / cfg_.n_heads));
  // LM head and final norm. dres_ carries d loss / d residual stream down the
  // layers; every branch adds its input gradient into it.
  be_.fill(dlogits_, 0.0f);
  be_.cross_entropy_backward(dlogits_, logits_, targets_, -1, static_cast<float>(loss_scale));
  be_.gemm(false, false, T, D, V_, 1.0f, dlogits_, w.lm_head, 0.0f, dxn_);
  be_.gemm(true, false, V_, D, T, 1.0f, dlogits_, xf_, 1.0f, g.lm_head);
  be_.fill(dres_, 0.0f);
  be_.rmsnorm_backward(dres_, g.norm, dxn_, res_.back(), w.norm, rstdf_);

  for (size_t li = layers_.size(); li-- > 0;) {
    LayerActs& A = layers_[li];
    const LayerWeights& W = w.layers[li];
    const LayerWeights& G = g.layers[li];
    const Tensor &x = res_[2 * li], &mid = res_[2 * li + 1];
    // FFN block.
    be_.fill(dxn_, 0.0f);
    if (is_moe_) {
      A.moe->backward(be_, dxn_, G.moe, *moe_scratch_, dres_, A.xn2, W.moe, aux_scale);
    } else {
      moe::ffn_backward(be_, dxn_, G.dense, ddense_, dres_, A.xn2, A.dense, W.dense);
    }
    be_.rmsnorm_backward(dres_, G.ln2, dxn_, mid, W.ln2, A.rstd2);
    // Attention block.
    be_.gemm(false, false, T, D, D, 1.0f, dres_, W.wo, 0.0f, datt_);
    be_.gemm(true, false, D, D, T, 1.0f, dres_, A.att, 1.0f, G.wo);
    be_.fill(dq_rot_, 0.0f);
    be_.fill(dk_rot_, 0.0f);
    be_.fill(dv_, 0.0f);
    be_.attention_backward(dq_rot_, dk_rot_, dv_, datt_.reshape(A.att.shape()), A.q, A.k, A.v,
                           A.att, A.lse, scale);
    be_.fill(dq_, 0.0f);
    be_.fill(dk_, 0.0f);
    be_.rope_backward(dq_, dq_rot_, 0, theta);
    be_.rope_backward(dk_, dk_rot_, 0, theta);
    be_.gemm(false, false, T, D, D, 1.0f, dq_, W.wq, 0.0f, dxn_);
    be_.gemm(false, false, T, D, D, 1.0f, dk_, W.wk, 1.0f, dxn_);
    be_.gemm(false, false, T, D, D, 1.0f, dv_, W.wv, 1.0f, dxn_);
    be_.gemm(true, false, D, D, T, 1.0f, dq_, A.xn1, 1.0f, G.wq);
    be_.gemm(true, false, D, D, T, 1.0f, dk_, A.xn1, 1.0f, G.wk);
    be_.gemm(true, false, D, D, T, 1.0f, dv_, A.xn1, 1.0f, G.wv);
    be_.rmsnorm_backward(dres_, G.ln1, dxn_, x, W.ln1, A.rstd1);
  }
  be_.embedding_backward(g.embed, dres_, ids_);
}

std::vector<std::vector<int64_t>> Decoder::expert_load() const {
  std::vector<std::vector<int64_t>> out;
  for (const LayerActs& A : layers_)
    if (A.moe) out.push_back(A.moe->plan().routed);
  return out;
}

std::vector<int64_t> Decoder::dropped() const {
  std::vector<int64_t> out;
  for (const LayerActs& A : layers_)
    if (A.moe) out.push_back(A.moe->plan().dropped);
  return out;
}

double train_flops_per_token(const ModelConfig& c) {
  const double D = static_cast<double>(c.d_model), V = static_cast<double>(c.vocab_size);
  const double S = static_cast<double>(c.seq_len);
  // Matmul weights touched per token (2 FLOPs per weight per token forward).
  double ffn = 0.0;
  if (c.ffn == "dense") {
    ffn = 3.0 * D * static_cast<double>(c.dense_hidden);
  } else {
    const double F = static_cast<double>(c.expert_hidden);
    ffn = static_cast<double>(c.n_experts) * D + static_cast<double>(c.top_k) * 3.0 * D * F +
          static_cast<double>(c.shared_experts) * 3.0 * D * F;
  }
  const double per_layer = 4.0 * D * D + ffn;
  // Causal attention: QK^T and AV over (S+1)/2 keys on average, 2 FLOPs each.
  const double attn = 2.0 * 2.0 * D * (S + 1.0) / 2.0;
  const double fwd = 2.0 * (static_cast<double>(c.n_layers) * per_layer + V * D) +
                     static_cast<double>(c.n_layers) * attn;
  return 3.0 * fwd;
}

}  // namespace troupe::model
