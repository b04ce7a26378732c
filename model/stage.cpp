// Stage forward/backward over backend ops: the decoder's layers, shared by the
// single-process Decoder (one stage, both ends) and the pipeline runtime.
#include "model/stage.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

#include "model/params.hpp"

namespace troupe::model {

using kernels::Tensor;

moe::MoeOptions moe_options(const ModelConfig& c) {
  moe::MoeOptions o;
  o.n_experts = c.n_experts;
  o.top_k = c.top_k;
  o.expert_hidden = c.expert_hidden;
  o.shared_hidden = c.shared_experts * c.expert_hidden;
  o.capacity_factor = c.capacity_factor;
  o.balance = c.balance;
  o.aux_alpha = c.aux_loss_alpha;
  return o;
}

std::vector<std::pair<int64_t, int64_t>> split_layers(int64_t n_layers, int64_t stages) {
  if (stages < 1 || stages > n_layers)
    throw std::invalid_argument("cannot split " + std::to_string(n_layers) + " layers into " +
                                std::to_string(stages) + " pipeline stages (need 1 <= stages <= n_layers)");
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t b = 0;
  for (int64_t i = 0; i < stages; ++i) {
    const int64_t n = n_layers / stages + (i < n_layers % stages ? 1 : 0);
    out.emplace_back(b, b + n);
    b += n;
  }
  return out;
}

Stage::Stage(kernels::Backend& be, const ModelConfig& c, int64_t batch, int64_t lb, int64_t le,
             bool first, bool last, int64_t n_slots)
    : be_(be), cfg_(c), batch_(batch), T_(batch * c.seq_len), D_(c.d_model), V_(c.vocab_size),
      lb_(lb), le_(le), first_(first), last_(last), is_moe_(c.ffn == Ffn::moe), arena_(be) {
  if (batch <= 0) throw std::invalid_argument("Stage: batch must be positive");
  build_param_layout(c);  // validates the config
  if (n_slots <= 0) throw std::invalid_argument("Stage: slots must be positive");
  if (lb < 0 || le < lb || le > c.n_layers)
    throw std::invalid_argument("Stage: layer range [" + std::to_string(lb) + ", " +
                                std::to_string(le) + ") outside the model's " +
                                std::to_string(c.n_layers) + " layers");
  const int64_t B = batch, S = c.seq_len, H = c.n_heads, hd = c.d_model / c.n_heads;
  const kernels::Shape bshd{B, S, H, hd};
  auto& a = arena_;
  moe::MoeOptions mo;
  if (is_moe_) mo = moe_options(c);
  for (int64_t si = 0; si < n_slots; ++si) {
    Slot s;
    if (first_) s.ids = a.i32({T_});
    if (last_) s.targets = a.i32({T_});
    for (int64_t i = 0; i < 2 * (le - lb) + 1; ++i) s.res.push_back(a.f32({T_, D_}));
    for (int64_t l = lb; l < le; ++l) {
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
      s.layers.push_back(std::move(L));
    }
    if (last_) {
      s.xf = a.f32({T_, D_});
      s.rstdf = a.f32({T_});
      s.logits = a.f32({T_, V_});
      s.losses = a.f32({T_});
    }
    s.wg = std::make_unique<moe::WeightGrads>(a);  // storage taken at the slot's first B
    slots_.push_back(std::move(s));
  }
  dres_ = a.f32({T_, D_});
  dxn_ = a.f32({T_, D_});
  datt_ = a.f32({T_, D_});
  dq_rot_ = a.f32(bshd);
  dk_rot_ = a.f32(bshd);
  dv_ = a.f32(bshd);
  dq_ = a.f32(bshd);
  dk_ = a.f32(bshd);
  if (last_) dlogits_ = a.f32({T_, V_});
  if (is_moe_) {
    moe_scratch_ = std::make_unique<moe::MoeScratch>(a, mo, T_, D_);
  } else {
    const int64_t F = c.dense_hidden;
    ddense_ = {a.f32({T_, F}), a.f32({T_, F}), a.f32({T_, F})};
  }
}

Stage::~Stage() = default;

Stage::Slot& Stage::slot(int64_t i) {
  if (i < 0 || i >= static_cast<int64_t>(slots_.size()))
    throw std::out_of_range("Stage: activation slot " + std::to_string(i) + " of " +
                            std::to_string(slots_.size()));
  return slots_[static_cast<size_t>(i)];
}
const Stage::Slot& Stage::slot(int64_t i) const { return const_cast<Stage*>(this)->slot(i); }

int64_t Stage::check_targets(std::span<const int32_t> targets) const {
  if (!last_) return 0;
  if (static_cast<int64_t>(targets.size()) != T_)
    throw std::invalid_argument("Stage: expected " + std::to_string(T_) + " targets, got " +
                                std::to_string(targets.size()));
  int64_t counted = 0;
  for (int32_t t : targets) {
    if (t < -1 || t >= V_)
      throw std::invalid_argument("Decoder::forward: target " + std::to_string(t) +
                                  " outside the vocabulary of " + std::to_string(V_));
    if (t >= 0) counted++;
  }
  return counted;
}

void Stage::prepare_tokens(Slot& s, std::span<const int32_t> inputs,
                           std::span<const int32_t> targets) {
  if (!first_) throw std::logic_error("Stage::forward_tokens on a stage that is not the first");
  if (static_cast<int64_t>(inputs.size()) != T_)
    throw std::invalid_argument("Decoder::forward: expected " + std::to_string(T_) +
                                " inputs and targets, got " + std::to_string(inputs.size()) +
                                " and " + std::to_string(targets.size()));
  for (int32_t t : inputs)
    if (t < 0 || t >= V_)
      throw std::invalid_argument("Decoder::forward: input token " + std::to_string(t) +
                                  " outside the vocabulary of " + std::to_string(V_));
  const int64_t counted = check_targets(targets);
  start(s, Cursor::forward);
  s.cur.result.counted = counted;
  be_.upload_i32(s.ids, inputs);
  if (last_) be_.upload_i32(s.targets, targets);
}

void Stage::prepare_hidden(Slot& s, std::span<const float> hidden,
                           std::span<const int32_t> targets) {
  if (first_) throw std::logic_error("Stage::forward_hidden on the first stage");
  if (static_cast<int64_t>(hidden.size()) != T_ * D_)
    throw std::invalid_argument("Stage: expected hidden of " + std::to_string(T_ * D_) +
                                " floats, got " + std::to_string(hidden.size()));
  const int64_t counted = check_targets(targets);
  start(s, Cursor::forward);
  s.cur.result.counted = counted;
  be_.upload_f32(s.res[0], hidden);
  if (last_) be_.upload_i32(s.targets, targets);
}

void Stage::start(Slot& s, Cursor::Phase phase) {
  if (s.cur.phase != Cursor::idle)
    throw std::logic_error("Stage: a pass starts on an activation slot whose previous pass is suspended");
  if (s.wg->pending())  // a forward would overwrite the activations the W reads
    throw std::logic_error("Stage: a pass starts on an activation slot whose weight pass (W) has not run");
  s.cur = Cursor{};
  s.cur.phase = phase;
}

void Stage::abandon_passes() {
  for (Slot& s : slots_) {
    s.cur = Cursor{};
    s.wg->drop();
  }
  backward_slot_ = -1;
}

ForwardResult Stage::forward_tokens(int64_t si, const ModelWeights& w, std::span<const int32_t> inputs,
                                    std::span<const int32_t> targets) {
  Slot& s = slot(si);
  for (auto* ex = begin_forward_tokens(si, w, inputs, targets); ex; ex = resume_forward(si, w))
    run_local_experts(s, w, nullptr);
  return s.cur.result;
}

ForwardResult Stage::forward_hidden(int64_t si, const ModelWeights& w, std::span<const float> hidden,
                                    std::span<const int32_t> targets) {
  Slot& s = slot(si);
  for (auto* ex = begin_forward_hidden(si, w, hidden, targets); ex; ex = resume_forward(si, w))
    run_local_experts(s, w, nullptr);
  return s.cur.result;
}

const MoeExchange* Stage::begin_forward_tokens(int64_t si, const ModelWeights& w,
                                               std::span<const int32_t> inputs,
                                               std::span<const int32_t> targets) {
  Slot& s = slot(si);
  prepare_tokens(s, inputs, targets);
  be_.embedding_forward(s.res[0], w.embed, s.ids);
  return forward_steps(s, w);
}

const MoeExchange* Stage::begin_forward_hidden(int64_t si, const ModelWeights& w,
                                               std::span<const float> hidden,
                                               std::span<const int32_t> targets) {
  Slot& s = slot(si);
  prepare_hidden(s, hidden, targets);
  return forward_steps(s, w);
}

const MoeExchange* Stage::resume_forward(int64_t si, const ModelWeights& w) {
  Slot& s = slot(si);
  if (s.cur.phase != Cursor::forward || !s.cur.at_experts)
    throw std::logic_error("Stage::resume_forward: the slot's forward is not waiting for experts");
  return forward_steps(s, w);
}

ForwardResult Stage::forward_result(int64_t si) const {
  const Slot& s = slot(si);
  if (s.cur.phase != Cursor::idle) throw std::logic_error("Stage::forward_result: the forward has not finished");
  return s.cur.result;
}

const MoeExchange* Stage::suspend(Slot& s, size_t li, bool backward) {
  Cursor& c = s.cur;
  c.at_experts = true;
  const moe::MoeLayer& m = *s.layers[li].moe;
  c.ex.layer = lb_ + static_cast<int64_t>(li);
  c.ex.backward = backward;
  c.ex.plan = &m.plan();
  c.ex.moe = &m;
  c.ex.in = backward ? c.ms.dy : m.xs();
  c.ex.out = backward ? c.ms.dxs : m.expert_out();
  c.ex.dout = backward ? dres_ : Tensor();
  return &c.ex;
}

void Stage::run_local_experts(Slot& s, const ModelWeights& w, const ModelWeights* g) {
  const size_t li = static_cast<size_t>(s.cur.ex.layer - lb_);
  moe::MoeLayer& m = *s.layers[li].moe;
  if (g) m.run_experts_backward(be_, g->layers[static_cast<size_t>(s.cur.ex.layer)].moe.experts, s.cur.ms,
                                w.layers[static_cast<size_t>(s.cur.ex.layer)].moe.experts, s.cur.wg);
  else m.run_experts_forward(be_, w.layers[static_cast<size_t>(s.cur.ex.layer)].moe.experts);
}

const MoeExchange* Stage::forward_steps(Slot& s, const ModelWeights& w) {
  Cursor& c = s.cur;
  ForwardResult& r = c.result;
  const int64_t D = D_, T = T_;
  const float eps = static_cast<float>(cfg_.norm_eps), theta = static_cast<float>(cfg_.rope_theta);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D / cfg_.n_heads));
  for (; c.layer < s.layers.size(); ++c.layer) {
    const size_t i = c.layer;
    LayerActs& A = s.layers[i];
    const LayerWeights& W = w.layers[static_cast<size_t>(lb_) + i];
    const Tensor &x = s.res[2 * i], &mid = s.res[2 * i + 1], &out = s.res[2 * i + 2];
    if (c.at_experts) {  // resumed: the experts' outputs are in place
      c.at_experts = false;
      r.aux_loss += A.moe->forward_end(be_, out, A.xn2, W.moe);
      continue;
    }
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
      A.moe->forward_begin(be_, A.xn2, W.moe);
      return suspend(s, i, false);
    }
    moe::ffn_forward(be_, out, A.dense, A.xn2, W.dense);
  }
  c.phase = Cursor::idle;
  if (!last_) return nullptr;
  be_.rmsnorm_forward(s.xf, s.rstdf, s.res.back(), w.norm, eps);
  be_.gemm(false, true, T, V_, D, 1.0f, s.xf, w.lm_head, 0.0f, s.logits);
  be_.cross_entropy_forward(s.losses, s.logits, s.targets, -1);
  // Sum on the host in double, in token order: deterministic on every backend.
  losses_host_.resize(static_cast<size_t>(T));
  be_.download(losses_host_.data(), s.losses, losses_host_.size() * sizeof(float));
  for (float v : losses_host_) r.loss_sum += static_cast<double>(v);
  return nullptr;
}

