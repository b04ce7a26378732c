// The synchronous RL loop (see trainer.hpp): generate -> reward -> train.
#include "rl/trainer.hpp"
#include "rl/task_jsonl.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <stdexcept>

#include "model/checkpoint.hpp"
#include "model/continuous_batch.hpp"
#include "model/kv_generate.hpp"
#include "model/params.hpp"
#include "model/policy_head.hpp"
#include "model/trainer.hpp"
#include "model/training_loop.hpp"
#include "model/update_rules.hpp"
#include "model/weights.hpp"
#include "moe/balance.hpp"
#include "rl/group.hpp"
#include "rl/loss.hpp"
#include "rl/parallel.hpp"
#include "rl/policy_stage_head.hpp"
#include "rl/rm_reward.hpp"
#include "rl/rollout.hpp"
#include "rl/rollout_step.hpp"
#include "rl/row_buckets.hpp"
#include "rl/task.hpp"
#include "model/clock.hpp"

namespace troupe::rl {

using kernels::Tensor;
using model::Clock;
using model::seconds_since;

namespace {


// The first update's view of the batch: mean entropy and k3 KL to the
// reference over the trained tokens, with what tells a real excursion of the
// policy from an estimator artefact: the largest single token's k3, the k1
// estimate (mean log pi - log ref, light-tailed) and k3 reweighted by
// pi / mu (self-normalised), which corrects for tokens sampled by an older
// behaviour policy mu.
void first_update_metrics(RlStepMetrics& m, std::span<const double> mask, std::span<const double> logp,
                          std::span<const double> logp_ref, std::span<const double> logp_behav,
                          std::span<const double> entropy) {
  double es = 0.0, ks = 0.0, k1 = 0.0, kmax = 0.0, n = 0.0, isw = 0.0, isk = 0.0;
  for (size_t k = 0; k < mask.size(); ++k) {
    if (mask[k] <= 0) continue;
    const double d = logp_ref[k] - logp[k];
    const double k3 = std::exp(d) - d - 1.0;
    es += entropy[k];
    ks += k3;
    k1 -= d;
    kmax = std::max(kmax, k3);
    n += 1.0;
    const double w = logp_behav.empty() ? 1.0 : std::exp(std::min(logp[k] - logp_behav[k], 50.0));
    isw += w;
    isk += w * k3;
  }
  m.entropy = n > 0 ? es / n : 0.0;
  m.kl_ref = n > 0 ? ks / n : 0.0;
  m.kl_ref_max = kmax;
  m.kl_ref_k1 = n > 0 ? k1 / n : 0.0;
  m.kl_ref_weighted = isw > 0 ? isk / isw : 0.0;
}

// The policy loss's inputs for one update: the log-probs of this update's
// forward, the proximal ones (the first update's), the reference's, and the
// scored batch's behaviour log-probs, advantages, mask and sequences.
PolicyTokens policy_tokens(std::span<const double> logp, std::span<const double> logp_prox,
                           std::span<const double> logp_ref, const ScoredBatch& sb) {
  PolicyTokens in;
  in.logp = logp;
  in.logp_prox = logp_prox;
  in.logp_behav = sb.logp_behav;
  in.logp_ref = logp_ref;
  in.advantage = sb.advantage;
  in.mask = sb.mask;
  in.offsets = sb.offsets;
  return in;
}

// An update's loss metrics (the last update's stand for the step).
void loss_metrics(RlStepMetrics& m, const PolicyMetrics& pm) {
  m.loss = pm.loss;
  m.pg_loss = pm.pg_loss;
  m.clip_low = pm.clip_low_fraction;
  m.clip_high = pm.clip_high_fraction;
  m.ratio_min = pm.ratio_min;
  m.ratio_mean = pm.ratio_mean;
  m.ratio_max = pm.ratio_max;
  m.weight_min = pm.behaviour_weight_min;
  m.weight_mean = pm.behaviour_weight_mean;
  m.weight_max = pm.behaviour_weight_max;
  m.approx_kl = pm.approx_kl;
}

}  // namespace

std::unique_ptr<Task> make_task(const RlConfig& rl, const model::DataConfig& data, uint64_t seed) {
  if (!rl.prompts.empty()) return make_jsonl_task(rl, data, seed);  // a user's task
  if (rl.task != "addition")
    throw std::invalid_argument("rl.task: unknown task \"" + rl.task + "\" (expected \"addition\")");
  std::unique_ptr<Task> task = make_addition_task(data, seed, rl.verifier);
  if (rl.sft_fraction <= 0) return task;
  std::unique_ptr<Task> side = make_sft_side_task(data, seed, rl.verifier);
  if (!side)
    throw std::invalid_argument("rl.sft_fraction: drawing prompts from the SFT side needs a target split "
                                "(data.target_pairs at one column, data.target_column >= 0)");
  return make_mixed_task(std::move(task), std::move(side), rl.sft_fraction);
}

struct RlTrainer::Impl {
  RlTrainOptions opt;
  uint64_t seed = 0;
  std::unique_ptr<Task> task;
  std::unique_ptr<Task> sft_side;  // evaluation of the split's other side, or null
  std::unique_ptr<kernels::Backend> be;
  model::ParamLayout layout;
  Tensor params, ref_params, grads, adam_m, adam_v;
  model::ModelWeights w, ref_w, g;
  std::vector<model::OptimizerRange> ranges;
  std::unique_ptr<model::ContinuousBatch> gen;     // the step's rollouts (rl.slots)
  std::unique_ptr<model::BatchGenerator> eval_gen;  // evaluation: whole chunks at once
  std::map<int64_t, std::unique_ptr<model::PolicyHead>> heads;  // by row length and rows (head_for)
  std::map<int64_t, int64_t> head_used;                          // when each was last used
  int64_t head_clock = 0;
  std::unique_ptr<ModelReward> model_reward;  // rl.reward = "model": the frozen RM
  std::unique_ptr<PolicyUpdater> updater;     // the update elsewhere (options.make_updater), or null
  // Devices 1.. of a data-parallel loop (RlTrainOptions::devices); device 0
  // is the members above. Each has its own backend, a copy of the parameters
  // and of the reference, its own gradients, heads and continuous batch.
  struct Replica {
    std::unique_ptr<kernels::Backend> be;
    Tensor params, ref_params, grads;
    model::ModelWeights w, ref_w, g;
    std::unique_ptr<model::ContinuousBatch> gen;
    std::map<int64_t, std::unique_ptr<model::PolicyHead>> heads;
    std::map<int64_t, int64_t> head_used;
  };
  std::vector<std::unique_ptr<Replica>> replicas;
  int64_t step = 0;
  bool bias_balance = false;

