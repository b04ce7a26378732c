// The values the rl/ library needs from a run's [rl] section, as one named
// struct the spec parser fills (the [rl] keys themselves are wired in
// launch/). Each enum is the C++ form of a spec string, converted once at
// parsing with the parse_* functions below; names, presets and the checks
// that only involve these values live here, once.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace troupe::rl {

// rl.loss: the objective family. All four use group-relative advantages.
//   grpo           PPO clip, (R - mean)/std advantages, sequence-mean aggregation
//   dr_grpo        PPO clip, R - mean advantages, constant normaliser
//   dapo           PPO clip-higher (0.2 / 0.28), token-level aggregation,
//                  dynamic sampling (zero-variance groups dropped)
//   decoupled_ppo  AReaL: ratio to the proximal policy, times the capped
//                  behaviour weight pi_prox / mu; token-level aggregation
enum class LossKind { grpo, dr_grpo, dapo, decoupled_ppo };

// How per-token losses l_t with mask weights m_t become one scalar.
//   token_mean    sum_t m_t l_t / sum_t m_t over the whole batch (DAPO)
//   seq_mean      mean over sequences of (sum_{t in s} m_t l_t / sum_{t in s} m_t),
//                 sequences whose mask sums to 0 left out (GRPO)
//   seq_constant  sum_t m_t l_t / (S * constant_norm), S = sequences given
//                 (Dr. GRPO: constant_norm = max_new_tokens, no length term)
enum class Aggregation { token_mean, seq_mean, seq_constant };

// What happens to a token whose behaviour weight w = pi_prox / mu exceeds
// behaviour_weight_cap:
//   mask  its loss term is dropped (w := 0) but it still counts in the
//         normaliser, as AReaL does (areal/utils/functional.py);
//   clip  w := cap (truncated importance sampling).
enum class CapMode { mask, clip };

// rl.sync: how generation and training are coupled.
//   synchronous  the in-process loop of rl/trainer.hpp: sample, score, train,
//                one after the other (Online RL I);
//   fixed_lag    generator, reward, buffer and trainer actors (actors/rl/):
//                the rollouts of step s are sampled by policy version
//                max(0, s - max_staleness) exactly, so generators run up to
//                max_staleness steps ahead of the trainer and a run is still
//                a pure function of its seed;
//   latest       the same actors, but generators take each new version as
//                soon as it is published, switching at a fence between
//                decode steps (a rollout in flight continues with the new
//                weights, AReaL-style); every token records its version, no
//                token older than the trainer's version - max_staleness is
//                trained on, and the loss must be decoupled_ppo (the
//                behaviour weight corrects for the mix). Not bitwise
//                reproducible: which decode step sees a new version depends
//                on thread timing.
enum class SyncMode { synchronous, fixed_lag, latest };
// Whether the mode runs on the decoupled actors (fixed_lag or latest).
inline bool decoupled(SyncMode mode) { return mode != SyncMode::synchronous; }

// rl.reward: what scores a completion (decoupled runs: reward:K actors for
// the verifier, reward_model:K actors for the model).
//   verifier  the task's rule verifier (exact match 1, partial credit, ...);
//   model     a learned reward model (run.mode = "reward_model", frozen; the
//             checkpoint rl.reward_model): reward = sigmoid(score), the RM's
//             probability that the completion is exactly right.
//   exact, numeric, regex, command: a user's task (rl.prompts, rl/task_jsonl.hpp):
//             the completion's text against the record's answer (trimmed
//             equality; numbers within reward_tolerance; what answer_pattern
//             extracts, then equality), or a reward program (rl/reward_command.hpp).
enum class RewardSource { verifier, model, exact, numeric, regex, command };

// rl.rm_loss: how run.mode = "reward_model" trains its score s (rl/reward_model.hpp).
//   bce            pointwise: sigmoid(s) against the verifier's label;
//   bradley_terry  pairwise: -log sigmoid(s_pos - s_neg) over pairs of one
//                  prompt's completions, one the verifier accepts and one it
//                  rejects; only differences of scores are trained, so the
//                  score's offset (and with it "s > 0") is not pinned down.
enum class RmLoss { bce, bradley_terry };

// Group-relative advantages A_i of the completions of one prompt.
struct AdvantageOptions {
  bool scale_by_std = true;  // true: (R - mean) / (std + std_eps) (GRPO); false: R - mean (Dr. GRPO)
  double std_eps = 1e-6;     // keeps near-uniform groups finite; > 0
  // DAPO dynamic sampling: groups whose rewards are all equal (advantage 0
  // everywhere) are marked not kept, so they leave the batch and its normaliser.
  bool drop_zero_variance = false;
};

struct PolicyLossOptions {
  LossKind kind = LossKind::grpo;
  double clip_low = 0.2;   // eps_low: the ratio is clipped below at 1 - clip_low (0 <= clip_low < 1)
  double clip_high = 0.2;  // eps_high: clipped above at 1 + clip_high (DAPO clip-higher: 0.28)
  // decoupled_ppo: cap on w = pi_prox / mu; 0 = no cap, otherwise > 1.
  double behaviour_weight_cap = 5.0;
  CapMode cap_mode = CapMode::mask;
  double kl_coef = 0.0;  // weight of the k3 KL to the frozen reference; 0 = no KL term
  Aggregation aggregation = Aggregation::seq_mean;
  double constant_norm = 0.0;  // seq_constant: tokens per sequence to divide by; must be > 0 then
};

// The rule verifier's reward: 1 for an exact answer, else partial_credit times
// the share of answer tokens (the answer without its EOS) that are right in
// place; minus format_penalty when the completion has no EOS (it ran out of
// max_new_tokens).
struct VerifierOptions {
  double partial_credit = 0.0;  // in [0, 1): stays below the exact-match reward
  double format_penalty = 0.0;  // >= 0
};

