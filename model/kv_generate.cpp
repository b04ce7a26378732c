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

void check_generation_input(const std::vector<std::vector<int32_t>>& prompts, size_t rngs, const ModelConfig& cfg) {
  const int64_t C = cfg.seq_len, V = cfg.vocab_size;
  if (rngs != prompts.size())
    throw std::invalid_argument("generate: " + std::to_string(prompts.size()) + " prompts but " +
                                std::to_string(rngs) + " RNGs (one per sequence)");
  for (size_t b = 0; b < prompts.size(); ++b) {
    const auto& p = prompts[b];
    const std::string who = "generate: prompt " + std::to_string(b);
    if (p.empty()) throw std::invalid_argument(who + " is empty");
    if (static_cast<int64_t>(p.size()) >= C)
      throw std::invalid_argument(who + " has " + std::to_string(p.size()) +
                                  " tokens, leaving no room in the context of " + std::to_string(C));
    for (int32_t t : p)
      if (t < 0 || t >= V)
        throw std::invalid_argument(who + ": token " + std::to_string(t) + " outside the vocabulary of " +
                                    std::to_string(V));
  }
}

bool append_sampled_token(Completion& c, const float* row, const ModelConfig& cfg, const GenerateOptions& o,
                          SamplerRng& rng, int64_t version, int64_t length) {
  const int64_t V = cfg.vocab_size;
  const int32_t tok = sample_token(row, V, o.sampling, rng);
  c.tokens.push_back(tok);
  c.logprobs.push_back(static_cast<float>(token_logprob(row, V, tok, o.sampling.temperature)));
  c.versions.push_back(version);
  if (o.eos >= 0 && tok == o.eos) c.stop = StopReason::eos;
  else if (static_cast<int64_t>(c.tokens.size()) >= o.max_new_tokens) c.stop = StopReason::max_new_tokens;
  else if (length >= cfg.seq_len) c.stop = StopReason::context_full;
  else return true;
  return false;
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
  start(prompts, rngs, o);
  while (step(w)) {
  }
  return finish();
}

void BatchGenerator::start(const std::vector<std::vector<int32_t>>& prompts,
                           std::span<SamplerRng> rngs, const GenerateOptions& o) {
  const int64_t B = static_cast<int64_t>(prompts.size());
  check_generation_input(prompts, rngs.size(), cfg_);
  prompts_ = prompts;
  rngs_ = rngs;
  opt_ = o;
  out_.assign(static_cast<size_t>(B), Completion{});
  len_.assign(static_cast<size_t>(B), 0);
  for (int64_t b = 0; b < B; ++b) len_[static_cast<size_t>(b)] = static_cast<int64_t>(prompts[static_cast<size_t>(b)].size());
  active_.assign(static_cast<size_t>(B), 1);
  prefilled_ = false;
  live_ = B > 0 && o.max_new_tokens > 0;
  dec_ = live_ ? &decoder_for(B) : nullptr;
}

std::vector<Completion> BatchGenerator::finish() {
  live_ = false;
  dec_ = nullptr;
  return std::move(out_);
}

// Samples sequence b's next token from logits row `row` (host copy) and
// records it; returns whether b goes on.
bool BatchGenerator::take(int64_t b, const float* row, int64_t version) {
  const size_t i = static_cast<size_t>(b);
  const bool more = append_sampled_token(out_[i], row, cfg_, opt_, rngs_[i], version, ++len_[i]);
  if (!more) active_[i] = 0;
  return more;
}

bool BatchGenerator::step(const ModelWeights& w, int64_t version) {
  if (!live_) return false;
  const int64_t B = static_cast<int64_t>(prompts_.size()), C = cfg_.seq_len, V = cfg_.vocab_size;
  bool any = false;
  if (!prefilled_) {
    // Prefill: every prompt at position 0, right-padded to a power-of-two
    // width (few distinct widths, so few workspaces). Causal attention keeps
    // the padding out of the real tokens, and decode overwrites its cache rows.
    int64_t width = 8, max_prompt = 0;
    for (const auto& p : prompts_) max_prompt = std::max<int64_t>(max_prompt, static_cast<int64_t>(p.size()));
    while (width < max_prompt) width *= 2;
    width = std::min(width, C);
    tokens_.assign(static_cast<size_t>(B * width), 0);
    pos_.assign(static_cast<size_t>(B), 0);
    for (int64_t b = 0; b < B; ++b) {
      const auto& p = prompts_[static_cast<size_t>(b)];
      std::copy(p.begin(), p.end(), tokens_.begin() + b * width);
    }
    const kernels::Tensor& pre = dec_->forward(w, tokens_, width, pos_);
    logits_host_.resize(static_cast<size_t>(B * width * V));
    be_.download(logits_host_.data(), pre, logits_host_.size() * sizeof(float));
    prefilled_ = true;
    for (int64_t b = 0; b < B; ++b)
      any |= take(b, logits_host_.data() + (b * width + len_[static_cast<size_t>(b)] - 1) * V, version);
  } else {
    // Decode: each live sequence feeds its newest token at position len - 1.
    // Finished ones ride along at position 0 with token 0 (their cache is dead).
    tokens_.assign(static_cast<size_t>(B), 0);
    for (int64_t b = 0; b < B; ++b) {
      const size_t i = static_cast<size_t>(b);
      tokens_[i] = active_[i] ? out_[i].tokens.back() : 0;
      pos_[i] = active_[i] ? static_cast<int32_t>(len_[i] - 1) : 0;
    }
    const kernels::Tensor& lg = dec_->forward(w, tokens_, 1, pos_);
    be_.download(logits_host_.data(), lg, static_cast<size_t>(B * V) * sizeof(float));
    for (int64_t b = 0; b < B; ++b)
      if (active_[static_cast<size_t>(b)]) any |= take(b, logits_host_.data() + b * V, version);
  }
  live_ = any;
  return any;
}

void BatchGenerator::recompute(const ModelWeights& w) {
  if (!live_ || !prefilled_) return;
  const int64_t B = static_cast<int64_t>(prompts_.size()), C = cfg_.seq_len;
  // A prefill of each live sequence's tokens but its newest, at position 0,
  // right-padded like the first prefill; finished sequences ride along as
  // padding (their cache is dead; their prompt may not even fit the width).
  int64_t width = 8, longest = 0;
  for (int64_t b = 0; b < B; ++b)
    if (active_[static_cast<size_t>(b)]) longest = std::max<int64_t>(longest, len_[static_cast<size_t>(b)] - 1);
  while (width < longest) width *= 2;
  width = std::min(width, C);
  tokens_.assign(static_cast<size_t>(B * width), 0);
  for (int64_t b = 0; b < B; ++b) {
    const size_t i = static_cast<size_t>(b);
    if (!active_[i]) continue;
    const auto& p = prompts_[i];
    std::copy(p.begin(), p.end(), tokens_.begin() + b * width);
    const auto& t = out_[i].tokens;
    std::copy(t.begin(), t.end() - 1, tokens_.begin() + b * width + static_cast<int64_t>(p.size()));
  }
  pos_.assign(static_cast<size_t>(B), 0);
  (void)dec_->forward(w, tokens_, width, pos_);
}

}  // namespace troupe::model
