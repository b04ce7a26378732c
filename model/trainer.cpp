// The single-process training loop (see trainer.hpp).
#include "model/trainer.hpp"
#include "model/tokenizer.hpp"
#include "model/training_loop.hpp"

#include <chrono>
#include <cmath>
#include <limits>
#include <stdexcept>

#include "model/checkpoint.hpp"
#include "model/data.hpp"
#include "model/decoder.hpp"
#include "model/generate.hpp"
#include "model/params.hpp"
#include "model/update_rules.hpp"
#include "model/weights.hpp"
#include "moe/balance.hpp"

namespace troupe::model {

using kernels::Tensor;

namespace {

void validate_options(const TrainOptions& o) {
  auto req = [](bool ok, const std::string& what) {
    if (!ok) throw std::invalid_argument("training options: " + what);
  };
  req(o.steps >= 0, "steps must be >= 0");
  req(o.microbatches >= 1, "microbatches must be >= 1");
  req(o.data.batch_size >= 1, "batch_size must be >= 1");
  req(o.data.batch_size % o.microbatches == 0,
      "batch_size (" + std::to_string(o.data.batch_size) + ") must be a multiple of microbatches (" +
          std::to_string(o.microbatches) + ")");
  req(o.eval_every >= 0 && o.eval_batches >= 0 && o.checkpoint_every >= 0,
      "eval_every, eval_batches and checkpoint_every must be >= 0");
  req(o.checkpoint_every == 0 || !o.checkpoint_dir.empty(),
      "checkpoint_every is set but checkpoint_dir is empty");
  req(o.optim.lr > 0.0, "lr must be positive");
  req(o.optim.warmup_steps >= 0, "warmup_steps must be >= 0");
}

}  // namespace

struct Trainer::Impl {
  TrainOptions opt;
  uint64_t seed = 0;
  std::unique_ptr<kernels::Backend> be;
  ParamLayout layout;
  std::unique_ptr<DataSource> data;
  Tensor params, grads, adam_m, adam_v;
  ModelWeights w, g;
  std::vector<OptimizerRange> ranges;
  std::unique_ptr<Decoder> dec;
  std::unique_ptr<Generator> gen;
  int64_t step = 0;
  int64_t mb_batch = 0;
  moe::Balance balance = moe::Balance::none;

  // `given`: start from this state (in memory) instead of options.resume_from.
  Impl(const TrainOptions& o, std::unique_ptr<kernels::Backend> backend, const TrainingState* given = nullptr)
      : opt(o), seed(o.seed), be(std::move(backend)) {
    validate_options(o);
    layout = build_param_layout(o.model);
    TrainingState st;
    const bool resume = given || !o.resume_from.empty();
    if (resume) {
      const std::string from = given ? std::string("the given state") : o.resume_from;
      if (given) {
        st = *given;
        if (static_cast<int64_t>(st.params.size()) != layout.total())
          throw std::invalid_argument("Trainer: the given state has " + std::to_string(st.params.size()) +
                                      " parameters, the model " + std::to_string(layout.total()));
      } else {
        st = load_checkpoint(o.resume_from, layout);
      }
      const std::string diff = config_difference(o.model, st.config);
      if (!diff.empty())
        throw std::invalid_argument("resume_from " + from +
                                    ": the checkpoint's model differs from the configured one (" +
                                    diff + ")");
      seed = st.seed;  // the data order and everything after follow the original run
      step = st.step;
      if (st.data_cursor != st.step)
        throw std::invalid_argument("resume_from " + from + ": data cursor " +
                                    std::to_string(st.data_cursor) + " does not match step " +
                                    std::to_string(st.step) + " (one batch per step)");
    }
    data = make_data_source(o.data, seed, o.model.seq_len);
    if (data->vocab_size() > o.model.vocab_size)
      throw std::invalid_argument("data source '" + data->describe() + "' needs vocab_size >= " +
                                  std::to_string(data->vocab_size()) + ", model has " +
                                  std::to_string(o.model.vocab_size));
    if (!be) be = kernels::make_backend(o.backend);
    const int64_t P = layout.total();
    params = be->from_f32({P}, resume ? st.params : init_params(layout, o.model, seed));
    grads = be->zeros({P});
    adam_m = be->zeros({P});
    adam_v = be->zeros({P});
    if (resume && !st.adam_m.empty()) {
      be->upload_f32(adam_m, st.adam_m);
      be->upload_f32(adam_v, st.adam_v);
    }
    w = bind_weights(layout, o.model, params);
    g = bind_weights(layout, o.model, grads);
    ranges = optimizer_ranges(layout);
    mb_batch = o.data.batch_size / o.microbatches;
    dec = std::make_unique<Decoder>(*be, o.model, mb_batch);
    if (o.model.ffn == Ffn::moe) balance = o.model.balance;
  }

