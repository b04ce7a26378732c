// Launch spec: the typed form of a TOML launch file, and its parser/validator.
//
// Every key lives in one table (launch/spec/keys.cpp) that drives parsing,
// type and range checks, did-you-mean suggestions, "not supported yet"
// rejections and the key reference in docs/spec.md (`troupe keys`). Validation
// collects every problem it finds, each with file:line:col, so a user can fix
// a spec in one pass.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "actors/cluster/auth.hpp"
#include "actors/cluster/process_loss.hpp"
#include "actors/schedule/schedule.hpp"
#include "actors/sim/sim_costs.hpp"
#include "actors/supervision/elastic.hpp"
#include "actors/names.hpp"
#include "kernels/backend.hpp"
#include "kernels/blas_core.hpp"
#include "model/config.hpp"
#include "rl/config.hpp"

namespace troupe::launch {

// Enum-like spec values, converted once by the key table (spec/keys.cpp);
// *_name gives the spec's spelling. The enums of other layers: model::Ffn,
// moe::Balance, model::LrSchedule, model::DataKind, sched::Kind,
// kernels::OpenclDeviceType, sim::CostModel, runtime::FaultKind.
enum class RunMode : uint8_t { pretrain, rl, reward_model, sft_rl };  // "pretrain", "rl", "reward_model", "sft_rl"
enum class DeviceKind : uint8_t { host, opencl, sim };         // "host", "opencl", "sim"
enum class ProgressStyle : uint8_t { automatic, bar, plain, off };  // "auto", "bar", "plain", "off"
const char* run_mode_name(RunMode mode);
const char* device_kind_name(DeviceKind kind);
const char* progress_style_name(ProgressStyle style);

struct RunConfig {
  std::string name = "quickstart";
  RunMode mode = RunMode::pretrain;  // next-token training, or online RL ([rl])
  int64_t seed = 1;               // one seed drives init, data order and sampling
  int64_t steps = 300;
  std::string out_dir;            // empty: runs/<name>
  int64_t eval_every = 100;       // validation every N steps (0: only at the end)
  int64_t eval_batches = 4;       // validation batches per evaluation
  int64_t max_restarts = 3;       // supervisor: restarts allowed within restart_window steps
  int64_t restart_window = 10;    // supervisor: window of the restart intensity, in steps
  double restart_period = 0.0;    // supervisor: the same intensity over seconds (0: off)
  int64_t max_restarts_stage = -1, max_restarts_optimizer = -1, max_restarts_expert = -1;  // per-role budgets (-1: none)
  runtime::Strategy supervision = runtime::Strategy::one_for_one;  // restart strategy
  double step_deadline = 0.0;     // seconds before an unfinished step is replayed; 0 = adaptive
  double memory_limit = 0.0;      // GiB a run may need (launch/spec/memory.cpp's estimate); 0 = this machine's memory
};

// [experts]: automatic placement of the experts on their expert-shard
// actors (actors/supervision/elastic.cpp, moe/placement.hpp).
struct ExpertsConfig {
  runtime::ExpertPolicy policy = runtime::ExpertPolicy::static_split;  // "static" | "eplb"
  int64_t rebalance_every = 0;  // eplb: steps between rebalances
  runtime::ExpertOnFailure on_failure = runtime::ExpertOnFailure::stop;  // "stop" | "shrink"
  double migration_cost_scale = 1.0;  // eplb's gate: x the measured migration cost
  int64_t redundant_experts = 0;      // eplb: copies per MoE layer (shared experts with row shares)
  double load_decay = 0.8;            // eplb: weight of the past in the moving average of the loads
  double imbalance_threshold = 0.0;   // eplb: also rebalance when a layer's max/mean passes this (0 = never)
};

struct TopologyConfig {
  int64_t devices = 1;                  // devices (threads / GPU queues) in the whole run
  DeviceKind device_kind = DeviceKind::host;
  int64_t threads_per_device = 1;       // host: the backend's threads per device
  kernels::HostKernels host_kernels = kernels::HostKernels::portable;  // OpenBLAS's family (kernels/blas_core.hpp)
  int64_t opencl_platform = -1;         // opencl: platform index, -1 = first usable
  int64_t opencl_device = 0;            // opencl: device index on the platform
  kernels::OpenclDeviceType opencl_device_type = kernels::OpenclDeviceType::any;  // opencl
  int64_t stages = 1;                   // pipeline stages
  sched::Kind schedule = sched::Kind::sequential;  // sequential, 1f1b, dualpipe, dualpipev
  int64_t microbatches = 1;             // microbatches per step (gradient accumulation)
  int64_t expert_shards = 1;            // expert-parallel shards per MoE layer
  int64_t optimizer_shards = 1;         // ZeRO-1 optimizer shards
  int64_t data_parallel = 1;            // data-parallel replicas
  int64_t processes = 1;                // OS processes (mpirun -np)
  std::string interface = "127.0.0.1"; // address that CAF ports bind to
  double peer_timeout = 3.0;            // seconds of silence before a peer process counts as lost
  double heartbeat_pause = 0.5;         // the least silence of a peer's heartbeats taken for its loss
  runtime::ProcessLoss process_loss = runtime::ProcessLoss::recover;  // what losing a process does
  runtime::ClusterAuth auth = runtime::ClusterAuth::tls;  // processes > 1: mutual TLS between processes
  std::string auth_dir;                 // tls: the cluster key from `troupe keygen DIR`; "" = a fresh key per run
  int64_t bulk_shm_bytes = 1 << 16;     // one host: envelopes this large go through shared memory; 0 = never
  int64_t ring_bytes = 1 << 22;         // one host: step messages through a shared-memory ring per pair; 0 = TCP
  int64_t ring_spin_us = 50;            // a ring's receiver spins this long before it sleeps
  std::string device_processes;         // explicit placement: process of each device, "0,0,1"; "" = blocks
};

struct CheckpointConfig {
  int64_t every = 0;      // also save every N steps (a run always saves when it ends)
  std::string dir;        // empty: <out_dir>/checkpoint
  std::string resume;     // checkpoint directory to resume from ("" = fresh start)
};

struct LogConfig {
  std::string level = "info";      // trace, debug, info, warn, error, off
  ProgressStyle progress = ProgressStyle::automatic;  // a bar on a TTY, lines otherwise
  int64_t progress_every = 10;     // plain progress: one line every N steps
  bool metrics = true;             // metrics.jsonl in out_dir
  std::string trace;               // Chrome trace file (actor runtime only)
  int64_t rollouts = 0;            // RL: every N-th step's groups to <out_dir>/rollouts.jsonl (0: none)
};

// One [[faults]] entry: a fault injected into one actor in one step
// (actor runtime only; kinds and keys in actors/names.hpp).
using FaultConfig = runtime::FaultSpec;  // one type: the runtime's (actors/names.hpp)

// One [[elastic]] entry: from step at_step on, expert_shards expert-shard
// actors per MoE layer (actors/supervision/elastic.hpp).
using ElasticConfig = runtime::ElasticEvent;

// [rl] as written in the spec: enum-like values as strings, presets not yet
// applied. The parser converts it once into rl::RlConfig (Spec::rl), which is
// what everything after parsing reads.
struct RlSection {
  std::string init;                   // checkpoint to start from (also the frozen reference); "" = fresh init
  std::string task = "addition";
  int64_t prompts_per_step = 8;
  int64_t group_size = 8;
  int64_t max_new_tokens = 8;
  double temperature = 1.0;
  double top_p = 1.0;
  std::string loss = "grpo";          // "grpo", "dr_grpo", "dapo", "decoupled_ppo"
  double clip_low = -1.0;             // < 0: the loss's preset
  double clip_high = -1.0;            // < 0: the loss's preset
  double kl_coef = 0.0;
  double behaviour_weight_cap = -1.0; // < 0: the loss's preset
  int64_t updates_per_batch = 1;
  double sft_fraction = 0.0;          // share of RL prompts from the SFT side of the split (retention)
  std::string advantage_std = "auto"; // "auto" (the loss's preset), "on", "off"
  std::string dynamic_sampling = "auto";  // "auto", "on", "off": drop zero-variance groups
  double partial_credit = 0.0;
  double format_penalty = 0.0;
  rl::SyncMode sync = rl::SyncMode::synchronous;  // "synchronous", "fixed_lag", "latest" (the last two: actors/rl/)
  int64_t max_staleness = 0;
  int64_t generators = 1;
  int64_t reward_actors = 1;
  double sync_deadline_ms = 10000.0;  // decoupled: a generator confirms each weight sync within this
  bool recompute_kv = true;           // latest: recompute the KV cache after a mid-rollout switch
  int64_t slots = 0;                  // sequences a generator decodes at once (0: a whole step's)
  int64_t row_buckets = 1;            // in-process update: rows in this many length buckets
  std::string trainer = "single";  // decoupled: "single" (one actor, in-process update) or "actors" ([topology]'s runtime)
  int64_t trainer_devices = 0;     // trainer = "actors": its devices 0..N-1 (0: stages x data_parallel)
  int64_t rm_prompts = 256;  // run.mode = "reward_model": training prompts to label
  int64_t rm_batch = 64;     // run.mode = "reward_model": examples per optimizer step
  rl::RmLoss rm_loss = rl::RmLoss::bce;  // run.mode = "reward_model": "bce" or "bradley_terry" (pairs)
  rl::RewardSource reward = rl::RewardSource::verifier;  // "verifier", "model" (a learned RM)
  std::string reward_model;  // reward = "model": the RM checkpoint
  std::string prompts;       // a user's task: JSONL prompts (rl/task_jsonl.hpp)
  std::string eval_prompts;  // its held-out prompts ("" = the hash split)
  double reward_tolerance = 1e-6;
  std::string answer_pattern;
  std::vector<std::string> reward_command;
  std::string reward_dir;    // the spec file's directory (set by the parser): where the command runs
  double reward_timeout = 30.0;
  std::string reward_errors = "fail";  // "fail" or "zero"
  // run.mode = "sft_rl" only: phase 2's own values of the keys it shares with
  // phase 1 (launch/phases.hpp maps them onto run.steps, run.eval_every,
  // optim.lr and optim.warmup_steps of the RL phase's spec).
  int64_t steps = 100;
  int64_t eval_every = 0;
  double lr = 1e-4;
  int64_t warmup_steps = 10;
};

// The spec format this troupe reads (the top-level spec_version key); a spec
// written for a newer format is refused with a clear error.
inline constexpr int64_t kSpecVersion = 1;

// [chaos]: a seeded nemesis schedule (actors/supervision/chaos.hpp),
// expanded into more [[faults]] entries by runtime_options().
struct ChaosConfig {
  int64_t seed = 1;
  double mean_steps_between_faults = 0.0;  // 0: off
  std::string kinds;  // comma-separated fault kinds ("" = every kind); a TOML list is accepted too
  std::string roles;  // comma-separated roles stage, optimizer, expert ("" = every role the run has)
};

struct Spec {
  int64_t spec_version = kSpecVersion;  // spec_version = N at the top of the file
  std::string source;  // file the spec came from ("<built-in default>" for the default)
  RunConfig run;
  model::ModelConfig model;
  model::DataConfig data;
  model::OptimConfig optim;
  TopologyConfig topology;
  ExpertsConfig experts;
  CheckpointConfig checkpoint;
  LogConfig log;
  sim::CostConfig sim;  // [sim]: cost model of device_kind = "sim" (actors/sim/sim_costs.hpp)
  std::vector<FaultConfig> faults;  // [[faults]], in file order
  ChaosConfig chaos;                // [chaos]
  std::vector<ElasticConfig> elastic;  // [[elastic]], in file order
  RlSection rl_section;  // [rl] as written
  rl::RlConfig rl;       // [rl] converted (presets applied); valid after parsing
  // What the spec allows but a user most likely did not mean (an LR warmup
  // longer than the run, a port open on every interface, an empty file);
  // every command prints them before it runs.
  std::vector<struct Diagnostic> warnings;

