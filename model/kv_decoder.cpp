// KV-cache forward over backend ops (see kv_decoder.hpp). The layer math
// mirrors Stage::forward_steps line for line; the differences are RoPE at
// per-sequence positions with the cache writes (Backend::rope_kv_append) and
// attention over the cache (Backend::attention_cached).
#include "model/kv_decoder.hpp"

#include <cmath>
#include <stdexcept>
#include <string>

#include "model/params.hpp"
#include "model/stage.hpp"
#include "moe/arena.hpp"
#include "moe/moe_layer.hpp"

namespace troupe::model {

using kernels::Tensor;

struct KvDecoder::Work {
  explicit Work(kernels::Backend& be) : arena(be) {}
  moe::Arena arena;
  Tensor ids;                     // [T] i32, T = batch * width
  Tensor x, mid, xn, rstd;        // [T,D] residual, [T,D] after attention, [T,D] normed, [T]
  Tensor q, k, v, att;            // [B,W,H,hd]
  moe::ExpertActs dense;          // [T,F] (dense FFN)
  std::unique_ptr<moe::MoeLayer> moe;  // one for all layers: no backward keeps its state
  Tensor logits;                  // [T,V]
};

KvDecoder::KvDecoder(kernels::Backend& be, const ModelConfig& c, int64_t batch)
    : be_(be), cfg_(c), batch_(batch), is_moe_(c.ffn == Ffn::moe) {
  if (batch <= 0) throw std::invalid_argument("KvDecoder: batch must be positive");
  build_param_layout(c);  // validates the config
  // Dropless at inference (see the top of kv_decoder.hpp).
  cfg_.capacity_factor = 0.0;
  const int64_t H = c.n_heads, hd = c.d_model / c.n_heads;
  for (int64_t l = 0; l < c.n_layers; ++l) {
    k_cache_.push_back(be.zeros({batch, c.seq_len, H, hd}));
    v_cache_.push_back(be.zeros({batch, c.seq_len, H, hd}));
  }
}

KvDecoder::~KvDecoder() = default;

int64_t KvDecoder::cache_elements() const {
  int64_t n = 0;
  for (size_t l = 0; l < k_cache_.size(); ++l) n += k_cache_[l].numel() + v_cache_[l].numel();
  return n;
}

void KvDecoder::move_sequence(int64_t from, int64_t to, int64_t length) {
  if (from < 0 || from >= batch_ || to < 0 || to >= batch_ || length < 0 || length > cfg_.seq_len)
    throw std::invalid_argument("KvDecoder::move_sequence: row " + std::to_string(from) + " to " + std::to_string(to) +
                                ", " + std::to_string(length) + " positions, in a cache of " + std::to_string(batch_) +
                                " x " + std::to_string(cfg_.seq_len));
  if (from == to || length == 0) return;
  const int64_t D = cfg_.d_model, C = cfg_.seq_len;
  for (size_t l = 0; l < k_cache_.size(); ++l)
    for (auto* cache : {&k_cache_[l], &v_cache_[l]})
      be_.copy(cache->view(to * C * D, {length * D}), cache->view(from * C * D, {length * D}));
}

KvDecoder::Work& KvDecoder::work_for(int64_t width, int64_t rows) {
  if (auto it = work_.find({width, rows}); it != work_.end()) return *it->second;
  // Width-1 workspaces (decode steps: one per live-row count, at most
  // batch()) are kept; of the wider ones (prefills, recomputes: widths times
  // row counts) only the newest, or a continuous batch's recomputes would
  // keep one per combination.
  if (width > 1) std::erase_if(work_, [](const auto& e) { return e.first.first > 1; });
  auto& slot = work_[{width, rows}];
  slot = std::make_unique<Work>(be_);
  Work& wk = *slot;
  auto& a = wk.arena;
  const int64_t B = rows, T = B * width, D = cfg_.d_model, H = cfg_.n_heads, hd = D / H;
  wk.ids = a.i32({T});
  wk.x = a.f32({T, D});
  wk.mid = a.f32({T, D});
  wk.xn = a.f32({T, D});
  wk.rstd = a.f32({T});
  for (Tensor* t : {&wk.q, &wk.k, &wk.v, &wk.att}) *t = a.f32({B, width, H, hd});
  if (is_moe_) {
    moe::MoeOptions mo = moe_options(cfg_);
    // The aux loss never changes routing; skip computing it. A selection
    // bias does change routing and stays.
    if (mo.balance == moe::Balance::aux_loss) mo.balance = moe::Balance::none;
    wk.moe = std::make_unique<moe::MoeLayer>(a, mo, T, D);
  } else {
    const int64_t F = cfg_.dense_hidden;
    wk.dense = {a.f32({T, F}), a.f32({T, F}), a.f32({T, F})};
  }
  wk.logits = a.f32({T, cfg_.vocab_size});
  return wk;
}

const Tensor& KvDecoder::forward(const ModelWeights& w, std::span<const int32_t> tokens,
                                 int64_t width, std::span<const int32_t> pos) {
  const int64_t B = static_cast<int64_t>(pos.size()), C = cfg_.seq_len, V = cfg_.vocab_size;
  if (B < 1 || B > batch_)
    throw std::invalid_argument("KvDecoder::forward: " + std::to_string(B) + " sequences for a cache of " +
                                std::to_string(batch_));
  if (width < 1 || width > C)
    throw std::invalid_argument("KvDecoder::forward: width " + std::to_string(width) +
                                " outside [1, " + std::to_string(C) + "]");
  if (static_cast<int64_t>(tokens.size()) != B * width)
    throw std::invalid_argument("KvDecoder::forward: expected " + std::to_string(B * width) + " tokens for " +
                                std::to_string(B) + " sequences, got " + std::to_string(tokens.size()));
  for (int32_t t : tokens)
    if (t < 0 || t >= V)
      throw std::invalid_argument("KvDecoder::forward: token " + std::to_string(t) +
                                  " outside the vocabulary of " + std::to_string(V));
  for (size_t b = 0; b < pos.size(); ++b)
    if (pos[b] < 0 || pos[b] + width > C)
      throw std::invalid_argument("KvDecoder::forward: sequence " + std::to_string(b) + " at position " +
                                  std::to_string(pos[b]) + " with " + std::to_string(width) +
                                  " new tokens does not fit the context of " + std::to_string(C));
  Work& wk = work_for(width, B);
  const int64_t T = B * width, D = cfg_.d_model, hd = D / cfg_.n_heads;
  const float eps = static_cast<float>(cfg_.norm_eps), theta = static_cast<float>(cfg_.rope_theta);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));

  be_.upload_i32(wk.ids, tokens);
  be_.embedding_forward(wk.x, w.embed, wk.ids);
  for (size_t l = 0; l < w.layers.size(); ++l) {
    const LayerWeights& W = w.layers[l];
    be_.rmsnorm_forward(wk.xn, wk.rstd, wk.x, W.ln1, eps);
    be_.gemm(false, true, T, D, D, 1.0f, wk.xn, W.wq, 0.0f, wk.q);
    be_.gemm(false, true, T, D, D, 1.0f, wk.xn, W.wk, 0.0f, wk.k);
    be_.gemm(false, true, T, D, D, 1.0f, wk.xn, W.wv, 0.0f, wk.v);
    // RoPE at each sequence's own positions, and this chunk's keys and
    // values into the cache rows at pos[b]: one op for the whole batch.
    const Tensor kc = B == batch_ ? k_cache_[l] : k_cache_[l].rows(0, B);
    const Tensor vc = B == batch_ ? v_cache_[l] : v_cache_[l].rows(0, B);
    be_.rope_kv_append(wk.q, wk.k, wk.v, kc, vc, pos, theta);
    be_.attention_cached(wk.att, wk.q, kc, vc, pos, scale);
    be_.copy(wk.mid, wk.x);
    be_.gemm(false, true, T, D, D, 1.0f, wk.att, W.wo, 1.0f, wk.mid);
    be_.rmsnorm_forward(wk.xn, wk.rstd, wk.mid, W.ln2, eps);
    be_.copy(wk.x, wk.mid);
    if (is_moe_) wk.moe->forward(be_, wk.x, wk.xn, W.moe);
    else moe::ffn_forward(be_, wk.x, wk.dense, wk.xn, W.dense);
  }
  be_.rmsnorm_forward(wk.xn, wk.rstd, wk.x, w.norm, eps);
  be_.gemm(false, true, T, V, D, 1.0f, wk.xn, w.lm_head, 0.0f, wk.logits);
  return wk.logits;
}

}  // namespace troupe::model
