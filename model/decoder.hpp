// The MoE decoder with explicit forward and backward for one microbatch:
// embedding -> L x (RMSNorm -> causal MHA with RoPE -> residual; RMSNorm ->
// FFN (dense SwiGLU or MoE) -> residual) -> RMSNorm -> LM head -> cross-entropy.
// It is the pipeline Stage that holds every layer and both ends
// (model/stage.hpp), so the single-process model and the pipeline runtime
// share one implementation. All activations live in an arena allocated once
// in the constructor; every forward/backward reuses it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kernels/backend.hpp"
#include "model/config.hpp"
#include "model/stage.hpp"
#include "model/weights.hpp"

namespace troupe::model {

class Decoder {
 public:
  // `batch` sequences of config.seq_len tokens per microbatch.
  Decoder(kernels::Backend& backend, const ModelConfig& config, int64_t batch);
  ~Decoder();
  Decoder(const Decoder&) = delete;
  Decoder& operator=(const Decoder&) = delete;

  int64_t batch() const { return batch_; }
  int64_t tokens() const { return stage_.tokens(); }
  const ModelConfig& config() const { return cfg_; }

  // inputs/targets: [batch*seq_len] (targets -1 = no loss). Ids are checked
  // against the vocabulary (std::invalid_argument).
  ForwardResult forward(const ModelWeights& w, std::span<const int32_t> inputs,
                        std::span<const int32_t> targets);
  // Backward of loss_scale * loss_sum + aux_scale * aux_loss for the last
  // forward; gradients ACCUMULATE into `grads` (same layout as `w`).
  void backward(const ModelWeights& w, const ModelWeights& grads, double loss_scale,
                double aux_scale);

  // Backward of a custom loss head on the logits plus aux_scale * aux_loss:
  // dlogits [T*V] is d total / d logits of the last forward; gradients
  // ACCUMULATE into `grads`.
  void backward_logits(const ModelWeights& w, const ModelWeights& grads,
                       std::span<const float> dlogits, double aux_scale);

  // Logits [T,V] of the last forward.
  const kernels::Tensor& logits() const { return stage_.logits(0); }
  // Assignments routed to each expert, per MoE layer, in the last forward
  // (empty for a dense model).
  std::vector<std::vector<int64_t>> expert_load() const { return stage_.expert_load(0); }
  // Assignments dropped by the capacity limit per MoE layer, last forward.
  std::vector<int64_t> dropped() const { return stage_.dropped(0); }
  // Activation memory in floats (arena), for reports.
  int64_t arena_elements() const { return stage_.arena_elements(); }

 private:
  ModelConfig cfg_;
  int64_t batch_;
  Stage stage_;
};

// Model FLOPs of one forward+backward over `tokens` tokens (matmuls and
// attention; 3x the forward), counting k routed experts per token.
double train_flops_per_token(const ModelConfig& config);

}  // namespace troupe::model
