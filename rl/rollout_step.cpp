// A step's rollouts as a value (see rollout_step.hpp).
#include "rl/rollout_step.hpp"

#include <chrono>
#include <stdexcept>
#include <string>

#include "model/params.hpp"
#include "rl/parallel.hpp"
#include "model/weights.hpp"

namespace troupe::rl {

int64_t StepRollouts::tokens() const {
  int64_t n = 0;
  for (const model::Completion& c : completions) n += static_cast<int64_t>(c.tokens.size());
  return n;
}

namespace {

// Lays out step `step`: its groups' ids and prompts into d.out, one sampler
// seed per sequence into d.rngs; returns the sequences' prompt tokens
// (group-major, as the completions will be).
std::vector<std::vector<int32_t>> lay_out_step(StepDecode& d, const Task& task, const RlConfig& rl, uint64_t seed,
                                               int64_t step, int64_t version) {
  const int64_t Pn = rl.prompts_per_step, G = rl.group_size;
  d.out = StepRollouts{};
  d.out.step = step;
  d.out.version = version;
  std::vector<std::vector<int32_t>> rows(static_cast<size_t>(Pn * G));
  d.rngs.clear();
  d.rngs.reserve(static_cast<size_t>(Pn * G));
  for (int64_t gi = 0; gi < Pn; ++gi) {
    const GroupId id{seed, step, gi};
    d.out.ids.push_back(id);
    d.out.prompts.push_back(task.train_prompt(prompt_index(id, Pn)));
    for (int64_t k = 0; k < G; ++k) {
      rows[static_cast<size_t>(gi * G + k)] = d.out.prompts.back().tokens;
      d.rngs.emplace_back(sampler_seed(id, k));
    }
  }
  return rows;
}

model::GenerateOptions generate_options(const Task& task, const RlConfig& rl) {
  model::GenerateOptions go;
  go.max_new_tokens = rl.max_new_tokens;
  go.sampling.temperature = rl.temperature;
  go.sampling.top_p = rl.top_p;
  go.eos = task.eos_token();
  return go;
}

}  // namespace

void begin_step(StepDecode& d, model::ContinuousBatch& gen, const Task& task, const RlConfig& rl, uint64_t seed,
                int64_t step, int64_t version) {
  const std::vector<std::vector<int32_t>> rows = lay_out_step(d, task, rl, seed, step, version);
  gen.start(rows, std::span<model::SamplerRng>(d.rngs), generate_options(task, rl));
}

StepRollouts end_step(StepDecode& d, model::ContinuousBatch& gen, double seconds) {
  d.out.completions = gen.finish();
  d.out.gen_seconds = seconds;
  return std::move(d.out);
}

StepRollouts sample_step(model::ContinuousBatch& gen, const model::ModelWeights& w, const Task& task,
                         const RlConfig& rl, uint64_t seed, int64_t step, int64_t version) {
  const auto t0 = std::chrono::steady_clock::now();
  StepDecode d;
  begin_step(d, gen, task, rl, seed, step, version);
  while (gen.step(w, version)) {
  }
  return end_step(d, gen, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

StepRollouts sample_step_parallel(std::span<model::ContinuousBatch* const> gens,
                                  std::span<const model::ModelWeights* const> ws, const Task& task,
                                  const RlConfig& rl, uint64_t seed, int64_t step, int64_t version) {
  if (gens.size() != ws.size() || gens.empty())
    throw std::invalid_argument("sample_step_parallel: one set of weights per continuous batch");
  if (gens.size() == 1) return sample_step(*gens[0], *ws[0], task, rl, seed, step, version);
  const auto t0 = std::chrono::steady_clock::now();
  // The whole step laid out once (prompts, seeds), then dealt.
  StepDecode all;
  const std::vector<std::vector<int32_t>> rows = lay_out_step(all, task, rl, seed, step, version);
  const model::GenerateOptions go = generate_options(task, rl);
  const int64_t N = static_cast<int64_t>(rows.size());
  const size_t D = gens.size();
  std::vector<std::vector<std::vector<int32_t>>> dealt(D);
  std::vector<std::vector<model::SamplerRng>> dealt_rngs(D);
  for (int64_t i = 0; i < N; ++i) {
    dealt[static_cast<size_t>(i) % D].push_back(rows[static_cast<size_t>(i)]);
    dealt_rngs[static_cast<size_t>(i) % D].push_back(all.rngs[static_cast<size_t>(i)]);
  }
  std::vector<std::vector<model::Completion>> done(D);
  DeviceTimes times;
  on_each_device(static_cast<int64_t>(D), [&](int64_t dev) {
    const size_t d = static_cast<size_t>(dev);
    if (dealt[d].empty()) return;
    gens[d]->start(dealt[d], std::span<model::SamplerRng>(dealt_rngs[d]), go);
    while (gens[d]->step(*ws[d], version)) {
    }
    done[d] = gens[d]->finish();
  }, &times);
  all.out.completions.resize(static_cast<size_t>(N));
  for (int64_t i = 0; i < N; ++i)
    all.out.completions[static_cast<size_t>(i)] = std::move(done[static_cast<size_t>(i) % D][static_cast<size_t>(i) / D]);
  all.out.gen_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  all.out.device_idle_seconds = times.idle(all.out.gen_seconds);
  return std::move(all.out);
}

ScoredBatch score_step(const Task& task, const RlConfig& rl, const StepRollouts& r) {
  std::vector<Completion> scored(r.completions.size());
  for (size_t i = 0; i < r.completions.size(); ++i) {
    scored[i].tokens = r.completions[i].tokens;
    scored[i].logp_behav.assign(r.completions[i].logprobs.begin(), r.completions[i].logprobs.end());
  }
  return score_groups(task, r.prompts, scored, rl.group_size, rl.advantage);
}

// One version's parameters on the copy's backend, shared by the jobs using it.
struct PolicyCopy::Weights {
  kernels::Tensor params;
  model::ModelWeights w;
  int64_t version = -1;
};

// A running step: its batch (its own slots' cache), its layout and seeds,
// the weights it decodes with, and when it began.
struct PolicyCopy::Job {
  std::unique_ptr<model::ContinuousBatch> batch;
  StepDecode decode;
  std::shared_ptr<Weights> weights;
  std::chrono::steady_clock::time_point t0;
  int64_t ticket = 0;
  bool done = false;
};

PolicyCopy::PolicyCopy(const model::ModelConfig& config, const kernels::BackendOptions& backend, int64_t slots)
    : config_(config), slots_(slots), be_(kernels::make_backend(backend)), layout_(model::build_param_layout(config)) {
  if (slots < 1) throw std::invalid_argument("PolicyCopy: slots must be >= 1, got " + std::to_string(slots));
}

PolicyCopy::~PolicyCopy() = default;

int64_t PolicyCopy::version() const { return newest_ ? newest_->version : -1; }

void PolicyCopy::load(std::span<const float> params, int64_t version) {
  if (static_cast<int64_t>(params.size()) != layout_.total())
    throw std::invalid_argument("PolicyCopy::load: " + std::to_string(params.size()) + " parameters for a model of " +
                                std::to_string(layout_.total()));
  // A buffer no job holds (held only here, and by newest_ when it is that
  // one), or a new one: a running step keeps the weights it began with.
  std::shared_ptr<Weights> w;
  for (const auto& b : buffers_)
    if (b.use_count() == 1 + (b == newest_ ? 1 : 0)) w = b;
  if (!w) {
    w = std::make_shared<Weights>();
    w->params = be_->zeros({layout_.total()});
    w->w = model::bind_weights(layout_, config_, w->params);
    buffers_.push_back(w);
  }
  be_->upload_f32(w->params, params);
  w->version = version;
  newest_ = std::move(w);
}

StepRollouts PolicyCopy::sample(const Task& task, const RlConfig& rl, uint64_t seed, int64_t step) {
  if (!jobs_.empty()) throw std::logic_error("PolicyCopy::sample: jobs are running");
  begin(task, rl, seed, step);
  while (decode()) {
  }
  return std::move(take_finished()->rollouts);
}

bool PolicyCopy::can_begin() const {
  return jobs_.size() < 2 && (jobs_.empty() || jobs_.back()->batch->queued() == 0);
}

int64_t PolicyCopy::begin(const Task& task, const RlConfig& rl, uint64_t seed, int64_t step) {
  if (!newest_) throw std::logic_error("PolicyCopy::begin: no weights loaded");
  if (!can_begin()) throw std::logic_error("PolicyCopy::begin: no room for another job");
  auto j = std::make_unique<Job>();
  // The batch (and its cache) of a finished job is reused when there is one.
  if (free_batches_.empty()) {
    j->batch = std::make_unique<model::ContinuousBatch>(*be_, config_, slots_);
  } else {
    j->batch = std::move(free_batches_.back());
    free_batches_.pop_back();
  }
  j->weights = newest_;
  j->t0 = std::chrono::steady_clock::now();
  begin_step(j->decode, *j->batch, task, rl, seed, step, newest_->version);
  j->done = j->batch->done();
  j->ticket = tickets_++;
  jobs_.push_back(std::move(j));
  return jobs_.back()->ticket;
}

bool PolicyCopy::decode() {
  if (jobs_.empty()) throw std::logic_error("PolicyCopy::decode: no generation in progress");
  int64_t used = 0;
  bool more = false;
  for (auto& j : jobs_) {
    if (j->done) continue;
    j->done = !j->batch->step(j->weights->w, j->weights->version, slots_ - used);
    used += j->batch->live();
    more = more || !j->done;
  }
  return more;
}

int64_t PolicyCopy::adopt_newest(bool recompute) {
  int64_t switched = 0;
  for (auto& j : jobs_) {
    if (j->done || j->weights == newest_) continue;
    j->weights = newest_;
    if (recompute) j->batch->recompute(newest_->w);
    ++switched;
  }
  return switched;
}

std::optional<PolicyCopy::Finished> PolicyCopy::take_finished() {
  for (auto it = jobs_.begin(); it != jobs_.end(); ++it) {
    if (!(*it)->done) continue;
    Job& j = **it;
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - j.t0).count();
    Finished f{j.ticket, end_step(j.decode, *j.batch, seconds)};
    free_batches_.push_back(std::move(j.batch));
    jobs_.erase(it);
    return f;
  }
  return std::nullopt;
}

}  // namespace troupe::rl
