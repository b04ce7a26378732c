// Tokenizers for the spec's [tokenizer] section: kind = "bytes" (one token per
// byte plus EOS) or kind = "sentencepiece" with model = FILE.model, and
// training such a model from text files. A SentencePiece model is identified
// by a hash of its file's bytes, so a checkpoint can store the file and refuse
// to resume with a different one. This layer knows nothing of actors.
//
// Models trained here (train_sentencepiece) use fixed ids and settings under
// which decode(encode(x)) == x for any valid UTF-8 text without U+2581 '▁':
//   id 0 <unk> (never produced: byte_fallback covers every byte),
//   id 1 </s>  (EOS), no BOS, no PAD,
//   ids 2..257 the byte pieces <0x00>..<0xFF>, then the learned pieces;
//   normalization "identity" (no NFKC), spaces kept as they are (no collapsing
//   or trimming), no dummy space in front of the text.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::model {

// A tokenizer that cannot be loaded or trained. what() is
// "tokenizer: <file>: <problem>"; file() names the model file, input or
// output concerned (or the origin of in-memory bytes).
class TokenizerError : public std::runtime_error {
 public:
  TokenizerError(const std::string& file, const std::string& problem);
  const std::string& file() const { return file_; }

 private:
  std::string file_;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  virtual std::string kind() const = 0;  // "bytes" | "sentencepiece"
  virtual int64_t vocab_size() const = 0;
  // Text to ids; adds no EOS/BOS. Never produces EOS.
  virtual std::vector<int32_t> encode(std::string_view text) const = 0;
  // Ids to text. Does not stop at EOS (which prints as nothing); never throws:
  // ids outside [0, vocab_size) print as '?' (bytes) or U+FFFD (sentencepiece).
  virtual std::string decode(std::span<const int32_t> ids) const = 0;
  virtual int32_t eos_id() const = 0;  // always in [0, vocab_size)
  // One line for logs: "bytes (vocab 257: 256 bytes + EOS 256)",
  // "sentencepiece model m.model (bpe, vocab 512, eos 1, byte fallback, normalizer identity, hash 1a2b...)".
  virtual std::string describe() const = 0;

  // The serialized model file ("" for bytes): what a checkpoint stores.
  const std::string& model_bytes() const { return model_bytes_; }
  // Identity: tokenizer_hash(model_bytes()) for sentencepiece; for bytes a
  // fixed constant (kBytesTokenizerHash).
  uint64_t hash() const { return hash_; }
  std::string hash_hex() const;  // 16 lowercase hex digits

 protected:
  // An rvalue reference, so that a subclass may pass (std::move(b), tokenizer_hash(b)).
  Tokenizer(std::string&& model_bytes, uint64_t hash) : model_bytes_(std::move(model_bytes)), hash_(hash) {}

 private:
  std::string model_bytes_;
  uint64_t hash_;
};

// FNV-1a 64 of the bytes: stable across runs, machines and builds.
constexpr uint64_t tokenizer_hash(std::string_view bytes) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (const char c : bytes) h = (h ^ static_cast<uint8_t>(c)) * 0x100000001b3ull;
  return h;
}
// "%016x" of a hash, for messages ("tokenizer 1a2b... differs from the checkpoint's 3c4d...").
std::string tokenizer_hash_hex(uint64_t hash);
// The bytes tokenizer's hash(): that of a string no SentencePiece model file
// equals (it does not parse as one).
inline constexpr uint64_t kBytesTokenizerHash = tokenizer_hash("troupe bytes tokenizer v1");

// Bytes: one token per byte 0..255, EOS = 256, vocab 257.
std::unique_ptr<Tokenizer> make_byte_tokenizer();

// Most bytes a model file may have (real models are a few MiB at most).
inline constexpr int64_t kMaxTokenizerModelBytes = int64_t{256} << 20;

// Loads a SentencePiece model file. Throws TokenizerError naming `path` when
// it is missing, not a regular file, empty, larger than
// kMaxTokenizerModelBytes, not a SentencePiece model, or has no EOS piece
// (trained with --eos_id=-1). Note that a file cut short exactly at a field
// boundary can still parse: files are only as trustworthy as their hash.
std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& path);
// The same from bytes already in memory (a checkpoint stores the file);
// `origin` names where they came from, for messages and describe().
std::unique_ptr<Tokenizer> sentencepiece_from_bytes(std::string bytes, const std::string& origin);

struct TokenizerConfig;
// The tokenizer a [tokenizer] section names: bytes, or the SentencePiece model
// (its stored bytes when a checkpoint supplied them, else the file). Throws
// TokenizerError (a bad or missing model, an unknown kind).
std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerConfig& config);

struct ModelConfig;
// The identity of a tokenizer: kBytesTokenizerHash for bytes, the hash of
// the model file for sentencepiece.
uint64_t tokenizer_identity(const std::string& kind, const std::string& model_bytes);
// The [tokenizer] to use with a checkpoint whose model is `saved`: its stored
// tokenizer when it has one (eval, sample, resume and rl.init all read the
// stored file), else `given`. Throws TokenizerError naming both hashes when
// the spec uses a different tokenizer than the checkpoint stores.
TokenizerConfig checkpoint_tokenizer(const ModelConfig& saved, const TokenizerConfig& given, const std::string& checkpoint);

// Fewest / most pieces a trained model may have. The minimum is the 256 byte
// pieces + <unk> + </s> + one character; a corpus needs one more per distinct
// character (character_coverage 1), which training checks.
inline constexpr int64_t kMinTrainedVocab = 259;
inline constexpr int64_t kMaxTrainedVocab = int64_t{1} << 20;

struct TokenizerTrainOptions {
  std::vector<std::string> inputs;  // UTF-8 text files, one sentence per line ("\r\n" accepted)
  int64_t vocab_size = 0;           // kMinTrainedVocab .. kMaxTrainedVocab
  std::string model_type = "bpe";   // "bpe" | "unigram"
  std::string output;               // the model file, written exactly at this path (".model" by convention)
  double character_coverage = 1.0;  // (0, 1]; characters outside it still encode, as bytes
  // 0: train on every line. > 0: a sample of that many lines, drawn by
  // SentencePiece with its own fixed seed (so still deterministic).
  int64_t max_sentences = 0;
  // Longer lines are skipped (SentencePiece's max_sentence_length; very long
  // sentences can make unigram training overflow).
  int64_t max_line_bytes = 4192;
  // Progress lines (SentencePiece's own INFO logging is switched off; its
  // warnings still go to stderr). May be empty.
  std::function<void(const std::string&)> log;
};

// Trains a SentencePiece model (settings in the comment at the top of this
// file; one thread, so the same inputs and options give the same bytes, and
// the bytes do not depend on where the inputs lie) and writes it atomically:
// a temporary file beside `output`, fsynced, renamed over it. No .vocab file
// is written (`spm_export_vocab --model=FILE` prints one). On any error
// nothing is left at `output` (an existing file there stays as it was).
// Throws TokenizerError naming the input, output or option at fault.
void train_sentencepiece(const TokenizerTrainOptions& o);

}  // namespace troupe::model
