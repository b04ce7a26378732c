// Reward-model training (see rm_trainer.hpp): label data with the starting
// policy, then pointwise BCE or Bradley–Terry steps through the decoder's
// logits backward.
#include "rl/rm_trainer.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <stdexcept>

#include "model/checkpoint.hpp"
#include "model/decoder.hpp"
#include "model/params.hpp"
#include "model/training_loop.hpp"
#include "model/update_rules.hpp"
#include "moe/balance.hpp"
#include "rl/group.hpp"
#include "rl/task.hpp"
#include "model/clock.hpp"

namespace troupe::rl {

using kernels::Tensor;
using model::Clock;
using model::seconds_since;

namespace {


// Salts of the two data sets' sampler seeds ("RMtr", "RMho"): neither can meet
// an RL step's seeds, whose step field is >= 0 with the run's own seed.
constexpr uint64_t kTrainSalt = 0x524d7472, kHeldoutSalt = 0x524d686f;

// What a reward-model run trains on, as one line stored in its checkpoints
// (TrainingState::rng_state): the seed, the loss, the batch and an FNV-1a
// hash of every labelled example. A resume recomputes it from rl.init and
// the spec, so a run continues only on the data, in the order, it began with.
std::string run_fingerprint(const RlTrainOptions& o, const std::vector<RmExample>& train,
                            const std::vector<RmExample>& heldout) {
  uint64_t h = 0xcbf29ce484222325ull;
  auto mix = [&h](int64_t x) {
    for (int i = 0; i < 8; ++i) {
      h ^= static_cast<uint64_t>(x >> (8 * i)) & 0xff;
      h *= 0x100000001b3ull;
    }
  };
  for (const auto* set : {&train, &heldout}) {
    mix(static_cast<int64_t>(set->size()));
    for (const RmExample& e : *set) {
      mix(e.prompt_index);
      mix(e.label);
      mix(static_cast<int64_t>(e.prompt.size()));
      for (int32_t t : e.prompt) mix(t);
      mix(static_cast<int64_t>(e.completion.size()));
      for (int32_t t : e.completion) mix(t);
    }
  }
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016llx", static_cast<unsigned long long>(h));
  return "reward model: seed " + std::to_string(o.seed) + ", rm_loss " + rm_loss_name(o.rl.rm_loss) + ", rm_batch " +
         std::to_string(o.rl.rm_batch) + ", data " + hex;
}

std::vector<int> labels_of(const std::vector<RmExample>& ex) {
  std::vector<int> y;
  y.reserve(ex.size());
  for (const RmExample& e : ex) y.push_back(e.label);
  return y;
}

}  // namespace

struct RmTrainer::Impl {
  RlTrainOptions opt;
  std::unique_ptr<Task> task;
  std::unique_ptr<kernels::Backend> be;
  model::ParamLayout layout;
  Tensor params, grads, adam_m, adam_v;
  model::ModelWeights w, g;
  std::vector<model::OptimizerRange> ranges;
  std::vector<RmExample> train, heldout;
  RmPairSet train_pairs, heldout_pairs;
  bool pairwise = false;  // rm_loss = bradley_terry
  RmDataStats stats;
  std::unique_ptr<RewardModel> rm;
  std::vector<size_t> perm;  // the current epoch's order of the training items (examples or pairs)
  int64_t perm_epoch = -1;
  int64_t step = 0;
  int64_t resumed_from = 0;
  std::string fingerprint;  // run_fingerprint(), saved with every checkpoint
  bool bias_balance = false;