  std::string out_dir() const;         // run.out_dir or runs/<name>
  std::string checkpoint_dir() const;  // checkpoint.dir or <out_dir>/checkpoint
};

// The memory a spec needs, in bytes, by part (launch/spec/memory.cpp): an
// estimate from the big float32 buffers, before anything runs. `troupe
// validate` prints it; a spec whose estimate exceeds run.memory_limit (or
// this machine's memory) is refused.
struct MemoryEstimate {
  double weights = 0.0;      // parameters and gradients
  double optimizer = 0.0;    // AdamW moments
  double activations = 0.0;  // a pretraining step's, kept for the backward
  double rl = 0.0;           // RL: reference and generator copies, KV cache, the policy update
  // The same bytes by the setting that scales them, for the check's advice:
  // bytes = fixed + per_unit * value, where `value` is the setting's value
  // (per_unit 0: not one number, e.g. the model's shape).
  struct Term {
    std::string key;   // "rl.slots", "rl.prompts_per_step x rl.group_size", "model.*", ...
    std::string what;  // "the KV cache", ...
    double bytes = 0.0, fixed = 0.0, per_unit = 0.0;
    double value = 0.0;
  };
  std::vector<Term> terms;
  double total() const;
  std::string describe() const;  // "about 1.2 GiB (weights and gradients ..., ...)"
};
MemoryEstimate estimate_memory(const Spec& spec);
double machine_memory_bytes();  // MemTotal, 0 when unknown
double memory_limit_bytes(const Spec& spec);  // run.memory_limit, else the machine's

// True when the spec's topology goes beyond one device running the whole
// model sequentially (devices, stages, schedule, optimizer_shards or
// data_parallel): `troupe run` then trains on the actor runtime
// (actors/runtime.hpp) instead of the single-process model::Trainer.
bool uses_runtime(const Spec& spec);

// run.mode = "rl" (or its RL phase) with sync = "synchronous" on devices =
// data_parallel > 1 (stages 1, sequential, one expert and optimizer shard,
// one process): the in-process loop data-parallel over those devices
// (rl::RlTrainOptions::devices), not the actor runtime.
bool sync_data_parallel(const Spec& spec);

// Sim devices with [topology] expert_shards > 1: the expert-parallel model
// (actors/sim/ep_sim.hpp, launch/commands/ep_sim.cpp), not the pipeline one.
bool is_ep_sim(const Spec& spec);

// [topology] device_processes as numbers, one per device ("0,1,1" -> {0,1,1});
// empty when the key is empty (contiguous blocks). Throws std::invalid_argument
// saying what is wrong (not a list of integers, wrong length, a process out of
// range, a process left without a device); validation reports it on the key.
std::vector<int> device_process_list(const Spec& spec);

// One problem found in a spec. line/column are 1-based, 0 when unknown.
struct Diagnostic {
  std::string file;
  int line = 0;
  int column = 0;
  std::string message;
  bool warning = false;     // a warning (Spec::warnings), not an error
  std::string str() const;  // "file:line:col: error: message" ("warning:" for a warning)
};

class SpecError : public std::runtime_error {
 public:
  explicit SpecError(std::vector<Diagnostic> diagnostics);
  const std::vector<Diagnostic>& diagnostics() const { return diagnostics_; }

 private:
  std::vector<Diagnostic> diagnostics_;
};

// "--set section.key=value" style overrides, applied after the file is read
// (value in TOML syntax: 10, 0.5, true, "text").
struct Override {
  std::string path;   // "section.key"
  std::string value;  // TOML value text
};

// Parses and validates; throws SpecError listing every problem.
Spec load_spec_file(const std::string& path, const std::vector<Override>& overrides = {});
Spec load_spec_text(const std::string& text, const std::string& source_name,
                    const std::vector<Override>& overrides = {});
// The built-in default spec (launch/specs/default.toml, embedded at build time).
const std::string& default_spec_text();
Spec load_default_spec(const std::vector<Override>& overrides = {});

// The key reference as a Markdown table (docs/spec.md) — one row per key.
std::string spec_keys_markdown();
// Every "section.key" the parser knows, in table order.
std::vector<std::string> spec_key_paths();

// Edit distance used for did-you-mean suggestions.
size_t edit_distance(const std::string& a, const std::string& b);

}  // namespace troupe::launch
