// Generation of one sequence: the KV cache when it fits, else full recompute
// over context-length buckets; and `troupe sample`.
#include "model/generate.hpp"
#include "model/tokenizer.hpp"

#include <algorithm>
#include <stdexcept>

#include "model/checkpoint.hpp"
#include "model/data.hpp"
#include "model/decoder.hpp"
#include "model/kv_generate.hpp"
#include "model/params.hpp"

namespace troupe::model {

Generator::Generator(kernels::Backend& be, const ModelConfig& c, bool kv_cache) : be_(be), cfg_(c) {
  if (kv_cache) kv_ = std::make_unique<BatchGenerator>(be, c);
}
Generator::~Generator() = default;

Decoder& Generator::decoder_for(int64_t length) {
  int64_t bucket = 8;
  while (bucket < length) bucket *= 2;
  bucket = std::min(bucket, cfg_.seq_len);
  auto& d = decoders_[bucket];
  if (!d) {
    ModelConfig c = cfg_;
    c.seq_len = bucket;
    // Dropless at inference: with a capacity limit, the padding after the
    // prompt would compete with real tokens for expert slots.
    c.capacity_factor = 0.0;
    d = std::make_unique<Decoder>(be_, c, 1);
  }
  return *d;
}

std::vector<int32_t> Generator::generate(const ModelWeights& w, const std::vector<int32_t>& prompt,
                                         int64_t max_new, const SamplingOptions& sampling,
                                         SamplerRng& rng, int32_t eos) {
  if (prompt.empty()) throw std::invalid_argument("generate: empty prompt");
  for (int32_t t : prompt)
    if (t < 0 || t >= cfg_.vocab_size)
      throw std::invalid_argument("generate: prompt token " + std::to_string(t) +
                                  " outside the vocabulary of " + std::to_string(cfg_.vocab_size));
  const int64_t n = static_cast<int64_t>(prompt.size());
  if (kv_ && n < cfg_.seq_len && n + std::max<int64_t>(max_new, 0) <= cfg_.seq_len) {
    GenerateOptions o;
    o.max_new_tokens = max_new;
    o.sampling = sampling;
    o.eos = eos;
    return kv_->generate(w, {prompt}, std::span<SamplerRng>(&rng, 1), o)[0].tokens;
  }
  std::vector<int32_t> seq = prompt, out, inputs, targets;
  std::vector<float> row(static_cast<size_t>(cfg_.vocab_size));
  for (int64_t i = 0; i < max_new; ++i) {
    const int64_t len = std::min<int64_t>(static_cast<int64_t>(seq.size()), cfg_.seq_len);
    Decoder& dec = decoder_for(len);
    const int64_t S = dec.tokens();
    // The last `len` tokens, padded after the end (causal: padding is never seen).
    inputs.assign(seq.end() - len, seq.end());
    inputs.resize(static_cast<size_t>(S), 0);
    targets.assign(static_cast<size_t>(S), -1);
    dec.forward(w, inputs, targets);
    be_.download(row.data(), dec.logits().rows(len - 1, len), row.size() * sizeof(float));
    const int32_t next = sample_token(row.data(), cfg_.vocab_size, sampling, rng);
    out.push_back(next);
    seq.push_back(next);
    if (eos >= 0 && next == eos) break;
  }
  return out;
}

SampleResult sample(const SampleOptions& o) {
  const TrainingState st = load_checkpoint(o.checkpoint_dir);
  // A model trained on a user's data reads its stored tokenizer (no data file
  // needed); a built-in task's model its data source's vocabulary.
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<DataSource> data;
  if (!st.config.tokenizer_kind.empty()) {
    tok = make_tokenizer(checkpoint_tokenizer(st.config, o.data.tokenizer, o.checkpoint_dir));
  } else {
    data = make_data_source(o.data, st.seed);
    if (data->vocab_size() > st.config.vocab_size)
      throw std::invalid_argument("sample: data source '" + data->describe() + "' needs vocab " +
                                  std::to_string(data->vocab_size()) + " but the model has " +
                                  std::to_string(st.config.vocab_size));
  }
  SampleResult r;
  if (tok) {
    r.prompt_tokens.push_back(tok->eos_id());
    for (int32_t t : tok->encode(o.prompt)) r.prompt_tokens.push_back(t);
  } else {
    r.prompt_tokens = data->encode_prompt(o.prompt);
  }
  auto be = kernels::make_backend(o.backend);
  const ParamLayout layout = build_param_layout(st.config);
  const kernels::Tensor p = be->from_f32({layout.total()}, st.params);
  const ModelWeights w = bind_weights(layout, st.config, p);
  Generator gen(*be, st.config);
  SamplerRng rng(o.seed);
  r.tokens = gen.generate(w, r.prompt_tokens, o.max_new_tokens, o.sampling, rng, tok ? tok->eos_id() : data->eos_token());
  r.text = tok ? tok->decode(r.tokens) : data->decode(r.tokens);
  return r;
}

}  // namespace troupe::model