  Impl(const RlTrainOptions& o, std::unique_ptr<Task> t) : opt(o), seed(o.seed), task(std::move(t)) {
    for (const ConfigProblem& p : check_config(o.rl))
      throw std::invalid_argument("rl." + p.key + ": " + p.message);
    if (o.steps < 0) throw std::invalid_argument("rl training: steps must be >= 0");
    layout = model::build_param_layout(o.model);
    const int64_t P = layout.total();
    // The policy starts from `init` (and keeps it as the frozen reference).
    std::vector<float> init;
    if (!o.rl.init.empty()) {
      model::TrainingState st = model::load_checkpoint(o.rl.init, layout);
      const std::string diff = model::config_difference(o.model, st.config);
      if (!diff.empty())
        throw std::invalid_argument("rl.init " + o.rl.init + ": the checkpoint's model differs from [model] (" +
                                    diff + ")");
      init = std::move(st.params);
    } else {
      init = model::init_params(layout, o.model, seed);
    }
    std::vector<float> start = init;
    std::vector<float> m0, v0;
    if (!o.resume_from.empty()) {
      model::TrainingState st = model::load_checkpoint(o.resume_from, layout);
      const std::string diff = model::config_difference(o.model, st.config);
      if (!diff.empty())
        throw std::invalid_argument("resume " + o.resume_from + ": the checkpoint's model differs from [model] (" +
                                    diff + ")");
      if (st.data_cursor != st.step)
        throw std::invalid_argument("resume " + o.resume_from + ": data cursor " + std::to_string(st.data_cursor) +
                                    " does not match step " + std::to_string(st.step));
      seed = st.seed;
      step = st.step;
      start = std::move(st.params);
      m0 = std::move(st.adam_m);
      v0 = std::move(st.adam_v);
    }
    if (!task) task = make_task(o.rl, o.data, seed);
    if (o.data.eval_problems > 0) sft_side = make_sft_side_task(o.data, seed, o.rl.verifier);
    be = kernels::make_backend(o.backend);
    params = be->from_f32({P}, start);
    ref_params = be->from_f32({P}, init);
    grads = be->zeros({P});
    adam_m = be->zeros({P});
    adam_v = be->zeros({P});
    if (!m0.empty()) {
      be->upload_f32(adam_m, m0);
      be->upload_f32(adam_v, v0);
    }
    w = model::bind_weights(layout, o.model, params);
    ref_w = model::bind_weights(layout, o.model, ref_params);
    g = model::bind_weights(layout, o.model, grads);
    ranges = model::optimizer_ranges(layout);
    gen = std::make_unique<model::ContinuousBatch>(*be, o.model, generation_slots(o.rl));
    eval_gen = std::make_unique<model::BatchGenerator>(*be, o.model);
    if (o.devices < 1) throw std::invalid_argument("rl training: devices must be >= 1");
    if (o.devices > 1 && o.make_updater)
      throw std::invalid_argument("rl training: devices > 1 is the in-process loop's data parallelism, not an updater's");
    for (int64_t d = 1; d < o.devices; ++d) {
      auto r = std::make_unique<Replica>();
      r->be = kernels::make_backend(o.backend);
      r->params = r->be->from_f32({P}, start);
      r->ref_params = r->be->from_f32({P}, init);
      r->grads = r->be->zeros({P});
      r->w = model::bind_weights(layout, o.model, r->params);
      r->ref_w = model::bind_weights(layout, o.model, r->ref_params);
      r->g = model::bind_weights(layout, o.model, r->grads);
      r->gen = std::make_unique<model::ContinuousBatch>(*r->be, o.model, generation_slots(o.rl));
      replicas.push_back(std::move(r));
    }
    if (o.rl.reward == RewardSource::model) {
      const int64_t rows = o.rl.prompts_per_step * o.rl.group_size;
      const int64_t longest = static_cast<int64_t>(task->train_prompt(0).tokens.size()) + o.rl.max_new_tokens + 1;
      model_reward = std::make_unique<ModelReward>(*be, o.model, o.rl.reward_model, *task, rows, longest);
    }
    bias_balance = o.model.ffn == model::Ffn::moe && o.model.balance == moe::Balance::bias;
    if (o.make_updater) {
      PolicyUpdaterStart us;
      us.model = o.model;
      us.model.seq_len = updater_row_length();
      us.optim = o.optim;
      us.state.config = us.model;
      us.state.seed = seed;
      us.state.step = step * o.rl.updates_per_batch;
      us.state.params = std::move(start);
      us.state.adam_m = std::move(m0);
      us.state.adam_v = std::move(v0);
      us.rows = o.rl.prompts_per_step * o.rl.group_size;
      us.total_updates = o.steps * o.rl.updates_per_batch;
      us.seed = seed;
      updater = o.make_updater(us);
      if (!updater || updater->rows() != us.rows || updater->seq_len() != us.model.seq_len)
        throw std::invalid_argument("rl: the policy updater does not take " + std::to_string(us.rows) + " rows of " +
                                    std::to_string(us.model.seq_len) + " tokens");
    }
  }

