// Autoregressive generation of one sequence, and `sample`, the entry point of
// `troupe sample`. When the prompt and max_new fit seq_len it runs the KV
// cache (model/kv_generate.hpp, batch 1); past that, a sliding window of the
// last seq_len tokens, recomputed in full per new token (a KV cache cannot
// slide: RoPE positions are absolute). Both draw the same way from the same
// RNG, so they give the same tokens up to float rounding.
// MoE layers run dropless here (capacity_factor ignored), so a token's output
// never depends on the padding of its context bucket.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "kernels/backend.hpp"
#include "model/config.hpp"
#include "model/sampling.hpp"
#include "model/weights.hpp"

namespace troupe::model {

class Decoder;
class BatchGenerator;

class Generator {
 public:
  // kv_cache = false always recomputes (the baseline of bench_generate).
  Generator(kernels::Backend& backend, const ModelConfig& config, bool kv_cache = true);
  ~Generator();
  // Up to max_new NEW tokens after `prompt`, stopping after `eos` (>= 0). The
  // context is the last seq_len tokens. Throws std::invalid_argument for an
  // empty prompt or ids outside the vocabulary.
  std::vector<int32_t> generate(const ModelWeights& w, const std::vector<int32_t>& prompt,
                                int64_t max_new, const SamplingOptions& sampling,
                                SamplerRng& rng, int32_t eos = -1);

 private:
  Decoder& decoder_for(int64_t length);
  kernels::Backend& be_;
  ModelConfig cfg_;
  // One decoder per context-length bucket (powers of two up to seq_len):
  // causal attention makes a short run's logits equal a long run's prefix.
  std::map<int64_t, std::unique_ptr<Decoder>> decoders_;
  std::unique_ptr<BatchGenerator> kv_;  // null when kv_cache is off
};

struct SampleOptions {
  std::string checkpoint_dir;
  DataConfig data;             // the tokenizer comes from the data source
  std::string prompt;
  int64_t max_new_tokens = 64;
  SamplingOptions sampling;    // temperature <= 0: greedy
  uint64_t seed = 1;
  kernels::BackendOptions backend;
};

struct SampleResult {
  std::vector<int32_t> prompt_tokens;
  std::vector<int32_t> tokens;  // the new tokens
  std::string text;             // decode(tokens)
};

// Loads the checkpoint, encodes the prompt with the data source's tokenizer,
// generates, decodes. Throws with a clear message on a bad checkpoint or prompt.
SampleResult sample(const SampleOptions& options);

}  // namespace troupe::model