  Impl(const RlTrainOptions& o, std::unique_ptr<Task> t) : opt(o), task(std::move(t)) {
    for (const ConfigProblem& p : check_config(o.rl)) throw std::invalid_argument("rl." + p.key + ": " + p.message);
    if (o.steps < 0) throw std::invalid_argument("reward model training: steps must be >= 0");
    layout = model::build_param_layout(o.model);
    std::vector<float> init;
    if (!o.rl.init.empty()) {
      model::TrainingState st = model::load_checkpoint(o.rl.init, layout);
      const std::string diff = model::config_difference(o.model, st.config);
      if (!diff.empty())
        throw std::invalid_argument("rl.init " + o.rl.init + ": the checkpoint's model differs from [model] (" + diff + ")");
      init = std::move(st.params);
    } else {
      init = model::init_params(layout, o.model, o.seed);
    }
    if (!task) task = make_task(o.rl, o.data, o.seed);
    be = kernels::make_backend(o.backend);
    const int64_t P = layout.total();
    params = be->from_f32({P}, init);
    grads = be->zeros({P});
    adam_m = be->zeros({P});
    adam_v = be->zeros({P});
    w = model::bind_weights(layout, o.model, params);
    g = model::bind_weights(layout, o.model, grads);
    ranges = model::optimizer_ranges(layout);
    bias_balance = o.model.ffn == model::Ffn::moe && o.model.balance == moe::Balance::bias;

    // The data: the starting policy's completions, labelled by the verifier.
    const auto t0 = Clock::now();
    {
      model::BatchGenerator gen(*be, o.model);
      model::GenerateOptions go;
      go.max_new_tokens = o.rl.max_new_tokens;
      go.sampling.temperature = o.rl.temperature;
      go.sampling.top_p = o.rl.top_p;
      go.eos = task->eos_token();
      std::vector<Prompt> tp;
      for (int64_t i = 0; i < o.rl.rm_prompts; ++i) tp.push_back(task->train_prompt(i));
      train = label_completions(gen, w, *task, tp, o.rl.group_size, go, kTrainSalt ^ (o.seed << 32));
      heldout = label_completions(gen, w, *task, task->eval_prompts(o.data.eval_problems), o.rl.group_size, go,
                                  kHeldoutSalt ^ (o.seed << 32));
    }
    stats.seconds = seconds_since(t0);
    stats.train_examples = static_cast<int64_t>(train.size());
    stats.heldout_examples = static_cast<int64_t>(heldout.size());
    for (const RmExample& e : train) stats.train_positives += e.label;
    for (const RmExample& e : heldout) stats.heldout_positives += e.label;
    train_pairs = make_pairs(train);
    heldout_pairs = make_pairs(heldout);
    stats.train_groups = train_pairs.counts;
    stats.heldout_groups = heldout_pairs.counts;
    pairwise = o.rl.rm_loss == RmLoss::bradley_terry;
    if (pairwise && train_pairs.pairs.empty())
      throw std::invalid_argument(
          "reward model training: rl.rm_loss = \"bradley_terry\" needs pairs, but none of the " +
          std::to_string(train_pairs.counts.groups) + " training prompts has both an accepted and a rejected completion (" +
          std::to_string(train_pairs.counts.all_right) + " all right, " + std::to_string(train_pairs.counts.all_wrong) +
          " all wrong); use rm_loss = \"bce\", more rm_prompts or a larger group_size");
    int64_t longest = 1;
    for (const auto* set : {&train, &heldout})
      for (const RmExample& e : *set)
        longest = std::max<int64_t>(longest, static_cast<int64_t>(e.prompt.size() + e.completion.size()) + 1);
    rm = std::make_unique<RewardModel>(*be, o.model, rows_per_step(), longest);

    // Resume: the data above is relabelled from rl.init (a pure function of
    // the spec), the weights and AdamW moments come from the checkpoint, and
    // the batch order is a function of (seed, step): the run continues bit
    // for bit.
    fingerprint = run_fingerprint(o, train, heldout);
    if (!o.resume_from.empty()) {
      model::TrainingState st = model::load_checkpoint(o.resume_from, layout);
      // A checkpoint that does not belong to this run is a bad input file.
      const std::string diff = model::config_difference(o.model, st.config);
      if (!diff.empty())
        throw model::CheckpointError(o.resume_from, "the checkpoint's model differs from [model] (" + diff + ")");
      if (st.rng_state.rfind("reward model:", 0) != 0)
        throw model::CheckpointError(o.resume_from, "not a checkpoint of a reward-model run (run.mode = \"reward_model\")");
      if (st.rng_state != fingerprint)
        throw model::CheckpointError(o.resume_from, "the checkpoint was trained as \"" + st.rng_state + "\", this spec gives \"" +
                                                        fingerprint + "\" (a run resumes only with the seed, rl.init, task, "
                                                        "sampling keys, rm_loss and rm_batch it started with)");
      if (st.adam_m.empty()) throw model::CheckpointError(o.resume_from, "the checkpoint has no optimizer state");
      be->upload_f32(params, st.params);
      be->upload_f32(adam_m, st.adam_m);
      be->upload_f32(adam_v, st.adam_v);
      step = resumed_from = st.step;
    }
  }

