// The byte tokenizer, SentencePiece models (loading, checking, describing)
// and SentencePiece training with fixed, deterministic settings, written
// atomically. See model/tokenizer.hpp for the contract.
#include "model/tokenizer.hpp"

#include "model/config.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <regex>
#include <unordered_map>

#include "model/atomic_file.hpp"

#include <sentencepiece_processor.h>
#include <sentencepiece_trainer.h>

namespace troupe::model {

namespace fs = std::filesystem;

namespace {

constexpr int32_t kByteEos = 256;
constexpr char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD, what a SentencePiece decode prints for a stray byte

// The ids every model trained here has (see the top of tokenizer.hpp).
constexpr int kTrainedUnkId = 0;
constexpr int kTrainedEosId = 1;

[[noreturn]] void fail(const std::string& file, const std::string& problem) { throw TokenizerError(file, problem); }

std::string errno_text() { return std::strerror(errno); }

std::string quoted(const std::string& s) { return "'" + s + "'"; }

// SentencePiece statuses read "./src/x.cc(580) [cond] Message.": keep the message.
std::string spm_message(const sentencepiece::util::Status& status) {
  std::string m = status.message();
  static const std::regex kLocation(R"(^\S+\(\d+\) \[.*\] )");
  std::smatch match;
  if (std::regex_search(m, match, kLocation)) m = m.substr(static_cast<size_t>(match.length(0)));
  return m;
}

// ---- protobuf wire format -------------------------------------------------
// Read just far enough to show a model's type and normalizer in describe():
// Debian ships no sentencepiece_model.pb.h, and the processor's public API
// does not expose them.

bool read_varint(std::string_view s, size_t& pos, uint64_t& v) {
  v = 0;
  for (int shift = 0; shift < 64 && pos < s.size(); shift += 7) {
    const auto b = static_cast<uint8_t>(s[pos++]);
    v |= static_cast<uint64_t>(b & 0x7f) << shift;
    if ((b & 0x80) == 0) return true;
  }
  return false;
}

struct WireField {
  bool found = false;
  uint64_t varint = 0;     // wire type 0
  std::string_view bytes;  // wire type 2
};

// The last occurrence of field `number` in message `s` (the one protobuf keeps
// for a scalar); not found when absent or when `s` is malformed.
WireField find_field(std::string_view s, uint64_t number) {
  WireField out;
  size_t pos = 0;
  while (pos < s.size()) {
    uint64_t key = 0, v = 0;
    std::string_view bytes;
    if (!read_varint(s, pos, key)) return {};
    switch (key & 7) {
      case 0:
        if (!read_varint(s, pos, v)) return {};
        break;
      case 1:
        if (s.size() - pos < 8) return {};
        pos += 8;
        break;
      case 2:
        if (!read_varint(s, pos, v) || v > s.size() - pos) return {};
        bytes = s.substr(pos, v);
        pos += v;
        break;
      case 5:
        if (s.size() - pos < 4) return {};
        pos += 4;
        break;
      default:
        return {};
    }
    if ((key >> 3) == number) out = {true, v, bytes};
  }
  return out;
}

// ModelProto.trainer_spec (2) .model_type (3), default UNIGRAM as in the
// proto: it is what the processor itself goes by.
std::string model_type_name(std::string_view model) {
  const WireField trainer = find_field(model, 2);
  const WireField type = trainer.found ? find_field(trainer.bytes, 3) : WireField{};
  switch (type.found ? type.varint : 1) {
    case 1: return "unigram";
    case 2: return "bpe";
    case 3: return "word";
    case 4: return "char";
    default: return "type " + std::to_string(type.varint);
  }
}

// ModelProto.normalizer_spec (3) .name (1); "" when absent.
std::string normalizer_name(std::string_view model) {
  const WireField spec = find_field(model, 3);
  return spec.found ? std::string(find_field(spec.bytes, 1).bytes) : std::string();
}

// ---- tokenizers -------------------------------------------------------------

class ByteTokenizer final : public Tokenizer {
 public:
  ByteTokenizer() : Tokenizer(std::string(), kBytesTokenizerHash) {}
  std::string kind() const override { return "bytes"; }
  int64_t vocab_size() const override { return 257; }
  int32_t eos_id() const override { return kByteEos; }
  std::string describe() const override { return "bytes (vocab 257: 256 bytes + EOS 256)"; }

  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int32_t> ids(text.size());
    for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<uint8_t>(text[i]);
    return ids;
  }

