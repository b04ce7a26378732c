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
#include <cmath>
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
  e.terms.push_back({"model.*", "the model's parameters, gradients and AdamW moments", e.weights + e.optimizer});
  // A pretraining step (phase 1 of a two-phase job): every sequence of the
  // batch keeps its activations until its backward.
  const bool trains = s.run.mode == RunMode::pretrain || s.run.mode == RunMode::sft_rl;
  if (trains) {
    const double per_row = kFloat * static_cast<double>(m.seq_len) * floats_per_token(m, m.seq_len);
    e.activations = per_row * static_cast<double>(s.data.batch_size);
    e.terms.push_back({"data.batch_size", "a training step's activations", e.activations, 0.0, per_row,
                       static_cast<double>(s.data.batch_size)});
  }
  if (s.run.mode == RunMode::rl || s.run.mode == RunMode::sft_rl || s.run.mode == RunMode::reward_model) {
    const rl::RlConfig& r = s.rl;
    const double rows = static_cast<double>(std::max<int64_t>(1, r.prompts_per_step)) *
                        static_cast<double>(std::max<int64_t>(1, r.group_size));
    // Rows are the task's longest prompt plus the completion, within seq_len
    // (RL runs are validated to have the addition task before this runs).
    // A user's task (rl.prompts) is bounded by seq_len alone (its files are checked elsewhere).
    const int64_t prompt = r.prompts.empty()
                               ? rl::make_addition_task(s.data, static_cast<uint64_t>(s.run.seed), r.verifier)->max_prompt_tokens()
                               : m.seq_len;
    const int64_t len = std::min<int64_t>(m.seq_len, std::max<int64_t>(prompt, 1) + r.max_new_tokens + 1);
    // The synchronous loop data-parallel over D devices keeps a parameter,
    // reference and gradient copy and a continuous batch per further device.
    const double dp = s.run.mode == RunMode::rl && sync_data_parallel(s) ? static_cast<double>(s.topology.devices) : 1.0;
    const bool decoupled = rl::decoupled(r.sync);
    const double copies = 1.0 + (decoupled ? static_cast<double>(r.generators) : 3.0 * (dp - 1.0));
    // The KV cache: rl.slots rows of seq_len positions per running step; a
    // generator runs up to two steps side by side (rl/rollout_step.hpp).
    const double slots = static_cast<double>(rl::generation_slots(r));
    const double slot_rows = decoupled ? 2.0 * static_cast<double>(r.generators) : dp;
    const double per_slot = kFloat * slot_rows * static_cast<double>(m.n_layers) * 2.0 *
                            static_cast<double>(m.seq_len) * static_cast<double>(m.d_model);
    const double per_row = kFloat * static_cast<double>(len) * floats_per_token(m, len);
    e.rl = kFloat * copies * P + per_slot * slots + per_row * rows;
    if (decoupled)
      e.terms.push_back({"rl.generators", "the reference's and the generators' policy copies", kFloat * copies * P,
                         kFloat * P, kFloat * P, static_cast<double>(r.generators)});
    else if (dp > 1.0)
      e.terms.push_back({"topology.devices", "the reference and the data-parallel devices' copies",
                         kFloat * copies * P, kFloat * P, 3.0 * kFloat * P, dp});
    else
      e.terms.push_back({"model.*", "the reference policy", kFloat * copies * P});
    e.terms.push_back({"rl.slots", r.slots > 0 ? "the generation KV cache" : "the generation KV cache (rl.slots = 0: "
                                                                               "a whole step's sequences at once)",
                       per_slot * slots, 0.0, per_slot, slots});
    e.terms.push_back({"rl.prompts_per_step x rl.group_size", "the policy update's activations and logits",
                       per_row * rows, 0.0, per_row, rows});
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
  // Name the term that dominates, at its key, and list each setting that
  // alone would bring the estimate under the limit.
  const MemoryEstimate::Term* top = &e.terms.front();
  for (const MemoryEstimate::Term& t : e.terms)
    if (t.bytes > top->bytes) top = &t;
  const double excess = e.total() - limit;
  std::vector<std::string> fixes;
  for (const MemoryEstimate::Term& t : e.terms) {
    if (t.per_unit <= 0.0) continue;
    const double fits = std::floor((t.bytes - excess - t.fixed) / t.per_unit);
    if (fits >= 1.0 && fits < t.value) fixes.push_back(t.key + " <= " + num_text(fits));
  }
  if (top->key == "model.*" || fixes.empty()) fixes.push_back("a smaller model (model.d_model, model.n_layers, ...)");
  fixes.push_back(limited ? "run.memory_limit >= " + gib(e.total()) + " if this machine has that much"
                          : "a machine with more memory");
  std::string advice;
  for (size_t i = 0; i < fixes.size(); ++i) advice += (i == 0 ? "" : i + 1 == fixes.size() ? " or " : ", ") + fixes[i];
  std::string key = top->key;
  if (key == "model.*") key = p.first_set_with_prefix("model.") ? "model" : "run.memory_limit";
  if (key == "rl.prompts_per_step x rl.group_size") key = p.set_at("rl.group_size") ? "rl.group_size" : "rl.prompts_per_step";
  const Pos at = key == "model" ? *p.first_set_with_prefix("model.") : p.where(key);
  const std::string term = top->per_unit > 0.0 ? top->key + " = " + num_text(top->value) : top->key;
  p.error(at, "the run needs " + e.describe() + ", more than " + where + "; the largest part is " + top->what +
                  " (" + term + "): " + gib(top->bytes) + ". Any one of these would fit: " + advice);
}

}  // namespace spec_detail

}  // namespace troupe::launch