  // Training items per step: examples (BCE) or pairs (Bradley–Terry, two rows
  // each), never more than the data holds.
  int64_t items_per_step() const {
    return pairwise ? std::min<int64_t>(opt.rl.rm_batch / 2, static_cast<int64_t>(train_pairs.pairs.size()))
                    : std::min<int64_t>(opt.rl.rm_batch, static_cast<int64_t>(train.size()));
  }
  int64_t rows_per_step() const { return pairwise ? 2 * items_per_step() : items_per_step(); }

  // Index of the training item (example or pair, n of them) at position k of
  // the endless sequence of epochs, each a seeded Fisher-Yates permutation
  // (SamplerRng, so it is the same everywhere).
  size_t item_at(int64_t k, int64_t n) {
    const int64_t epoch = k / n;
    if (epoch != perm_epoch) {
      perm.resize(static_cast<size_t>(n));
      std::iota(perm.begin(), perm.end(), size_t{0});
      model::SamplerRng rng(sampler_seed(GroupId{opt.seed, epoch, 0}, -7));
      for (size_t i = perm.size(); i > 1; --i) std::swap(perm[i - 1], perm[rng.next_u64() % i]);
      perm_epoch = epoch;
    }
    return perm[static_cast<size_t>(k % n)];
  }

  RmStepMetrics run_step() {
    const auto t0 = Clock::now();
    RmStepMetrics m;
    m.step = step + 1;
    const int64_t B = items_per_step();
    std::vector<RmExample> batch;
    batch.reserve(static_cast<size_t>(rows_per_step()));
    be->fill(grads, 0.0f);
    std::vector<double> scores;
    if (pairwise) {
      // Rows 2b and 2b + 1: pair b's accepted and rejected completion.
      const int64_t n = static_cast<int64_t>(train_pairs.pairs.size());
      std::vector<RmPair> local;
      for (int64_t b = 0; b < B; ++b) {
        const RmPair& p = train_pairs.pairs[item_at(step * B + b, n)];
        batch.push_back(train[static_cast<size_t>(p.pos)]);
        batch.push_back(train[static_cast<size_t>(p.neg)]);
        local.push_back({2 * b, 2 * b + 1});
      }
      m.loss = rm->train_pairs(w, g, batch, local, 1.0, &scores);
      m.batch_accuracy = rm_pair_accuracy(scores, local).accuracy;
    } else {
      const int64_t n = static_cast<int64_t>(train.size());
      for (int64_t b = 0; b < B; ++b) batch.push_back(train[item_at(step * B + b, n)]);
      m.loss = rm->train_batch(w, g, batch, 1.0, &scores);
      m.batch_accuracy = rm_accuracy(scores, labels_of(batch)).accuracy;
    }
    // The optimizer rules every engine applies (model/update_rules.hpp).
    m.grad_norm = std::sqrt(be->squared_norm(grads));
    m.lr = model::learning_rate(opt.optim, step, opt.steps);
    for (const model::OptimizerRange& r : ranges)
      be->adamw(params.view(r.offset, {r.numel}), grads.view(r.offset, {r.numel}), adam_m.view(r.offset, {r.numel}),
                adam_v.view(r.offset, {r.numel}), model::adamw_params(opt.optim, step, opt.steps, r.decay, m.grad_norm));
    if (bias_balance) {
      const auto load = rm->decoder().expert_load();
      for (size_t l = 0; l < w.layers.size() && l < load.size(); ++l) {
        const Tensor& bias = w.layers[l].moe.bias;
        std::vector<float> host = be->download_f32(bias);
        moe::update_router_bias(host, load[l], opt.model.bias_update_rate);
        be->upload_f32(bias, host);
      }
    }
    be->synchronize();
    ++step;
    m.seconds = seconds_since(t0);
    return m;
  }