  std::string decode(std::span<const int32_t> ids) const override {
    std::string out;
    out.reserve(ids.size());
    for (const int32_t id : ids) {
      if (id >= 0 && id < 256) out.push_back(static_cast<char>(id));
      else if (id != kByteEos) out.push_back('?');  // as the byte-level text source prints unknown ids
    }
    return out;
  }
};

class SentencePieceTokenizer final : public Tokenizer {
 public:
  SentencePieceTokenizer(std::string bytes, const std::string& origin)
      : Tokenizer(std::move(bytes), tokenizer_hash(bytes)), origin_(origin) {
    const std::string& model = model_bytes();
    if (model.empty()) fail(origin, "is empty (expected a SentencePiece .model file)");
    if (static_cast<int64_t>(model.size()) > kMaxTokenizerModelBytes)
      fail(origin, std::to_string(model.size()) + " bytes is more than any tokenizer model has (limit " +
                       std::to_string(kMaxTokenizerModelBytes >> 20) + " MiB): is it the right file?");
    const auto status = sp_.LoadFromSerializedProto(model);
    if (!status.ok()) fail(origin, "is not a SentencePiece model (" + spm_message(status) + ")");
    vocab_ = sp_.GetPieceSize();
    eos_ = sp_.eos_id();
    if (eos_ < 0 || eos_ >= vocab_)
      fail(origin,
           "the SentencePiece model has no EOS piece (it was trained with --eos_id=-1); troupe ends every sequence "
           "with EOS: retrain it with an eos_id (troupe's trainer uses eos_id=1)");
    for (int id = 0; id < vocab_ && !byte_fallback_; ++id) byte_fallback_ = sp_.IsByte(id);
    type_ = model_type_name(model);
    normalizer_ = normalizer_name(model);
  }

  std::string kind() const override { return "sentencepiece"; }
  int64_t vocab_size() const override { return vocab_; }
  int32_t eos_id() const override { return eos_; }

  std::string describe() const override {
    std::string d = "sentencepiece model " + origin_ + " (" + type_ + ", vocab " + std::to_string(vocab_) + ", eos " +
                    std::to_string(eos_);
    if (byte_fallback_) d += ", byte fallback";
    if (!normalizer_.empty()) d += ", normalizer " + normalizer_;
    return d + ", hash " + hash_hex() + ")";
  }

  std::vector<int32_t> encode(std::string_view text) const override {
    std::vector<int> ids;
    const auto status = sp_.Encode(text, &ids);
    // Only an unloaded processor fails here; this one loaded in the constructor.
    if (!status.ok()) fail(origin_, "cannot encode text: " + spm_message(status));
    return {ids.begin(), ids.end()};
  }

  std::string decode(std::span<const int32_t> ids) const override {
    // SentencePiece refuses a whole list with one bad id in it: decode the runs
    // of valid ids between bad ones. (A model with a dummy prefix then drops
    // the space that starts a run, as it does at the start of any text.)
    std::string out;
    std::vector<int> run;
    const auto flush = [&] {
      if (run.empty()) return;
      std::string text;
      out += sp_.Decode(run, &text).ok() ? text : std::string(kReplacement);
      run.clear();
    };
    for (const int32_t id : ids) {
      if (id >= 0 && id < vocab_) {
        run.push_back(id);
      } else {
        flush();
        out += kReplacement;
      }
    }
    flush();
    return out;
  }

 private:
  sentencepiece::SentencePieceProcessor sp_;
  std::string origin_;
  int32_t vocab_ = 0;
  int32_t eos_ = -1;
  bool byte_fallback_ = false;
  std::string type_;
  std::string normalizer_;
};

// ---- training -----------------------------------------------------------------

// Feeds the input files to the trainer line by line, so that the model holds
// no file names (TrainerSpec.input stays empty: the bytes depend on the text
// only) and a read error names its file.
class FileLines final : public sentencepiece::SentenceIterator {
 public:
  FileLines(const std::vector<std::string>& files, int64_t max_line_bytes)
      : files_(files), max_line_bytes_(max_line_bytes) {
    advance();
  }

  bool done() const override { return done_; }
  void Next() override { advance(); }
  const std::string& value() const override { return line_; }
  sentencepiece::util::Status status() const override {
    if (error_.empty()) return {};
    return {sentencepiece::util::StatusCode::kInternal, error_file_ + ": " + error_};
  }

