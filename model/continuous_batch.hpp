// Continuous batching for rollout generators: a job's sequences decode up to
// `slots` at a time, and a finished sequence's slot goes at once to the next
// queued one instead of idling until the longest sequence of the batch ends.
//
// Every step is one width-1 forward of the live sequences. A sequence that
// just got its slot feeds its prompt one token per step beside the running
// decodes (chunked prefill with chunk 1), so prefill and decode are the same
// call and a new prompt never stalls the others. Rows are kept contiguous: a
// finished sequence's row is filled by moving the last live one into it
// (KvDecoder::move_sequence), so a step's GEMMs have exactly the live rows.
//
// The slot does not matter: on a backend with batch-invariant GEMMs (the host
// backend; Backend::set_batch_invariant, switched on for each step) a
// sequence's tokens, log-probs and cache are the same bits whichever row it
// sits in, whichever sequences share its steps and whenever it starts, so
// how a generator mixes jobs, refills slots or restarts after a kill cannot
// change a rollout. Sequence i draws only from rngs[i], as in BatchGenerator.
// On a backend without them (OpenCL) the rollouts are right but may differ in
// the last bits with the schedule.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "kernels/backend.hpp"
#include "model/config.hpp"
#include "model/kv_generate.hpp"
#include "model/sampling.hpp"
#include "model/weights.hpp"

namespace troupe::model {

class KvDecoder;

class ContinuousBatch {
 public:
  // `slots` >= 1: the most sequences decoding at once (the cache's rows).
  ContinuousBatch(kernels::Backend& backend, const ModelConfig& config, int64_t slots);
  ~ContinuousBatch();
  ContinuousBatch(const ContinuousBatch&) = delete;
  ContinuousBatch& operator=(const ContinuousBatch&) = delete;

  // Queues one sequence per prompt, in order (checked like
  // BatchGenerator::start); `rngs` must outlive the job.
  void start(const std::vector<std::vector<int32_t>>& prompts, std::span<SamplerRng> rngs,
             const GenerateOptions& options);
  // Gives free slots to queued sequences, in queue order, while fewer than
  // min(slots, max_live) are live, then runs one step: each live sequence
  // feeds its next prompt token or its newest one, and those past their prompt
  // sample a token (recording `version`). Returns whether any sequence is
  // still live or queued.
  bool step(const ModelWeights& w, int64_t version, int64_t max_live);
  bool step(const ModelWeights& w, int64_t version) { return step(w, version, slots_); }
  // Recomputes the cached keys and values of every live sequence under `w`
  // (after a weight switch, as BatchGenerator::recompute).
  void recompute(const ModelWeights& w);

  int64_t live() const { return static_cast<int64_t>(rows_.size()); }
  int64_t queued() const { return static_cast<int64_t>(prompts_.size()) - next_; }
  bool done() const { return live() == 0 && queued() == 0; }
  // The job's completions, in prompt order (moved out).
  std::vector<Completion> finish();

  // Counters of the job so far: forwards run, and the rows they carried.
  struct Counters {
    int64_t steps = 0, rows = 0;
  };
  const Counters& counters() const { return counters_; }

 private:
  struct Row {
    int64_t seq = 0;  // index into the job's prompts
    int64_t fed = 0;  // tokens in the cache (prompt first, then new ones)
  };
  bool take(Row& r, const float* logits, int64_t version);
  int64_t length(const Row& r) const;

  kernels::Backend& be_;
  ModelConfig cfg_;
  int64_t slots_;
  std::unique_ptr<KvDecoder> dec_;
  std::vector<std::vector<int32_t>> prompts_;
  std::span<SamplerRng> rngs_;
  GenerateOptions opt_;
  int64_t next_ = 0;       // first queued prompt
  std::vector<Row> rows_;  // the live sequences, row i of the cache
  std::vector<Completion> out_;
  std::vector<int32_t> tokens_, pos_;
  std::vector<char> finished_;  // per row, this step
  std::vector<float> logits_host_;
  Counters counters_;
};

}  // namespace troupe::model