  // Rows for an updater have one fixed length: the task's longest prompt
  // (when it cannot say, the longest of its first 1,024 training prompts)
  // plus max_new_tokens, rounded up to 8, at most seq_len (train_on refuses
  // a longer row).
  int64_t updater_row_length() const {
    int64_t longest = task->max_prompt_tokens();
    if (longest < 0)
      for (int64_t i = 0; i < 1024; ++i)
        longest = std::max<int64_t>(longest, static_cast<int64_t>(task->train_prompt(i).tokens.size()));
    return std::min<int64_t>(opt.model.seq_len, (std::max<int64_t>(longest, 1) + opt.rl.max_new_tokens + 7) / 8 * 8);
  }

  // A policy head for rows of `len` tokens (prompt + completion): causal
  // attention makes a short row's log-probs those of a seq_len row's prefix.
  // One per (chunk, row length, rows) in use: each chunk of a step keeps
  // its own activations from forward to backward. Row lengths follow each
  // step's completions, so long-tailed tasks see many: only the 2 x
  // rl.row_buckets used last are kept (keeping every length held 3.3 GB after 8
  // steps of the reasoning task).
  model::PolicyHead& head_for(int64_t device, int64_t chunk, int64_t len, int64_t rows) {
    auto& heads = device == 0 ? this->heads : replicas[static_cast<size_t>(device - 1)]->heads;
    auto& head_used = device == 0 ? this->head_used : replicas[static_cast<size_t>(device - 1)]->head_used;
    kernels::Backend& be = device == 0 ? *this->be : *replicas[static_cast<size_t>(device - 1)]->be;
    const int64_t key = (chunk * 100003 + len) * 1000003 + rows;
    auto it = heads.find(key);
    if (it == heads.end()) {
      if (heads.size() >= static_cast<size_t>(2 * std::max<int64_t>(1, opt.rl.row_buckets))) {
        auto oldest = heads.begin();
        for (auto h = heads.begin(); h != heads.end(); ++h)
          if (head_used[h->first] < head_used[oldest->first]) oldest = h;
        head_used.erase(oldest->first);
        heads.erase(oldest);
      }
      model::ModelConfig c = opt.model;
      c.seq_len = len;
      it = heads.emplace(key, std::make_unique<model::PolicyHead>(be, c, rows)).first;
    }
    head_used[key] = ++head_clock;
    return *it->second;
  }

  double train_temperature() const { return opt.rl.temperature > 0 ? opt.rl.temperature : 1.0; }

  model::GenerateOptions generate_options(double temperature) const {
    model::GenerateOptions go;
    go.max_new_tokens = opt.rl.max_new_tokens;
    go.sampling.temperature = temperature;
    go.sampling.top_p = opt.rl.top_p;
    go.eos = task->eos_token();
    return go;
  }

  // The optimizer step's rules as both pretraining engines apply them
  // (model/update_rules.hpp): clipping to the global norm, the scheduled LR
  // and AdamW per optimizer range, then the router-bias rule.
  void optimizer_step(RlStepMetrics& m, int64_t opt_step, int64_t total_opt_steps,
                      const std::vector<std::vector<int64_t>>& load) {
    m.grad_norm = std::sqrt(be->squared_norm(grads));
    m.lr = model::learning_rate(opt.optim, opt_step, total_opt_steps);
    for (const model::OptimizerRange& r : ranges)
      be->adamw(params.view(r.offset, {r.numel}), grads.view(r.offset, {r.numel}), adam_m.view(r.offset, {r.numel}),
                adam_v.view(r.offset, {r.numel}), model::adamw_params(opt.optim, opt_step, total_opt_steps, r.decay, m.grad_norm));
    if (bias_balance) {
      for (size_t l = 0; l < w.layers.size() && l < load.size(); ++l) {
        const Tensor& b = w.layers[l].moe.bias;
        std::vector<float> host = be->download_f32(b);
        moe::update_router_bias(host, load[l], opt.model.bias_update_rate);
        be->upload_f32(b, host);
      }
    }
  }

