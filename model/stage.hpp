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
//
// Expert parallelism: a pass can also run step-wise (begin_* / resume_*). It
// stops at every MoE layer once the experts' input rows are ready, hands out
// a MoeExchange, and the caller computes the experts anywhere (expert-shard
// actors) and resumes. The single-call forward_*/backward are the same steps
// with all experts computed here, so both paths run the same ops in the same
// order. Rule: at most ONE backward of a Stage is suspended at a time (its
// gradient scratch is shared by the slots); forwards of other slots may run
// meanwhile. Breaking the rule throws std::logic_error.
//
// B/W split (zero-bubble schedules): backward_input is the B pass, the
// input gradients plus the cheap elementwise gains (RMSNorm weights); every
// weight GEMM (dW += X^T dY: attention and FFN projections, router, experts,
// LM head) and the embedding scatter are recorded with their operands
// (moe/weight_grads.hpp: the dY tensors live in per-slot storage from the
// arena, the X are the slot's activations) and backward_weights(slot) is
// the W pass that runs them. B then W gives bitwise the gradients of
// backward: the same ops on the same operands, and per gradient buffer the
// same order. Between a slot's B and W other slots' F, B and W may run; the
// slot itself takes no new pass until its W has run.
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
#include "moe/weight_grads.hpp"

namespace troupe::model {

struct ForwardResult {
  double loss_sum = 0.0;   // sum of token cross-entropies over counted tokens (last stage)
  int64_t counted = 0;     // tokens with a target (not -1) (last stage)
  double aux_loss = 0.0;   // sum over this stage's MoE layers of the aux loss
};

// Expert work of a pass suspended at a MoE layer. The caller computes the
// experts on `in` (rows grouped by expert: expert e's rows are
// [plan->offsets[e], plan->offsets[e+1]), in token order), writes rows
// [0, N) of `out`, N = plan->rows(), and resumes the pass.
struct MoeExchange {
  int64_t layer = -1;                      // global layer index
  bool backward = false;
  const moe::DispatchPlan* plan = nullptr;  // rows per expert, token_index, routed load
  const moe::MoeLayer* moe = nullptr;      // the layer's forward state (combine weights, ...)
  kernels::Tensor in;   // [>=N, D] forward: token rows xs; backward: d loss / d unweighted expert output
  kernels::Tensor out;  // [>=N, D] forward: unweighted expert outputs; backward: d loss / d xs
  kernels::Tensor dout;  // backward: [T, D] d loss / d layer output (row token_index[i] is row i's, unweighted)
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
  // Step-wise forward (see the top of this file): begin_* take the same
  // inputs and checks as forward_*; begin_* and resume_forward return the
  // exchange to serve (valid until the next call on this slot) or nullptr
  // when the pass has finished, then forward_result has its result.
  const MoeExchange* begin_forward_tokens(int64_t slot, const ModelWeights& w,
                                          std::span<const int32_t> inputs,
                                          std::span<const int32_t> targets);
  const MoeExchange* begin_forward_hidden(int64_t slot, const ModelWeights& w,
                                          std::span<const float> hidden,
                                          std::span<const int32_t> targets);
  const MoeExchange* resume_forward(int64_t slot, const ModelWeights& w);
  ForwardResult forward_result(int64_t slot) const;

  // Non-last stages: the output hidden [T*D] of the slot's last forward.
  void read_output(int64_t slot, std::span<float> out) const;

