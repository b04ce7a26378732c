// ParamLayout: every model parameter is a named view into ONE flat float32
// buffer. Optimizer shards own ranges of it, gradients use the same layout,
// and a checkpoint or safetensors export is one pass over the entries.
// Names follow Hugging Face conventions (documented in docs/architecture.md) so exported
// weights load in PyTorch tooling; matrices are stored [out, in] like
// torch.nn.Linear.weight.
#pragma once

#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "kernels/tensor.hpp"
#include "model/config.hpp"

namespace troupe::model {

// What a parameter is, independent of its (Hugging Face) name: the runtime
// finds parameters by these tags, never by matching name strings.
enum class ParamRole : uint8_t {
  Embedding,     // token embedding (also the head when embeddings are tied)
  Norm,          // a layer's RMSNorm weights
  Attention,     // q/k/v/o projections
  Dense,         // a dense layer's FFN
  Router,        // a MoE layer's router (gate) weight
  RouterBias,    // the aux-loss-free router bias (not trained by AdamW)
  Expert,        // a routed expert's gate/up/down projection
  SharedExpert,  // the shared experts' projections
  FinalNorm,     // the final RMSNorm
  Head,          // the untied LM head
};
struct ParamTag {
  ParamRole role = ParamRole::Embedding;
  int layer = -1;   // decoder layer; -1 outside the layers
  int expert = -1;  // routed expert id (role Expert); -1 otherwise
  int part = -1;    // role Expert: 0 gate_proj, 1 up_proj, 2 down_proj; -1 otherwise
};

struct ParamEntry {
  std::string name;      // e.g. "model.layers.0.self_attn.q_proj.weight"
  kernels::Shape shape;  // e.g. [d_model, d_model]
  int64_t offset = 0;    // first element in the flat buffer
  int64_t numel = 0;
  bool trainable = true;  // false: state such as the aux-loss-free router bias
  bool decay = true;      // AdamW weight decay applies (false for norms)
  ParamTag tag;           // what it is (layer, role, expert)
};

class ParamLayout {
 public:
  // Appends an entry at the end of the buffer and returns it.
  const ParamEntry& add(std::string name, kernels::Shape shape, bool trainable = true,
                        bool decay = true, ParamTag tag = {});
  const std::vector<ParamEntry>& entries() const { return entries_; }
  int64_t total() const { return total_; }
  // nullptr when absent.
  const ParamEntry* find(const std::string& name) const;
  // The entry that must exist (throws std::out_of_range naming it otherwise).
  const ParamEntry& at(const std::string& name) const;

 private:
  std::vector<ParamEntry> entries_;
  std::unordered_map<std::string, size_t> index_;  // name -> entries_ index (a 64-layer MoE has ~10^4 entries)
  int64_t total_ = 0;
};

// A run of consecutive trainable entries that AdamW treats alike (same decay
// flag). The single-process trainer and the optimizer-shard actors both update
// exactly these runs (shards intersect them with the range they own).
struct OptimizerRange {
  int64_t offset = 0, numel = 0;
  bool decay = true;
};
std::vector<OptimizerRange> optimizer_ranges(const ParamLayout& layout);

// The layout of the decoder described by `config` (model/params.cpp).
ParamLayout build_param_layout(const ModelConfig& config);

}  // namespace troupe::model