void Stage::read_output(int64_t si, std::span<float> out) const {
  if (last_) throw std::logic_error("Stage::read_output on the last stage");
  if (static_cast<int64_t>(out.size()) != T_ * D_)
    throw std::invalid_argument("Stage::read_output: buffer of " + std::to_string(out.size()) +
                                " floats, expected " + std::to_string(T_ * D_));
  be_.download(out.data(), slot(si).res.back(), out.size() * sizeof(float));
}

void Stage::backward(int64_t si, const ModelWeights& w, const ModelWeights& g,
                     std::span<const float> dout, double loss_scale, double aux_scale) {
  Slot& s = slot(si);
  for (auto* ex = begin_backward(si, w, g, dout, loss_scale, aux_scale); ex; ex = resume_backward(si, w, g))
    run_local_experts(s, w, &g);
}

void Stage::backward_input(int64_t si, const ModelWeights& w, const ModelWeights& g,
                           std::span<const float> dout, double loss_scale, double aux_scale) {
  Slot& s = slot(si);
  for (auto* ex = begin_backward(si, w, g, dout, loss_scale, aux_scale, true); ex; ex = resume_backward(si, w, g))
    run_local_experts(s, w, &g);
}

void Stage::backward_weights(int64_t si) {
  Slot& s = slot(si);
  if (s.cur.phase == Cursor::backward)
    throw std::logic_error("Stage::backward_weights: the B pass of slot " + std::to_string(si) + " has not finished");
  s.wg->run(be_);
}

