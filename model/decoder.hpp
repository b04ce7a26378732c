// The MoE decoder with explicit forward and backward for one microbatch:
// embedding -> L x (RMSNorm -> causal MHA with RoPE -> residual; RMSNorm ->
// FFN (dense SwiGLU or MoE) -> residual) -> RMSNorm -> LM head -> cross-entropy.
// All activations live in an arena allocated once in the constructor; every
// forward/backward reuses it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kernels/backend.hpp"
#include "model/config.hpp"
#include "model/weights.hpp"
#include "moe/arena.hpp"
#include "moe/moe_layer.hpp"

namespace troupe::model {

struct ForwardResult {
  double loss_sum = 0.0;   // sum of token cross-entropies over counted tokens
  int64_t counted = 0;     // tokens with a target (not -1)
  double aux_loss = 0.0;   // sum over MoE layers of the aux loss (0 unless aux_loss)
};

// MoE options of a model config (throws on an unknown balance method).
moe::MoeOptions moe_options(const ModelConfig& config);

class Decoder {
 public:
  // `batch` sequences of config.seq_len tokens per microbatch.
  Decoder(kernels::Backend& backend, const ModelConfig& config, int64_t batch);
  ~Decoder();
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  int64_t batch() const { return batch_; }
  int64_t tokens() const { return T_; }
  const ModelConfig& config() const { return cfg_; }

  // inputs/targets: [batch*seq_len] (targets -1 = no loss). Ids are checked
  // against the vocabulary (std::invalid_argument).
  ForwardResult forward(const ModelWeights& w, std::span<const int32_t> inputs,
                        std::span<const int32_t> targets);
  // Backward of loss_scale * loss_sum + aux_scale * aux_loss for the last
  // forward; gradients ACCUMULATE into `grads` (same layout as `w`).
  void backward(const ModelWeights& w, const ModelWeights& grads, double loss_scale,
                double aux_scale);

  // Logits [T,V] of the last forward.
  const kernels::Tensor& logits() const { return logits_; }
  // Assignments routed to each expert, per MoE layer, in the last forward
  // (empty for a dense model).
  std::vector<std::vector<int64_t>> expert_load() const;
  // Assignments dropped by the capacity limit per MoE layer, last forward.
  std::vector<int64_t> dropped() const;
  // Activation memory in floats (arena), for reports.
  int64_t arena_elements() const { return arena_.used(); }

 private:
  struct LayerActs {
    kernels::Tensor xn1, rstd1;      // [T,D], [T]
    kernels::Tensor q, k, v, att;    // [B,S,H,hd] (q, k after RoPE)
    kernels::Tensor lse;             // [B,H,S]
    kernels::Tensor xn2, rstd2;      // [T,D], [T]
    moe::ExpertActs dense;           // [T,H] (dense FFN)
    std::unique_ptr<moe::MoeLayer> moe;
  };

  kernels::Backend& be_;
  ModelConfig cfg_;
  int64_t batch_, T_, D_, V_;
  bool is_moe_;
  moe::Arena arena_;
  kernels::Tensor ids_, targets_;          // [T] i32
  std::vector<kernels::Tensor> res_;       // 2L+1 residual streams [T,D]
  std::vector<LayerActs> layers_;
  kernels::Tensor xf_, rstdf_;             // [T,D], [T]
  kernels::Tensor logits_, losses_;        // [T,V], [T]
  // Backward scratch (shared by all layers).
  kernels::Tensor dres_, dxn_, datt_;      // [T,D]
  kernels::Tensor dq_rot_, dk_rot_, dv_;   // [B,S,H,hd]
  kernels::Tensor dq_, dk_;                // [B,S,H,hd]
  kernels::Tensor dlogits_;                // [T,V]
  moe::ExpertActs ddense_;                 // [T,H]
  std::unique_ptr<moe::MoeScratch> moe_scratch_;
  std::vector<float> losses_host_;
};

// Model FLOPs of one forward+backward over `tokens` tokens (matmuls and
// attention; 3x the forward), counting k routed experts per token.
double train_flops_per_token(const ModelConfig& config);

}  // namespace troupe::model