struct RlConfig {
  std::string init;               // checkpoint the policy starts from, also the frozen reference; "" = fresh init
  std::string task = "addition";  // the built-in task (rl/task.hpp)
  int64_t prompts_per_step = 8;   // groups sampled per RL step
  int64_t group_size = 8;  // completions sampled per prompt (>= 2: the advantages are group-relative)
  int64_t max_new_tokens = 8;     // most tokens per completion
  double temperature = 1.0;       // sampling temperature (> 0); the loss's log-probs use the same one
  double top_p = 1.0;             // nucleus sampling mass in (0, 1]
  int64_t updates_per_batch = 1;  // optimizer steps per sampled batch (PPO epochs)
  // Retention: this share of the training prompts comes from the SFT side of
  // the task's target split (the problems SFT did train on), rewarded by the
  // same verifier, so RL keeps being paid for what SFT taught (rl/task.hpp,
  // make_task). 0 = target problems only. In [0, 1); needs a target split.
  double sft_fraction = 0.0;
  SyncMode sync = SyncMode::synchronous;
  int64_t max_staleness = 0;  // decoupled: eta, fixed_lag: the version lag of every rollout, latest: its bound (0 = on-policy)
  int64_t generators = 1;     // decoupled: generator actors (RL steps are dealt to them round-robin)
  int64_t reward_actors = 1;  // decoupled: rule-verifier actors (round-robin by step)
  // decoupled: how long a generator has to confirm a weight publication; a
  // miss is retried once, a second miss restarts the generator.
  double sync_deadline_ms = 10000.0;
  // latest: after taking a new version mid-rollout, recompute the KV cache of
  // the tokens so far under it (false: keep the keys and values of the old one).
  bool recompute_kv = true;
  // Continuous batching (model/continuous_batch.hpp): the most sequences a
  // generator (or the synchronous loop) decodes at once; a finished one's
  // slot goes at once to the next. 0 = prompts_per_step * group_size, a
  // whole step's. Decoupled generators refill with the next step's prompts.
  int64_t slots = 0;
  // The in-process policy update (sync loop, trainer = "single"): the step's
  // rows sorted by length into this many buckets, each padded to its own
  // longest row instead of every row to the step's longest (long-tailed
  // completions). 1 = one batch in sample order, the math the actors
  // trainer (one row length) reproduces bit for bit; more buckets change
  // the rounding, not the loss.
  int64_t row_buckets = 1;
  // run.mode = "reward_model" (rl/rm_trainer.hpp): training prompts whose
  // group_size completions are labelled, and completions scored per
  // optimizer step (bradley_terry: rm_batch / 2 pairs, so rm_batch is even).
  int64_t rm_prompts = 256;
  int64_t rm_batch = 64;
  RmLoss rm_loss = RmLoss::bce;
  RewardSource reward = RewardSource::verifier;
  std::string reward_model;  // reward = model: the RM checkpoint (same model as the policy)
  // A user's task (rl/task_jsonl.hpp): prompts {prompt, answer, meta?} from
  // JSONL, held out by eval_prompts or by a hash of the line (the data's
  // eval_fraction), tokenized by the data's [tokenizer].
  std::string prompts;        // "" = the built-in task (rl.task)
  std::string eval_prompts;   // "" = the hash split of `prompts`
  double reward_tolerance = 1e-6;  // numeric: |x - answer| <= tolerance * max(1, |answer|)
  std::string answer_pattern;      // regex: a std::regex (ECMAScript) whose group 1 (else whole match) is the answer
  std::vector<std::string> reward_command;  // command: the program and its arguments
  std::string reward_dir;          // command: its working directory (the spec file's)
  double reward_timeout = 30.0;    // command: seconds for one batch before a restart
  bool reward_errors_zero = false; // command: a bad reply scores 0 (counted) instead of stopping the run
  std::string reward_log_name = "reward";  // command: the prefix of its stderr lines in the run's log ("reward:K")
  AdvantageOptions advantage;
  PolicyLossOptions policy;
  VerifierOptions verifier;
};

// rl.slots resolved: slots, or a whole step's sequences when 0.
inline int64_t generation_slots(const RlConfig& c) {
  return c.slots > 0 ? c.slots : c.prompts_per_step * c.group_size;
}

// The published settings of each kind (see LossKind); max_new_tokens is Dr.
// GRPO's constant normaliser. Explicit spec keys override the preset's values.
RlConfig rl_preset(LossKind kind, int64_t max_new_tokens);

// Spec strings: "synchronous", "fixed_lag", "latest"; "grpo", "dr_grpo", "dapo", "decoupled_ppo"; "token_mean",
// "seq_mean", "seq_constant"; "mask", "clip". Each parse throws
// std::invalid_argument naming the value and the choices.
LossKind parse_loss_kind(const std::string& name);
SyncMode parse_sync_mode(const std::string& name);
const char* sync_mode_name(SyncMode mode);
const char* reward_source_name(RewardSource source);  // "verifier", "model"
const char* rm_loss_name(RmLoss loss);                // "bce", "bradley_terry"
Aggregation parse_aggregation(const std::string& name);
CapMode parse_cap_mode(const std::string& name);
const char* loss_kind_name(LossKind kind);
const char* aggregation_name(Aggregation aggregation);
const char* cap_mode_name(CapMode mode);

// One violated rule: the [rl] key to point at (e.g. "group_size") and why.
struct ConfigProblem {
  std::string key;
  std::string message;
};
// Every range and cross-field rule over these values; empty when the config is
// usable. The spec parser attaches file:line:col to each by its key.
std::vector<ConfigProblem> check_config(const RlConfig& config);

}  // namespace troupe::rl