bool Stage::weights_pending(int64_t si) const { return slot(si).wg->pending(); }

const MoeExchange* Stage::begin_backward(int64_t si, const ModelWeights& w, const ModelWeights& g,
                                         std::span<const float> dout, double loss_scale,
                                         double aux_scale, bool defer_weights) {
  Slot& s = slot(si);
  if (backward_slot_ >= 0)
    throw std::logic_error("Stage::begin_backward on slot " + std::to_string(si) + " while the backward of slot " +
                           std::to_string(backward_slot_) + " is suspended (they share the gradient scratch)");
  if (!last_ && static_cast<int64_t>(dout.size()) != T_ * D_)
    throw std::invalid_argument("Stage::backward: expected an output gradient of " +
                                std::to_string(T_ * D_) + " floats, got " +
                                std::to_string(dout.size()));
  if (last_ && !dout.empty() && static_cast<int64_t>(dout.size()) != T_ * V_)
    throw std::invalid_argument("Stage::backward: expected no gradient or a logits gradient of " +
                                std::to_string(T_ * V_) + " floats, got " +
                                std::to_string(dout.size()));
  start(s, Cursor::backward);
  s.cur.layer = s.layers.size();
  s.cur.aux_scale = aux_scale;
  moe::WeightGrads* wg = nullptr;
  if (defer_weights) {
    wg = s.wg.get();
    wg->begin();
  }
  s.cur.wg = wg;
  const int64_t D = D_, T = T_;
  // dres_ carries d loss / d residual stream down the layers; every branch
  // adds its input gradient into it.
  if (last_) {
    // LM head and final norm. A custom loss head hands d total / d logits in;
    // else it is the cross-entropy's.
    // dlogits is the LM head's dY: held when W is deferred.
    const Tensor dlogits = moe::held(wg, dlogits_);
    if (!dout.empty()) {
      be_.upload_f32(dlogits, dout);
    } else {
      be_.cross_entropy_backward_overwrite(dlogits, s.logits, s.targets, -1, static_cast<float>(loss_scale));
    }
    be_.gemm(false, false, T, D, V_, 1.0f, dlogits, w.lm_head, 0.0f, dxn_);
    moe::weight_gemm(be_, wg, true, false, V_, D, T, 1.0f, dlogits, s.xf, 1.0f, g.lm_head);
    be_.rmsnorm_backward_overwrite(dres_, g.norm, dxn_, s.res.back(), w.norm, s.rstdf);
  } else {
    be_.upload_f32(dres_, dout);
  }
  return backward_steps(si, s, w, g);
}

