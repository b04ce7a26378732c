// The tiny MoE topology-free run the runtime tests start from (4 layers, 4
// experts top-2, addition task, 4 micro-batches of 2 sequences, clipping on):
// each test sets the topology and whatever it varies on top of it.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "actors/runtime.hpp"

namespace troupe::test {

// Bitwise equality of two float buffers (parameters, AdamW moments).
inline bool same_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0;
}

inline runtime::RuntimeOptions tiny_moe_options(uint64_t seed, int64_t steps) {
  runtime::RuntimeOptions o;
  auto& t = o.train;
  t.model.vocab_size = 16;
  t.model.d_model = 16;
  t.model.n_layers = 4;
  t.model.n_heads = 2;
  t.model.seq_len = 16;
  t.model.ffn = troupe::model::Ffn::moe;
  t.model.n_experts = 4;
  t.model.top_k = 2;
  t.model.expert_hidden = 8;
  t.data.source = troupe::model::DataKind::addition;
  t.data.digits = 2;
  t.data.batch_size = 8;
  t.microbatches = 4;
  t.steps = steps;
  t.optim.warmup_steps = 1;
  t.optim.grad_clip = 0.5;  // small, so the clipping path runs
  t.eval_every = 0;
  t.seed = seed;
  // A generous fixed step deadline instead of the adaptive default: these
  // tests count restarts and replays exactly, and on a loaded test machine a
  // descheduled thread can look like a lost message to deadlines learnt in
  // milliseconds (a replay that changes no bit, but adds an event). The
  // adaptive deadlines have their own tests (step_deadline = 0 there).
  o.step_deadline = 60.0;
  // The bitwise matrix (tests/bitwise_matrix.sh) runs these tests with 1 and 2 threads per device.
  if (const char* threads = std::getenv("TROUPE_TEST_THREADS")) t.backend.threads = std::atoi(threads);
  return o;
}

// runtime::validate(o) rejects `o` with a message containing `words`.
inline void expect_invalid(const runtime::RuntimeOptions& o, const std::string& words) {
  try {
    runtime::validate(o);
    ADD_FAILURE() << "accepted; expected an error with \"" << words << "\"";
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
  }
}

}  // namespace troupe::test
