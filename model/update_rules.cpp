// Optimizer-step rules shared by model::Trainer and the runtime's optimizer
// shards (see update_rules.hpp).
#include "model/update_rules.hpp"

#include <algorithm>
#include <cmath>

#include "model/checkpoint.hpp"
#include "model/trainer.hpp"

namespace troupe::model {

// Declared in trainer.hpp (its public home); the schedule lives here with the other rules.
double learning_rate(const OptimConfig& o, int64_t step, int64_t total) {
  if (o.warmup_steps > 0 && step < o.warmup_steps)
    return o.lr * static_cast<double>(step + 1) / static_cast<double>(o.warmup_steps);
  if (o.schedule == LrSchedule::constant) return o.lr;
  const double span = static_cast<double>(std::max<int64_t>(1, total - o.warmup_steps - 1));
  const double progress = std::min(1.0, static_cast<double>(step - o.warmup_steps) / span);
  const double min_lr = o.lr * o.min_lr_ratio;
  return min_lr + (o.lr - min_lr) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

kernels::AdamWParams adamw_params(const OptimConfig& o, int64_t step, int64_t total, bool decay,
                                  double grad_norm) {
  kernels::AdamWParams hp;
  hp.lr = static_cast<float>(learning_rate(o, step, total));
  hp.beta1 = static_cast<float>(o.beta1);
  hp.beta2 = static_cast<float>(o.beta2);
  hp.eps = static_cast<float>(o.eps);
  hp.step = step + 1;
  hp.weight_decay = decay ? static_cast<float>(o.weight_decay) : 0.0f;
  // The same float factor the former separate scale pass multiplied by.
  if (o.grad_clip > 0.0 && grad_norm > o.grad_clip) hp.grad_scale = static_cast<float>(o.grad_clip / (grad_norm + 1e-6));
  return hp;
}

void save_device_state(const std::string& dir, const ModelConfig& config, uint64_t seed, int64_t step,
                       kernels::Backend& backend, const kernels::Tensor& params, const kernels::Tensor& adam_m,
                       const kernels::Tensor& adam_v, const ParamLayout& layout, const std::string& rng_state) {
  TrainingState st;
  st.config = config;
  st.seed = seed;
  st.step = step;
  st.params = backend.download_f32(params);
  st.adam_m = backend.download_f32(adam_m);
  st.adam_v = backend.download_f32(adam_v);
  st.data_cursor = step;
  st.rng_state = rng_state;
  save_checkpoint(dir, st, layout);
}

}  // namespace troupe::model