  // One length bucket of training rows (train_on): rows x S tokens, the
  // head that runs them (its activations kept from forward to backward).
  struct RowChunk {
    int64_t rows = 0, S = 0;
    double share = 1.0;  // rows / all rows: the chunk's weight of the MoE aux loss
    std::vector<int32_t> inputs, targets;
    // Its completion tokens: index k in score_groups' order, and the flat
    // position in these rows where token k is the target (both ascending in
    // k within a row; with one chunk in sample order, tok is 0, 1, 2, ...).
    std::vector<size_t> tok, at;
    model::PolicyHead* head = nullptr;
    int64_t device = 0;  // which device's head runs it (data-parallel loop)
  };

  int64_t devices() const { return 1 + static_cast<int64_t>(replicas.size()); }
  const model::ModelWeights& w_of(int64_t d) const { return d == 0 ? w : replicas[static_cast<size_t>(d - 1)]->w; }
  const model::ModelWeights& ref_w_of(int64_t d) const { return d == 0 ? ref_w : replicas[static_cast<size_t>(d - 1)]->ref_w; }
  const model::ModelWeights& g_of(int64_t d) const { return d == 0 ? g : replicas[static_cast<size_t>(d - 1)]->g; }

  std::vector<RowChunk> layout_rows(const std::vector<std::vector<int32_t>>& prompts,
                                    const std::vector<model::Completion>& comps, const std::vector<int64_t>& offsets) {
    const int64_t N = static_cast<int64_t>(prompts.size());
    auto length = [&](int64_t i) {
      return static_cast<int64_t>(prompts[static_cast<size_t>(i)].size() + comps[static_cast<size_t>(i)].tokens.size());
    };
    // Groups of rows, one chunk each, with their device.
    struct Group {
      std::vector<int64_t> rows;
      int64_t device = 0;
    };
    std::vector<Group> groups;
    const int64_t D = devices();
    std::vector<int64_t> order(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; ++i) order[static_cast<size_t>(i)] = i;
    // The updater's rows are one fixed length, in order. In process, with
    // K = max(rl.row_buckets, devices) > 1, the rows sorted by length in K
    // buckets, each padded to its own longest row (a multiple of 8); the
    // bucket boundaries are those with the fewest padded tokens in all
    // (dynamic programming over the sorted lengths), so a long tail's few
    // longest rows get a bucket of their own instead of padding a quarter of
    // the step to their length. The chunks do not depend on the device count
    // beyond K, so a data-parallel step trains the same chunks as one device
    // with row_buckets = K (only the gradients' grouping differs).
    const int64_t K = updater ? 1 : std::max<int64_t>({1, opt.rl.row_buckets, D});
    if (K == 1) {
      groups.push_back({order, 0});
    } else {
      std::stable_sort(order.begin(), order.end(), [&](int64_t x, int64_t y) { return length(x) < length(y); });
      std::vector<int64_t> padded(static_cast<size_t>(N));
      for (int64_t j = 0; j < N; ++j)
        padded[static_cast<size_t>(j)] = std::min<int64_t>(opt.model.seq_len, (length(order[static_cast<size_t>(j)]) + 7) / 8 * 8);
      const std::vector<std::pair<int64_t, int64_t>> spans = length_buckets(padded, K);
      for (const auto& [i, j] : spans) groups.push_back({std::vector<int64_t>(order.begin() + i, order.begin() + j), 0});
      // Data-parallel: the buckets dealt so that every device gets the same
      // padded tokens, the costliest first to the device with the fewest so
      // far (ties: the lower bucket, the lower device). Dealing them in a
      // snake instead left one device with the step's longest bucket and the
      // other idle up to half the training phase (rl_step's device_idle).
      if (D > 1) {
        std::vector<int64_t> costs;
        for (const auto& [i, j] : spans) costs.push_back((j - i) * padded[static_cast<size_t>(j - 1)]);
        const std::vector<int64_t> device = deal_buckets(costs, D);
        for (size_t g = 0; g < groups.size(); ++g) groups[g].device = device[g];
      }
    }
    const int32_t pad = task->eos_token() >= 0 ? task->eos_token() : 0;
    std::vector<RowChunk> chunks;
    for (const Group& gr : groups) {
      RowChunk ch;
      ch.rows = static_cast<int64_t>(gr.rows.size());
      int64_t longest = 1;
      for (int64_t i : gr.rows) longest = std::max(longest, length(i));
      ch.S = updater ? updater->seq_len() : std::min<int64_t>(opt.model.seq_len, (longest + 7) / 8 * 8);
      if (longest > ch.S)
        throw std::invalid_argument("RlTrainer::train_on: a row of " + std::to_string(longest) +
                                    " tokens (prompt + completion) does not fit the rows of " + std::to_string(ch.S));
      ch.share = static_cast<double>(ch.rows) / static_cast<double>(N);
      ch.inputs.assign(static_cast<size_t>(ch.rows * ch.S), pad);
      ch.targets.assign(static_cast<size_t>(ch.rows * ch.S), -1);
      for (int64_t r = 0; r < ch.rows; ++r) {
        const int64_t i = gr.rows[static_cast<size_t>(r)];
        const auto& p = prompts[static_cast<size_t>(i)];
        const auto& c = comps[static_cast<size_t>(i)].tokens;
        int32_t* row = ch.inputs.data() + r * ch.S;
        int64_t t = 0;
        for (int32_t x : p) row[t++] = x;
        for (size_t j = 0; j + 1 < c.size() && t < ch.S; ++j) row[t++] = c[j];
        for (size_t j = 0; j < c.size(); ++j) {
          const size_t at = static_cast<size_t>(r * ch.S + static_cast<int64_t>(p.size()) - 1 + static_cast<int64_t>(j));
          ch.targets[at] = c[j];
          ch.tok.push_back(static_cast<size_t>(offsets[static_cast<size_t>(i)]) + j);
          ch.at.push_back(at);
        }
      }
      const int64_t b = static_cast<int64_t>(chunks.size());
      ch.device = gr.device;
      ch.head = &head_for(ch.device, b, ch.S, ch.rows);
      chunks.push_back(std::move(ch));
    }
    return chunks;
  }