  const std::string& error_file() const { return error_file_; }
  const std::string& error() const { return error_; }
  int64_t text_lines = 0;  // non-empty lines handed over
  int64_t long_lines = 0;  // of those, longer than max_line_bytes: the trainer skips them

 private:
  void advance() {
    while (!done_) {
      if (!in_.is_open()) {
        if (next_file_ == files_.size()) {
          done_ = true;
          return;
        }
        in_.open(files_[next_file_], std::ios::binary);
        file_text_lines_ = 0;
        if (!in_) return stop(files_[next_file_], "cannot open: " + errno_text());
      }
      if (std::getline(in_, line_)) {
        if (!line_.empty() && line_.back() == '\r') line_.pop_back();
        if (line_.empty()) continue;
        ++text_lines;
        ++file_text_lines_;
        if (static_cast<int64_t>(line_.size()) > max_line_bytes_) ++long_lines;
        return;
      }
      if (in_.bad()) return stop(files_[next_file_], "read error: " + errno_text());
      in_.close();
      if (file_text_lines_ == 0) return stop(files_[next_file_], "has no text (only empty lines)");
      ++next_file_;
    }
  }

  void stop(const std::string& file, const std::string& problem) {
    error_file_ = file;
    error_ = problem;
    done_ = true;
  }

  const std::vector<std::string>& files_;
  const int64_t max_line_bytes_;
  std::ifstream in_;
  size_t next_file_ = 0;
  int64_t file_text_lines_ = 0;
  std::string line_;
  bool done_ = false;
  std::string error_file_, error_;
};

// `output` may be written: it names a file (not a directory) in a directory
// that exists and that we may write in (where the temporary file goes).
void check_output(const std::string& output) {
  if (output.empty()) fail("", "no output model file given");
  const fs::path path(output);
  if (!path.has_filename()) fail(output, "names a directory; expected a model file such as words.model");
  const fs::path dir = path.has_parent_path() ? path.parent_path() : fs::path(".");
  std::error_code ec;
  const fs::file_status dir_status = fs::status(dir, ec);
  if (!fs::exists(dir_status)) fail(output, "its directory " + dir.string() + " does not exist");
  if (!fs::is_directory(dir_status)) fail(output, dir.string() + " is not a directory");
  if (::access(dir.c_str(), W_OK | X_OK) != 0)
    fail(output, "cannot write in its directory " + dir.string() + ": " + errno_text());
  const fs::file_status out_status = fs::status(path, ec);
  if (fs::is_directory(out_status)) fail(output, "is a directory; expected a model file such as words.model");
  if (fs::exists(out_status) && !fs::is_regular_file(out_status))
    fail(output, "exists and is not a regular file");
}

void check_input(const std::string& input) {
  std::error_code ec;
  const fs::file_status status = fs::status(input, ec);
  if (!fs::exists(status)) fail(input, "training input does not exist");
  if (fs::is_directory(status)) fail(input, "training input is a directory; expected a text file");
  if (!fs::is_regular_file(status)) fail(input, "training input is not a regular file");
  if (fs::file_size(input, ec) == 0 || ec) fail(input, "training input is empty");
  if (!std::ifstream(input, std::ios::binary)) fail(input, "cannot read training input: " + errno_text());
}

// Turns the trainer's vocabulary-size complaints into advice in our terms.
std::string training_problem(const std::string& message, const TokenizerTrainOptions& o) {
  static const std::regex kTooSmall(R"(smaller than required_chars\. (\d+) vs (\d+))");
  static const std::regex kTooLarge(R"(Vocabulary size too high \((\d+)\)\. Please set it to a value <= (\d+))");
  std::smatch m;
  if (std::regex_search(message, m, kTooSmall))
    return "vocab_size " + m.str(1) + " is too small for these inputs: they need at least " + m.str(2) +
           " (256 byte pieces, <unk>, </s> and one piece per character kept by character_coverage)";
  if (std::regex_search(message, m, kTooLarge))
    return "vocab_size " + m.str(1) + " is too large for these inputs: a " + o.model_type +
           " model of them has at most " + m.str(2) + " pieces";
  return "SentencePiece training failed: " + message;
}

std::string format_double(double v) {
  char buf[64];
  const auto r = std::to_chars(buf, buf + sizeof buf, v);
  return std::string(buf, r.ptr);
}

}  // namespace

TokenizerError::TokenizerError(const std::string& file, const std::string& problem)
    : std::runtime_error("tokenizer: " + (file.empty() ? problem : file + ": " + problem)), file_(file) {}

std::string tokenizer_hash_hex(uint64_t hash) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(hash));
  return buf;
}