  // Backward of the slot's forward. Last stage: of loss_scale * loss_sum +
  // aux_scale * aux (dout empty), or, for a custom loss head (the policy
  // gradient, model/policy_head.hpp), dout [T*V] is d total / d logits and
  // loss_scale is unused; other stages: dout [T*D] is d total / d output. Parameter gradients ACCUMULATE into `grads` (views of the flat
  // gradient buffer; only this stage's entries are touched).
  void backward(int64_t slot, const ModelWeights& w, const ModelWeights& grads,
                std::span<const float> dout, double loss_scale, double aux_scale);
  // The B pass of the split (see the top of this file): same arguments as
  // backward; read_input_grad is valid after it, the weight gradients are
  // pending until backward_weights(slot).
  void backward_input(int64_t slot, const ModelWeights& w, const ModelWeights& grads,
                      std::span<const float> dout, double loss_scale, double aux_scale);
  // The W pass: the slot's pending weight gradients ACCUMULATE into the
  // `grads` its B was given. Throws std::logic_error while the slot's B has
  // not finished.
  void backward_weights(int64_t slot);
  // Whether the slot's B ran and its W has not.
  bool weights_pending(int64_t slot) const;
  // Step-wise backward: same arguments as backward. Expert weight gradients
  // are NOT accumulated into `grads` (whoever computes the experts owns
  // them); everything else is. read_input_grad is valid once it returned
  // nullptr. Throws std::logic_error while another slot's backward is
  // suspended. defer_weights: the pass is a B (backward_input), its weight
  // gradients wait for backward_weights.
  const MoeExchange* begin_backward(int64_t slot, const ModelWeights& w, const ModelWeights& grads,
                                    std::span<const float> dout, double loss_scale,
                                    double aux_scale, bool defer_weights = false);
  const MoeExchange* resume_backward(int64_t slot, const ModelWeights& w, const ModelWeights& grads);
  // Drops every suspended pass (a discarded step: its experts never answer)
  // and every pending W; every slot can start a new pass. Activations and gradients written so
  // far stay as they are (the caller zeroes the gradients it keeps).
  void abandon_passes();

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
  // Where a slot's step-wise pass stands.
  struct Cursor {
    enum Phase { idle, forward, backward } phase = idle;
    size_t layer = 0;        // forward: layers done; backward: layers still to do
    bool at_experts = false;  // suspended at layer's experts
    ForwardResult result;    // forward: accumulated so far / final
    double aux_scale = 0.0;  // backward
    moe::WeightGrads* wg = nullptr;  // backward: where its weight gradients wait (B), nullptr = at once
    moe::MoeScratch ms;      // backward: the MoE scratch of the layer at hand (dy held when deferring)
    MoeExchange ex;
  };
  struct Slot {
    Cursor cur;
    kernels::Tensor ids, targets;     // [T] i32 (ids: first stage, targets: last)
    std::vector<kernels::Tensor> res; // 2n+1 residual streams [T,D], n = layers here
    std::vector<LayerActs> layers;
    kernels::Tensor xf, rstdf;        // [T,D], [T] (last stage)
    kernels::Tensor logits, losses;   // [T,V], [T] (last stage)
    std::unique_ptr<moe::WeightGrads> wg;  // the slot's deferred weight gradients (B/W split)
  };

  int64_t check_targets(std::span<const int32_t> targets) const;  // counted tokens
  void prepare_tokens(Slot& s, std::span<const int32_t> inputs, std::span<const int32_t> targets);
  void prepare_hidden(Slot& s, std::span<const float> hidden, std::span<const int32_t> targets);
  void start(Slot& s, Cursor::Phase phase);
  const MoeExchange* forward_steps(Slot& s, const ModelWeights& w);
  const MoeExchange* backward_steps(int64_t si, Slot& s, const ModelWeights& w, const ModelWeights& g);
  const MoeExchange* suspend(Slot& s, size_t li, bool backward);
  // Serves an exchange with all experts computed here (the single-call path).
  void run_local_experts(Slot& s, const ModelWeights& w, const ModelWeights* g);
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
  int64_t backward_slot_ = -1;  // slot whose backward is suspended (owns the scratch), -1 none
};

// Contiguous, balanced split of n_layers into `stages` layer ranges: stage i
// gets [begin, end); the first n_layers % stages stages get one layer more.
// Throws std::invalid_argument when stages < 1 or stages > n_layers.
std::vector<std::pair<int64_t, int64_t>> split_layers(int64_t n_layers, int64_t stages);

}  // namespace troupe::model