  RlStepMetrics run_step() {
    // Generate with the current policy (version = steps done), score, train.
    std::vector<model::ContinuousBatch*> gens{gen.get()};
    std::vector<const model::ModelWeights*> ws{&w};
    for (const auto& rp : replicas) {
      gens.push_back(rp->gen.get());
      ws.push_back(&rp->w);
    }
    const StepRollouts r = sample_step_parallel(gens, ws, *task, opt.rl, seed, step, step);
    const auto tr = Clock::now();
    const ScoredBatch sb = model_reward ? model_reward->score_step(opt.rl, r) : score_step(*task, opt.rl, r);
    return train_on(r, sb, seconds_since(tr));
  }

  // One RL step on a step's rollouts and their scores, wherever they were
  // sampled (here, or by a generator actor holding a copy of some version).
  RlStepMetrics train_on(const StepRollouts& r, const ScoredBatch& sb, double reward_seconds) {
    const auto t0 = Clock::now();
    const RlConfig& rl = opt.rl;
    const int64_t Pn = rl.prompts_per_step, G = rl.group_size, N = Pn * G;
    if (r.step != step)
      throw std::invalid_argument("RlTrainer::train_on: rollouts of step " + std::to_string(r.step) +
                                  " offered at step " + std::to_string(step));
    if (static_cast<int64_t>(r.completions.size()) != N || static_cast<int64_t>(r.prompts.size()) != Pn)
      throw std::invalid_argument("RlTrainer::train_on: rollouts do not have prompts_per_step x group_size completions");
    if (opt.on_rollouts && opt.rollouts_every > 0 && (step + 1) % opt.rollouts_every == 0) opt.on_rollouts(r, sb);
    RlStepMetrics m;
    m.step = step + 1;
    m.sampled_version = r.version;
    std::vector<std::vector<int32_t>> prompts(static_cast<size_t>(N));
    for (int64_t i = 0; i < N; ++i) prompts[i] = r.prompts[i / G].tokens;
    const std::vector<model::Completion>& comps = r.completions;
    m.gen_seconds = r.gen_seconds;
    for (int64_t i = 0; i < N; ++i) m.gen_tokens += static_cast<int64_t>(comps[i].tokens.size());
    m.reward_seconds = reward_seconds;
    m.reward_mean = sb.stats.reward_mean;
    m.reward_std = sb.stats.reward_std;
    m.groups = sb.stats.groups;
    m.zero_variance_groups = sb.stats.zero_variance_groups;
    m.zero_variance_share = sb.stats.zero_variance_share;
    m.correct = sb.correct_share;
    m.finished = sb.finished_share;
    m.response_length = sb.length_mean;
    m.gen_tokens_per_s = m.gen_seconds > 0 ? static_cast<double>(m.gen_tokens) / m.gen_seconds : 0.0;

    // 4. Training rows: row i is prompt_i + completion_i; completion token j
    //    is the target at position len(prompt_i) - 1 + j. In process, with
    //    rl.row_buckets > 1, the rows go in length buckets (sorted by length,
    //    each padded to its own longest row), so a long-tailed task does not
    //    pad every row to the step's longest completion; the updater takes
    //    one chunk of its fixed row length, in order.
    auto tt = Clock::now();
    const std::vector<RowChunk> chunks = layout_rows(prompts, comps, sb.offsets);
    const std::vector<double>& mask = sb.mask;
    const size_t T = sb.mask.size();
    const double temp = train_temperature();
    int64_t padded = 0;
    for (const RowChunk& c : chunks) padded += c.rows * c.S;

    // The frozen reference's log-probs: the KL penalty and its metric.
    // Each device runs its own chunks (a chunk's tokens are its own slots of
    // these arrays, so the devices never write the same element).
    std::vector<double> logp_ref(T);
    DeviceTimes times;
    on_each_device(devices(), [&](int64_t d) {
      for (const RowChunk& c : chunks) {
        if (c.device != d) continue;
        const model::PolicyForward& f = c.head->forward(ref_w_of(d), c.inputs, c.targets, temp);
        for (size_t x = 0; x < c.tok.size(); ++x) logp_ref[c.tok[x]] = f.logprobs[c.at[x]];
      }
    }, &times);
    const int64_t U = rl.updates_per_batch;
    if (updater) {
      update_elsewhere(m, chunks[0].inputs, chunks[0].targets, chunks[0].at, sb, logp_ref);
    } else {
      std::vector<double> logp(T), logp_prox, entropy(T), grad(T);
      std::vector<std::vector<float>> coef(chunks.size());
      std::vector<double> chunk_aux(chunks.size());
      std::vector<std::vector<std::vector<int64_t>>> chunk_load(chunks.size());
      for (int64_t u = 0; u < U; ++u) {
        on_each_device(devices(), [&](int64_t d) {
          for (size_t b = 0; b < chunks.size(); ++b) {
            const RowChunk& c = chunks[b];
            if (c.device != d) continue;
            const model::PolicyForward& f = c.head->forward(w_of(d), c.inputs, c.targets, temp);
            for (size_t x = 0; x < c.tok.size(); ++x) {
              logp[c.tok[x]] = f.logprobs[c.at[x]];
              entropy[c.tok[x]] = f.entropy[c.at[x]];
            }
            chunk_aux[b] = f.aux_loss * c.share;
          }
        }, &times);
        double aux = 0.0;
        for (double a : chunk_aux) aux += a;  // in chunk order, whichever device ran it
        if (u == 0) logp_prox = logp;  // the policy that sampled, recomputed (PPO's "old" policy)
        const PolicyTokens in = policy_tokens(logp, logp_prox, logp_ref, sb);
        const PolicyMetrics pm = policy_loss_forward(in, rl.policy);
        policy_loss_backward(grad, in, rl.policy);
        // Each chunk's backward, from its own head's forward above; the MoE
        // aux loss weighted by the chunk's share of the rows (its mean over
        // the batch), the expert loads summed for bias balancing.
        // Data-parallel: each device's gradients over its chunks, then their
        // sum in device order on device 0 (one fixed order: the same bits
        // whatever the threads' timing).
        on_each_device(devices(), [&](int64_t d) {
          kernels::Backend& dbe = d == 0 ? *be : *replicas[static_cast<size_t>(d - 1)]->be;
          dbe.fill(d == 0 ? grads : replicas[static_cast<size_t>(d - 1)]->grads, 0.0f);
          for (size_t b = 0; b < chunks.size(); ++b) {
            if (chunks[b].device != d) continue;
            coef[b].assign(chunks[b].inputs.size(), 0.0f);
            for (size_t x = 0; x < chunks[b].tok.size(); ++x)
              coef[b][chunks[b].at[x]] = static_cast<float>(grad[chunks[b].tok[x]]);
            chunks[b].head->backward(w_of(d), g_of(d), coef[b], chunks[b].share);
            chunk_load[b] = chunks[b].head->decoder().expert_load();
          }
        }, &times);
        for (const auto& rp : replicas) {
          const Tensor part = be->from_f32({grads.numel()}, rp->be->download_f32(rp->grads));
          be->axpy(grads, 1.0f, part);
        }
        std::vector<std::vector<int64_t>> load;
        for (const auto& l : chunk_load) {
          if (load.empty()) load = l;
          else
            for (size_t i = 0; i < l.size() && i < load.size(); ++i)
              for (size_t e = 0; e < l[i].size() && e < load[i].size(); ++e) load[i][e] += l[i][e];
        }
        if (u == 0) first_update_metrics(m, mask, logp, logp_ref, sb.logp_behav, entropy);
        loss_metrics(m, pm);
        m.aux_loss = aux;
        optimizer_step(m, step * U + u, opt.steps * U, load);
        broadcast_params();
      }
    }
    m.train_tokens = padded * U;
    be->synchronize();
    m.train_seconds = seconds_since(tt);
    m.train_serial_seconds = std::max(0.0, m.train_seconds - times.in_calls);
    if (devices() > 1) {
      m.train_idle_seconds = times.idle(m.train_seconds);
      m.gen_idle_seconds = r.device_idle_seconds;
      m.gen_idle_seconds.resize(static_cast<size_t>(devices()), 0.0);  // rollouts sampled elsewhere: none
    }
    m.train_tokens_per_s = m.train_seconds > 0 ? static_cast<double>(m.train_tokens) / m.train_seconds : 0.0;
    ++step;
    m.step_seconds = seconds_since(t0) + m.gen_seconds + m.reward_seconds;
    return m;
  }

