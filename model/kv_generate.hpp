// Batched sampling with the KV cache, the API rollout generators use: a batch
// of prompts of different lengths, one RNG per sequence, and per sequence the
// new tokens, each token's log-prob and why it stopped.
//
// Reproducibility: sequence b draws only from rngs[b], exactly one
// next_double() per sampled token (none when greedy), so its tokens are a
// pure function of (weights, prompt, its seed), whatever other sequences
// share the batch (up to GEMM rounding of the batched matmuls, which could
// flip a draw that lands within ~1e-7 of a boundary).
//
// Log-probs: log softmax(logits / T)[token], the tempered distribution over
// the FULL vocabulary, not renormalised after top-k/top-p. That is what the
// RL loss recomputes at the same temperature (model/policy_head.hpp), so an
// on-policy ratio is 1 up to rounding; with top_p < 1 the draw's actual
// probability is this one divided by the kept mass. Greedy (T <= 0) records
// log softmax(logits) (T = 1).
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <vector>

#include "kernels/backend.hpp"
#include "model/config.hpp"
#include "model/sampling.hpp"
#include "model/weights.hpp"

namespace troupe::model {

class KvDecoder;

enum class StopReason : uint8_t {
  eos = 0,             // sampled the eos token (it is the last token)
  max_new_tokens = 1,  // generated max_new_tokens
  context_full = 2,    // prompt + completion reached seq_len (a training row is full)
};
const char* stop_reason_name(StopReason r);

struct GenerateOptions {
  int64_t max_new_tokens = 64;
  SamplingOptions sampling;  // temperature <= 0: greedy
  int32_t eos = -1;          // stop after this token (< 0: never)
};

struct Completion {
  std::vector<int32_t> tokens;    // new tokens (eos included when it stopped there)
  std::vector<float> logprobs;    // per new token, see the top of this file
  std::vector<int64_t> versions;  // per new token, the policy version of the step that sampled it
  StopReason stop = StopReason::max_new_tokens;
};

// Shared by BatchGenerator and ContinuousBatch (model/continuous_batch.hpp):
// the input check of a generation (std::invalid_argument naming the prompt),
// and one sampled token appended to `c` from logits `row` (its log-prob and
// `version` recorded, the stop reason set); `length` is the sequence's
// prompt + new tokens after it. Returns whether the sequence goes on.
void check_generation_input(const std::vector<std::vector<int32_t>>& prompts, size_t rngs, const ModelConfig& config);
bool append_sampled_token(Completion& c, const float* row, const ModelConfig& config, const GenerateOptions& options,
                          SamplerRng& rng, int64_t version, int64_t length);

class BatchGenerator {
 public:
  BatchGenerator(kernels::Backend& backend, const ModelConfig& config);
  ~BatchGenerator();

  // One completion per prompt; rngs[b] belongs to prompts[b] and advances.
  // Every prompt must be non-empty, shorter than seq_len and inside the
  // vocabulary (std::invalid_argument otherwise, naming the prompt).
  // Equals start, then step(w) until it returns false, then finish.
  std::vector<Completion> generate(const ModelWeights& w,
                                   const std::vector<std::vector<int32_t>>& prompts,
                                   std::span<SamplerRng> rngs, const GenerateOptions& options);

  // Step-wise, for a generator that may switch weights between steps (a
  // fence: never inside one). start checks the input like generate; `rngs`
  // must outlive the generation. Each step samples one token for every live
  // sequence (the first one prefills the prompts), recording `version` on
  // it, and returns whether any sequence is still live. Keys and values
  // cached under earlier weights are kept, not recomputed.
  void start(const std::vector<std::vector<int32_t>>& prompts, std::span<SamplerRng> rngs,
             const GenerateOptions& options);
  bool step(const ModelWeights& w, int64_t version = 0);
  // Recomputes the cached keys and values of every live sequence under `w`
  // (all its tokens but the newest, which the next step feeds): after a
  // weight switch at a fence, later tokens then attend to the new policy's
  // view of the earlier ones, as a full recompute would (AReaL-style
  // interruptible generation). The recorded tokens, log-probs and versions
  // of earlier steps stay as sampled. A no-op before the prefill.
  void recompute(const ModelWeights& w);
  // The completions of the generation (moved out; start begins a new one).
  std::vector<Completion> finish();

 private:
  KvDecoder& decoder_for(int64_t batch);
  bool take(int64_t b, const float* row, int64_t version);
  kernels::Backend& be_;
  ModelConfig cfg_;
  std::map<int64_t, std::unique_ptr<KvDecoder>> decoders_;  // by batch size (the cache is sized by it)
  std::vector<float> logits_host_;
  // The generation in progress.
  std::vector<std::vector<int32_t>> prompts_;
  std::span<SamplerRng> rngs_;
  GenerateOptions opt_;
  KvDecoder* dec_ = nullptr;
  bool prefilled_ = false, live_ = false;
  std::vector<int64_t> len_;  // tokens so far (prompt + new)
  std::vector<char> active_;
  std::vector<Completion> out_;
  std::vector<int32_t> tokens_, pos_;
};

}  // namespace troupe::model
