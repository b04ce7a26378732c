@0xaf57872fd4a95876;
# Decoupled online RL between processes (actors/rl/rl_remote.cpp): the
# messages a generator on another process exchanges with the coordinator on
# process 0. In one process these travel by reference (actors/rl/rl_messages.hpp)
# and are never encoded; across processes the envelope carries them, and the
# bulk data plane (shared memory on one host) carries the large ones.

$import "/capnp/c++.capnp".namespace("troupe::schemas");

using import "tensor.capnp".Tensor;

# One published policy version: coordinator (process 0) -> generator.
struct RlWeights {
  version @0 :Int64;     # policy version (optimizer updates applied), >= 0
  params @1 :Tensor;     # f32 [parameters]: the flat buffer of model::build_param_layout
}

# The ledger's key of one rollout group.
struct RlGroupId {
  seed @0 :UInt64;       # the run's seed
  step @1 :Int64;        # RL step that trains on the group
  index @2 :Int64;       # 0 .. prompts_per_step - 1
}

struct RlPrompt {
  index @0 :Int64;            # the training prompt index it was drawn for
  tokens @1 :List(Int32);     # fed to the model
  answer @2 :List(Int32);     # the expected completion (ends with the task's EOS)
}

struct RlCompletion {
  tokens @0 :List(Int32);     # new tokens
  logprobs @1 :List(Float32); # behaviour log-prob per new token
  versions @2 :List(Int64);   # policy version that sampled each new token
  stop @3 :UInt8;             # model::StopReason: 0 eos, 1 max_new_tokens, 2 context_full
}

# One step's rollouts with what they cost: generator -> coordinator.
struct RlRollout {
  step @0 :Int64;                       # 0-based RL step that trains on them
  version @1 :Int64;                    # policy version the step started with
  ids @2 :List(RlGroupId);              # [prompts_per_step]
  prompts @3 :List(RlPrompt);           # [prompts_per_step]
  completions @4 :List(RlCompletion);   # [prompts_per_step * group_size], group-major
  genSeconds @5 :Float64;
  generator @6 :UInt32;                 # generator:K that sampled them
  busySeconds @7 :Float64;              # sampling plus weight copies
  syncSeconds @8 :Float64;              # weight copies at the fences
  syncBytes @9 :Int64;
  loads @10 :Int64;                     # weight copies in
  pausedSeconds @11 :Float64;           # idle before this job
  switches @12 :Int64;                  # latest: versions taken mid-rollout
}