  // Device 0's parameters (after an optimizer step, a load) to the others.
  void broadcast_params() {
    if (replicas.empty()) return;
    const std::vector<float> host = be->download_f32(params);
    for (const auto& rp : replicas) rp->be->upload_f32(rp->params, host);
  }

  // train_on's updates through the updater: per update, the rows and each
  // token's inputs (PolicyStageHead's columns: its batch-wide aggregation
  // weight, the proximal log-prob from the first update's forward, the
  // behaviour and reference log-probs, the advantage) go out; the per-token
  // log-probs and entropies come back, from which the loss metrics are
  // computed exactly as in the in-process update. Then the trainer's copy of
  // the parameters is refreshed (generation, evaluation, publication).
  void update_elsewhere(RlStepMetrics& m, const std::vector<int32_t>& inputs, const std::vector<int32_t>& targets,
                        const std::vector<size_t>& pos, const ScoredBatch& sb, const std::vector<double>& logp_ref) {
    const RlConfig& rl = opt.rl;
    const size_t T = pos.size();
    constexpr int64_t K = PolicyStageHead::kColumns, R = PolicyStageHead::kReportColumns;
    std::vector<double> c(T);
    aggregation_weights(c, sb.mask, sb.offsets, rl.policy.aggregation, rl.policy.constant_norm);
    const bool with_ref = rl.policy.kl_coef > 0;
    std::vector<double> logp(T), logp_prox, entropy(T);
    for (int64_t u = 0; u < rl.updates_per_batch; ++u) {
      std::vector<double> data(inputs.size() * K, 0.0);
      for (size_t k = 0; k < T; ++k) {
        double* d = data.data() + pos[k] * K;
        d[PolicyStageHead::kC] = c[k];
        d[PolicyStageHead::kProx] = u == 0 ? std::nan("") : logp_prox[k];
        d[PolicyStageHead::kBehav] = sb.logp_behav[k];
        d[PolicyStageHead::kRef] = with_ref ? logp_ref[k] : std::nan("");
        d[PolicyStageHead::kAdv] = sb.advantage[k];
      }
      const PolicyUpdater::Result res = updater->update(inputs, targets, std::move(data));
      if (res.report.size() != inputs.size() * R)
        throw std::runtime_error("rl: the policy updater reported " + std::to_string(res.report.size()) +
                                 " values for " + std::to_string(inputs.size()) + " tokens");
      for (size_t k = 0; k < T; ++k) {
        logp[k] = res.report[pos[k] * R + PolicyStageHead::kLogp];
        entropy[k] = res.report[pos[k] * R + PolicyStageHead::kEntropy];
      }
      if (u == 0) logp_prox = logp;
      const PolicyTokens in = policy_tokens(logp, logp_prox, logp_ref, sb);
      const PolicyMetrics pm = policy_loss_forward(in, rl.policy);
      if (u == 0) first_update_metrics(m, sb.mask, logp, logp_ref, sb.logp_behav, entropy);
      loss_metrics(m, pm);
      m.aux_loss = res.aux_loss;
      m.grad_norm = res.grad_norm;
      m.lr = res.lr;
    }
    be->upload_f32(params, updater->read_params());
  }