  StepMetrics run_step() {
    const auto t0 = std::chrono::steady_clock::now();
    const int64_t S = opt.model.seq_len, M = opt.microbatches, Bm = mb_batch;
    const Batch batch = data->train_batch(step, opt.data.batch_size, S);
    int64_t counted = 0;
    for (int32_t t : batch.targets) counted += t >= 0;
    // The loss is the mean over every counted token of the whole batch, so
    // the result does not depend on how it is split into microbatches.
    const double loss_scale = counted > 0 ? 1.0 / static_cast<double>(counted) : 0.0;
    const double aux_scale = 1.0 / static_cast<double>(M);

    StepMetrics m;
    m.step = step + 1;
    m.tokens = opt.data.batch_size * S;
    be->fill(grads, 0.0f);
    double loss_sum = 0.0, aux = 0.0;
    for (int64_t mb = 0; mb < M; ++mb) {
      const size_t off = static_cast<size_t>(mb * Bm * S), n = static_cast<size_t>(Bm * S);
      const std::span<const int32_t> in(batch.inputs.data() + off, n), tg(batch.targets.data() + off, n);
      const ForwardResult r = dec->forward(w, in, tg);
      dec->backward(w, g, loss_scale, aux_scale);
      loss_sum += r.loss_sum;
      aux += r.aux_loss;
      const auto load = dec->expert_load();
      const auto dropped = dec->dropped();
      if (m.dropped.empty()) m.dropped.assign(dropped.size(), 0);
      for (size_t l = 0; l < dropped.size(); ++l) m.dropped[l] += dropped[l];
      if (m.expert_load.empty()) m.expert_load.assign(load.size(), {});
      for (size_t l = 0; l < load.size(); ++l) {
        if (m.expert_load[l].empty()) m.expert_load[l].assign(load[l].size(), 0);
        for (size_t e = 0; e < load[l].size(); ++e) m.expert_load[l][e] += load[l][e];
      }
    }
    m.loss = loss_sum * loss_scale;
    m.aux_loss = aux * aux_scale;

    // The step's rules (model/update_rules.hpp), as the optimizer shards apply them.
    m.grad_norm = std::sqrt(be->squared_norm(grads));
    m.lr = learning_rate(opt.optim, step, opt.steps);
    for (const OptimizerRange& r : ranges)
      be->adamw(params.view(r.offset, {r.numel}), grads.view(r.offset, {r.numel}),
                adam_m.view(r.offset, {r.numel}), adam_v.view(r.offset, {r.numel}),
                adamw_params(opt.optim, step, opt.steps, r.decay, m.grad_norm));
    if (balance == moe::Balance::bias) update_biases(m.expert_load);
    ++step;
    be->synchronize();
    m.step_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    return m;
  }

  // DeepSeek-V3 aux-loss-free balancing, after the optimizer step.
  void update_biases(const std::vector<std::vector<int64_t>>& load) {
    for (size_t l = 0; l < w.layers.size(); ++l) {
      const Tensor& b = w.layers[l].moe.bias;
      std::vector<float> host = be->download_f32(b);
      moe::update_router_bias(host, load[l], opt.model.bias_update_rate);
      be->upload_f32(b, host);
    }
  }

