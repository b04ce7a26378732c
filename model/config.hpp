// Plain configuration structs for the model, optimizer, data and training
// loop. launch/ fills them from the TOML spec (and validates them there);
// model/, moe/ and rl/ only read them. Defaults are the quickstart config.
// Enum-like spec values are C++ enums here, converted once when the spec is
// parsed (or a checkpoint manifest read); *_name gives the spec's spelling.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "moe/balance.hpp"

namespace troupe::model {

enum class Ffn : uint8_t { dense, moe };                           // "dense" (SwiGLU), "moe"
enum class LrSchedule : uint8_t { cosine, constant };              // "cosine", "constant"
// "addition", "addition_plain", "text", "scratchpad", "jsonl" (append-only: manifests store them)
enum class DataKind : uint8_t { addition, addition_plain, text, scratchpad, jsonl };

const char* ffn_name(Ffn ffn);
const char* lr_schedule_name(LrSchedule schedule);
const char* data_kind_name(DataKind kind);
// The inverses of ffn_name and data_kind_name: std::invalid_argument
// (parse_ffn) or std::runtime_error (parse_data_kind, as an unusable data
// source) naming the text and the valid names otherwise.
Ffn parse_ffn(std::string_view name);
DataKind parse_data_kind(std::string_view name);

struct ModelConfig {
  int64_t vocab_size = 256;     // token ids in [0, vocab_size); the data source may require more
  int64_t d_model = 128;        // residual width
  int64_t n_layers = 4;         // decoder blocks
  int64_t n_heads = 4;          // attention heads; d_model % n_heads == 0, head dim even (RoPE)
  int64_t seq_len = 128;        // tokens per sequence (context length)
  Ffn ffn = Ffn::moe;           // dense SwiGLU or routed experts
  int64_t dense_hidden = 512;   // hidden width of dense SwiGLU FFNs
  int64_t n_experts = 8;        // routed experts per MoE layer
  int64_t top_k = 2;            // experts per token, <= n_experts
  int64_t expert_hidden = 256;  // hidden width of each expert's SwiGLU
  int64_t shared_experts = 0;   // always-on shared experts (0 or more), hidden = expert_hidden
  moe::Balance balance = moe::Balance::aux_loss;  // aux_loss, bias (DeepSeek-V3 aux-loss-free) or none
  double aux_loss_alpha = 0.01;      // alpha in alpha * E * sum_i f_i P_i
  double bias_update_rate = 0.001;   // gamma in bias += gamma * sign(mean load - load)
  double capacity_factor = 0.0;      // 0 = dropless; else capacity = ceil(cf * T * k / E)
  bool tie_embeddings = true;   // LM head shares the token embedding matrix
  double rope_theta = 10000.0;
  double norm_eps = 1e-5;
  double init_std = 0.02;
  // The tokenizer of a user's data ([tokenizer], model/tokenizer.hpp), stored
  // with the weights it gives meaning to: "" (a built-in task's own
  // vocabulary), "bytes" or "sentencepiece" with the model file's bytes.
  std::string tokenizer_kind;
  std::string tokenizer_model;
};

struct OptimConfig {
  double lr = 3e-3;            // peak learning rate
  double min_lr_ratio = 0.1;   // cosine decays to lr * min_lr_ratio
  int64_t warmup_steps = 20;   // linear warmup from 0
  LrSchedule schedule = LrSchedule::cosine;  // after warmup
  double beta1 = 0.9;
  double beta2 = 0.95;
  double eps = 1e-8;
  double weight_decay = 0.1;   // decoupled; not applied to norms and router bias
  double grad_clip = 1.0;      // max global grad norm, 0 = off
};

// The [tokenizer] section: how a user's text (data.source = "jsonl", rl.prompts)
// becomes tokens (model/tokenizer.hpp). The built-in tasks keep their own.
struct TokenizerConfig {
  std::string kind = "bytes";  // "bytes" (256 bytes + EOS) or "sentencepiece"
  std::string model;           // sentencepiece: the FILE.model
  // sentencepiece: the model file's bytes, read once when the spec is
  // checked, or taken from a checkpoint (which stores them); used instead of
  // reading `model` again.
  std::string model_bytes;
  bool in_use = false;  // the spec's data or RL prompts use it (set by the spec check)
};

struct DataConfig {
  DataKind source = DataKind::addition;  // the built-in task (two formats), a byte-level text file or JSONL
  std::string path;                 // text: the file to read; jsonl: the training records
  // jsonl: the held-out records: eval_path's, or else the share eval_fraction
  // taken by a hash of each line (jsonl.hpp), whatever the order of the lines.
  std::string eval_path;
  double eval_fraction = 0.1;
  std::string prompt_field = "prompt";          // jsonl: the field names of a record
  std::string completion_field = "completion";
  TokenizerConfig tokenizer;
  double val_fraction = 0.1;        // text: tail fraction held out for validation
  int64_t batch_size = 16;          // sequences per optimizer step (all microbatches together)
  int64_t digits = 3;               // addition: max digits per operand
  int64_t width = 0;                // addition: written digits per operand (0 = digits)
  // addition: the target split (empty = none). Unordered digit pairs "x+y, ..."
  // of the operands' digits at target_column (0 = units; -1 = any): training rows never
  // show such a problem, RL prompts and task evaluation are only such problems.
  std::string target_pairs;
  int64_t target_column = 2;
  int64_t eval_problems = 500;      // addition: held-out problems scored for exact match
};

}  // namespace troupe::model
