// Checkpoints: everything needed to resume training bit for bit, stored as a
// DIRECTORY holding
//   manifest.bin     Cap'n Proto CheckpointManifest (schemas/checkpoint.capnp)
//                    + a 16-byte trailer (magic "TRPCKPT1", hash of the message)
//   params.f32.zst   the flat parameter buffer, zstd-compressed float32 LE
//   adam_m.f32.zst   AdamW first moments  (absent when no optimizer state)
//   adam_v.f32.zst   AdamW second moments (absent when no optimizer state)
// Every file is hashed whole and every tensor inside it is hashed too, so a
// damaged checkpoint is rejected with the file (and tensor) named.
//
// Saving writes `<dir>.tmp-<pid>-<n>`, fsyncs its files and itself, then swaps
// it into place atomically (renameat2 RENAME_EXCHANGE; where the filesystem
// lacks it: rename old away, rename new in, remove old) and fsyncs the parent.
// A crash at any point leaves either the old or the new checkpoint: at <dir>,
// or (fallback only, crash between its two renames) at <dir>.old-<pid>-<n>,
// which a load then reads and the next save renames back. Other leftovers of
// dead processes (.tmp-*) are never read; they are removed by the next save
// and, at start-up and on resume, by clean_checkpoint_leftovers.
#pragma once

#include <cstddef>
#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/config.hpp"
#include "model/params.hpp"

namespace troupe::model {

struct TrainingState {
  ModelConfig config;
  uint64_t seed = 0;
  int64_t step = 0;            // optimizer steps completed
  std::vector<float> params;   // [layout.total()]
  std::vector<float> adam_m;   // [layout.total()], or empty: no optimizer state
  std::vector<float> adam_v;   // [layout.total()], or empty (together with adam_m)
  std::string rng_state;       // opaque bytes (e.g. SamplerRng::state())
  int64_t data_cursor = 0;     // DataSource::train_batch cursor to continue from
};

// A checkpoint that cannot be written or read. what() names the file and the
// problem, e.g. "ckpt/params.f32.zst: checksum mismatch for tensor 'x'";
// file() is that path.
class CheckpointError : public std::runtime_error {
 public:
  CheckpointError(const std::string& file, const std::string& problem);
  const std::string& file() const { return file_; }

 private:
  std::string file_;
};

// Writes `state` to the directory `dir` (created, or replaced atomically if it
// already holds a checkpoint; a non-empty directory that is not a checkpoint
// is never replaced). Throws CheckpointError (I/O errors, sizes that do not
// match the layout).
void save_checkpoint(const std::string& dir, const TrainingState& state, const ParamLayout& layout);

// Reads and verifies a checkpoint: the manifest, every file's size and hash,
// every tensor's hash, and the tensor table against `expected` (names, shapes,
// offsets, flags). Throws CheckpointError naming the bad file; nothing is
// returned on error.
TrainingState load_checkpoint(const std::string& dir, const ParamLayout& expected);
// Same, checked against build_param_layout(config stored in the checkpoint).
TrainingState load_checkpoint(const std::string& dir);

// True when `dir` holds a manifest (says nothing about its validity).
bool checkpoint_exists(const std::string& dir);

// Leftovers of processes that no longer exist beside <dir> (a process killed
// during a save): puts a moved-away complete checkpoint back at <dir> when
// <dir> is missing, and removes the rest (<dir>.tmp-<pid>-<n>, and .old-* once
// <dir> exists). A live process's leftovers are never touched (it may be
// saving right now). Best effort; returns how many it removed.
int clean_checkpoint_leftovers(const std::string& dir);

// "" when a and b describe the same model; otherwise the first differing
// field, e.g. "d_model: 128 vs 256". For resume: refuse a checkpoint whose
// architecture differs from the one configured.
std::string config_difference(const ModelConfig& a, const ModelConfig& b);

// The 64-bit hash used for checkpoint files and tensors (our own design: four
// multiply-rotate lanes over 8-byte words, then a splitmix64 avalanche).
uint64_t checkpoint_hash(const void* data, size_t bytes, uint64_t seed = 0);

}  // namespace troupe::model