  RmEvalMetrics run_eval() {
    const auto t0 = Clock::now();
    RmEvalMetrics e;
    e.step = step;
    if (!heldout.empty()) {
      const std::vector<double> s = rm->score(w, heldout);
      e.heldout = rm_accuracy(s, labels_of(heldout));
      e.heldout_pairs = rm_pair_accuracy(s, heldout_pairs.pairs);
    }
    const std::vector<double> s = rm->score(w, train);
    e.train = rm_accuracy(s, labels_of(train));
    e.train_pairs = rm_pair_accuracy(s, train_pairs.pairs);
    e.seconds = seconds_since(t0);
    return e;
  }

  void save(const std::string& dir) {
    model::save_device_state(dir, opt.model, opt.seed, step, *be, params, adam_m, adam_v, layout, fingerprint);
  }
};

RmTrainer::RmTrainer(const RlTrainOptions& o, std::unique_ptr<Task> task)
    : impl_(std::make_unique<Impl>(o, std::move(task))) {}
RmTrainer::~RmTrainer() = default;
RmStepMetrics RmTrainer::step() { return impl_->run_step(); }
RmEvalMetrics RmTrainer::evaluate() { return impl_->run_eval(); }
void RmTrainer::save(const std::string& dir) { impl_->save(dir); }
int64_t RmTrainer::steps_done() const { return impl_->step; }
int64_t RmTrainer::resumed_from() const { return impl_->resumed_from; }
const RmDataStats& RmTrainer::data_stats() const { return impl_->stats; }
const std::vector<RmExample>& RmTrainer::train_examples() const { return impl_->train; }
const std::vector<RmExample>& RmTrainer::heldout_examples() const { return impl_->heldout; }
const RmPairSet& RmTrainer::train_pairs() const { return impl_->train_pairs; }
const RmPairSet& RmTrainer::heldout_pairs() const { return impl_->heldout_pairs; }
std::vector<double> RmTrainer::score(const std::vector<RmExample>& ex) { return impl_->rm->score(impl_->w, ex); }
std::vector<float> RmTrainer::parameters() const { return impl_->be->download_f32(impl_->params); }
const Task& RmTrainer::task() const { return *impl_->task; }

namespace {

class RmEngine final : public model::LoopEngine {
 public:
  RmEngine(RmTrainer& tr, RmObserver& obs, RmSummary& s) : tr_(tr), obs_(obs), s_(s) {}
  int64_t steps_done() const override { return tr_.steps_done(); }
  void step() override { obs_.on_step(tr_.step()); }
  void evaluate() override {
    RmEvalMetrics& e = tr_.steps_done() == 0 ? s_.first_eval : s_.last_eval;
    e = tr_.evaluate();
    obs_.on_eval(e);
  }
  void save(const std::string& dir) override { tr_.save(dir); }

 private:
  RmTrainer& tr_;
  RmObserver& obs_;
  RmSummary& s_;
};

}  // namespace

RmSummary train_reward_model(const RlTrainOptions& o, RmObserver& obs) {
  RmTrainer tr(o);
  RmSummary s;
  s.resumed_from = tr.resumed_from();
  s.data = tr.data_stats();
  obs.on_data(s.data);
  RmEngine engine(tr, obs, s);
  model::LoopOptions lo;
  lo.steps = o.steps;
  lo.eval_every = o.eval_every > 0 ? o.eval_every : o.steps;
  lo.eval_at_start = true;  // the accuracy of the untrained head, the "before"
  lo.checkpoint_every = o.checkpoint_every;
  lo.checkpoint_dir = o.checkpoint_dir;
  lo.stop = o.stop;
  const model::LoopOutcome out =
      model::run_loop(engine, lo, [&obs](int64_t step, const std::string& dir) { obs.on_checkpoint(step, dir); });
  s.steps_done = out.steps_done;
  s.interrupted = out.interrupted;
  return s;
}

}  // namespace troupe::rl
