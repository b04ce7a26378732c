// run.mode = "sft_rl": one spec, two phases. Phase 1 is the spec's own
// pretraining run (SFT on the actor runtime, as [run], [optim] and
// [topology] say); phase 2 is an RL run (as [rl] says) that starts from phase
// 1's checkpoint. Each phase is an ordinary Spec derived here, once, so that
// validation, `troupe validate`, `troupe run` and the tests all read the
// same two specs, and each phase equals the standalone run of its spec bit
// for bit (tests/rl/main_job_test.sh).
#pragma once

#include <string>

#include "launch/spec/spec.hpp"

namespace troupe::launch {

// Where phase 1 saves: the spec's checkpoint directory with "_sft" appended
// (runs/<name>/checkpoint_sft). Phase 2, the end of the job, saves to the
// spec's checkpoint directory itself, so `troupe eval` / `troupe sample` on
// the spec read the final policy.
std::string sft_checkpoint_dir(const Spec& spec);

// Phase 1: the spec with run.mode = "pretrain" and checkpoint.dir =
// sft_checkpoint_dir(spec); everything else (resume included) as written.
Spec sft_phase_spec(const Spec& spec);

// True when [checkpoint] resume names phase 2's own checkpoint (the spec's
// checkpoint directory, where phase 2 saves and where an interrupted phase 2
// left its state): the job then resumes inside phase 2, from phase 1's
// finished checkpoint as rl.init.
bool resumes_phase2(const Spec& spec);

// Phase 2: run.mode = "rl" from checkpoint `init`, with run.steps, run.eval_every,
// optim.lr and optim.warmup_steps taken from rl.steps, rl.eval_every, rl.lr and
// rl.warmup_steps, resuming only when resumes_phase2(spec), and the RL topology: with rl.sync = "fixed_lag"
// the spec's devices (trainer on device 0, generators on the others), else one
// device with all the spec's threads; one stage, one process, no expert or
// optimizer shards (the RL trainer is one actor).
Spec rl_phase_spec(const Spec& spec, const std::string& init);

// The addition task's "SFT side" for a target split: the digit pairs at the
// split's column that are NOT targets, written as data.target_pairs accepts
// them ("0-5+0-9" style lists of pairs), so that scoring with them evaluates
// held-out problems SFT was trained on. Empty when the spec has no split.
std::string sft_side_pairs(const Spec& spec);

}  // namespace troupe::launch
