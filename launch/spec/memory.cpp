// The memory a spec needs, estimated before anything runs (memory.hpp), and
// the check that refuses a spec whose estimate exceeds the machine or
// run.memory_limit. The estimate counts the big buffers troupe allocates
// (float32 everywhere): parameters, gradients and AdamW moments; the
// activations a training step keeps for its backward; for RL the reference,
// the generators' copies, the KV cache of a step's rollouts and the policy
// update's activations and logits. Small buffers and the allocator's slack
// are left out, so it is a lower bound on the peak, close for big specs (the
// ones it exists to refuse).
#include "launch/spec/parser.hpp"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <string>

#include "model/params.hpp"
#include "rl/task.hpp"

namespace troupe::launch {

namespace {

constexpr double kFloat = 4.0;

// Floats one token keeps per training step for the backward pass: per layer
// the residual stream, norms, q/k/v, attention output and its probabilities
// over the context, the FFN's (or the chosen experts') hidden activations;
// then the logits and their gradient.
double floats_per_token(const model::ModelConfig& m, int64_t context) {
  const double d = static_cast<double>(m.d_model);
  const double ffn = m.ffn == model::Ffn::moe
                         ? static_cast<double>(m.top_k + m.shared_experts) * 3.0 * static_cast<double>(m.expert_hidden) +
                               static_cast<double>(m.n_experts)
                         : 3.0 * static_cast<double>(m.dense_hidden);
  const double attention = static_cast<double>(m.n_heads) * static_cast<double>(context);
  return static_cast<double>(m.n_layers) * (10.0 * d + attention + ffn) + 2.0 * static_cast<double>(m.vocab_size);
}

std::string gib(double bytes) {
  char b[32];
  if (bytes >= 1024.0 * 1024 * 1024 * 1024)
    std::snprintf(b, sizeof b, "%.3g TiB", bytes / (1024.0 * 1024 * 1024 * 1024));
  else if (bytes >= 1024.0 * 1024 * 1024)
    std::snprintf(b, sizeof b, "%.3g GiB", bytes / (1024.0 * 1024 * 1024));
  else
    std::snprintf(b, sizeof b, "%.3g MiB", bytes / (1024.0 * 1024));
  return b;
}

}  // namespace

double MemoryEstimate::total() const { return weights + optimizer + activations + rl; }

std::string MemoryEstimate::describe() const {
  std::string s = "about " + gib(total()) + " (weights and gradients " + gib(weights) + ", AdamW moments " +
                  gib(optimizer) + ", activations " + gib(activations);
  if (rl > 0) s += ", RL rollouts, KV cache and policy update " + gib(rl);
  return s + ")";
}

MemoryEstimate estimate_memory(const Spec& s) {
  MemoryEstimate e;
  const model::ModelConfig& m = s.model;
  const double P = static_cast<double>(model::build_param_layout(m).total());
  e.weights = 2.0 * kFloat * P;  // parameters and gradients
  e.optimizer = 2.0 * kFloat * P;
  // A pretraining step (phase 1 of a two-phase job): every sequence of the
  // batch keeps its activations until its backward.
  const bool trains = s.run.mode == RunMode::pretrain || s.run.mode == RunMode::sft_rl;
  if (trains)
    e.activations = kFloat * static_cast<double>(s.data.batch_size) * static_cast<double>(m.seq_len) *
                    floats_per_token(m, m.seq_len);
  if (s.run.mode == RunMode::rl || s.run.mode == RunMode::sft_rl || s.run.mode == RunMode::reward_model) {
    const rl::RlConfig& r = s.rl;
    const double rows = static_cast<double>(std::max<int64_t>(1, r.prompts_per_step)) *
                        static_cast<double>(std::max<int64_t>(1, r.group_size));
    // Rows are the task's longest prompt plus the completion, within seq_len
    // (RL runs are validated to have the addition task before this runs).
    const int64_t prompt = rl::make_addition_task(s.data, static_cast<uint64_t>(s.run.seed), r.verifier)->max_prompt_tokens();
    const int64_t len = std::min<int64_t>(m.seq_len, std::max<int64_t>(prompt, 1) + r.max_new_tokens + 1);
    // The synchronous loop data-parallel over D devices keeps a parameter,
    // reference and gradient copy and a continuous batch per further device.
    const double dp = s.run.mode == RunMode::rl && sync_data_parallel(s) ? static_cast<double>(s.topology.devices) : 1.0;
    const double copies = 1.0 + (rl::decoupled(r.sync) ? static_cast<double>(r.generators) : 3.0 * (dp - 1.0));
    // The KV cache: rl.slots rows of seq_len positions per running step; a
    // generator runs up to two steps side by side (rl/rollout_step.hpp).
    const double kv_rows = static_cast<double>(rl::generation_slots(r)) *
                           (rl::decoupled(r.sync) ? 2.0 * static_cast<double>(r.generators) : dp);
    const double kv = kv_rows * static_cast<double>(m.n_layers) * 2.0 * static_cast<double>(m.seq_len) *
                      static_cast<double>(m.d_model);
    const double update = rows * static_cast<double>(len) * floats_per_token(m, len);
    e.rl = kFloat * (copies * P + kv + update);
  }
  return e;
}

double memory_limit_bytes(const Spec& s) {
  return s.run.memory_limit > 0 ? s.run.memory_limit * 1024.0 * 1024 * 1024 : machine_memory_bytes();
}

// Physical memory of this machine in bytes (MemTotal), or 0 when unknown.
double machine_memory_bytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  double kib = 0;
  while (in >> key >> kib) {
    if (key == "MemTotal:") return kib * 1024.0;
    in.ignore(256, '\n');
  }
  return 0;
}

namespace spec_detail {

void check_memory(const Spec& s, SpecSites& p) {
  if (s.topology.device_kind == DeviceKind::sim) return;  // the sim allocates no model
  const MemoryEstimate e = estimate_memory(s);
  const bool limited = s.run.memory_limit > 0;
  const double limit = memory_limit_bytes(s);
  if (limit <= 0 || e.total() <= limit) return;
  const std::string where = limited ? "run.memory_limit = " + num_text(s.run.memory_limit) + " GiB"
                                    : "this machine's " + std::to_string(static_cast<long long>(limit / (1024.0 * 1024 * 1024) + 0.5)) +
                                          " GiB of memory";
  // Point at what makes it big: the RL batch when RL dominates, else the model.
  const std::string key = e.rl > e.activations + e.weights + e.optimizer
                              ? (p.set_at("rl.group_size") ? "rl.group_size" : "rl.prompts_per_step")
                              : (limited ? "run.memory_limit" : "data.batch_size");
  p.error(p.where(key), "the run needs " + e.describe() + ", more than " + where +
                            " (lower the batch, rl.prompts_per_step x rl.group_size or the model, or raise "
                            "run.memory_limit if this machine has more)");
}

}  // namespace spec_detail

}  // namespace troupe::launch