std::string Tokenizer::hash_hex() const { return tokenizer_hash_hex(hash_); }

std::unique_ptr<Tokenizer> make_byte_tokenizer() { return std::make_unique<ByteTokenizer>(); }

std::unique_ptr<Tokenizer> sentencepiece_from_bytes(std::string bytes, const std::string& origin) {
  return std::make_unique<SentencePieceTokenizer>(std::move(bytes), origin);
}

std::unique_ptr<Tokenizer> load_sentencepiece(const std::string& path) {
  std::error_code ec;
  const fs::file_status status = fs::status(path, ec);
  if (!fs::exists(status)) fail(path, "tokenizer model file does not exist");
  if (fs::is_directory(status)) fail(path, "is a directory; expected a SentencePiece .model file");
  if (!fs::is_regular_file(status)) fail(path, "is not a regular file; expected a SentencePiece .model file");
  const auto size = fs::file_size(path, ec);
  if (ec) fail(path, "cannot stat: " + ec.message());
  if (size == 0) fail(path, "is empty (expected a SentencePiece .model file)");
  if (size > static_cast<uint64_t>(kMaxTokenizerModelBytes))
    fail(path, std::to_string(size) + " bytes is more than any tokenizer model has (limit " +
                   std::to_string(kMaxTokenizerModelBytes >> 20) + " MiB): is it the right file?");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, "cannot open: " + errno_text());
  std::string bytes(size, '\0');
  in.read(bytes.data(), static_cast<std::streamsize>(size));
  if (in.gcount() != static_cast<std::streamsize>(size)) fail(path, "cannot read (short read)");
  return sentencepiece_from_bytes(std::move(bytes), path);
}

void train_sentencepiece(const TokenizerTrainOptions& o) {
  const auto start = std::chrono::steady_clock::now();
  check_output(o.output);
  if (o.model_type != "bpe" && o.model_type != "unigram")
    fail(o.output, "model_type " + quoted(o.model_type) + " is not \"bpe\" or \"unigram\"");
  if (o.vocab_size < kMinTrainedVocab || o.vocab_size > kMaxTrainedVocab)
    fail(o.output, "vocab_size " + std::to_string(o.vocab_size) + " is outside " + std::to_string(kMinTrainedVocab) +
                       ".." + std::to_string(kMaxTrainedVocab) + " (a model holds the 256 byte pieces, <unk>, </s> "
                       "and at least one piece per character)");
  if (!(o.character_coverage > 0.0 && o.character_coverage <= 1.0))
    fail(o.output, "character_coverage " + format_double(o.character_coverage) + " is outside (0, 1]");
  if (o.max_sentences < 0) fail(o.output, "max_sentences " + std::to_string(o.max_sentences) + " is negative");
  if (o.max_line_bytes < 1 || o.max_line_bytes > (int64_t{1} << 30))
    fail(o.output, "max_line_bytes " + std::to_string(o.max_line_bytes) + " is outside 1..2^30");
  if (o.inputs.empty()) fail(o.output, "no training input files given");
  uint64_t input_bytes = 0;
  for (const std::string& input : o.inputs) {
    check_input(input);
    input_bytes += fs::file_size(input);
  }
  if (o.log)
    o.log("tokenizer: training a " + o.model_type + " model of " + std::to_string(o.vocab_size) + " pieces for " +
          o.output + " from " + std::to_string(o.inputs.size()) + (o.inputs.size() == 1 ? " file (" : " files (") +
          std::to_string(input_bytes) + " bytes)");

  // Every setting is spelled out, so a SentencePiece default that changes
  // between versions does not change our models. Why each one:
  const std::unordered_map<std::string, std::string> args = {
      {"model_type", o.model_type},
      {"vocab_size", std::to_string(o.vocab_size)},
      {"character_coverage", format_double(o.character_coverage)},
      // Every byte has a piece: any text encodes without <unk> and decodes back.
      {"byte_fallback", "true"},
      {"unk_id", std::to_string(kTrainedUnkId)},
      {"eos_id", std::to_string(kTrainedEosId)},
      {"bos_id", "-1"},  // troupe's sequences start with nothing / EOS, as the byte sources do
      {"pad_id", "-1"},  // padding is masked by target -1, never a token
      // The default nmt_nfkc rewrites text (NFKC, collapses and trims spaces)
      // and the dummy prefix adds a space: both break decode(encode(x)) == x.
      {"normalization_rule_name", "identity"},
      {"remove_extra_whitespaces", "false"},
      {"add_dummy_prefix", "false"},
      // Threads partition the unigram E/M-steps (float sums differ by thread
      // count) and num_threads is stored in the model: one thread, same bytes.
      {"num_threads", "1"},
      // With sampling, SentencePiece draws with its own fixed seed (12345678).
      {"input_sentence_size", std::to_string(o.max_sentences)},
      {"shuffle_input_sentence", "true"},
      {"max_sentence_length", std::to_string(o.max_line_bytes)},
      {"minloglevel", "1"},  // no INFO spam on stderr (process-wide; warnings still show)
  };
  FileLines lines(o.inputs, o.max_line_bytes);
  std::string model;
  const auto status = sentencepiece::SentencePieceTrainer::Train(args, &lines, &model);
  if (!lines.error().empty()) fail(lines.error_file(), lines.error());
  if (lines.text_lines == lines.long_lines)
    fail(o.inputs.size() == 1 ? o.inputs.front() : o.output,
         "no line of the training inputs has 1.." + std::to_string(o.max_line_bytes) +
             " bytes (longer lines are skipped)");
  if (!status.ok()) fail(o.output, training_problem(spm_message(status), o));

  // Check what we are about to write as a loader will see it.
  const auto tokenizer = sentencepiece_from_bytes(model, o.output);
  if (tokenizer->vocab_size() != o.vocab_size || tokenizer->eos_id() != kTrainedEosId)
    fail(o.output, "SentencePiece produced a model of " + std::to_string(tokenizer->vocab_size()) +
                       " pieces with EOS " + std::to_string(tokenizer->eos_id()) + "; expected " +
                       std::to_string(o.vocab_size) + " with EOS " + std::to_string(kTrainedEosId));
  try {
    write_file_atomically(o.output, model);  // the one atomic write (model/atomic_file.hpp)
  } catch (const std::runtime_error& e) {
    fail(o.output, e.what());
  }
  if (o.log) {
    const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    char took[32];
    std::snprintf(took, sizeof took, "%.1f s", seconds);
    std::string skipped;
    if (lines.long_lines > 0)
      skipped = ", " + std::to_string(lines.long_lines) + " longer than " + std::to_string(o.max_line_bytes) +
                " bytes skipped";
    o.log("tokenizer: wrote " + tokenizer->describe() + ": " + std::to_string(model.size()) + " bytes from " +
          std::to_string(lines.text_lines) + " lines" + skipped + ", in " + took);
  }
}