  // The updater's parameters and moments into the trainer's buffers (before
  // a checkpoint: the moments stay with the updater in between).
  void pull_state() {
    std::vector<float> p, am, av;
    updater->read_state(p, am, av);
    be->upload_f32(params, p);
    if (!am.empty()) {
      be->upload_f32(adam_m, am);
      be->upload_f32(adam_v, av);
    }
  }

  // Greedy exact match and mean reward, and pass@k at the run's temperature,
  // of `t`'s first eval_problems held-out problems.
  struct SplitScore {
    int64_t problems = 0;
    double exact_match = 0.0, mean_reward = 0.0, pass_at_k = 0.0;
  };
  SplitScore score_split(const Task& t) {
    SplitScore e;
    const std::vector<Prompt> probs = t.eval_prompts(opt.data.eval_problems);
    e.problems = static_cast<int64_t>(probs.size());
    if (probs.empty()) return e;
    constexpr int64_t kChunk = 128;  // sequences per generator batch
    // Greedy: exact match and mean reward.
    int64_t exact = 0;
    double reward = 0.0;
    for (size_t at = 0; at < probs.size(); at += kChunk) {
      const size_t n = std::min<size_t>(kChunk, probs.size() - at);
      std::vector<std::vector<int32_t>> ps;
      std::vector<model::SamplerRng> rngs(n, model::SamplerRng(0));
      for (size_t i = 0; i < n; ++i) ps.push_back(probs[at + i].tokens);
      const auto comps = eval_gen->generate(w, ps, std::span<model::SamplerRng>(rngs), generate_options(0.0));
      std::vector<const Prompt*> pp(n);
      std::vector<std::span<const int32_t>> cc(n);
      for (size_t i = 0; i < n; ++i) pp[i] = &probs[at + i], cc[i] = comps[i].tokens;
      for (const Verdict& v : t.verifier().score_batch(pp, cc)) {  // one batch: a reward program's round trip
        exact += v.correct;
        reward += v.reward;
      }
    }
    e.exact_match = static_cast<double>(exact) / static_cast<double>(probs.size());
    e.mean_reward = reward / static_cast<double>(probs.size());
    // pass@k: k samples per problem at the run's temperature, with seeds that
    // depend on the problem only, so evaluations compare across runs and steps.
    const int64_t K = opt.rl.group_size;
    std::vector<uint8_t> solved(probs.size(), 0);
    const int64_t per_chunk = std::max<int64_t>(1, kChunk / K);
    for (size_t at = 0; at < probs.size(); at += static_cast<size_t>(per_chunk)) {
      const size_t n = std::min<size_t>(static_cast<size_t>(per_chunk), probs.size() - at);
      std::vector<std::vector<int32_t>> ps;
      std::vector<model::SamplerRng> rngs;
      for (size_t i = 0; i < n; ++i)
        for (int64_t k = 0; k < K; ++k) {
          ps.push_back(probs[at + i].tokens);
          rngs.emplace_back(sampler_seed(GroupId{0, -1 - static_cast<int64_t>(at + i), 0}, k));
        }
      const double temp = opt.rl.temperature > 0 ? opt.rl.temperature : 1.0;
      const auto comps = eval_gen->generate(w, ps, std::span<model::SamplerRng>(rngs), generate_options(temp));
      std::vector<const Prompt*> pp;
      std::vector<std::span<const int32_t>> cc;
      for (size_t i = 0; i < n; ++i)
        for (int64_t k = 0; k < K; ++k) pp.push_back(&probs[at + i]), cc.push_back(comps[i * static_cast<size_t>(K) + static_cast<size_t>(k)].tokens);
      const std::vector<Verdict> v = t.verifier().score_batch(pp, cc);
      for (size_t j = 0; j < v.size(); ++j)
        if (v[j].correct) solved[at + j / static_cast<size_t>(K)] = 1;
    }
    int64_t pass = 0;
    for (uint8_t x : solved) pass += x;
    e.pass_at_k = static_cast<double>(pass) / static_cast<double>(probs.size());
    return e;
  }

