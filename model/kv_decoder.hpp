// Incremental decoding with a KV cache: the decoder's forward over only the
// NEW tokens of a batch of sequences, each at its own position, attending to
// the keys and values cached from the earlier ones. The same layers and
// Backend ops as Stage's forward (RMSNorm, q/k/v/o GEMMs, RoPE, dense SwiGLU
// or MoE FFN with shared experts, tied or untied LM head), so it runs on
// every backend; only RoPE + cache writes and attention differ
// (Backend::rope_kv_append, Backend::attention_cached).
//
// One call is a "chunk" of `width` tokens per sequence: a prefill is one
// chunk of the (right-padded) prompts at position 0, a decode step a chunk of
// width 1. Sequences of different lengths share a chunk: positions are per
// sequence. MoE layers run dropless (capacity_factor ignored, as in
// generate.hpp), so a token's output never depends on its batch mates or on
// padding. Inference only: no backward, no aux loss.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>

#include "kernels/backend.hpp"
#include "model/config.hpp"
#include "model/weights.hpp"

namespace troupe::model {

class KvDecoder {
 public:
  // A cache for `batch` sequences of up to config.seq_len positions each.
  KvDecoder(kernels::Backend& backend, const ModelConfig& config, int64_t batch);
  ~KvDecoder();
  KvDecoder(const KvDecoder&) = delete;
  KvDecoder& operator=(const KvDecoder&) = delete;

  int64_t batch() const { return batch_; }
  int64_t capacity() const { return cfg_.seq_len; }

  // Runs `width` new tokens per sequence for the first n = pos.size() <=
  // batch() sequences (rows of the cache; the rest are left alone). tokens:
  // [n*width] row-major [n, width]; sequence b's tokens sit at positions pos[b] ..
  // pos[b]+width-1, and its cache must already hold positions < pos[b] (rows
  // at and past pos[b] are overwritten). Returns the logits [batch*width, V]
  // of every new token (valid until the next call). Throws
  // std::invalid_argument for ids outside the vocabulary, a wrong count or
  // positions with pos[b] + width > capacity().
  const kernels::Tensor& forward(const ModelWeights& w, std::span<const int32_t> tokens,
                                 int64_t width, std::span<const int32_t> pos);

  // Copies sequence `from`'s cached keys and values at positions < length
  // into row `to` (a continuous batch closing a gap). Throws
  // std::invalid_argument for rows or a length out of range.
  void move_sequence(int64_t from, int64_t to, int64_t length);

  // Cache memory in floats (keys and values of every layer), for reports.
  int64_t cache_elements() const;

 private:
  struct Work;  // activations of one chunk width
  Work& work_for(int64_t width, int64_t rows);

  kernels::Backend& be_;
  ModelConfig cfg_;
  int64_t batch_;
  bool is_moe_;
  std::vector<kernels::Tensor> k_cache_, v_cache_;  // per layer [B, seq_len, H, hd]
  std::map<std::pair<int64_t, int64_t>, std::unique_ptr<Work>> work_;  // by (chunk width, rows)
};

}  // namespace troupe::model