const MoeExchange* Stage::resume_backward(int64_t si, const ModelWeights& w, const ModelWeights& g) {
  Slot& s = slot(si);
  if (s.cur.phase != Cursor::backward || !s.cur.at_experts)
    throw std::logic_error("Stage::resume_backward: the slot's backward is not waiting for experts");
  return backward_steps(si, s, w, g);
}

const MoeExchange* Stage::backward_steps(int64_t si, Slot& s, const ModelWeights& w, const ModelWeights& g) {
  Cursor& c = s.cur;
  const int64_t D = D_, T = T_;
  const float theta = static_cast<float>(cfg_.rope_theta);
  const float scale = 1.0f / std::sqrt(static_cast<float>(D / cfg_.n_heads));
  for (; c.layer > 0; --c.layer) {
    const size_t li = c.layer - 1;
    LayerActs& A = s.layers[li];
    const LayerWeights& W = w.layers[static_cast<size_t>(lb_) + li];
    const LayerWeights& G = g.layers[static_cast<size_t>(lb_) + li];
    const Tensor &x = s.res[2 * li], &mid = s.res[2 * li + 1];
    // FFN block.
    if (c.at_experts) {  // resumed: the experts' input gradients are in place
      c.at_experts = false;
      backward_slot_ = -1;
      A.moe->backward_end(be_, dxn_, G.moe, c.ms, A.xn2, W.moe, c.aux_scale, c.wg);
    } else {
      be_.fill(dxn_, 0.0f);
      if (is_moe_) {
        c.ms = *moe_scratch_;
        if (c.wg) c.ms.dy = c.wg->hold(c.ms.dy);  // the experts' dY
        A.moe->backward_begin(be_, dxn_, G.moe, c.ms, dres_, A.xn2, W.moe, c.wg);
        backward_slot_ = si;
        return suspend(s, li, true);
      }
      moe::ffn_backward(be_, dxn_, G.dense, ddense_, dres_, A.xn2, A.dense, W.dense, c.wg);
    }
    be_.rmsnorm_backward(dres_, G.ln2, dxn_, mid, W.ln2, A.rstd2);
    // Attention block. dres_ (the output projection's dY) runs on down the
    // layers: a deferred W needs a copy; dq, dk, dv (the q/k/v projections'
    // dY) are written where W finds them.
    be_.gemm(false, false, T, D, D, 1.0f, dres_, W.wo, 0.0f, datt_);
    moe::weight_gemm(be_, c.wg, true, false, D, D, T, 1.0f, moe::kept(be_, c.wg, dres_), A.att, 1.0f, G.wo);
    const Tensor dq = moe::held(c.wg, dq_), dk = moe::held(c.wg, dk_), dv = moe::held(c.wg, dv_);
    // One contribution each: written, not added (no zeroing passes).
    be_.attention_backward_overwrite(dq_rot_, dk_rot_, dv, datt_.reshape(A.att.shape()), A.q, A.k,
                                     A.v, A.att, A.lse, scale);
    be_.rope_backward_overwrite(dq, dq_rot_, 0, theta);
    be_.rope_backward_overwrite(dk, dk_rot_, 0, theta);
    be_.gemm(false, false, T, D, D, 1.0f, dq, W.wq, 0.0f, dxn_);
    be_.gemm(false, false, T, D, D, 1.0f, dk, W.wk, 1.0f, dxn_);
    be_.gemm(false, false, T, D, D, 1.0f, dv, W.wv, 1.0f, dxn_);
    moe::weight_gemm(be_, c.wg, true, false, D, D, T, 1.0f, dq, A.xn1, 1.0f, G.wq);
    moe::weight_gemm(be_, c.wg, true, false, D, D, T, 1.0f, dk, A.xn1, 1.0f, G.wk);
    moe::weight_gemm(be_, c.wg, true, false, D, D, T, 1.0f, dv, A.xn1, 1.0f, G.wv);
    be_.rmsnorm_backward(dres_, G.ln1, dxn_, x, W.ln1, A.rstd1);
  }
  c.phase = Cursor::idle;
  if (first_) {
    if (c.wg) c.wg->embedding_backward(g.embed, c.wg->keep(be_, dres_), s.ids);
    else be_.embedding_backward(g.embed, dres_, s.ids);
  }
  c.wg = nullptr;
  return nullptr;
}

void Stage::read_input_grad(std::span<float> out) const {
  if (first_) throw std::logic_error("Stage::read_input_grad on the first stage");
  if (static_cast<int64_t>(out.size()) != T_ * D_)
    throw std::invalid_argument("Stage::read_input_grad: buffer of " + std::to_string(out.size()) +
                                " floats, expected " + std::to_string(T_ * D_));
  be_.download(out.data(), dres_, out.size() * sizeof(float));
}

const Tensor& Stage::logits(int64_t si) const {
  if (!last_) throw std::logic_error("Stage::logits on a stage that is not the last");
  return slot(si).logits;
}

std::vector<std::vector<int64_t>> Stage::expert_load(int64_t si) const {
  std::vector<std::vector<int64_t>> out;
  for (const LayerActs& A : slot(si).layers)
    if (A.moe) out.push_back(A.moe->plan().routed);
  return out;
}

std::vector<int64_t> Stage::dropped(int64_t si) const {
  std::vector<int64_t> out;
  for (const LayerActs& A : slot(si).layers)
    if (A.moe) out.push_back(A.moe->plan().dropped);
  return out;
}

}  // namespace troupe::model
