// Maps a validated Spec onto the model library's options (one place, shared by
// run, eval and sample).
#pragma once

#include "launch/spec/spec.hpp"
#include "model/trainer.hpp"

namespace troupe::launch {

kernels::BackendOptions backend_options(const Spec& spec);
model::TrainOptions train_options(const Spec& spec);

}  // namespace troupe::launch
