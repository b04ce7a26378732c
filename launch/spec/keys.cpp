// The launch-spec key table (one row per key). Parsing, validation, the
// key reference (docs/spec.md) and `troupe keys` are all driven from here, so a key
// is documented exactly where it is defined.
#include "launch/spec/keys.hpp"

#include "actors/cluster/interface_address.hpp"

#include <cmath>
#include <cstdio>
#include <sstream>
#include <stdexcept>

namespace troupe::launch {

const char* run_mode_name(RunMode mode) {
  switch (mode) {
    case RunMode::pretrain: return "pretrain";
    case RunMode::rl: return "rl";
    case RunMode::reward_model: return "reward_model";
    case RunMode::sft_rl: return "sft_rl";
  }
  return "?";
}

const char* device_kind_name(DeviceKind kind) {
  switch (kind) {
    case DeviceKind::host: return "host";
    case DeviceKind::opencl: return "opencl";
    case DeviceKind::sim: return "sim";
  }
  return "?";
}

const char* progress_style_name(ProgressStyle style) {
  switch (style) {
    case ProgressStyle::automatic: return "auto";
    case ProgressStyle::bar: return "bar";
    case ProgressStyle::plain: return "plain";
    case ProgressStyle::off: return "off";
  }
  return "?";
}

const char* key_type_name(KeyType t) {
  switch (t) {
    case KeyType::Int: return "integer";
    case KeyType::Float: return "float";
    case KeyType::Bool: return "boolean";
    case KeyType::String:
    case KeyType::Choice: return "string";
    case KeyType::FloatList: return "array of floats";
    case KeyType::StringList: return "array of strings";
  }
  return "?";
}

namespace {

constexpr double kBig = 1e12;

// Helpers that build a row: F(expr) gives the field accessor for a Spec member.
#define F(expr) [](Spec& s) -> void* { return &s.expr; }

std::vector<KeyDef> build_keys() {
  std::vector<KeyDef> k;
  auto add = [&](KeyDef d) { k.push_back(std::move(d)); };

  // Top level (before any [section]).
  add({"", "spec_version", KeyType::Int, F(spec_version), "Version of the spec format the file is written for (omitted: this troupe's). A spec for a newer version than this troupe reads is refused with an error saying so, before any other check.", 1, static_cast<double>(kSpecVersion)});

  // [run]
  add({"run", "name", KeyType::String, F(run.name), "Run name; the default output directory is runs/<name>."});
  add({"run", "mode", KeyType::Choice, F(run.mode), "What the run does: \"pretrain\" (next-token training), \"rl\" (online RL post-training), \"reward_model\" (trains a learned reward model on the [rl] task's completions labelled by its verifier; docs/rl.md) or \"sft_rl\" (two phases: pretrain as [run]/[optim]/[topology] say, then RL as [rl] says from phase 1's checkpoint, with a before/after table of both tasks; README \"The main job\").",
       0, 0, {} /* the enum's names: bind_choices */});
  add({"run", "seed", KeyType::Int, F(run.seed), "Seed for initialisation, data order and sampling; same seed and spec give the same run.", 0, 9.2e18});
  add({"run", "steps", KeyType::Int, F(run.steps), "Optimizer steps to train.", 1, kBig});
  add({"run", "out_dir", KeyType::String, F(run.out_dir), "Output directory (log, metrics.jsonl, checkpoint); empty means runs/<name>."});
  add({"run", "eval_every", KeyType::Int, F(run.eval_every), "Validation loss (and task accuracy) every N steps; 0 means only at the end.", 0, kBig});
  add({"run", "eval_batches", KeyType::Int, F(run.eval_batches), "Validation batches per evaluation.", 1, 1e6});
  add({"run", "max_restarts", KeyType::Int, F(run.max_restarts), "Supervisor (actor runtime): a failed stage or optimizer-shard actor is restarted and its step replayed; more than this many restarts within restart_window steps fail the run.", 0, 1e6});
  add({"run", "memory_limit", KeyType::Float, F(run.memory_limit), "GiB the run may use: a spec whose estimated need (weights, gradients, AdamW moments, activations, RL rollouts and KV cache; `troupe validate` prints it) exceeds it is refused before anything runs. 0 = this machine's physical memory.", 0, 1e9});
  add({"run", "step_deadline", KeyType::Float, F(run.step_deadline), "Actor runtime: seconds after which a step that has not finished (a lost message, a frozen actor) is discarded and replayed from its snapshot; more than max_restarts replays of one step fail the run naming the actors it waited for. 0 means adaptive (one process; docs/faults.md \"Adaptive deadlines\"): the step is replayed when the run falls silent (no step message sent, no device busy) for longer than its fault-free steps' silences allow (phi-accrual, at least 20 ms), or runs longer than its fault-free steps allow (at least 1 s); before they have 8 samples, max(3 s, 4 x the slowest step so far), 120 s for the first step (OpenCL kernels may compile).", 0, 86400});
  add({"run", "restart_window", KeyType::Int, F(run.restart_window), "Supervisor: the window, in steps, over which max_restarts is counted.", 1, kBig});
  add({"run", "restart_period", KeyType::Float, F(run.restart_period), "Supervisor: max_restarts is counted over this many seconds as well (more than max_restarts restarts within it escalate); 0 means steps only. Erlang's default intensity is max_restarts = 1 in restart_period = 5.", 0, 1e9});
  add({"run", "max_restarts_stage", KeyType::Int, F(run.max_restarts_stage), "Supervisor: the pipeline-stage actors' own budget: more than this many restarts of stage actors within restart_window steps (or restart_period seconds) escalate; -1 means none of their own (max_restarts only).", -1, 1e6});
  add({"run", "max_restarts_optimizer", KeyType::Int, F(run.max_restarts_optimizer), "Supervisor: the optimizer-shard actors' own restart budget, as max_restarts_stage.", -1, 1e6});
  add({"run", "max_restarts_expert", KeyType::Int, F(run.max_restarts_expert), "Supervisor: the expert-shard actors' own restart budget, as max_restarts_stage.", -1, 1e6});
  add({"run", "supervision", KeyType::Choice, F(run.supervision), "Supervisor's restart strategy on the actor runtime: \"one_for_one\" (the actor that went down is respawned alone), \"one_for_all\" (every pipeline-rank, optimizer-shard and expert-shard actor is respawned with it) or \"rest_for_one\" (it and those started after it: optimizer shards, then ranks, then expert shards). The step is replayed from its snapshot either way; one failure counts as one restart against max_restarts.", 0, 0, {} /* the enum's names: bind_choices */});

  // [chaos]
  add({"chaos", "seed", KeyType::Int, F(chaos.seed), "Seed of the nemesis schedule ([chaos]): the same seed and topology inject the same faults (`troupe validate` lists them).", 0, 9.2e18});
  add({"chaos", "mean_steps_between_faults", KeyType::Float, F(chaos.mean_steps_between_faults), "Actor runtime in one process, or a decoupled RL run's actors: faults arrive as a Poisson process with this mean gap in steps (0.5: about two per step), each at a random actor of `roles` with a random kind of `kinds`; 0 means no chaos. Combine with [run] step_deadline (lost messages are found by it; RL: rl.sync_deadline_ms) and max_restarts.", 0, 1e9});
  add({"chaos", "kinds", KeyType::String, F(chaos.kinds), "Fault kinds the nemesis draws from: a list or a comma-separated string of kill, drop, duplicate, delay, pause, corrupt, slow, partition (RL actors: kill, drop, duplicate, delay, pause); empty means all of them."});
  add({"chaos", "roles", KeyType::String, F(chaos.roles), "Roles whose actors the nemesis hits: a list or a comma-separated string of stage, optimizer, expert (RL runs: generator, reward); empty means every role the topology has."});

  // [model]
  add({"model", "vocab_size", KeyType::Int, F(model.vocab_size), "Vocabulary size; must cover the data source's tokens (256 for byte-level text).", 2, 1e7});
  add({"model", "d_model", KeyType::Int, F(model.d_model), "Residual stream width.", 2, 65536});
  add({"model", "n_layers", KeyType::Int, F(model.n_layers), "Decoder blocks.", 1, 1024});
  add({"model", "n_heads", KeyType::Int, F(model.n_heads), "Attention heads; must divide d_model with an even head size (RoPE).", 1, 1024});
  add({"model", "seq_len", KeyType::Int, F(model.seq_len), "Tokens per training sequence (context length).", 2, 1e6});
  add({"model", "ffn", KeyType::Choice, F(model.ffn), "Feed-forward block of every layer: \"moe\" (routed experts) or \"dense\" (SwiGLU).", 0, 0, {} /* the enum's names: bind_choices */});
  add({"model", "dense_hidden", KeyType::Int, F(model.dense_hidden), "Hidden width of dense SwiGLU FFNs.", 1, 1e6});
  add({"model", "n_experts", KeyType::Int, F(model.n_experts), "Routed experts per MoE layer.", 1, 4096});
  add({"model", "top_k", KeyType::Int, F(model.top_k), "Experts per token; at most n_experts.", 1, 4096});
  add({"model", "expert_hidden", KeyType::Int, F(model.expert_hidden), "Hidden width of each expert's SwiGLU (and of shared experts).", 1, 1e6});
  add({"model", "shared_experts", KeyType::Int, F(model.shared_experts), "Always-on shared experts per MoE layer.", 0, 64});
  add({"model", "balance", KeyType::Choice, F(model.balance), "Load balancing: \"aux_loss\" (alpha*E*sum f_i P_i), \"bias\" (DeepSeek-V3 auxiliary-loss-free bias) or \"none\".", 0, 0, {} /* the enum's names: bind_choices */});
  add({"model", "aux_loss_alpha", KeyType::Float, F(model.aux_loss_alpha), "Weight alpha of the auxiliary balance loss.", 0, 10});
  add({"model", "bias_update_rate", KeyType::Float, F(model.bias_update_rate), "gamma of the aux-loss-free bias update bias += gamma*sign(mean load - load).", 0, 1});
  add({"model", "capacity_factor", KeyType::Float, F(model.capacity_factor), "Expert capacity = ceil(cf*tokens*top_k/n_experts), extra tokens dropped; 0 means dropless.", 0, 64});
  add({"model", "tie_embeddings", KeyType::Bool, F(model.tie_embeddings), "The LM head shares the token embedding matrix."});
  add({"model", "rope_theta", KeyType::Float, F(model.rope_theta), "RoPE base.", 1, 1e9});
  add({"model", "norm_eps", KeyType::Float, F(model.norm_eps), "RMSNorm epsilon.", 1e-12, 1});
  add({"model", "init_std", KeyType::Float, F(model.init_std), "Standard deviation of the normal weight initialisation.", 1e-6, 1});

  // [data]
  add({"data", "source", KeyType::Choice, F(data.source), "\"addition\" (built-in multi-digit addition task scored by exact match; operands zero-padded, the answer zero-padded and written least-significant digit first: 12+345 is 012+345=7530), \"addition_plain\" (12+345=357), \"text\" (byte-level text file), \"jsonl\" (a user's prompt/completion records at data.path, tokenized by [tokenizer]; loss on the completion only; docs/own_task.md) or \"scratchpad\" (long addition with written work, one line per column, then # and the sum: completions of 12 to 10 x digits + 3 tokens, widths long-tailed; the RL verifier scores only the sum; docs/rl.md).", 0, 0, {} /* the enum's names: bind_choices */});
  add({"data", "path", KeyType::String, F(data.path), "The file for source = \"text\" or \"jsonl\" (relative paths are relative to the spec file)."});
  add({"data", "eval_path", KeyType::String, F(data.eval_path), "jsonl: the held-out records (evaluation and validation); empty: the share eval_fraction of data.path, chosen by a hash of each line (never by its position)."});
  add({"data", "eval_fraction", KeyType::Float, F(data.eval_fraction), "jsonl (and rl.prompts without rl.eval_prompts): the share of records held out, by a hash of each line.", 0.0, 0.9});
  add({"data", "prompt_field", KeyType::String, F(data.prompt_field), "jsonl: the field of a record that holds the prompt."});
  add({"data", "completion_field", KeyType::String, F(data.completion_field), "jsonl: the field of a record that holds the completion (the loss is on its tokens and the EOS after them)."});

  // [tokenizer]
  add({"tokenizer", "kind", KeyType::String, F(data.tokenizer.kind), "How a user's text (data.source = \"jsonl\", rl.prompts) becomes tokens: \"bytes\" (one token per byte, EOS 256: vocab 257) or \"sentencepiece\" (tokenizer.model, e.g. from `troupe tokenizer train`). model.vocab_size follows from it. The checkpoint stores the tokenizer; a different one given later is an error naming both hashes.", 0, 0, {"bytes", "sentencepiece"}});
  add({"tokenizer", "model", KeyType::String, F(data.tokenizer.model), "kind = \"sentencepiece\": the FILE.model (relative to the spec file)."});
  add({"data", "val_fraction", KeyType::Float, F(data.val_fraction), "Text: fraction of the file (its tail) held out for validation.", 0.001, 0.5});
  add({"data", "batch_size", KeyType::Int, F(data.batch_size), "Sequences per optimizer step, over all microbatches and replicas.", 1, 1e6});
  add({"data", "digits", KeyType::Int, F(data.digits), "Addition: maximum digits per operand (1 .. 9). Scratchpad: the widest operand of RL prompts and evaluation, widths long-tailed over 1..digits (up to 64).", 1, 64});
  add({"data", "width", KeyType::Int, F(data.width), "Addition: digits each operand is written with (zero-padded; the answer gets one more); 0 means digits. At least digits when set: digits 3, width 4 writes 12+345 as 0012+0345=75300. Scratchpad: the widest operand of training rows (0 means digits): SFT sees the short part of the distribution.", 0, 64});
  add({"data", "target_pairs", KeyType::String, F(data.target_pairs), "Addition: a target split, unordered digit pairs \"x+y, ...\" at target_column (a side may be a range: \"6-9+0-9\" is every pair with a digit in 6..9). Training rows never show a problem whose operand digits there form such a pair; RL prompts and the task evaluation are only such problems (the RL task of launch/specs/rl_addition.toml). Empty means no split."});
  add({"data", "target_column", KeyType::Int, F(data.target_column), "Addition: the operand column target_pairs looks at (0 = units; below digits), or -1: any column (the pairs' cells of the addition table are never shown).", -1, 8});
  add({"data", "eval_problems", KeyType::Int, F(data.eval_problems), "Addition: held-out problems scored for exact-match accuracy.", 1, 1e6});

  // [optim]
  add({"optim", "lr", KeyType::Float, F(optim.lr), "Peak learning rate (AdamW).", 0, 10});
  add({"optim", "min_lr_ratio", KeyType::Float, F(optim.min_lr_ratio), "Cosine decay ends at lr*min_lr_ratio.", 0, 1});
  add({"optim", "warmup_steps", KeyType::Int, F(optim.warmup_steps), "Linear warmup steps from 0 to lr.", 0, kBig});
  add({"optim", "schedule", KeyType::Choice, F(optim.schedule), "Learning-rate schedule after warmup: \"cosine\" or \"constant\".", 0, 0, {} /* the enum's names: bind_choices */});
  add({"optim", "beta1", KeyType::Float, F(optim.beta1), "AdamW beta1.", 0, 0.999999});
  add({"optim", "beta2", KeyType::Float, F(optim.beta2), "AdamW beta2.", 0, 0.999999});
  add({"optim", "eps", KeyType::Float, F(optim.eps), "AdamW epsilon.", 1e-30, 1});
  add({"optim", "weight_decay", KeyType::Float, F(optim.weight_decay), "Decoupled weight decay (not applied to norms or router bias).", 0, 10});
  add({"optim", "grad_clip", KeyType::Float, F(optim.grad_clip), "Clip the global gradient norm to this value; 0 disables clipping.", 0, 1e9});

  // [topology]
  add({"topology", "devices", KeyType::Int, F(topology.devices), "Devices in the run (a device is a serial executor: a thread or a GPU queue); pipeline ranks and optimizer shards are placed on them round-robin.", 1, 1e6});
  add({"topology", "device_kind", KeyType::Choice, F(topology.device_kind), "\"host\" (CPU, OpenBLAS), \"opencl\" (CLBlast + OpenCL C) or \"sim\" (no math: each device is a virtual clock that runs the schedule with costs from [sim]; devices = stages * data_parallel; with expert_shards > 1 the expert-parallel model instead, devices = expert_shards).", 0, 0, {} /* the enum's names: bind_choices */,
       [](const Spec& s) -> std::string {
         // Sim devices run the pipeline schedule's timing only: no optimizer shards or experts to place.
         if (s.topology.device_kind != DeviceKind::sim) return "";
         if (s.topology.optimizer_shards > 1) return "sim devices model the optimizer step as one fixed cost ([sim] optimizer_ms); set optimizer_shards = 1";
         return "";
       }});
  add({"topology", "threads_per_device", KeyType::Int, F(topology.threads_per_device), "Host devices: threads per device (the host backend's own: row blocks of large GEMMs, grouped GEMM groups, attention heads, elementwise parts; OpenBLAS itself runs single-threaded). The result is the same bits for every value.", 1, 1024});
  add({"topology", "host_kernels", KeyType::Choice, F(topology.host_kernels), "OpenBLAS's kernel family on host devices: \"portable\" (its Haswell kernels: the same checkpoint bytes on every x86-64 CPU with AVX2 and FMA, Intel or AMD) or \"native\" (the fastest this CPU runs: SkylakeX's AVX-512 kernels where present; faster, but the bits are this CPU family's). An OPENBLAS_CORETYPE set in the environment overrides both.", 0, 0, {} /* the enum's names: bind_choices */});
  add({"topology", "opencl_platform", KeyType::Int, F(topology.opencl_platform), "OpenCL platform index; -1 picks the first platform with a matching device.", -1, 64});
  add({"topology", "opencl_device", KeyType::Int, F(topology.opencl_device), "OpenCL device index on the platform.", 0, 64});
  add({"topology", "opencl_device_type", KeyType::Choice, F(topology.opencl_device_type), "OpenCL device type to look for: \"any\", \"gpu\" or \"cpu\".", 0, 0, {} /* the enum's names: bind_choices */});
  add({"topology", "stages", KeyType::Int, F(topology.stages), "Pipeline ranks per replica (each holds contiguous layer ranges; dualpipev cuts the model into 2*stages).", 1, 4096});
  add({"topology", "schedule", KeyType::Choice, F(topology.schedule), "Pipeline schedule: \"sequential\", \"1f1b\", \"dualpipe\" (needs even stages and microbatches >= 2*stages, even) or \"dualpipev\" (microbatches >= 2*stages).", 0, 0, {} /* the enum's names: bind_choices */});
  add({"topology", "microbatches", KeyType::Int, F(topology.microbatches), "Microbatches per step (gradient accumulation); must divide batch_size / data_parallel.", 1, 1e6});
  add({"topology", "expert_shards", KeyType::Int, F(topology.expert_shards), "Expert-parallel shards per MoE layer and replica; at most n_experts. 1: the experts run inside their stage; more: each shard is an actor holding a contiguous range of the layer's experts, reached through dispatch/combine messages (runs on the actor runtime).", 1, 4096});
  add({"topology", "optimizer_shards", KeyType::Int, F(topology.optimizer_shards), "ZeRO-1 optimizer shards, each owning a range of the flat parameter buffer.", 1, 4096});
  add({"topology", "data_parallel", KeyType::Int, F(topology.data_parallel), "Data-parallel replicas; each runs `microbatches` microbatches of batch_size / (microbatches * data_parallel) sequences.", 1, 4096});
  add({"topology", "processes", KeyType::Int, F(topology.processes), "OS processes (launch with mpirun -np <processes>); devices are split into contiguous blocks over them, actors follow their device, the coordinator is on process 0. Decoupled RL: the trainer and the control actors stay on process 0, generators follow their device.", 1, 1e6});
  add({"topology", "interface", KeyType::String, F(topology.interface), "Address CAF ports bind to between processes (loopback by default; \"0.0.0.0\" binds every interface and advertises the host name, and validate warns about it; an IPv4 subnet such as \"10.77.0.0/24\" makes each process bind to and advertise its own address in that subnet, for several hosts). A name or address must be one of this host's (checked by binding to it); an empty value is refused.", 0, 0, {},
       [](const Spec& s) -> std::string { return runtime::interface_error(s.topology.interface); }});
  add({"topology", "auth", KeyType::Choice, F(topology.auth), "Between processes: \"tls\" (mutual TLS on every CAF connection; a peer without the cluster key is refused) or \"none\" (plain connections: anyone who reaches the port can talk to the actors).", 0, 0, {} /* the enum's names: bind_choices */});
  add({"topology", "auth_dir", KeyType::String, F(topology.auth_dir), "auth = \"tls\": directory with cluster.pem and cluster.key from `troupe keygen DIR` (copy it to every host); \"\" = process 0 makes a fresh key for the run and sends it to the others over MPI (one host: shared memory)."});
  add({"topology", "peer_timeout", KeyType::Float, F(topology.peer_timeout), "The most seconds without traffic (CAF heartbeats run at a tenth of it) before a peer process counts as lost (a hung or SIGSTOPped one; a dead one is noticed at once); then process_loss applies. Sooner, process 0 suspects a process whose own heartbeats (every 50 ms) stop for longer than their gaps so far allow (phi-accrual, at least heartbeat_pause; docs/faults.md \"Adaptive deadlines\").", 0.1, 3600});
  add({"topology", "heartbeat_pause", KeyType::Float, F(topology.heartbeat_pause), "Across processes: the shortest silence of a process's heartbeats that process 0 takes for its loss (the floor of the adaptive heartbeat deadline, Akka's acceptable-heartbeat-pause; the deadline grows with the gaps seen, up to peer_timeout). Raise it to ride out network partitions or stalls this long.", 0.05, 3600});
  add({"topology", "process_loss", KeyType::Choice, F(topology.process_loss), "A lost process: \"recover\" (2 processes, process 1 lost: it is SIGKILLed if still there, its actors restart on process 0's devices from the coordinator's committed snapshot, the step is replayed and the run ends bitwise equal; needs `mpirun --enable-recovery`) or \"fail\" (the run stops with exit 1 naming the lost process and its actors). Losing process 0, or any process of a run with more than 2, always fails. Decoupled RL: any generator process may be lost; its generators restart on process 0 (\"fail\" ends the run).", 0, 0, {} /* the enum's names: bind_choices */});
  add({"topology", "device_processes", KeyType::String, F(topology.device_processes), "Explicit placement: the process of each device, comma-separated (e.g. \"0,0,1,1\"); actors follow their device, the coordinator stays on process 0. Empty: contiguous blocks of devices per process."});
  add({"topology", "ring_bytes", KeyType::Int, F(topology.ring_bytes), "When all processes are on one host, step messages between each ordered pair of processes go through a shared-memory ring of this many bytes (a power of two, at least 65536) with a futex doorbell, instead of CAF's TCP stream; 0 = never.", 0, 1ll << 32});
  add({"topology", "ring_spin_us", KeyType::Int, F(topology.ring_spin_us), "A ring's receiver that finds it empty spins this many microseconds (yielding the core) before it sleeps on the doorbell; 0 = sleep at once.", 0, 100000});
  add({"topology", "bulk_shm_bytes", KeyType::Int, F(topology.bulk_shm_bytes), "When all processes are on one host, envelopes of at least this many bytes go between them through a shared-memory segment (CAF carries a 64-byte record naming it) instead of CAF's TCP stream; 0 = never.", 0, 1e12});

  // [checkpoint]
  add({"checkpoint", "every", KeyType::Int, F(checkpoint.every), "Also save a checkpoint every N steps; 0 means only the final one (a run always saves when it ends).", 0, kBig,
       {}, [](const Spec& s) -> std::string {
         return s.checkpoint.every > 0 && s.topology.device_kind == DeviceKind::sim
                    ? "a sim run computes no parameters, so it saves no checkpoints" : "";
       }});
  add({"checkpoint", "dir", KeyType::String, F(checkpoint.dir), "Checkpoint directory; empty means <out_dir>/checkpoint."});
  add({"checkpoint", "resume", KeyType::String, F(checkpoint.resume), "Checkpoint directory to resume from (bitwise continuation); empty starts fresh.", 0, 0, {},
       [=](const Spec& s) {
         if (!s.checkpoint.resume.empty() && s.topology.device_kind == DeviceKind::sim)
           return std::string("a sim run computes no parameters, so there is nothing to resume");
         return std::string();
       }});

  // [log]
  add({"log", "level", KeyType::String, F(log.level), "Log level (also --log-level).", 0, 0, {"trace", "debug", "info", "warn", "error", "off"}});
  add({"log", "progress", KeyType::Choice, F(log.progress), "Progress display: \"auto\" (a bar on a terminal, plain lines otherwise), \"bar\", \"plain\" or \"off\".", 0, 0, {} /* the enum's names: bind_choices */});
  add({"log", "progress_every", KeyType::Int, F(log.progress_every), "Plain progress: one line every N steps.", 1, kBig});
  add({"log", "metrics", KeyType::Bool, F(log.metrics), "Write metrics as JSON lines to <out_dir>/metrics.jsonl."});
  add({"log", "rollouts", KeyType::Int, F(log.rollouts), "Online RL: every N-th step's groups to <out_dir>/rollouts.jsonl, one JSON line per group: the prompt and each completion as text, its reward, advantage, and per token the behaviour log-prob and the policy version that sampled it (docs/rl.md \"Reading rollouts\"). 0: none.", 0, kBig});
  add({"log", "trace", KeyType::String, F(log.trace),
       "Chrome/Perfetto trace JSON written after the run: one track per device with its F, B, optimizer and "
       "parameter-exchange work (gaps are idle time); with sim devices, the virtual clock's F, B, W, wait and idle spans. "
       "Actor runtime or sim devices only (not single-device sequential specs).", 0, 0, {},
       [](const Spec& s) -> std::string {
         if (s.log.trace.empty() || uses_runtime(s) || s.topology.device_kind == DeviceKind::sim) return "";
         return "needs the actor runtime; this single-device sequential spec runs in the single-process "
                "trainer, which records no device trace (use e.g. [topology] schedule = \"1f1b\" to run it on the runtime)";
       }});

  // [experts]: automatic expert placement (actors/supervision/elastic.cpp, moe/placement.hpp).
  add({"experts", "policy", KeyType::Choice, F(experts.policy), "How experts are placed on their expert-shard actors: \"static\" (the even contiguous split, changed only by [[elastic]] events) or \"eplb\" (every rebalance_every steps, experts move one at a time to the neighbouring shard of the most loaded one, by a moving average of the measured loads; at most expert_shards moves per layer and rebalance). Needs expert_shards >= 2.", 0, 0, {} /* the enum's names: bind_choices */,
       [](const Spec& s) -> std::string {
         if (s.experts.policy != runtime::ExpertPolicy::eplb) return "";
         if (!uses_runtime(s) || s.model.ffn != model::Ffn::moe || s.topology.expert_shards < 2)
           return "needs expert-shard actors: the actor runtime, [model] ffn = \"moe\" and [topology] expert_shards >= 2";
         if (s.experts.rebalance_every < 1) return "needs [experts] rebalance_every >= 1";
         return "";
       }});
  add({"experts", "rebalance_every", KeyType::Int, F(experts.rebalance_every), "eplb: steps between rebalances (a rebalance replaces the expert-shard actors and loads their experts from the optimizer shards, between steps); 0 with policy = \"static\".", 0, kBig,
       {}, [](const Spec& s) -> std::string {
         return s.experts.rebalance_every > 0 && s.experts.policy != runtime::ExpertPolicy::eplb
                    ? "applies only to [experts] policy = \"eplb\""
                    : "";
       }});
  add({"experts", "load_decay", KeyType::Float, F(experts.load_decay), "eplb: the policy places by a moving average of each expert's routed load, avg = load_decay x avg + (1 - load_decay) x the last step's; 0 = the last step's loads alone (follows a drifting router best; bench/results/experts.md), closer to 1 = smoother.", 0, 0.999,
       {}, [](const Spec& s) -> std::string {
         return s.experts.load_decay != 0.8 && s.experts.policy != runtime::ExpertPolicy::eplb
                    ? "applies only to [experts] policy = \"eplb\""
                    : "";
       }});
  add({"experts", "imbalance_threshold", KeyType::Float, F(experts.imbalance_threshold), "eplb: between the periodic rebalances, one is also tried (gated by gain against migration cost as usual) after a step whose moving-average loads put any MoE layer's max/mean shard load above this; 0 = periodic rebalances only; else >= 1. The rebalance line says which triggered it (\"trigger\").", 0, 1e6,
       {}, [](const Spec& s) -> std::string {
         if (s.experts.imbalance_threshold == 0.0) return "";
         if (s.experts.policy != runtime::ExpertPolicy::eplb) return "applies only to [experts] policy = \"eplb\"";
         return s.experts.imbalance_threshold < 1.0 ? "must be 0 (off) or >= 1 (max/mean is never below 1)" : "";
       }});
  add({"experts", "migration_cost_scale", KeyType::Float, F(experts.migration_cost_scale), "eplb: a layer's moves are made only when their predicted gain over the next rebalance_every steps (its share of the recent step time, by its drop in busiest-shard load) beats their migration cost: the bytes its changed shards load x the seconds per byte measured on this run's past placement changes x this factor (1 = as measured; 0 = no cost; large = skip). The first move, before any migration was measured, is always made.", 0, 1e15,
       {}, [](const Spec& s) -> std::string {
         return s.experts.migration_cost_scale != 1.0 && s.experts.policy != runtime::ExpertPolicy::eplb
                    ? "applies only to [experts] policy = \"eplb\""
                    : "";
       }});
  add({"experts", "redundant_experts", KeyType::Int, F(experts.redundant_experts), "eplb: at each rebalance at most this many copies per MoE layer, placed to balance the shards by the moving average of the measured loads: the busiest shard repeatedly shares the expert it holds most load of with the least busy shard, which takes the part of its rows that brings one of them to the mean (weighted row shares, contiguous blocks in token order); the copies' weight gradients are summed by the optimizer shards in shard order. A copy's weights are loaded from the optimizer shards like a move's. expert_shards - 1 copies balance the moving average when the busiest shards hold a big enough expert. 0 = no copies; at most [model] n_experts.", 0, kBig,
       {}, [](const Spec& s) -> std::string {
         if (s.experts.redundant_experts == 0) return "";
         if (s.experts.policy != runtime::ExpertPolicy::eplb)
           return "applies only to [experts] policy = \"eplb\" (the copies follow its measured loads)";
         if (s.experts.redundant_experts > s.model.n_experts)
           return "more copies than experts: at most [model] n_experts (" + std::to_string(s.model.n_experts) +
                  "), one second copy per expert";
         return "";
       }});
  add({"experts", "on_failure", KeyType::Choice, F(experts.on_failure), "An expert shard over its restart budget (max_restarts_expert, else max_restarts): \"stop\" ends the run (as for any actor); \"shrink\" removes that shard's slot from every MoE layer (its experts join the neighbouring shard with fewer experts, loaded from the optimizer shards' committed parameters), replays the step and trains on with one shard fewer per layer, until the next [[elastic]] event. With one shard left it stops. On [topology] processes = 2 (process_loss = \"recover\") it also applies to a lost process 1: the slots of its expert shards are removed (when every layer lost as many and keeps one; else they are respawned on process 0).", 0, 0, {} /* the enum's names: bind_choices */,
       [](const Spec& s) -> std::string {
         if (s.experts.on_failure != runtime::ExpertOnFailure::shrink) return "";
         if (!uses_runtime(s) || s.model.ffn != model::Ffn::moe || s.topology.expert_shards < 2)
           return "needs expert-shard actors: the actor runtime, [model] ffn = \"moe\" and [topology] expert_shards >= 2";
         if (s.topology.processes > 2 || (s.topology.processes == 2 && s.topology.process_loss != runtime::ProcessLoss::recover))
           return "runs in one process, or on [topology] processes = 2 with process_loss = \"recover\" (it then shrinks "
                  "around a lost process 1)";
         return "";
       }});
  // [sim]: sim devices (actors/sim/sim_costs.hpp, actors/sim/sim_runtime.hpp).
  add({"sim", "cost_model", KeyType::Choice, F(sim.model), "Sim devices: \"fixed\" (forward_ms / backward_ms / weight_ms per micro-batch and stage), \"flops\" (each stage's FLOPs and bytes from [model] and the micro-batch size, over gflops and gbps) or \"measured\" (per-stage times, stage_forward_ms / stage_backward_ms / stage_weight_ms, as `troupe calibrate` writes them).", 0, 0, {} /* the enum's names: bind_choices */});
  add({"sim", "forward_ms", KeyType::Float, F(sim.forward_ms), "Sim, fixed: forward of one micro-batch at one stage, in ms.", 0, 1e6});
  add({"sim", "backward_ms", KeyType::Float, F(sim.backward_ms), "Sim, fixed: full backward (inputs + weights) of one micro-batch at one stage, in ms.", 0, 1e6});
  add({"sim", "weight_ms", KeyType::Float, F(sim.weight_ms), "Sim, fixed: the weight-gradient part of backward_ms (zb1p/dualpipe W ops; their B costs backward_ms - weight_ms); at most backward_ms.", 0, 1e6});
  add({"sim", "gflops", KeyType::Float, F(sim.gflops), "Sim, flops: device compute rate in GFLOP/s.", 1e-3, 1e9});
  add({"sim", "gbps", KeyType::Float, F(sim.gbps), "Sim, flops: device memory bandwidth in GB/s (op time = max(FLOPs / gflops, bytes / gbps)).", 1e-3, 1e9});
  add({"sim", "stage_forward_ms", KeyType::FloatList, F(sim.stage_forward_ms), "Sim, measured: forward of one micro-batch at each pipeline stage, in ms, one value per stage of the schedule's layout (dualpipe: stages per direction).", 0, 1e6});
  add({"sim", "stage_backward_ms", KeyType::FloatList, F(sim.stage_backward_ms), "Sim, measured: full backward (inputs + weights) of one micro-batch at each stage, in ms, one value per stage.", 0, 1e6});
  add({"sim", "stage_weight_ms", KeyType::FloatList, F(sim.stage_weight_ms), "Sim, measured: the weight-gradient part of each stage's backward, in ms (each at most its stage_backward_ms); empty means none (a split B then costs the full backward). `troupe calibrate` writes it when the spec's schedule splits backwards (dualpipe, dualpipev).", 0, 1e6});
  add({"sim", "link_latency_us", KeyType::Float, F(sim.link_latency_us), "Sim: latency of every activation/gradient message between two devices, in microseconds.", 0, 1e9});
  add({"sim", "link_gbps", KeyType::Float, F(sim.link_gbps), "Sim: link bandwidth in GB/s (a message is tokens x d_model float32); 0 means unlimited.", 0, 1e9});
  add({"sim", "optimizer_ms", KeyType::Float, F(sim.optimizer_ms), "Sim: fixed time of the optimizer step after the pipeline drains, in ms; 0 leaves it out (the step time is then the pipeline's alone).", 0, 1e9});
  // [sim] for run.mode = "rl" on sim devices (actors/sim/rl_sim.hpp).
  add({"sim", "rl_mean_tokens", KeyType::Float, F(sim.rl_mean_tokens), "Sim RL: mean completion length in tokens (log-normal before the cap).", 1, 1e7});
  add({"sim", "rl_sigma", KeyType::Float, F(sim.rl_sigma), "Sim RL: sigma of the log-normal completion length (the long tail); 0 gives every completion rl_mean_tokens.", 0, 4});
  add({"sim", "rl_max_tokens", KeyType::Int, F(sim.rl_max_tokens), "Sim RL: completion length cap in tokens (max_new_tokens of the simulated policy).", 1, 1e7});
  add({"sim", "rl_slots", KeyType::Int, F(sim.rl_slots), "Sim RL: sequences a generating device decodes at once (continuous batching).", 1, 1e6});
  add({"sim", "rl_decode_ms_per_token", KeyType::Float, F(sim.rl_decode_ms_per_token), "Sim RL: one decode step of a generating device, in ms (the same for up to rl_slots sequences).", 0, 1e6});
  add({"sim", "rl_reward_ms", KeyType::Float, F(sim.rl_reward_ms), "Sim RL: reward (verifier or reward model) per completion, in ms, on its generator slot.", 0, 1e6});
  add({"sim", "rl_train_ms_per_token", KeyType::Float, F(sim.rl_train_ms_per_token), "Sim RL: one device's training time per token, in ms (a step over T trainer devices takes tokens x this / T).", 0, 1e6});
  add({"sim", "rl_parallel_decode_ms_per_token", KeyType::Float, F(sim.rl_parallel_decode_ms_per_token), "Sim RL: the decode step while more than one device generates at once (devices sharing a host slow each other down), in ms; 0 means rl_decode_ms_per_token. `troupe calibrate` measures it.", 0, 1e6});
  add({"sim", "rl_parallel_train_ms_per_token", KeyType::Float, F(sim.rl_parallel_train_ms_per_token), "Sim RL: one device's training time per token while more than one device trains at once, in ms; 0 means rl_train_ms_per_token. `troupe calibrate` measures it.", 0, 1e6});
  add({"sim", "rl_train_step_ms", KeyType::Float, F(sim.rl_train_step_ms), "Sim RL: the serial part of every training step (loss, gradient sum, optimizer step, parameter copy), in ms, added to the per-token time.", 0, 1e9});
  add({"sim", "rl_sync_ms", KeyType::Float, F(sim.rl_sync_ms), "Sim RL, decoupled: time to publish a new policy version to the generators, in ms.", 0, 1e9});
  // [sim] for expert parallelism on sim devices: expert_shards > 1 (actors/sim/ep_sim.hpp).
  add({"sim", "ep_slots_per_device", KeyType::Int, F(sim.ep_slots_per_device), "Sim EP: physical expert slots per device for the eplb placement (devices * slots - n_experts are redundant slots for replicas of hot experts); 0 = ceil(n_experts / expert_shards).", 0, 1e6});
  add({"sim", "ep_zipf", KeyType::Float, F(sim.ep_zipf), "Sim EP: Zipf exponent of the expert loads (the expert of rank r gets a share proportional to 1/r^ep_zipf; 0 = uniform).", 0, 100});
  add({"sim", "ep_drift_every", KeyType::Int, F(sim.ep_drift_every), "Sim EP: steps between drifts of each layer's expert ranking; 0 = the loads never change.", 0, kBig});
  add({"sim", "ep_drift", KeyType::Float, F(sim.ep_drift), "Sim EP: share of experts whose rank changes at a drift (random pairs swap ranks).", 0, 1});
  add({"sim", "ep_ema", KeyType::Float, F(sim.ep_ema), "Sim EP: weight of the newest step in the moving average of expert loads that eplb places by.", 1e-6, 1});
  add({"sim", "ep_rebalance_every", KeyType::Int, F(sim.ep_rebalance_every), "Sim EP: steps between eplb rebalances (a layer moves only when the predicted gain over this many steps beats its migration time).", 1, kBig});
  add({"sim", "ep_imbalance_threshold", KeyType::Float, F(sim.ep_imbalance_threshold), "Sim EP: between periodic rebalances, a layer whose max/mean device load under the moving average exceeds this is rebalanced too (still only when the gain beats the migration); 0 = periodic rebalances only.", 0, 1e6});
  add({"sim", "ep_tolerance", KeyType::Float, F(sim.ep_tolerance), "Sim EP, incremental eplb: an expert copy stays on its device while the device is within (1 + this) x the mean load.", 0, 10});
  add({"sim", "ep_bytes_per_param", KeyType::Int, F(sim.ep_bytes_per_param), "Sim EP: bytes a migration moves per expert parameter (12: float32 weights and two Adam moments).", 0, 1e6});
  add({"sim", "mtbf_hours", KeyType::Float, F(sim.mtbf_hours), "Sim: mean time between failures of one device, in hours (the job sees N / mtbf_hours failures per hour); after the simulated steps, a goodput study over fault_horizon_hours compares troupe's recovery (replay the step, restart elsewhere) with checkpoint-restart. 0 = no failures. Llama 3's 16,384 GPUs: ~50,700 h.", 0, 1e12,
       {}, [](const Spec& s) -> std::string {
         if (s.sim.mtbf_hours <= 0) return "";
         if (s.topology.device_kind != DeviceKind::sim) return "applies to sim devices only ([topology] device_kind = \"sim\")";
         if (s.run.mode == RunMode::rl || s.topology.expert_shards > 1)
           return "applies to the pipeline sim only (not run.mode = \"rl\" or expert_shards > 1 on sim devices)";
         return "";
       }});
  add({"sim", "fault_horizon_hours", KeyType::Float, F(sim.fault_horizon_hours), "Sim faults: wall time the goodput study covers, in hours.", 1e-3, 1e7});
  add({"sim", "detect_s", KeyType::Float, F(sim.detect_s), "Sim faults: seconds from a failure to its detection (both policies).", 0, 1e7});
  add({"sim", "recover_s", KeyType::Float, F(sim.recover_s), "Sim faults, troupe: seconds to restart the lost actors on other devices and restore them from the buddy snapshot; then the step in flight is replayed.", 0, 1e7});
  add({"sim", "snapshot_overhead", KeyType::Float, F(sim.snapshot_overhead), "Sim faults, troupe: the per-step in-memory snapshot's cost as a share of the step time.", 0, 10});
  add({"sim", "checkpoint_every_min", KeyType::Float, F(sim.checkpoint_every_min), "Sim faults, baseline: minutes between checkpoints of checkpoint-restart (the study also runs the Young/Daly interval).", 1e-3, 1e9});
  add({"sim", "checkpoint_write_s", KeyType::Float, F(sim.checkpoint_write_s), "Sim faults, baseline: seconds a checkpoint stalls the run.", 0, 1e7});
  add({"sim", "checkpoint_restart_s", KeyType::Float, F(sim.checkpoint_restart_s), "Sim faults, baseline: seconds to requeue the job and reload the last checkpoint after a failure.", 0, 1e7});
  // [rl]: run.mode = "rl" (rl/trainer.hpp; converted into rl::RlConfig at parsing).
  add({"rl", "init", KeyType::String, F(rl_section.init), "Checkpoint directory the policy starts from; its parameters are also the frozen reference for the KL term. Its model must equal [model]. Empty: a fresh initialisation from the seed."});
  add({"rl", "task", KeyType::String, F(rl_section.task), "The RL task: \"addition\" (prompts \"a+b=\" from the training split of [data], only its target problems when data.target_pairs is set, rewarded by the rule verifier; held-out problems for evaluation).", 0, 0, {"addition"}});
  add({"rl", "prompts_per_step", KeyType::Int, F(rl_section.prompts_per_step), "Prompts (groups) sampled per RL step.", 1, 1e6});
  add({"rl", "group_size", KeyType::Int, F(rl_section.group_size), "Completions sampled per prompt; advantages are relative to the group, so at least 2.", 1, 1e6});
  add({"rl", "max_new_tokens", KeyType::Int, F(rl_section.max_new_tokens), "Most tokens generated per completion; prompt + completion must fit [model] seq_len.", 1, 1e6});
  add({"rl", "temperature", KeyType::Float, F(rl_section.temperature), "Sampling temperature of the generators; the loss uses log-probs at the same temperature.", 0.01, 100});
  add({"rl", "top_p", KeyType::Float, F(rl_section.top_p), "Nucleus sampling: keep the smallest most-likely token set with this mass (1 = all).", 0.01, 1});
  add({"rl", "loss", KeyType::String, F(rl_section.loss), "Objective: \"grpo\" (PPO clip, (R-mean)/std advantages, sequence mean), \"dr_grpo\" (R-mean, constant normaliser), \"dapo\" (clip-higher 0.2/0.28, token-level, zero-variance groups dropped) or \"decoupled_ppo\" (AReaL: ratio to the proximal policy times the capped behaviour weight).", 0, 0, {"grpo", "dr_grpo", "dapo", "decoupled_ppo"}});
  add({"rl", "clip_low", KeyType::Float, F(rl_section.clip_low), "eps_low: the ratio is clipped below at 1 - clip_low; negative means the loss's preset (0.2).", -1, 0.99});
  add({"rl", "clip_high", KeyType::Float, F(rl_section.clip_high), "eps_high: the ratio is clipped above at 1 + clip_high; negative means the loss's preset (0.28 for dapo, else 0.2).", -1, 100});
  add({"rl", "kl_coef", KeyType::Float, F(rl_section.kl_coef), "Weight of the k3 KL penalty to the frozen reference (init); 0 = none (the KL is still reported).", 0, 100});
  add({"rl", "behaviour_weight_cap", KeyType::Float, F(rl_section.behaviour_weight_cap), "decoupled_ppo: tokens whose behaviour weight pi_prox/mu exceeds this are masked out; negative means the preset (5), 0 = no cap.", -1, 1e6});
  add({"rl", "updates_per_batch", KeyType::Int, F(rl_section.updates_per_batch), "Optimizer steps per sampled batch (PPO epochs). The clip ratio is pi_theta / pi_prox, where pi_prox is the trainer's own recompute of the batch before its first update (not the sampler's log-probs): 1 on the first update by construction, so it moves only from the second on. The sampler's log-probs enter only decoupled_ppo's behaviour weight pi_prox / mu.", 1, 64});
  add({"rl", "sft_fraction", KeyType::Float, F(rl_section.sft_fraction), "Retention: this share of each step's RL prompts comes from the SFT side of the target split (problems SFT trained on, from its training split, never a held-out one), rewarded by the same verifier, so the policy keeps being paid for what SFT taught. Needs data.target_pairs at one column (data.target_column >= 0). 0 = target problems only.", 0, 0.99});
  add({"rl", "advantage_std", KeyType::String, F(rl_section.advantage_std), "Divide advantages by the group's reward std: \"auto\" (the loss's preset: on for grpo and dapo), \"on\" or \"off\".", 0, 0, {"auto", "on", "off"}});
  add({"rl", "dynamic_sampling", KeyType::String, F(rl_section.dynamic_sampling), "Drop groups whose rewards are all equal from the loss: \"auto\" (on for dapo), \"on\" or \"off\".", 0, 0, {"auto", "on", "off"}});
  add({"rl", "partial_credit", KeyType::Float, F(rl_section.partial_credit), "Verifier: a wrong answer earns partial_credit times the share of its answer digits that are right (exact match earns 1).", 0, 0.999});
  add({"rl", "format_penalty", KeyType::Float, F(rl_section.format_penalty), "Verifier: subtracted when a completion has no EOS within max_new_tokens.", 0, 10});
  add({"rl", "sync", KeyType::Choice, F(rl_section.sync), "How generation and training are coupled: \"synchronous\" (one process, sample then train, no actors), \"fixed_lag\" (generator, reward, rollout-buffer and trainer actors; step s is sampled by policy version max(0, s - max_staleness) exactly, deterministic for a seed) or \"latest\" (the same actors; generators take each new version at the next fence between decode steps, tokens record their version, none older than trainer version - max_staleness is trained on; needs loss = \"decoupled_ppo\"; not bitwise reproducible).",
       0, 0, {} /* the enum's names: bind_choices */});
  add({"rl", "max_staleness", KeyType::Int, F(rl_section.max_staleness), "fixed_lag: eta, how many versions generation runs ahead of training (0 = on-policy, equal to \"synchronous\" bit for bit); latest: the most versions a trained token may lag the trainer.", 0, 1000});
  add({"rl", "generators", KeyType::Int, F(rl_section.generators), "fixed_lag: generator actors, each with its own copy of the policy (RL steps are dealt to them round-robin).", 1, 64});
  add({"rl", "recompute_kv", KeyType::Bool, F(rl_section.recompute_kv), "latest: after a generator takes a new version between two decode steps, the keys and values cached for the tokens so far are recomputed under it (AReaL-style), so later tokens see the new policy's view of the earlier ones; false keeps the old version's cache (cheaper, the rollout mixes both)."});
  add({"rl", "slots", KeyType::Int, F(rl_section.slots), "Continuous batching: the most sequences a generator (or the synchronous loop) decodes at once; a finished sequence's slot goes at once to the next queued one (decoupled generators: the next admitted step's, within the staleness bound). KV-cache memory is per slot. 0 = a whole step's sequences (prompts_per_step x group_size). The slot never changes a sequence's bits on the host backend.", 0, 1e6});
  add({"rl", "row_buckets", KeyType::Int, F(rl_section.row_buckets), "The in-process policy update (synchronous, or rl.trainer = \"single\"): the step's rows sorted by length into this many buckets (at least one per data-parallel device), each padded to its own longest row instead of every row to the step's longest, with the boundaries that pad the fewest tokens; for long-tailed completions. 1 = one batch in sample order, the math rl.trainer = \"actors\" reproduces bit for bit (which takes rows of one length, so it needs 1).", 1, 1024});
  add({"rl", "sync_deadline_ms", KeyType::Float, F(rl_section.sync_deadline_ms), "fixed_lag / latest: a generator must confirm each weight sync within this many ms; a miss sends it again, a second miss restarts the generator.", 1, 1e7});
  add({"rl", "trainer", KeyType::String, F(rl_section.trainer), "fixed_lag / latest: where the policy update runs: \"single\" (one trainer actor, the in-process update on device 0) or \"actors\" (the [topology]'s pipeline ranks, expert shards and optimizer shards, with the policy loss at the last stage; kill-and-replay covers them, and [[faults]] may name them: at_step is the RL step, hit at its first optimizer update).", 0, 0, {"single", "actors"}});
  add({"rl", "trainer_devices", KeyType::Int, F(rl_section.trainer_devices), "trainer = \"actors\": the trainer's devices 0..N-1 (0: stages x data_parallel); generators go round-robin on the devices after them (on the trainer's when there are none).", 0, 1024});
  add({"rl", "reward_actors", KeyType::Int, F(rl_section.reward_actors), "fixed_lag: rule-verifier actors (steps dealt round-robin).", 1, 64});
  add({"rl", "rm_prompts", KeyType::Int, F(rl_section.rm_prompts), "run.mode = \"reward_model\": training prompts whose group_size completions (sampled by init at temperature) are labelled by the verifier; held-out data is the same for data.eval_problems held-out prompts.", 1, 1e7});
  add({"rl", "rm_batch", KeyType::Int, F(rl_section.rm_batch), "run.mode = \"reward_model\": labelled completions scored per optimizer step (rm_loss = \"bradley_terry\": rm_batch / 2 pairs, so even).", 1, 1e6});
  add({"rl", "rm_loss", KeyType::Choice, F(rl_section.rm_loss), "run.mode = \"reward_model\": \"bce\" (pointwise: sigmoid(score) against the verifier's label) or \"bradley_terry\" (pairwise: -log sigmoid(s_accepted - s_rejected) over pairs of one prompt's completions, every accepted one against every rejected one; all-right and all-wrong groups give no pair). Evaluations report pointwise and pairwise accuracy either way.",
       0, 0, {} /* the enum's names: bind_choices */});
  add({"rl", "reward", KeyType::Choice, F(rl_section.reward), "What rewards a completion: \"verifier\" (the task's rule verifier; for rl.prompts: exact), \"model\" (the frozen learned reward model rl.reward_model: reward = sigmoid(score); step metrics still report the verifier's exact match; decoupled runs serve it from reward_model:K actors), and for a user's task (rl.prompts): \"exact\" (trimmed text equals the answer), \"numeric\" (the number within rl.reward_tolerance), \"regex\" (what rl.answer_pattern extracts equals the answer) or \"command\" (the program rl.reward_command; docs/own_task.md).",
       0, 0, {} /* the enum's names: bind_choices */});
  add({"rl", "reward_model", KeyType::String, F(rl_section.reward_model), "reward = \"model\": checkpoint directory of a run.mode = \"reward_model\" run (the same [model])."});
  add({"rl", "prompts", KeyType::String, F(rl_section.prompts), "A user's RL task: a JSONL file of {\"prompt\", \"answer\", \"meta\"?} records (relative to the spec file), tokenized by [tokenizer]; held out by rl.eval_prompts or data.eval_fraction. Empty: the built-in task (rl.task)."});
  add({"rl", "eval_prompts", KeyType::String, F(rl_section.eval_prompts), "rl.prompts: the held-out prompts' JSONL file; empty: the share data.eval_fraction of rl.prompts by a hash of each line."});
  add({"rl", "reward_tolerance", KeyType::Float, F(rl_section.reward_tolerance), "reward = \"numeric\": a completion's number x is right when |x - answer| <= reward_tolerance * max(1, |answer|).", 0, 1e6});
  add({"rl", "answer_pattern", KeyType::String, F(rl_section.answer_pattern), "reward = \"regex\": an ECMAScript regular expression; the last match's group 1 (or the whole match) is the completion's answer, e.g. \"#### (.*)\" or \"\\\\boxed\\\\{([^}]*)\\\\}\"."});
  add({"rl", "reward_command", KeyType::StringList, F(rl_section.reward_command), "reward = \"command\": the program and its arguments, e.g. [\"python3\", \"reward.py\"], started in the spec file's directory, one persistent child per reward actor; newline-delimited JSON {id, prompt, completion, answer, meta} in, {id, reward, correct?} out (docs/own_task.md)."});
  add({"rl", "reward_timeout", KeyType::Float, F(rl_section.reward_timeout), "reward = \"command\": seconds the program has for one batch (a step's completions); past it the program is killed, restarted and sent the batch again.", 0.01, 86400});
  add({"rl", "reward_errors", KeyType::String, F(rl_section.reward_errors), "reward = \"command\": a bad reply (not JSON, a missing or repeated id, a NaN reward) \"fail\"s the run (exit 1, naming the request and quoting the line) or scores \"zero\" (counted).", 0, 0, {"fail", "zero"}});
  // run.mode = "sft_rl": phase 2's values of keys phase 1 reads from [run] and [optim] (launch/phases.hpp).
  add({"rl", "steps", KeyType::Int, F(rl_section.steps), "run.mode = \"sft_rl\": RL steps of phase 2 (phase 1 trains [run] steps).", 1, kBig});
  add({"rl", "eval_every", KeyType::Int, F(rl_section.eval_every), "run.mode = \"sft_rl\": phase 2's held-out evaluation every N RL steps (0: only before the first and after the last).", 0, kBig});
  add({"rl", "lr", KeyType::Float, F(rl_section.lr), "run.mode = \"sft_rl\": phase 2's peak learning rate (phase 1 uses [optim] lr; schedule, weight decay and clipping are [optim]'s).", 0, 10});
  add({"rl", "warmup_steps", KeyType::Int, F(rl_section.warmup_steps), "run.mode = \"sft_rl\": phase 2's linear warmup, in optimizer steps.", 0, kBig});
  return k;
}

#undef F

// Makes the row `path` a Choice key over `values`, spelled by `name` (the
// enum's own name function, so each spelling is written once).
template <class E, class Name>
void bind_choice(std::vector<KeyDef>& keys, const std::string& path, std::vector<E> values, Name name) {
  for (KeyDef& d : keys) {
    if (d.path() != path) continue;
    if (d.type != KeyType::Choice) throw std::logic_error("spec key table: " + path + " is not a choice key");
    for (E v : values) d.choices.emplace_back(name(v));
    d.set_choice = [values](void* field, size_t i) { *static_cast<E*>(field) = values.at(i); };
    d.choice_index = [values](const void* field) {
      for (size_t i = 0; i < values.size(); ++i)
        if (values[i] == *static_cast<const E*>(field)) return i;
      throw std::logic_error("spec key table: a value outside its key's choices");
    };
    return;
  }
  throw std::logic_error("spec key table: no key " + path);
}

// The enum values each Choice key offers, in the order the docs list them.
void bind_choices(std::vector<KeyDef>& k) {
  bind_choice(k, "run.mode", std::vector{RunMode::pretrain, RunMode::rl, RunMode::reward_model, RunMode::sft_rl},
              run_mode_name);
  bind_choice(k, "model.ffn", std::vector{model::Ffn::moe, model::Ffn::dense}, model::ffn_name);
  bind_choice(k, "model.balance", std::vector{moe::Balance::aux_loss, moe::Balance::bias, moe::Balance::none}, moe::balance_name);
  bind_choice(k, "data.source", std::vector{model::DataKind::addition, model::DataKind::addition_plain, model::DataKind::text, model::DataKind::scratchpad, model::DataKind::jsonl},
       model::data_kind_name);
  bind_choice(k, "optim.schedule", std::vector{model::LrSchedule::cosine, model::LrSchedule::constant}, model::lr_schedule_name);
  bind_choice(k, "topology.device_kind", std::vector{DeviceKind::host, DeviceKind::opencl, DeviceKind::sim}, device_kind_name);
  bind_choice(k, "topology.host_kernels", std::vector{kernels::HostKernels::portable, kernels::HostKernels::native}, kernels::host_kernels_name);
  bind_choice(k, "topology.opencl_device_type",
       std::vector{kernels::OpenclDeviceType::any, kernels::OpenclDeviceType::gpu, kernels::OpenclDeviceType::cpu},
       kernels::opencl_device_type_name);
  // zb1p runs in the runtime and the sim but is not offered in specs (B and W are not split yet).
  bind_choice(k, "topology.schedule",
       std::vector{sched::Kind::sequential, sched::Kind::one_f_one_b, sched::Kind::dualpipe, sched::Kind::dualpipev},
       [](sched::Kind x) { return std::string(sched::to_string(x)); });
  bind_choice(k, "log.progress",
       std::vector{ProgressStyle::automatic, ProgressStyle::bar, ProgressStyle::plain, ProgressStyle::off},
       progress_style_name);
  bind_choice(k, "topology.auth", std::vector{runtime::ClusterAuth::tls, runtime::ClusterAuth::none}, runtime::cluster_auth_name);
  bind_choice(k, "run.supervision", std::vector{runtime::Strategy::one_for_one, runtime::Strategy::one_for_all, runtime::Strategy::rest_for_one}, runtime::strategy_name);
  bind_choice(k, "topology.process_loss", std::vector{runtime::ProcessLoss::recover, runtime::ProcessLoss::fail}, runtime::process_loss_name);
  bind_choice(k, "rl.sync", std::vector{rl::SyncMode::synchronous, rl::SyncMode::fixed_lag, rl::SyncMode::latest},
       rl::sync_mode_name);
  bind_choice(k, "rl.reward",
              std::vector{rl::RewardSource::verifier, rl::RewardSource::model, rl::RewardSource::exact,
                          rl::RewardSource::numeric, rl::RewardSource::regex, rl::RewardSource::command},
              rl::reward_source_name);
  bind_choice(k, "rl.rm_loss", std::vector{rl::RmLoss::bce, rl::RmLoss::bradley_terry}, rl::rm_loss_name);
  bind_choice(k, "experts.policy", std::vector{runtime::ExpertPolicy::static_split, runtime::ExpertPolicy::eplb},
              runtime::expert_policy_name);
  bind_choice(k, "experts.on_failure", std::vector{runtime::ExpertOnFailure::stop, runtime::ExpertOnFailure::shrink},
              runtime::expert_on_failure_name);
  bind_choice(k, "sim.cost_model", std::vector{sim::CostModel::fixed, sim::CostModel::flops, sim::CostModel::measured},
              sim::cost_model_name);
  for (const KeyDef& d : k)
    if (d.type == KeyType::Choice && !d.set_choice) throw std::logic_error("spec key table: " + d.path() + " has no enum");
}

}  // namespace

const std::vector<KeyDef>& spec_keys() {
  static const std::vector<KeyDef> keys = [] {
    std::vector<KeyDef> k = build_keys();
    bind_choices(k);
    return k;
  }();
  return keys;
}

std::string float_list_text(const std::vector<double>& values) {
  std::string out = "[";
  for (size_t i = 0; i < values.size(); ++i) {
    char buf[32];
    std::snprintf(buf, sizeof buf, "%g", values[i]);
    out += (i ? ", " : "") + std::string(buf);
  }
  return out + "]";
}

std::string key_value_text(const KeyDef& def, Spec& spec) {
  void* p = def.field(spec);
  std::ostringstream os;
  switch (def.type) {
    case KeyType::Int: os << *static_cast<int64_t*>(p); break;
    case KeyType::Float: os << *static_cast<double*>(p); break;
    case KeyType::Bool: os << (*static_cast<bool*>(p) ? "true" : "false"); break;
    case KeyType::String: os << '"' << *static_cast<std::string*>(p) << '"'; break;
    case KeyType::Choice: os << '"' << def.choices.at(def.choice_index(p)) << '"'; break;
    case KeyType::FloatList: os << float_list_text(*static_cast<std::vector<double>*>(p)); break;
    case KeyType::StringList: {
      const auto& v = *static_cast<std::vector<std::string>*>(p);
      os << '[';
      for (size_t i = 0; i < v.size(); ++i) os << (i ? ", " : "") << '"' << v[i] << '"';
      os << ']';
      break;
    }
  }
  return os.str();
}

}  // namespace troupe::launch
