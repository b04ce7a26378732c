// RL tasks and verifiers. A task hands out prompts (training prompts a pure
// function of (seed, index), held-out prompts for evaluation only) and the
// verifier that scores a completion. Both are interfaces, so tasks beyond the
// built-in addition can follow; the rule verifier works for any task whose
// prompts carry an exact reference answer.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "model/config.hpp"
#include "rl/config.hpp"

namespace troupe::model {
class DataSource;
}

namespace troupe::rl {

// One prompt and the reference its verifier checks against.
struct Prompt {
  int64_t index = 0;            // training: the prompt index it was drawn for; eval: the problem number
  std::vector<int32_t> tokens;  // fed to the model
  std::vector<int32_t> answer;  // the exact expected completion, ending with the task's EOS
  // A user's task (rl/task_jsonl.hpp): the prompt and answer as written and
  // the record's "meta" (JSON text), which text rewards and a reward program
  // read. Empty for the built-in tasks. Re-derived from the task by whoever
  // receives a prompt (a pure function of the index), never sent.
  std::string text, answer_text, meta_json;
};

// What a verifier says of one completion.
struct Verdict {
  double reward = 0.0;
  bool correct = false;   // the completion equals the answer exactly
  bool finished = false;  // it contains the EOS (else it ran out of max_new_tokens)
};

class Verifier {
 public:
  virtual ~Verifier() = default;
  // completion: the generated tokens only (not the prompt). Tokens after the
  // first EOS are ignored, so a generator that does not stop at EOS is scored
  // as one that does.
  virtual Verdict score(const Prompt& prompt, std::span<const int32_t> completion) const = 0;
  // A whole batch at once (completion i answers prompts[i]): what a reward
  // program behind a pipe wants (one round trip per batch). The default
  // scores one by one.
  virtual std::vector<Verdict> score_batch(std::span<const Prompt* const> prompts,
                                           std::span<const std::span<const int32_t>> completions) const;
  // Times a reward program behind this verifier was restarted after a crash,
  // a hang or a bad reply (0 for the rules): the run's fault summary counts them.
  virtual int64_t program_restarts() const { return 0; }
};

// Exact match 1, else partial credit and format penalty (VerifierOptions).
// With an answer marker (the scratchpad task's '#'), only what follows the
// last marker is scored, in the completion and in the expected answer: the
// work before it is the model's own.
class RuleVerifier final : public Verifier {
 public:
  // Throws std::invalid_argument for options outside their ranges.
  RuleVerifier(int32_t eos_token, const VerifierOptions& options, int32_t answer_marker = -1);
  Verdict score(const Prompt& prompt, std::span<const int32_t> completion) const override;

 private:
  int32_t eos_;
  VerifierOptions opt_;
  int32_t marker_;
};

class Task {
 public:
  virtual ~Task() = default;
  virtual std::string describe() const = 0;
  // Training prompt number `index` (0, 1, ...): a pure function of (seed,
  // index), never a held-out problem. The RL loop draws group g of step s as
  // prompt_index() in group.hpp says, so group ids fix their prompts.
  virtual Prompt train_prompt(int64_t index) const = 0;
  // The first n held-out prompts, independent of the seed: evaluation only.
  virtual std::vector<Prompt> eval_prompts(int64_t n) const = 0;
  virtual const Verifier& verifier() const = 0;
  virtual int32_t eos_token() const = 0;
  // The most tokens any training prompt has, or -1 when the task cannot say
  // (the RL trainer on actors then sizes its fixed rows from a sample).
  virtual int64_t max_prompt_tokens() const { return -1; }
  // The most tokens a right completion takes (EOS included), or -1 when the
  // task cannot say.
  virtual int64_t max_answer_tokens() const { return -1; }
};

// The built-in addition task (data.source "addition" or "addition_plain",
// with data.digits and data.width) as RL prompts "EOS a+b=" from the training
// split, held-out problems for evaluation, scored by a RuleVerifier. With a
// target split (data.target_pairs) both are only the split's target problems,
// the ones SFT rows never show. Throws
// std::runtime_error for a source without a task (text) or a bad config.
std::unique_ptr<Task> make_addition_task(const model::DataConfig& data, uint64_t seed,
                                         const VerifierOptions& verifier);

// The addition task on the other side of data's target split: the problems
// SFT rows do show (training prompts) and their held-out problems
// (evaluation). Null when data has no split at one column (target_pairs
// empty or target_column -1), where there is no other side.
std::unique_ptr<Task> make_sft_side_task(const model::DataConfig& data, uint64_t seed,
                                         const VerifierOptions& verifier);

// Training prompts from two tasks: a share `fraction` in [0, 1) of the
// prompt indices from `side`, the rest from `main`, spread evenly (index i
// goes to `side` when floor((i + 1) f) > floor(i f), so any window of n
// consecutive indices holds floor(n f) or ceil(n f) of them), each task
// seeing its own indices 0, 1, 2, ... so no prompt repeats. Evaluation,
// verifier and EOS are `main`'s. A pure function of the index, as Task asks.
std::unique_ptr<Task> make_mixed_task(std::unique_ptr<Task> main, std::unique_ptr<Task> side, double fraction);

}  // namespace troupe::rl
