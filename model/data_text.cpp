// Byte-level text source: any file, one token per byte (vocab 256). The tail
// val_fraction of the bytes is the validation split. Training sequence i is a
// window at a position drawn from hash(seed, i), so it depends on nothing but
// (seed, i); validation windows tile the tail in order, whatever the seed.
#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>

#include "model/data.hpp"

namespace troupe::model::detail {
namespace {

uint64_t mix64(uint64_t x) {  // splitmix64 finalizer: a bijective avalanche
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// Uniform in [0, n) from 64 random bits (multiply-shift; the bias is < n / 2^64).
int64_t below(uint64_t bits, int64_t n) {
  return static_cast<int64_t>((static_cast<unsigned __int128>(bits) * static_cast<uint64_t>(n)) >> 64);
}

class TextSource final : public DataSource {
 public:
  TextSource(std::string path, std::string bytes, int64_t n_train, uint64_t seed)
      : path_(std::move(path)), bytes_(std::move(bytes)), n_train_(n_train), seed_(seed) {}

  int64_t vocab_size() const override { return 256; }

  std::string describe() const override {
    std::ostringstream os;
    os << "text '" << path_ << "': " << bytes_.size() << " bytes (train " << n_train_ << ", val "
       << n_val() << "), byte-level vocab 256";
    return os.str();
  }

  std::vector<int32_t> encode(const std::string& text) const override {
    std::vector<int32_t> out(text.size());
    for (size_t i = 0; i < text.size(); ++i) out[i] = static_cast<unsigned char>(text[i]);
    return out;
  }

  std::string decode(const std::vector<int32_t>& tokens) const override {
    std::string out;
    out.reserve(tokens.size());
    for (int32_t t : tokens) out.push_back(t >= 0 && t < 256 ? static_cast<char>(t) : '?');
    return out;
  }

  // Checks that windows of seq tokens (seq + 1 bytes with the last target)
  // fit in each split; `need_val` = false skips the validation split.
  void check_seq(int64_t seq, bool need_train, bool need_val) const {
    if (need_train && n_train_ < seq + 1)
      throw std::runtime_error("data: text file '" + path_ + "' has " + std::to_string(n_train_) +
                               " training bytes; sequences of " + std::to_string(seq) +
                               " tokens need at least " + std::to_string(seq + 1));
    if (need_val && n_val() == 0)
      throw std::runtime_error("data: text file '" + path_ +
                               "' has no validation split (val_fraction is 0)");
    if (need_val && n_val() < seq + 1)
      throw std::runtime_error("data: text file '" + path_ + "' has " + std::to_string(n_val()) +
                               " validation bytes; sequences of " + std::to_string(seq) +
                               " tokens need at least " + std::to_string(seq + 1) +
                               " (use a longer file or a larger val_fraction)");
  }

 protected:
  void train_sequence(int32_t* inputs, int32_t* targets, int64_t index, int64_t seq) const override {
    check_seq(seq, true, false);
    const uint64_t bits = mix64(mix64(seed_ ^ 0x7465787474726e00ull) ^ static_cast<uint64_t>(index));
    window(inputs, targets, below(bits, n_train_ - seq), seq);
  }

  void val_sequence(int32_t* inputs, int32_t* targets, int64_t index, int64_t seq) const override {
    check_seq(seq, false, true);
    // Non-overlapping windows starting at k*seq; index wraps around them.
    const int64_t windows = (n_val() - 1) / seq;
    window(inputs, targets, n_train_ + (index % windows) * seq, seq);
  }

 private:
  int64_t n_val() const { return static_cast<int64_t>(bytes_.size()) - n_train_; }

  // inputs = bytes[start, start+seq), targets = bytes[start+1, start+seq+1).
  void window(int32_t* inputs, int32_t* targets, int64_t start, int64_t seq) const {
    const auto* p = reinterpret_cast<const unsigned char*>(bytes_.data()) + start;
    for (int64_t t = 0; t < seq; ++t) {
      inputs[t] = p[t];
      targets[t] = p[t + 1];
    }
  }

  std::string path_;
  std::string bytes_;
  int64_t n_train_;
  uint64_t seed_;
};

}  // namespace

// 4 GiB: held in memory as bytes; larger corpora need a streaming source.
constexpr uintmax_t kMaxTextFileBytes = uintmax_t{4} << 30;

std::unique_ptr<DataSource> make_text_source(const DataConfig& config, uint64_t seed, int64_t seq_len) {
  if (config.path.empty()) throw std::runtime_error("data: source \"text\" needs a file path");
  if (!(config.val_fraction >= 0.0 && config.val_fraction < 1.0))
    throw std::runtime_error("data: val_fraction must be in [0, 1), got " +
                             std::to_string(config.val_fraction));
  std::error_code ec;
  if (!std::filesystem::exists(config.path, ec))
    throw std::runtime_error("data: text file '" + config.path + "' does not exist");
  if (std::filesystem::is_directory(config.path, ec))
    throw std::runtime_error("data: text file '" + config.path + "' is a directory");
  // The whole file is read into memory: a FIFO would block forever and a
  // huge file would exhaust memory, so both are refused before reading.
  if (!std::filesystem::is_regular_file(config.path, ec))
    throw std::runtime_error("data: text file '" + config.path + "' is not a regular file (a FIFO, device or socket)");
  const uintmax_t size = std::filesystem::file_size(config.path, ec);
  if (!ec && size > kMaxTextFileBytes)
    throw std::runtime_error("data: text file '" + config.path + "' has " + std::to_string(size) +
                             " bytes, more than the " + std::to_string(kMaxTextFileBytes) +
                             " a text source reads into memory");
  std::ifstream in(config.path, std::ios::binary);
  if (!in)
    throw std::runtime_error("data: cannot open text file '" + config.path + "': " + std::strerror(errno));
  std::ostringstream buf;
  buf << in.rdbuf();
  if (in.bad()) throw std::runtime_error("data: error reading text file '" + config.path + "'");
  std::string bytes = std::move(buf).str();
  if (bytes.empty()) throw std::runtime_error("data: text file '" + config.path + "' is empty");
  const auto n = static_cast<int64_t>(bytes.size());
  const auto n_val = static_cast<int64_t>(static_cast<double>(n) * config.val_fraction);
  auto src = std::make_unique<TextSource>(config.path, std::move(bytes), n - n_val, seed);
  if (seq_len > 0) src->check_seq(seq_len, true, n_val > 0);
  return src;
}

}  // namespace troupe::model::detail
