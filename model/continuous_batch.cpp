// Continuous batching (see continuous_batch.hpp).
#include "model/continuous_batch.hpp"

#include <stdexcept>
#include <string>

#include "model/kv_decoder.hpp"

namespace troupe::model {

namespace {

// Batch-invariant GEMMs for the scope of one call, where the backend has
// them; the backend's previous setting comes back after (the synchronous RL
// loop trains on the same backend, with BLAS).
class InvariantGemms {
 public:
  explicit InvariantGemms(kernels::Backend& be)
      : be_(be), on_(be.supports_batch_invariant()), was_(on_ && be.set_batch_invariant(true)) {}
  ~InvariantGemms() {
    if (on_) be_.set_batch_invariant(was_);
  }
  InvariantGemms(const InvariantGemms&) = delete;
  InvariantGemms& operator=(const InvariantGemms&) = delete;

 private:
  kernels::Backend& be_;
  bool on_, was_;
};

}  // namespace

ContinuousBatch::ContinuousBatch(kernels::Backend& be, const ModelConfig& c, int64_t slots)
    : be_(be), cfg_(c), slots_(slots) {
  if (slots < 1) throw std::invalid_argument("ContinuousBatch: slots must be >= 1, got " + std::to_string(slots));
  dec_ = std::make_unique<KvDecoder>(be, c, slots);
}

ContinuousBatch::~ContinuousBatch() = default;

void ContinuousBatch::start(const std::vector<std::vector<int32_t>>& prompts, std::span<SamplerRng> rngs,
                            const GenerateOptions& o) {
  const int64_t B = static_cast<int64_t>(prompts.size());
  check_generation_input(prompts, rngs.size(), cfg_);
  prompts_ = prompts;
  rngs_ = rngs;
  opt_ = o;
  out_.assign(static_cast<size_t>(B), Completion{});
  rows_.clear();
  // max_new_tokens 0: every sequence is done before it starts.
  next_ = o.max_new_tokens > 0 ? 0 : B;
  counters_ = {};
}

int64_t ContinuousBatch::length(const Row& r) const {
  return static_cast<int64_t>(prompts_[static_cast<size_t>(r.seq)].size() +
                              out_[static_cast<size_t>(r.seq)].tokens.size());
}

// Samples row r's next token; false when its sequence stops.
bool ContinuousBatch::take(Row& r, const float* row, int64_t version) {
  const size_t i = static_cast<size_t>(r.seq);
  return append_sampled_token(out_[i], row, cfg_, opt_, rngs_[i], version, length(r) + 1);
}

bool ContinuousBatch::step(const ModelWeights& w, int64_t version, int64_t max_live) {
  const int64_t limit = std::min(slots_, max_live);
  while (live() < limit && queued() > 0) rows_.push_back(Row{next_++, 0});
  if (rows_.empty()) return queued() > 0;
  const int64_t n = live(), V = cfg_.vocab_size;
  tokens_.resize(static_cast<size_t>(n));
  pos_.resize(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const Row& r = rows_[static_cast<size_t>(i)];
    const auto& p = prompts_[static_cast<size_t>(r.seq)];
    const int64_t P = static_cast<int64_t>(p.size());
    tokens_[static_cast<size_t>(i)] = r.fed < P ? p[static_cast<size_t>(r.fed)]
                                                : out_[static_cast<size_t>(r.seq)].tokens[static_cast<size_t>(r.fed - P)];
    pos_[static_cast<size_t>(i)] = static_cast<int32_t>(r.fed);
  }
  {
    InvariantGemms invariant(be_);
    const kernels::Tensor& lg = dec_->forward(w, tokens_, 1, pos_);
    logits_host_.resize(static_cast<size_t>(n * V));
    be_.download(logits_host_.data(), lg, logits_host_.size() * sizeof(float));
  }
  ++counters_.steps;
  counters_.rows += n;
  // Sample where the fed token was the sequence's newest; mark the finished.
  std::vector<char>& finished = finished_;
  finished.assign(static_cast<size_t>(n), 0);
  for (int64_t i = 0; i < n; ++i) {
    Row& r = rows_[static_cast<size_t>(i)];
    ++r.fed;
    if (r.fed < length(r)) continue;  // still feeding its prompt
    finished[static_cast<size_t>(i)] = take(r, logits_host_.data() + i * V, version) ? 0 : 1;
  }
  // Close the gaps: the last live row moves into each finished one.
  int64_t end = n;
  for (int64_t i = 0; i < end; ++i) {
    if (!finished[static_cast<size_t>(i)]) continue;
    while (end - 1 > i && finished[static_cast<size_t>(end - 1)]) --end;
    --end;
    if (end > i) {
      dec_->move_sequence(end, i, rows_[static_cast<size_t>(end)].fed);
      rows_[static_cast<size_t>(i)] = rows_[static_cast<size_t>(end)];
      finished[static_cast<size_t>(i)] = 0;
    }
  }
  rows_.resize(static_cast<size_t>(end));
  return !done();
}

void ContinuousBatch::recompute(const ModelWeights& w) {
  const int64_t n = live(), C = cfg_.seq_len;
  if (n == 0) return;
  // One chunk of every live sequence's cached tokens at position 0, padded
  // to a power-of-two width (padding lands past each sequence's end, where
  // the next step overwrites it and no query looks).
  int64_t width = 8, longest = 1;
  for (const Row& r : rows_) longest = std::max(longest, r.fed);
  while (width < longest) width *= 2;
  width = std::min(width, C);
  tokens_.assign(static_cast<size_t>(n * width), 0);
  pos_.assign(static_cast<size_t>(n), 0);
  for (int64_t i = 0; i < n; ++i) {
    const Row& r = rows_[static_cast<size_t>(i)];
    const auto& p = prompts_[static_cast<size_t>(r.seq)];
    const auto& t = out_[static_cast<size_t>(r.seq)].tokens;
    for (int64_t j = 0; j < r.fed; ++j)
      tokens_[static_cast<size_t>(i * width + j)] =
          j < static_cast<int64_t>(p.size()) ? p[static_cast<size_t>(j)] : t[static_cast<size_t>(j) - p.size()];
  }
  InvariantGemms invariant(be_);
  (void)dec_->forward(w, tokens_, width, pos_);
}

std::vector<Completion> ContinuousBatch::finish() {
  rows_.clear();
  next_ = static_cast<int64_t>(prompts_.size());
  return std::move(out_);
}

}  // namespace troupe::model
