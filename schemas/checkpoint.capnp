# Checkpoint manifest: the one Cap'n Proto message stored as `manifest.bin` in
# a checkpoint directory (model/checkpoint.cpp writes and validates it). It
# names and checksums the zstd-compressed tensor files next to it, so a
# checkpoint can be verified before anything is loaded.
#
# On disk, manifest.bin = this message (flat, unpacked, one segment) followed
# by a 16-byte trailer: the 8 ASCII bytes "TRPCKPT1" and the little-endian
# 64-bit troupe hash of the message bytes. To inspect one:
#   head -c -16 manifest.bin | capnp decode schemas/checkpoint.capnp CheckpointManifest
@0xc00396dad63b9c3d;

$import "/capnp/c++.capnp".namespace("troupe::schemas");

# The architecture fields of model::ModelConfig (model/config.hpp), one for one.
struct ModelConfigMsg {
  vocabSize @0 :Int64;       # token ids in [0, vocabSize)
  dModel @1 :Int64;          # residual width
  nLayers @2 :Int64;         # decoder blocks
  nHeads @3 :Int64;          # attention heads
  seqLen @4 :Int64;          # context length
  ffn @5 :Text;              # "dense" or "moe"
  denseHidden @6 :Int64;     # hidden width of dense SwiGLU FFNs
  nExperts @7 :Int64;        # routed experts per MoE layer
  topK @8 :Int64;            # experts per token
  expertHidden @9 :Int64;    # hidden width of each expert
  sharedExperts @10 :Int64;  # always-on shared experts
  balance @11 :Text;         # "aux_loss", "bias" or "none"
  auxLossAlpha @12 :Float64; # aux loss weight
  biasUpdateRate @13 :Float64;  # gamma of the aux-loss-free bias update
  capacityFactor @14 :Float64;  # 0 = dropless
  tieEmbeddings @15 :Bool;   # LM head shares the embedding matrix
  ropeTheta @16 :Float64;    # RoPE base
  normEps @17 :Float64;      # RMSNorm epsilon
  initStd @18 :Float64;      # init standard deviation
  tokenizerKind @19 :Text;   # a user's tokenizer: "bytes" or "sentencepiece"; "" = the built-in task's own
  tokenizerModel @20 :Data;  # sentencepiece: the model file's bytes (its hash is the tokenizer's identity)
}

# What a tensor file holds. Append-only.
enum TensorRole {
  params @0;  # the flat parameter buffer
  adamM @1;   # AdamW first moment, same layout as params
  adamV @2;   # AdamW second moment, same layout as params
}

# One zstd-compressed file holding a whole flat float32 buffer (little endian).
struct TensorFile {
  role @0 :TensorRole;        # which buffer this file holds
  fileName @1 :Text;          # name inside the checkpoint directory, e.g. "params.f32.zst"
  numel @2 :Int64;            # float32 elements once decompressed (= paramCount)
  compressedBytes @3 :UInt64; # exact size of the file on disk
  fileHash @4 :UInt64;        # troupe hash of the compressed file bytes
  tensorHashes @5 :List(UInt64);  # troupe hash of each tensor's raw bytes, in `tensors` order
}

# One named view of the flat buffer (model::ParamEntry).
struct TensorEntry {
  name @0 :Text;              # e.g. "model.layers.0.self_attn.q_proj.weight"
  shape @1 :List(Int64);      # dimensions, outermost first
  offset @2 :Int64;           # first element in the flat buffer
  numel @3 :Int64;            # product of shape
  trainable @4 :Bool;         # false for state such as the router bias
  decay @5 :Bool;             # AdamW weight decay applies
}

struct CheckpointManifest {
  formatVersion @0 :UInt32;   # 1; readers reject versions they do not know
  config @1 :ModelConfigMsg;  # the architecture the tensors belong to
  seed @2 :UInt64;            # run seed (init, data order)
  step @3 :Int64;             # optimizer steps completed
  dataCursor @4 :Int64;       # the data source's cursor (model/data.hpp) to resume from
  rngState @5 :Data;          # opaque RNG state bytes of the trainer
  paramCount @6 :Int64;       # elements in the flat buffer (ParamLayout::total)
  tensors @7 :List(TensorEntry);  # the layout, in buffer order
  files @8 :List(TensorFile); # params always; adamM and adamV when optimizer state was saved
}
