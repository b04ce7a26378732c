// Presets, names and checks of the [rl] values (see config.hpp).
#include "rl/config.hpp"

#include <cmath>
#include <sstream>
#include <stdexcept>

namespace troupe::rl {

RlConfig rl_preset(LossKind kind, int64_t max_new_tokens) {
  RlConfig c;
  c.max_new_tokens = max_new_tokens;
  c.policy.kind = kind;
  switch (kind) {
    case LossKind::grpo:  // DeepSeekMath: std-normalised, 1/|o_i| then mean over the group
      c.advantage.scale_by_std = true;
      c.policy.aggregation = Aggregation::seq_mean;
      break;
    case LossKind::dr_grpo:  // Dr. GRPO: neither std nor length normalisation
      c.advantage.scale_by_std = false;
      c.policy.aggregation = Aggregation::seq_constant;
      c.policy.constant_norm = static_cast<double>(max_new_tokens);
      break;
    case LossKind::dapo:  // DAPO: clip-higher, token-level, dynamic sampling
      c.advantage.scale_by_std = true;
      c.advantage.drop_zero_variance = true;
      c.policy.clip_high = 0.28;
      c.policy.aggregation = Aggregation::token_mean;
      break;
    case LossKind::decoupled_ppo:  // AReaL: token-level, cap 5, over-cap tokens masked
      c.advantage.scale_by_std = true;
      c.policy.aggregation = Aggregation::token_mean;
      c.policy.behaviour_weight_cap = 5.0;
      c.policy.cap_mode = CapMode::mask;
      break;
  }
  return c;
}

LossKind parse_loss_kind(const std::string& name) {
  if (name == "grpo") return LossKind::grpo;
  if (name == "dr_grpo") return LossKind::dr_grpo;
  if (name == "dapo") return LossKind::dapo;
  if (name == "decoupled_ppo") return LossKind::decoupled_ppo;
  throw std::invalid_argument("rl: unknown loss '" + name +
                              "' (expected \"grpo\", \"dr_grpo\", \"dapo\" or \"decoupled_ppo\")");
}

Aggregation parse_aggregation(const std::string& name) {
  if (name == "token_mean") return Aggregation::token_mean;
  if (name == "seq_mean") return Aggregation::seq_mean;
  if (name == "seq_constant") return Aggregation::seq_constant;
  throw std::invalid_argument("rl: unknown aggregation '" + name +
                              "' (expected \"token_mean\", \"seq_mean\" or \"seq_constant\")");
}

CapMode parse_cap_mode(const std::string& name) {
  if (name == "mask") return CapMode::mask;
  if (name == "clip") return CapMode::clip;
  throw std::invalid_argument("rl: unknown behaviour-weight cap mode '" + name + "' (expected \"mask\" or \"clip\")");
}

SyncMode parse_sync_mode(const std::string& name) {
  if (name == "synchronous") return SyncMode::synchronous;
  if (name == "fixed_lag") return SyncMode::fixed_lag;
  if (name == "latest") return SyncMode::latest;
  throw std::invalid_argument("rl: unknown sync mode '" + name + "' (expected \"synchronous\", \"fixed_lag\" or \"latest\")");
}

const char* reward_source_name(RewardSource source) {
  switch (source) {
    case RewardSource::verifier: return "verifier";
    case RewardSource::model: return "model";
    case RewardSource::exact: return "exact";
    case RewardSource::numeric: return "numeric";
    case RewardSource::regex: return "regex";
    case RewardSource::command: return "command";
  }
  return "?";
}

const char* rm_loss_name(RmLoss loss) { return loss == RmLoss::bradley_terry ? "bradley_terry" : "bce"; }

const char* sync_mode_name(SyncMode mode) {
  switch (mode) {
    case SyncMode::synchronous: return "synchronous";
    case SyncMode::fixed_lag: return "fixed_lag";
    case SyncMode::latest: return "latest";
  }
  return "?";
}

const char* loss_kind_name(LossKind kind) {
  switch (kind) {
    case LossKind::grpo: return "grpo";
    case LossKind::dr_grpo: return "dr_grpo";
    case LossKind::dapo: return "dapo";
    case LossKind::decoupled_ppo: return "decoupled_ppo";
  }
  return "?";
}

const char* aggregation_name(Aggregation aggregation) {
  switch (aggregation) {
    case Aggregation::token_mean: return "token_mean";
    case Aggregation::seq_mean: return "seq_mean";
    case Aggregation::seq_constant: return "seq_constant";
  }
  return "?";
}

const char* cap_mode_name(CapMode mode) {
  switch (mode) {
    case CapMode::mask: return "mask";
    case CapMode::clip: return "clip";
  }
  return "?";
}

std::vector<ConfigProblem> check_config(const RlConfig& c) {
  std::vector<ConfigProblem> out;
  auto bad = [&](const char* key, const std::string& why) { out.push_back({key, why}); };
  auto num = [](double x) {
    std::ostringstream os;  // shortest readable form: 0.2, 1e-07, nan
    os << x;
    return os.str();
  };
  const auto& p = c.policy;
  if (c.prompts_per_step < 1)
    bad("prompts_per_step", "prompts_per_step = " + std::to_string(c.prompts_per_step) + " must be >= 1");
  if (c.max_new_tokens < 1)
    bad("max_new_tokens", "max_new_tokens = " + std::to_string(c.max_new_tokens) + " must be >= 1");
  if (!(c.temperature > 0 && std::isfinite(c.temperature)))
    bad("temperature", "temperature = " + num(c.temperature) +
                           " must be > 0 (greedy decoding would make every completion of a group the same)");
  if (!(c.top_p > 0 && c.top_p <= 1)) bad("top_p", "top_p = " + num(c.top_p) + " must be in (0, 1]");
  if (c.row_buckets < 1)
    bad("row_buckets", "row_buckets = " + std::to_string(c.row_buckets) + " must be >= 1 (1: one batch of rows)");
  if (c.slots < 0) bad("slots", "slots = " + std::to_string(c.slots) + " must be >= 0 (0: a whole step's sequences)");
  if (c.rm_prompts < 1) bad("rm_prompts", "rm_prompts = " + std::to_string(c.rm_prompts) + " must be >= 1");
  if (c.rm_batch < 1) bad("rm_batch", "rm_batch = " + std::to_string(c.rm_batch) + " must be >= 1");
  else if (c.rm_loss == RmLoss::bradley_terry && c.rm_batch % 2 != 0)
    bad("rm_batch", "rm_batch = " + std::to_string(c.rm_batch) +
                        " with rm_loss = \"bradley_terry\": a step scores rm_batch / 2 pairs of completions, so "
                        "rm_batch must be even");
  if (c.updates_per_batch < 1)
    bad("updates_per_batch", "updates_per_batch = " + std::to_string(c.updates_per_batch) + " must be >= 1");
  if (c.group_size < 2)
    bad("group_size", "group_size = " + std::to_string(c.group_size) + ": loss \"" + loss_kind_name(p.kind) +
                          "\" uses group-relative advantages (R - group mean), which are all 0 for a group of "
                          "one; use group_size >= 2");
  if (!(p.clip_low >= 0 && p.clip_low < 1))
    bad("clip_low", "clip_low = " + num(p.clip_low) + " must be in [0, 1) (the ratio is clipped below at 1 - clip_low)");
  if (!(p.clip_high >= 0 && std::isfinite(p.clip_high)))
    bad("clip_high", "clip_high = " + num(p.clip_high) + " must be >= 0");
  if (!(p.kl_coef >= 0 && std::isfinite(p.kl_coef))) bad("kl_coef", "kl_coef = " + num(p.kl_coef) + " must be >= 0");
  if (!(p.behaviour_weight_cap == 0 || (p.behaviour_weight_cap > 1 && std::isfinite(p.behaviour_weight_cap))))
    bad("behaviour_weight_cap", "behaviour_weight_cap = " + num(p.behaviour_weight_cap) +
                                    " must be 0 (no cap) or > 1 (a cap below 1 would drop or shrink on-policy tokens)");
  if (p.aggregation == Aggregation::seq_constant && !(p.constant_norm > 0 && std::isfinite(p.constant_norm)))
    bad("constant_norm", "aggregation = \"seq_constant\" needs constant_norm > 0 (Dr. GRPO: max_new_tokens), got " +
                             num(p.constant_norm));
  if (!(c.advantage.std_eps > 0 && std::isfinite(c.advantage.std_eps)))
    bad("std_eps", "std_eps = " + num(c.advantage.std_eps) + " must be > 0");
  if (!(c.verifier.partial_credit >= 0 && c.verifier.partial_credit < 1))
    bad("partial_credit", "partial_credit = " + num(c.verifier.partial_credit) +
                              " must be in [0, 1) (a partly right answer must earn less than an exact one)");
  if (!(c.verifier.format_penalty >= 0 && std::isfinite(c.verifier.format_penalty)))
    bad("format_penalty", "format_penalty = " + num(c.verifier.format_penalty) + " must be >= 0");
  if (!(c.sft_fraction >= 0 && c.sft_fraction < 1))
    bad("sft_fraction", "sft_fraction = " + num(c.sft_fraction) +
                            " must be in [0, 1) (the share of RL prompts drawn from the SFT side of the split)");
  if (c.reward == RewardSource::model && c.reward_model.empty())
    bad("reward_model", "reward = \"model\" needs reward_model, the checkpoint of a run.mode = \"reward_model\" run");
  if (c.sync == SyncMode::latest && c.policy.kind != LossKind::decoupled_ppo)
    bad("sync", std::string("sync = \"latest\" mixes policy versions within a rollout and needs loss = \"decoupled_ppo\" "
                            "(the behaviour weight pi_prox / mu corrects for it), got loss = \"") +
                    loss_kind_name(c.policy.kind) + "\"");
  if (!(c.sync_deadline_ms > 0 && std::isfinite(c.sync_deadline_ms)))
    bad("sync_deadline_ms", "sync_deadline_ms = " + num(c.sync_deadline_ms) + " must be > 0");
  if (c.max_staleness < 0 || c.max_staleness > 1000)
    bad("max_staleness", "max_staleness = " + std::to_string(c.max_staleness) + " is out of range (allowed 0 .. 1000)");
  else if (c.max_staleness > 0 && !decoupled(c.sync))
    bad("max_staleness", "max_staleness = " + std::to_string(c.max_staleness) +
                             " needs sync = \"fixed_lag\" or \"latest\" (the synchronous loop is always on-policy)");
  if (c.generators < 1 || c.generators > 64)
    bad("generators", "generators = " + std::to_string(c.generators) + " is out of range (allowed 1 .. 64)");
  else if (c.generators > 1 && c.sync == SyncMode::synchronous)
    bad("generators", "generators = " + std::to_string(c.generators) +
                          " needs sync = \"fixed_lag\" or \"latest\" (the synchronous loop samples in the trainer)");
  if (c.reward_actors < 1 || c.reward_actors > 64)
    bad("reward_actors", "reward_actors = " + std::to_string(c.reward_actors) + " is out of range (allowed 1 .. 64)");
  else if (c.reward_actors > 1 && c.sync == SyncMode::synchronous)
    bad("reward_actors", "reward_actors = " + std::to_string(c.reward_actors) +
                             " needs sync = \"fixed_lag\" or \"latest\" (the synchronous loop scores in the trainer)");
  return out;
}

}  // namespace troupe::rl
