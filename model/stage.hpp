// One pipeline stage of the MoE decoder: a contiguous layer range [lb, le),
// plus the token embedding on the first stage and the final norm, LM head and
// cross-entropy on the last. The whole-model Decoder is the stage [0, L) with
// both ends, so the single-process model and the pipeline run ONE
// implementation of every layer.
//
// Several micro-batches can be in flight at once (1F1B keeps up to PP of
// them): each has an activation slot, filled by a forward and consumed by the
// matching backward. Backward scratch is shared by all slots (a backward runs
// to completion before the next starts).
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
  double loss_sum = 0.0;   // sum of token cross-entropies over counted tokens (last stage)
  int64_t counted = 0;     // tokens with a target (not -1) (last stage)
  double aux_loss = 0.0;   // sum over this stage's MoE layers of the aux loss
};

// MoE options of a model config (throws on an unknown balance method).
moe::MoeOptions moe_options(const ModelConfig& config);

class Stage {
 public:
  // `batch` sequences of config.seq_len tokens per micro-batch; layers
  // [layer_begin, layer_end) of config.n_layers (may be empty for a stage
  // that only embeds or only computes the loss); `slots` activation slots.
  Stage(kernels::Backend& backend, const ModelConfig& config, int64_t batch, int64_t layer_begin,
        int64_t layer_end, bool first, bool last, int64_t slots = 1);
  ~Stage();
  Stage(const Stage&) = delete;
  Stage& operator=(const Stage&) = delete;

  int64_t tokens() const { return T_; }
  int64_t d_model() const { return D_; }
  int64_t slots() const { return static_cast<int64_t>(slots_.size()); }
  bool first() const { return first_; }
  bool last() const { return last_; }
  int64_t layer_begin() const { return lb_; }
  int64_t layer_end() const { return le_; }

  // First stage: token ids [T]. Targets [T] (-1 = no loss) are needed only on
  // the last stage (pass an empty span otherwise). Ids and targets are checked
  // against the vocabulary (std::invalid_argument).
  ForwardResult forward_tokens(int64_t slot, const ModelWeights& w, std::span<const int32_t> inputs,
                               std::span<const int32_t> targets);
  // Other stages: the previous stage's output hidden [T*D].
  ForwardResult forward_hidden(int64_t slot, const ModelWeights& w, std::span<const float> hidden,
                               std::span<const int32_t> targets);
  // Non-last stages: the output hidden [T*D] of the slot's last forward.
  void read_output(int64_t slot, std::span<float> out) const;

  // Backward of the slot's forward. Last stage: of loss_scale * loss_sum +
  // aux_scale * aux (dout empty); other stages: dout [T*D] is d total / d
  // output. Parameter gradients ACCUMULATE into `grads` (views of the flat
  // gradient buffer; only this stage's entries are touched).
  void backward(int64_t slot, const ModelWeights& w, const ModelWeights& grads,
                std::span<const float> dout, double loss_scale, double aux_scale);
  // Non-first stages: d total / d input hidden [T*D] of the last backward.
  void read_input_grad(std::span<float> out) const;

  // Logits [T,V] of the slot's last forward (last stage).
  const kernels::Tensor& logits(int64_t slot) const;
  // Assignments routed to each expert / dropped by capacity, per MoE layer of
  // this stage, in the slot's last forward.
  std::vector<std::vector<int64_t>> expert_load(int64_t slot) const;
  std::vector<int64_t> dropped(int64_t slot) const;
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
  struct Slot {
    kernels::Tensor ids, targets;     // [T] i32 (ids: first stage, targets: last)
    std::vector<kernels::Tensor> res; // 2n+1 residual streams [T,D], n = layers here
    std::vector<LayerActs> layers;
    kernels::Tensor xf, rstdf;        // [T,D], [T] (last stage)
    kernels::Tensor logits, losses;   // [T,V], [T] (last stage)
  };

  int64_t check_targets(std::span<const int32_t> targets) const;  // counted tokens
  ForwardResult run_forward(Slot& s, const ModelWeights& w, int64_t counted);
  Slot& slot(int64_t i);
  const Slot& slot(int64_t i) const;

  kernels::Backend& be_;
  ModelConfig cfg_;
  int64_t batch_, T_, D_, V_, lb_, le_;
  bool first_, last_, is_moe_;
  moe::Arena arena_;
  std::vector<Slot> slots_;
  // Backward scratch (shared by all layers and slots).
  kernels::Tensor dres_, dxn_, datt_;      // [T,D]
  kernels::Tensor dq_rot_, dk_rot_, dv_;   // [B,S,H,hd]
  kernels::Tensor dq_, dk_;                // [B,S,H,hd]
  kernels::Tensor dlogits_;                // [T,V] (last stage)
  moe::ExpertActs ddense_;                 // [T,H]
  std::unique_ptr<moe::MoeScratch> moe_scratch_;
  std::vector<float> losses_host_;
};

// Contiguous, balanced split of n_layers into `stages` layer ranges: stage i
// gets [begin, end); the first n_layers % stages stages get one layer more.
// Throws std::invalid_argument when stages < 1 or stages > n_layers.
std::vector<std::pair<int64_t, int64_t>> split_layers(int64_t n_layers, int64_t stages);

}  // namespace troupe::model