  RlEvalMetrics run_eval() {
    const auto t0 = Clock::now();
    RlEvalMetrics e;
    e.step = step;
    e.k = opt.rl.group_size;
    const SplitScore target = score_split(*task);
    e.problems = target.problems;
    e.exact_match = target.exact_match;
    e.mean_reward = target.mean_reward;
    e.pass_at_k = target.pass_at_k;
    if (sft_side) {
      const SplitScore side = score_split(*sft_side);
      e.sft_problems = side.problems;
      e.sft_exact_match = side.exact_match;
      e.sft_mean_reward = side.mean_reward;
      e.sft_pass_at_k = side.pass_at_k;
    }
    e.seconds = seconds_since(t0);
    return e;
  }

  void save(const std::string& dir) {
    if (updater) pull_state();
    model::save_device_state(dir, opt.model, seed, step, *be, params, adam_m, adam_v, layout);
  }
};

RlTrainer::RlTrainer(const RlTrainOptions& options, std::unique_ptr<Task> task)
    : impl_(std::make_unique<Impl>(options, std::move(task))) {}
RlTrainer::~RlTrainer() = default;
RlStepMetrics RlTrainer::step() { return impl_->run_step(); }
RlStepMetrics RlTrainer::train_on(const StepRollouts& rollouts, const ScoredBatch& scored, double reward_seconds) {
  return impl_->train_on(rollouts, scored, reward_seconds);
}
RlEvalMetrics RlTrainer::evaluate() { return impl_->run_eval(); }
void RlTrainer::save(const std::string& dir) { impl_->save(dir); }
int64_t RlTrainer::steps_done() const { return impl_->step; }
std::vector<float> RlTrainer::parameters() const { return impl_->be->download_f32(impl_->params); }
const Task& RlTrainer::task() const { return *impl_->task; }

namespace {

// The RL trainer as an engine of the one loop (model/training_loop.hpp).
class RlEngine final : public model::LoopEngine {
 public:
  RlEngine(RlTrainer& tr, RlObserver& obs, RlSummary& s, const std::function<RlStepMetrics()>& step_fn,
           const std::function<void(const std::string&)>& after_save)
      : tr_(tr), obs_(obs), s_(s), step_fn_(step_fn), after_save_(after_save) {}
  int64_t steps_done() const override { return tr_.steps_done(); }
  void step() override {
    const RlStepMetrics m = step_fn_ ? step_fn_() : tr_.step();
    s_.final_reward = m.reward_mean;
    obs_.on_step(m);
  }
  void evaluate() override {
    RlEvalMetrics& e = tr_.steps_done() == 0 ? s_.first_eval : s_.last_eval;
    e = tr_.evaluate();
    obs_.on_eval(e);
  }
  void save(const std::string& dir) override {
    tr_.save(dir);
    if (after_save_) after_save_(dir);
  }

 private:
  RlTrainer& tr_;
  RlObserver& obs_;
  RlSummary& s_;
  const std::function<RlStepMetrics()>& step_fn_;
  const std::function<void(const std::string&)>& after_save_;
};

}  // namespace

RlSummary train(const RlTrainOptions& o, RlObserver& obs) {
  RlTrainer tr(o);
  return run_rl_loop(tr, o, obs, {});
}

RlSummary run_rl_loop(RlTrainer& tr, const RlTrainOptions& o, RlObserver& obs,
                      const std::function<RlStepMetrics()>& step_fn,
                      const std::function<void(const std::string&)>& after_save) {
  RlSummary s;
  RlEngine engine(tr, obs, s, step_fn, after_save);
  model::LoopOptions lo;
  lo.steps = o.steps;
  lo.eval_every = o.data.eval_problems > 0 ? (o.eval_every > 0 ? o.eval_every : o.steps) : 0;
  lo.eval_at_start = true;  // the base the run starts from (fresh runs)
  lo.checkpoint_every = o.checkpoint_every;
  lo.checkpoint_dir = o.checkpoint_dir;
  lo.stop = o.stop;
  const model::LoopOutcome out =
      model::run_loop(engine, lo, [&obs](int64_t step, const std::string& dir) { obs.on_checkpoint(step, dir); });
  s.steps_done = out.steps_done;
  s.interrupted = out.interrupted;
  return s;
}

std::vector<double> RlStepMetrics::device_idle_shares() const {
  const double wall = gen_seconds + reward_seconds + train_seconds;
  std::vector<double> out(train_idle_seconds.size(), 0.0);
  if (wall <= 0.0) return out;
  for (size_t d = 0; d < out.size(); ++d) {
    const double gen_idle = d < gen_idle_seconds.size() ? gen_idle_seconds[d] : 0.0;
    out[d] = std::min(1.0, (gen_idle + train_idle_seconds[d] + (d > 0 ? reward_seconds : 0.0)) / wall);
  }
  return out;
}

}  // namespace troupe::rl
