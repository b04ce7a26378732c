// Helpers shared by the model tests: tiny configs, backends by name (OpenCL
// skipped unless TROUPE_REQUIRE_OPENCL=1), random token batches.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <span>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "kernels/backend.hpp"
#include "model/config.hpp"

namespace troupe::test {

inline model::ModelConfig tiny_config(const std::string& ffn) {
  model::ModelConfig c;
  c.vocab_size = 16;
  c.d_model = 8;
  c.n_layers = 2;
  c.n_heads = 2;
  c.seq_len = 6;
  c.ffn = model::parse_ffn(ffn);
  c.dense_hidden = 12;
  c.n_experts = 4;
  c.top_k = 2;
  c.expert_hidden = 6;
  c.shared_experts = 0;
  c.balance = troupe::moe::Balance::aux_loss;
  c.aux_loss_alpha = 0.1;  // large, so the aux term's gradient is visible in the check
  c.capacity_factor = 0.0;
  c.tie_embeddings = true;
  c.init_std = 0.3;        // O(1) activations and clear router margins in a tiny model
  return c;
}

inline bool require_opencl() {
  const char* v = std::getenv("TROUPE_REQUIRE_OPENCL");
  return v && std::string(v) == "1";
}

// The backend of that kind, or nullptr (with the reason in *why) when OpenCL
// is unavailable and not required; a failure to create a required backend
// is a test failure.
inline std::unique_ptr<kernels::Backend> try_backend(const std::string& kind, std::string* why) {
  kernels::BackendOptions o;
  o.kind = kernels::parse_backend_kind(kind);
  try {
    return kernels::make_backend(o);
  } catch (const std::exception& e) {
    if (kind == "host" || require_opencl()) ADD_FAILURE() << "backend " << kind << ": " << e.what();
    *why = e.what();
    return nullptr;
  }
}

// inputs/targets for `batch` sequences; a few targets are -1 (ignored).
inline void random_tokens(std::vector<int32_t>& inputs, std::vector<int32_t>& targets,
                          int64_t tokens, int64_t vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  inputs.resize(static_cast<size_t>(tokens));
  targets.resize(static_cast<size_t>(tokens));
  for (int64_t t = 0; t < tokens; ++t) {
    inputs[t] = static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
    targets[t] = (t % 5 == 2) ? -1 : static_cast<int32_t>(rng() % static_cast<uint64_t>(vocab));
  }
}

// Token ids and targets of micro-batch `mb`, a fixed pattern (every fifth
// target is -1, no loss), for the stage tests that compare two ways of
// running the same passes.
inline void pattern_tokens(std::vector<int32_t>& in, std::vector<int32_t>& tg, int64_t T, int64_t V, int mb) {
  in.resize(static_cast<size_t>(T));
  tg.resize(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    in[t] = static_cast<int32_t>((t * 7 + mb * 5 + 3) % V);
    tg[t] = (t % 5 == 4) ? -1 : static_cast<int32_t>((t * 3 + mb * 11 + 1) % V);
  }
}

inline bool bitwise_equal(std::span<const float> a, std::span<const float> b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

}  // namespace troupe::test