std::unique_ptr<Tokenizer> make_tokenizer(const TokenizerConfig& config) {
  if (config.kind == "bytes") return make_byte_tokenizer();
  if (config.kind != "sentencepiece")
    throw TokenizerError(config.model, "unknown tokenizer kind \"" + config.kind + "\" (expected \"bytes\" or \"sentencepiece\")");
  if (!config.model_bytes.empty()) return sentencepiece_from_bytes(config.model_bytes, config.model);  // read once already
  if (config.model.empty()) throw TokenizerError("[tokenizer] model", "kind \"sentencepiece\" needs model = FILE.model");
  return load_sentencepiece(config.model);
}

uint64_t tokenizer_identity(const std::string& kind, const std::string& model_bytes) {
  return kind == "sentencepiece" ? tokenizer_hash(model_bytes) : kBytesTokenizerHash;
}

TokenizerConfig checkpoint_tokenizer(const ModelConfig& saved, const TokenizerConfig& given, const std::string& checkpoint) {
  if (saved.tokenizer_kind.empty()) return given;
  if (given.in_use) {
    const uint64_t have = tokenizer_identity(saved.tokenizer_kind, saved.tokenizer_model);
    const uint64_t want = tokenizer_identity(given.kind, given.model_bytes);
    if (have != want)
      throw TokenizerError(given.model.empty() ? "[tokenizer]" : given.model,
                           "this tokenizer (" + given.kind + ", hash " + tokenizer_hash_hex(want) +
                               ") is not the one the checkpoint " + checkpoint + " was trained with (" + saved.tokenizer_kind +
                               ", hash " + tokenizer_hash_hex(have) + "); use that one, or leave [tokenizer] out");
  }
  TokenizerConfig t = given;
  t.kind = saved.tokenizer_kind;
  t.model_bytes = saved.tokenizer_model;
  if (t.model.empty()) t.model = checkpoint + "/(stored tokenizer)";
  t.in_use = true;
  return t;
}

}  // namespace troupe::model
