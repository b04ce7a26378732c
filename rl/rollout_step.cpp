// A step's rollouts as a value (see rollout_step.hpp).
#include "rl/rollout_step.hpp"

#include <chrono>
#include <stdexcept>
#include <string>

#include "model/params.hpp"
#include "model/weights.hpp"

namespace troupe::rl {

int64_t StepRollouts::tokens() const {
  int64_t n = 0;
  for (const model::Completion& c : completions) n += static_cast<int64_t>(c.tokens.size());
  return n;
}

void begin_step(StepDecode& d, model::BatchGenerator& gen, const Task& task, const RlConfig& rl, uint64_t seed,
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
      rows[gi * G + k] = d.out.prompts.back().tokens;
      d.rngs.emplace_back(sampler_seed(id, k));
    }
  }
  model::GenerateOptions go;
  go.max_new_tokens = rl.max_new_tokens;
  go.sampling.temperature = rl.temperature;
  go.sampling.top_p = rl.top_p;
  go.eos = task.eos_token();
  // Step-wise decoding: the same arithmetic as BatchGenerator::generate, with
  // the policy version recorded on every token.
  gen.start(rows, std::span<model::SamplerRng>(d.rngs), go);
  d.live = true;
}

StepRollouts end_step(StepDecode& d, model::BatchGenerator& gen, double seconds) {
  d.out.completions = gen.finish();
  d.out.gen_seconds = seconds;
  d.live = false;
  return std::move(d.out);
}

StepRollouts sample_step(model::BatchGenerator& gen, const model::ModelWeights& w, const Task& task, const RlConfig& rl,
                         uint64_t seed, int64_t step, int64_t version) {
  const auto t0 = std::chrono::steady_clock::now();
  StepDecode d;
  begin_step(d, gen, task, rl, seed, step, version);
  while (gen.step(w, version)) {
  }
  return end_step(d, gen, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
}

ScoredBatch score_step(const Task& task, const RlConfig& rl, const StepRollouts& r) {
  std::vector<Completion> scored(r.completions.size());
  for (size_t i = 0; i < r.completions.size(); ++i) {
    scored[i].tokens = r.completions[i].tokens;
    scored[i].logp_behav.assign(r.completions[i].logprobs.begin(), r.completions[i].logprobs.end());
  }
  return score_groups(task, r.prompts, scored, rl.group_size, rl.advantage);
}

PolicyCopy::PolicyCopy(const model::ModelConfig& config, const kernels::BackendOptions& backend)
    : config_(config), be_(kernels::make_backend(backend)) {
  const model::ParamLayout layout = model::build_param_layout(config);
  params_ = be_->zeros({layout.total()});
  w_ = model::bind_weights(layout, config, params_);
  gen_ = std::make_unique<model::BatchGenerator>(*be_, config);
}

PolicyCopy::~PolicyCopy() = default;

void PolicyCopy::load(std::span<const float> params, int64_t version) {
  if (static_cast<int64_t>(params.size()) != params_.numel())
    throw std::invalid_argument("PolicyCopy::load: " + std::to_string(params.size()) + " parameters for a model of " +
                                std::to_string(params_.numel()));
  be_->upload_f32(params_, params);
  version_ = version;
}

StepRollouts PolicyCopy::sample(const Task& task, const RlConfig& rl, uint64_t seed, int64_t step) {
  if (version_ < 0) throw std::logic_error("PolicyCopy::sample: no weights loaded");
  return sample_step(*gen_, w_, task, rl, seed, step, version_);
}

void PolicyCopy::begin(const Task& task, const RlConfig& rl, uint64_t seed, int64_t step) {
  if (version_ < 0) throw std::logic_error("PolicyCopy::begin: no weights loaded");
  begin_step(decoding_, *gen_, task, rl, seed, step, version_);
}

bool PolicyCopy::decode() {
  if (!decoding_.live) throw std::logic_error("PolicyCopy::decode: no generation in progress");
  return gen_->step(w_, version_);
}

void PolicyCopy::recompute() {
  if (!decoding_.live) throw std::logic_error("PolicyCopy::recompute: no generation in progress");
  gen_->recompute(w_);
}

StepRollouts PolicyCopy::end(double seconds) {
  if (!decoding_.live) throw std::logic_error("PolicyCopy::end: no generation in progress");
  return end_step(decoding_, *gen_, seconds);
}

}  // namespace troupe::rl
