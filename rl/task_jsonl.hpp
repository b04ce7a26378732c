// A user's RL task: prompts from JSONL (rl.prompts; each line {"prompt",
// "answer", "meta"?}), tokenized by the data's [tokenizer], rewarded by a
// built-in text rule or a reward program (rl.reward):
//   exact    1 when the completion's text, trimmed, equals the answer, trimmed;
//   numeric  1 when the completion's number (the whole trimmed text, else the
//            last number in it) is within reward_tolerance * max(1, |answer|);
//   regex    the completion's answer is what answer_pattern extracts (the last
//            match's group 1, or the whole match without a group), trimmed,
//            then equality;
//   command  the program rl.reward_command (rl/reward_command.hpp), one
//            persistent child per task (per reward actor), a step per batch.
// The completion's text is decoded up to its first EOS; a completion without
// EOS ran out of max_new_tokens (not `finished`) and is still scored.
// Prompts: EOS, then the prompt's tokens; training prompt i is a record of the
// training split chosen by a per-epoch permutation of (seed, epoch), a pure
// function of (seed, i); held-out records (rl.eval_prompts, else the share
// data.eval_fraction by a hash of each line) are for evaluation only.
#pragma once

#include <memory>

#include "model/config.hpp"
#include "rl/config.hpp"
#include "rl/task.hpp"

namespace troupe::rl {

// Throws model::JsonlError / model::TokenizerError (bad files),
// RewardCommandError (a reward program that cannot start) or
// std::invalid_argument (a bad answer_pattern, a reward kind the task lacks).
// Making the task starts no program: its verifier is made on first use.
std::unique_ptr<Task> make_jsonl_task(const RlConfig& rl, const model::DataConfig& data, uint64_t seed);

// One line naming the reward a user's task uses, with its settings.
std::string describe_reward(const RlConfig& rl);

}  // namespace troupe::rl