  EvalMetrics run_eval(bool accuracy) {
    EvalMetrics e;
    e.step = step;
    const int64_t S = opt.model.seq_len, Bm = mb_batch;
    double loss_sum = 0.0;
    int64_t counted = 0;
    for (int64_t i = 0; i < opt.eval_batches; ++i) {
      const Batch b = data->val_batch(i, opt.data.batch_size, S);
      for (int64_t mb = 0; mb < opt.microbatches; ++mb) {
        const size_t off = static_cast<size_t>(mb * Bm * S), n = static_cast<size_t>(Bm * S);
        const ForwardResult r = dec->forward(w, std::span<const int32_t>(b.inputs.data() + off, n),
                                             std::span<const int32_t>(b.targets.data() + off, n));
        loss_sum += r.loss_sum;
        counted += r.counted;
      }
    }
    e.val_loss = counted > 0 ? loss_sum / static_cast<double>(counted)
                             : std::numeric_limits<double>::quiet_NaN();
    e.accuracy = std::numeric_limits<double>::quiet_NaN();
    if (accuracy && data->has_task() && opt.data.eval_problems > 0) {
      if (!gen) gen = std::make_unique<Generator>(*be, opt.model);
      SamplingOptions greedy;
      greedy.temperature = 0.0;
      SamplerRng rng(0);  // unused by greedy decoding
      const int32_t eos = data->eos_token();
      GenerateFn fn = [&](const std::vector<int32_t>& prompt, int64_t max_new) {
        return gen->generate(w, prompt, max_new, greedy, rng, eos);
      };
      TaskScore score = data->score_task(fn, opt.data.eval_problems);
      e.problems = score.problems;
      e.accuracy = score.exact_match;
      e.digit_accuracy = std::move(score.digit_accuracy);
      e.context_accuracy = std::move(score.context_accuracy);
      e.size_accuracy = std::move(score.size_accuracy);
    }
    return e;
  }

  void save(const std::string& dir) {
    save_device_state(dir, opt.model, seed, step, *be, params, adam_m, adam_v, layout);
  }
};

Trainer::Trainer(const TrainOptions& options) : impl_(std::make_unique<Impl>(options, nullptr)) {}
Trainer::Trainer(const TrainOptions& options, std::unique_ptr<kernels::Backend> backend)
    : impl_(std::make_unique<Impl>(options, std::move(backend))) {}
Trainer::Trainer(const TrainOptions& options, const TrainingState& state)
    : impl_(std::make_unique<Impl>(options, nullptr, &state)) {}
Trainer::~Trainer() = default;
StepMetrics Trainer::step() { return impl_->run_step(); }
EvalMetrics Trainer::evaluate(bool accuracy) { return impl_->run_eval(accuracy); }
void Trainer::save(const std::string& dir) { impl_->save(dir); }
int64_t Trainer::steps_done() const { return impl_->step; }
std::vector<float> Trainer::parameters() const { return impl_->be->download_f32(impl_->params); }
kernels::Backend& Trainer::backend() { return *impl_->be; }
const DataSource& Trainer::data() const { return *impl_->data; }

TrainSummary train(const TrainOptions& o, TrainObserver& obs) {
  Trainer tr(o);
  return run_training(tr, o, obs);
}

EvalMetrics evaluate(const std::string& checkpoint_dir, const DataConfig& data,
                     int64_t eval_batches, const kernels::BackendOptions& backend) {
  const TrainingState st = load_checkpoint(checkpoint_dir);
  TrainOptions o;
  o.model = st.config;
  o.data = data;
  o.data.tokenizer = checkpoint_tokenizer(st.config, data.tokenizer, checkpoint_dir);  // the stored one
  o.seed = st.seed;
  o.steps = st.step;
  o.eval_batches = eval_batches;
  o.backend = backend;
  o.resume_from = checkpoint_dir;
  Trainer tr(o);
  return tr.evaluate(true);
}

}  // namespace troupe::model
