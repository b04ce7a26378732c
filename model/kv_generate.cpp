// Batched KV-cache sampling: one prefill chunk over the right-padded prompts,
// then one width-1 decode chunk per new token (see kv_generate.hpp).
#include "model/kv_generate.hpp"

#include <algorithm>
#include <stdexcept>
#include <string>

#include "model/kv_decoder.hpp"

namespace troupe::model {

const char* stop_reason_name(StopReason r) {
  switch (r) {
    case StopReason::eos: return "eos";
    case StopReason::max_new_tokens: return "max_new_tokens";
    case StopReason::context_full: return "context_full";
  }
  return "?";
}

BatchGenerator::BatchGenerator(kernels::Backend& be, const ModelConfig& c) : be_(be), cfg_(c) {}
BatchGenerator::~BatchGenerator() = default;

KvDecoder& BatchGenerator::decoder_for(int64_t batch) {
  auto& d = decoders_[batch];
  if (!d) d = std::make_unique<KvDecoder>(be_, cfg_, batch);
  return *d;
}

std::vector<Completion> BatchGenerator::generate(const ModelWeights& w,
                                                 const std::vector<std::vector<int32_t>>& prompts,
                                                 std::span<SamplerRng> rngs,
                                                 const GenerateOptions& o) {
  const int64_t B = static_cast<int64_t>(prompts.size()), C = cfg_.seq_len, V = cfg_.vocab_size;
  if (static_cast<int64_t>(rngs.size()) != B)
    throw std::invalid_argument("generate: " + std::to_string(prompts.size()) + " prompts but " +
                                std::to_string(rngs.size()) + " RNGs (one per sequence)");
  int64_t max_prompt = 0;
  for (int64_t b = 0; b < B; ++b) {
    const auto& p = prompts[static_cast<size_t>(b)];
    const std::string who = "generate: prompt " + std::to_string(b);
    if (p.empty()) throw std::invalid_argument(who + " is empty");
    if (static_cast<int64_t>(p.size()) >= C)
      throw std::invalid_argument(who + " has " + std::to_string(p.size()) +
                                  " tokens, leaving no room in the context of " + std::to_string(C));
    for (int32_t t : p)
      if (t < 0 || t >= V)
        throw std::invalid_argument(who + ": token " + std::to_string(t) +
                                    " outside the vocabulary of " + std::to_string(V));
    max_prompt = std::max<int64_t>(max_prompt, static_cast<int64_t>(p.size()));
  }
  std::vector<Completion> out(static_cast<size_t>(B));
  if (B == 0 || o.max_new_tokens <= 0) return out;

  KvDecoder& dec = decoder_for(B);
  std::vector<int64_t> len(static_cast<size_t>(B));  // tokens so far (prompt + new)
  std::vector<char> active(static_cast<size_t>(B), 1);
  // Samples sequence b's next token from logits row `row` (host copy) and
  // records it; returns whether b goes on.
  auto take = [&](int64_t b, const float* row) {
    const size_t i = static_cast<size_t>(b);
    const int32_t tok = sample_token(row, V, o.sampling, rngs[i]);
    Completion& c = out[i];
    c.tokens.push_back(tok);
    c.logprobs.push_back(static_cast<float>(token_logprob(row, V, tok, o.sampling.temperature)));
    ++len[i];
    if (o.eos >= 0 && tok == o.eos) c.stop = StopReason::eos;
    else if (static_cast<int64_t>(c.tokens.size()) >= o.max_new_tokens) c.stop = StopReason::max_new_tokens;
    else if (len[i] >= C) c.stop = StopReason::context_full;
    else return true;
    active[i] = 0;
    return false;
  };

  // Prefill: every prompt at position 0, right-padded to a power-of-two width
  // (few distinct widths, so few workspaces). Causal attention keeps the
  // padding out of the real tokens, and the next chunk overwrites its cache rows.
  int64_t width = 8;
  while (width < max_prompt) width *= 2;
  width = std::min(width, C);
  std::vector<int32_t> tokens(static_cast<size_t>(B * width), 0), pos(static_cast<size_t>(B), 0);
  for (int64_t b = 0; b < B; ++b) {
    const auto& p = prompts[static_cast<size_t>(b)];
    std::copy(p.begin(), p.end(), tokens.begin() + b * width);
    len[static_cast<size_t>(b)] = static_cast<int64_t>(p.size());
  }
  const kernels::Tensor& pre = dec.forward(w, tokens, width, pos);
  logits_host_.resize(static_cast<size_t>(B * width * V));
  be_.download(logits_host_.data(), pre, logits_host_.size() * sizeof(float));
  bool any = false;
  for (int64_t b = 0; b < B; ++b)
    any |= take(b, logits_host_.data() + (b * width + len[static_cast<size_t>(b)] - 1) * V);

  // Decode: each live sequence feeds its newest token at position len - 1.
  // Finished ones ride along at position 0 with token 0 (their cache is dead).
  tokens.assign(static_cast<size_t>(B), 0);
  while (any) {
    for (int64_t b = 0; b < B; ++b) {
      const size_t i = static_cast<size_t>(b);
      tokens[i] = active[i] ? out[i].tokens.back() : 0;
      pos[i] = active[i] ? static_cast<int32_t>(len[i] - 1) : 0;
    }
    const kernels::Tensor& lg = dec.forward(w, tokens, 1, pos);
    be_.download(logits_host_.data(), lg, static_cast<size_t>(B * V) * sizeof(float));
    any = false;
    for (int64_t b = 0; b < B; ++b)
      if (active[static_cast<size_t>(b)]) any |= take(b, logits_host_.data() + b * V);
  }
  return out;
}

}  // namespace troupe::model
