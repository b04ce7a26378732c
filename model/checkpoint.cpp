// Checkpoint save/load: the Cap'n Proto manifest, zstd tensor files, hashes,
// validation of everything read (a checkpoint on disk is untrusted input), and
// the atomic directory swap. See model/checkpoint.hpp for the on-disk layout.
#include "model/checkpoint.hpp"
#include "model/tokenizer.hpp"

#include "model/atomic_file.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zstd.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>

#include <capnp/message.h>
#include <capnp/serialize.h>
#include <kj/exception.h>

#include "schemas/checkpoint.capnp.h"

namespace troupe::model {

static_assert(std::endian::native == std::endian::little,
              "checkpoint and safetensors files are little endian; add byte swaps for this host");

namespace fs = std::filesystem;

namespace {

constexpr uint32_t kFormatVersion = 1;
constexpr char kMagic[8] = {'T', 'R', 'P', 'C', 'K', 'P', 'T', '1'};
constexpr const char* kManifestName = "manifest.bin";
constexpr const char* kFileNames[3] = {"params.f32.zst", "adam_m.f32.zst", "adam_v.f32.zst"};
// float32 weights barely compress (~8% at any level; measured 0.92 at levels 1
// and 3 on normal(0, 0.02) data): level 1 is the fastest way to get it.
constexpr int kZstdLevel = 1;
constexpr int64_t kMaxElements = int64_t{1} << 40;  // sanity bound on sizes read from a manifest

[[noreturn]] void fail(const fs::path& file, const std::string& problem) {
  throw CheckpointError(file.string(), problem);
}

std::string errno_text() { return std::strerror(errno); }

// ---- small file utilities -------------------------------------------------

void write_file_durable(const fs::path& path, const void* data, size_t n) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) fail(path, "cannot create: " + errno_text());
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) {
      const std::string err = errno_text();
      ::close(fd);
      fail(path, "write failed: " + err);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  if (::fsync(fd) != 0) {
    const std::string err = errno_text();
    ::close(fd);
    fail(path, "fsync failed: " + err);
  }
  if (::close(fd) != 0) fail(path, "close failed: " + errno_text());
}

void fsync_dir(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) fail(dir, "cannot open directory to fsync: " + errno_text());
  const int rc = ::fsync(fd);
  const std::string err = rc != 0 ? errno_text() : "";
  ::close(fd);
  if (rc != 0) fail(dir, "fsync of directory failed: " + err);
}

// Reads a whole regular file of at most `max_bytes` (checked before any
// allocation: a huge or sparse file is a clear error naming it, never a
// std::bad_alloc).
std::string read_file(const fs::path& path, const char* missing_problem, uint64_t max_bytes, const char* limit_why) {
  // O_NONBLOCK: opening a FIFO must not wait for a writer (fstat below
  // refuses it); a regular file ignores the flag.
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) {
    if (errno == ENOENT) fail(path, missing_problem);
    fail(path, "cannot open: " + errno_text());
  }
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    fail(path, "not a regular file");
  }
  if (static_cast<uint64_t>(st.st_size) > max_bytes) {
    ::close(fd);
    fail(path, "has " + std::to_string(st.st_size) + " bytes; " + limit_why + " " + std::to_string(max_bytes));
  }
  std::string out(static_cast<size_t>(st.st_size), '\0');
  size_t got = 0;
  while (got < out.size()) {
    const ssize_t r = ::read(fd, out.data() + got, out.size() - got);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) break;
    got += static_cast<size_t>(r);
  }
  ::close(fd);
  out.resize(got);
  return out;
}

// <dir>, without a trailing slash, so that name-based siblings work.
fs::path normalize(const std::string& dir) {
  if (dir.empty()) throw CheckpointError(dir, "empty checkpoint path");
  fs::path p = fs::path(dir).lexically_normal();
  if (!p.has_filename()) p = p.parent_path();
  if (p.empty() || p == "." || p == "/" || p.filename() == "..")
    throw CheckpointError(dir, "not a usable checkpoint directory name");
  return p;
}

// <base>.tmp-<pid>-<n> and <base>.old-<pid>-<n> directories left behind by
// processes that no longer exist (a crash during save), sorted by name.
struct Leftover {
  fs::path path;
  bool old;  // a moved-away complete checkpoint (fallback swap), not a partial one
};

std::vector<Leftover> dead_leftovers(const fs::path& target) {
  const std::string base = target.filename().string();
  const fs::path parent = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  std::vector<Leftover> out;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(parent, ec)) {
    const std::string name = entry.path().filename().string();
    for (const char* tag : {".tmp-", ".old-"}) {
      const std::string prefix = base + tag;
      if (name.compare(0, prefix.size(), prefix) != 0) continue;
      const std::string rest = name.substr(prefix.size());
      char* end = nullptr;
      const long pid = std::strtol(rest.c_str(), &end, 10);
      if (end == rest.c_str() || *end != '-' || pid <= 0 || pid == ::getpid()) continue;
      if (::kill(static_cast<pid_t>(pid), 0) != 0 && errno == ESRCH)
        out.push_back({entry.path(), tag[1] == 'o'});
    }
  }
  std::sort(out.begin(), out.end(), [](const Leftover& a, const Leftover& b) { return a.path < b.path; });
  return out;
}

// A complete checkpoint moved away by a fallback swap that crashed before the
// new one was renamed in; empty when <dir> exists or there is none.
fs::path orphaned_checkpoint(const fs::path& target) {
  std::error_code ec;
  if (fs::exists(target, ec)) return {};
  for (const Leftover& l : dead_leftovers(target))
    if (l.old && fs::is_regular_file(l.path / kManifestName, ec)) return l.path;
  return {};
}

// Before a save, at start-up and on resume: put an orphaned checkpoint back
// in place, then delete the other leftovers of dead processes. Best effort.
int recover_and_clean(const fs::path& target) {
  const fs::path orphan = orphaned_checkpoint(target);
  if (!orphan.empty()) std::rename(orphan.c_str(), target.c_str());
  int removed = 0;
  for (const Leftover& l : dead_leftovers(target)) {
    std::error_code ec;
    if (fs::remove_all(l.path, ec) > 0 && !ec) ++removed;
  }
  return removed;
}

// Removes a temporary directory unless released (exceptions during save).
struct DirGuard {
  fs::path path;
  bool armed = true;
  ~DirGuard() {
    if (!armed) return;
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

// ---- config <-> manifest ----------------------------------------------------

void write_config(schemas::ModelConfigMsg::Builder b, const ModelConfig& c) {
  b.setVocabSize(c.vocab_size);
  b.setDModel(c.d_model);
  b.setNLayers(c.n_layers);
  b.setNHeads(c.n_heads);
  b.setSeqLen(c.seq_len);
  b.setFfn(ffn_name(c.ffn));
  b.setDenseHidden(c.dense_hidden);
  b.setNExperts(c.n_experts);
  b.setTopK(c.top_k);
  b.setExpertHidden(c.expert_hidden);
  b.setSharedExperts(c.shared_experts);
  b.setBalance(moe::balance_name(c.balance));
  b.setAuxLossAlpha(c.aux_loss_alpha);
  b.setBiasUpdateRate(c.bias_update_rate);
  b.setCapacityFactor(c.capacity_factor);
  b.setTieEmbeddings(c.tie_embeddings);
  b.setRopeTheta(c.rope_theta);
  b.setNormEps(c.norm_eps);
  b.setInitStd(c.init_std);
  b.setTokenizerKind(c.tokenizer_kind);
  b.setTokenizerModel(capnp::Data::Reader(reinterpret_cast<const kj::byte*>(c.tokenizer_model.data()),
                                          c.tokenizer_model.size()));
}

ModelConfig read_config(const std::filesystem::path& path, schemas::ModelConfigMsg::Reader r) {
  ModelConfig c;
  c.vocab_size = r.getVocabSize();
  c.d_model = r.getDModel();
  c.n_layers = r.getNLayers();
  c.n_heads = r.getNHeads();
  c.seq_len = r.getSeqLen();
  const std::string ffn = r.getFfn();
  try {
    c.ffn = parse_ffn(ffn);
  } catch (const std::invalid_argument& e) {
    fail(path, std::string("manifest: ") + e.what());
  }
  c.dense_hidden = r.getDenseHidden();
  c.n_experts = r.getNExperts();
  c.top_k = r.getTopK();
  c.expert_hidden = r.getExpertHidden();
  c.shared_experts = r.getSharedExperts();
  const std::string balance = r.getBalance();
  try {
    c.balance = moe::parse_balance(balance);
  } catch (const std::invalid_argument& e) {
    fail(path, std::string("manifest: ") + e.what());
  }
  c.aux_loss_alpha = r.getAuxLossAlpha();
  c.bias_update_rate = r.getBiasUpdateRate();
  c.capacity_factor = r.getCapacityFactor();
  c.tokenizer_kind = r.getTokenizerKind();
  const auto tm = r.getTokenizerModel();
  c.tokenizer_model.assign(reinterpret_cast<const char*>(tm.begin()), tm.size());
  c.tie_embeddings = r.getTieEmbeddings();
  c.rope_theta = r.getRopeTheta();
  c.norm_eps = r.getNormEps();
  c.init_std = r.getInitStd();
  return c;
}

// The manifest as plain C++ values, copied out of the Cap'n Proto reader.
struct ManifestFile {
  int role = 0;  // index into kFileNames
  std::string name;
  int64_t numel = 0;
  uint64_t compressed_bytes = 0, file_hash = 0;
  std::vector<uint64_t> tensor_hashes;
};

struct Manifest {
  uint32_t version = 0;
  ModelConfig config;
  uint64_t seed = 0;
  int64_t step = 0, data_cursor = 0, param_count = 0;
  std::string rng_state;
  std::vector<ParamEntry> tensors;
  std::vector<ManifestFile> files;
};

std::string shape_text(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(s[i]);
  }
  return out + "]";
}

Manifest read_manifest(const fs::path& path) {
  // 64 MiB: a manifest is ~100 bytes per tensor.
  const std::string bytes = read_file(path, "missing (not a checkpoint directory?)", uint64_t{64} << 20,
                                      "a checkpoint manifest is at most");
  if (bytes.size() < 16 + 8 || bytes.size() % 8 != 0)
    fail(path, "truncated or not a checkpoint manifest (" + std::to_string(bytes.size()) + " bytes)");
  const size_t body = bytes.size() - 16;
  if (std::memcmp(bytes.data() + body, kMagic, 8) != 0)
    fail(path, "not a troupe checkpoint manifest (bad trailer magic)");
  uint64_t stored_hash = 0;
  std::memcpy(&stored_hash, bytes.data() + body + 8, 8);
  if (checkpoint_hash(bytes.data(), body) != stored_hash)
    fail(path, "manifest checksum mismatch (the file is corrupted)");

  kj::Array<capnp::word> words = kj::heapArray<capnp::word>(body / 8);
  std::memcpy(words.begin(), bytes.data(), body);
  capnp::ReaderOptions options;
  options.traversalLimitInWords = body / 8 * 4 + 1024;
  options.nestingLimit = 16;
  Manifest m;
  try {
    capnp::FlatArrayMessageReader reader(words.asPtr(), options);
    if (reader.getEnd() != words.end()) fail(path, "manifest unreadable: trailing bytes after the message");
    auto root = reader.getRoot<schemas::CheckpointManifest>();
    m.version = root.getFormatVersion();
    if (m.version != kFormatVersion)
      fail(path, "format version " + std::to_string(m.version) + " is not supported (this build reads " +
                     std::to_string(kFormatVersion) + ")");
    m.config = read_config(path, root.getConfig());
    m.seed = root.getSeed();
    m.step = root.getStep();
    m.data_cursor = root.getDataCursor();
    m.param_count = root.getParamCount();
    auto rng = root.getRngState();
    m.rng_state.assign(reinterpret_cast<const char*>(rng.begin()), rng.size());
    for (auto t : root.getTensors()) {
      ParamEntry e;
      e.name = t.getName();
      for (int64_t d : t.getShape()) e.shape.push_back(d);
      e.offset = t.getOffset();
      e.numel = t.getNumel();
      e.trainable = t.getTrainable();
      e.decay = t.getDecay();
      m.tensors.push_back(std::move(e));
    }
    for (auto f : root.getFiles()) {
      ManifestFile mf;
      mf.role = static_cast<int>(f.getRole());
      mf.name = f.getFileName();
      mf.numel = f.getNumel();
      mf.compressed_bytes = f.getCompressedBytes();
      mf.file_hash = f.getFileHash();
      for (uint64_t h : f.getTensorHashes()) mf.tensor_hashes.push_back(h);
      m.files.push_back(std::move(mf));
    }
  } catch (const kj::Exception& e) {
    fail(path, "manifest unreadable: " + std::string(e.getDescription().cStr()));
  }
  return m;
}

// Structural checks of a manifest read from disk (it is untrusted).
void validate_manifest(const Manifest& m, const fs::path& path) {
  if (m.param_count < 0 || m.param_count > kMaxElements)
    fail(path, "paramCount " + std::to_string(m.param_count) + " is out of range");
  std::set<std::string> names;
  int64_t running = 0;
  for (const ParamEntry& e : m.tensors) {
    if (e.name.empty()) fail(path, "a tensor has an empty name");
    if (!names.insert(e.name).second) fail(path, "tensor '" + e.name + "' is listed twice");
    int64_t numel = 1;
    for (int64_t d : e.shape) {
      if (d < 0 || d > kMaxElements || (d > 0 && numel > kMaxElements / d))
        fail(path, "tensor '" + e.name + "' has a bad shape " + shape_text(e.shape));
      numel *= d;
    }
    if (numel != e.numel)
      fail(path, "tensor '" + e.name + "' has numel " + std::to_string(e.numel) + " but shape " +
                     shape_text(e.shape));
    if (e.offset != running)
      fail(path, "tensor '" + e.name + "' is at offset " + std::to_string(e.offset) + ", expected " +
                     std::to_string(running) + " (tensors must tile the buffer in order)");
    running += numel;
    if (running > kMaxElements) fail(path, "tensor table is too large");
  }
  if (running != m.param_count)
    fail(path, "tensor table covers " + std::to_string(running) + " elements, paramCount says " +
                   std::to_string(m.param_count));
  bool seen[3] = {false, false, false};
  for (const ManifestFile& f : m.files) {
    if (f.role < 0 || f.role > 2) fail(path, "file '" + f.name + "' has an unknown role");
    if (seen[f.role]) fail(path, "two files hold " + std::string(kFileNames[f.role]));
    seen[f.role] = true;
    // Names are fixed per role: nothing in a manifest can point outside the directory.
    if (f.name != kFileNames[f.role])
      fail(path, "file '" + f.name + "' should be named '" + kFileNames[f.role] + "'");
    if (f.numel != m.param_count)
      fail(path, "file '" + f.name + "' holds " + std::to_string(f.numel) + " elements, paramCount says " +
                     std::to_string(m.param_count));
    if (f.tensor_hashes.size() != m.tensors.size())
      fail(path, "file '" + f.name + "' has " + std::to_string(f.tensor_hashes.size()) +
                     " tensor hashes for " + std::to_string(m.tensors.size()) + " tensors");
  }
  if (!seen[0]) fail(path, "no params file listed");
  if (seen[1] != seen[2]) fail(path, "adam_m and adam_v must be saved together");
}

void check_layout(const Manifest& m, const ParamLayout& expected, const fs::path& path) {
  const std::string pre = "layout mismatch with the config: ";
  const auto& want = expected.entries();
  if (m.tensors.size() != want.size())
    fail(path, pre + "the checkpoint has " + std::to_string(m.tensors.size()) +
                   " tensors, the config's layout has " + std::to_string(want.size()));
  for (size_t i = 0; i < want.size(); ++i) {
    const ParamEntry& a = m.tensors[i];
    const ParamEntry& b = want[i];
    if (a.name != b.name)
      fail(path, pre + "tensor #" + std::to_string(i) + " is '" + a.name + "' in the checkpoint, '" + b.name +
                     "' in the config's layout");
    if (a.shape != b.shape)
      fail(path, pre + "tensor '" + a.name + "' has shape " + shape_text(a.shape) + " in the checkpoint, " +
                     shape_text(b.shape) + " in the config's layout");
    if (a.offset != b.offset || a.numel != b.numel)
      fail(path, pre + "tensor '" + a.name + "' is at a different offset in the config's layout");
    if (a.trainable != b.trainable || a.decay != b.decay)
      fail(path, pre + "tensor '" + a.name + "' has different trainable/decay flags");
  }
  if (m.param_count != expected.total())
    fail(path, pre + "the checkpoint holds " + std::to_string(m.param_count) + " parameters, the layout " +
                   std::to_string(expected.total()));
}

// Reads one tensor file and verifies size, zstd frame, per-tensor and file hashes.
std::vector<float> read_tensor_file(const fs::path& dir, const ManifestFile& f, const Manifest& m) {
  const fs::path path = dir / f.name;
  // The manifest (hash-checked) says how long the file is: anything longer is
  // refused before it is read.
  const std::string data = read_file(path, "missing (the manifest lists it)", f.compressed_bytes,
                                     "the manifest says it has");
  if (data.size() < f.compressed_bytes)
    fail(path, "truncated: " + std::to_string(data.size()) + " bytes on disk, the manifest says " +
                   std::to_string(f.compressed_bytes));
  if (data.size() > f.compressed_bytes)
    fail(path, "has " + std::to_string(data.size()) + " bytes, the manifest says " +
                   std::to_string(f.compressed_bytes) + " (trailing data)");
  const size_t raw_bytes = static_cast<size_t>(f.numel) * sizeof(float);
  const size_t frame = ZSTD_findFrameCompressedSize(data.data(), data.size());
  if (ZSTD_isError(frame)) fail(path, std::string("bad zstd frame: ") + ZSTD_getErrorName(frame));
  if (frame != data.size()) fail(path, "bad zstd frame: data after the first frame");
  const unsigned long long content = ZSTD_getFrameContentSize(data.data(), data.size());
  if (content == ZSTD_CONTENTSIZE_ERROR || content == ZSTD_CONTENTSIZE_UNKNOWN)
    fail(path, "bad zstd frame: no valid content size");
  if (content != raw_bytes)
    fail(path, "bad zstd frame: it holds " + std::to_string(content) + " bytes, the manifest says " +
                   std::to_string(raw_bytes));
  std::vector<float> out(static_cast<size_t>(f.numel));
  const size_t got = ZSTD_decompress(out.data(), raw_bytes, data.data(), data.size());
  if (ZSTD_isError(got)) fail(path, std::string("bad zstd frame: ") + ZSTD_getErrorName(got));
  if (got != raw_bytes) fail(path, "bad zstd frame: decompressed to " + std::to_string(got) + " bytes");
  for (size_t i = 0; i < m.tensors.size(); ++i) {
    const ParamEntry& e = m.tensors[i];
    const uint64_t h = checkpoint_hash(out.data() + e.offset, static_cast<size_t>(e.numel) * sizeof(float));
    if (h != f.tensor_hashes[i]) fail(path, "checksum mismatch for tensor '" + e.name + "'");
  }
  if (checkpoint_hash(data.data(), data.size()) != f.file_hash) fail(path, "file checksum mismatch");
  return out;
}

TrainingState load_impl(const std::string& dir, const ParamLayout* expected) {
  fs::path target = normalize(dir);
  std::error_code ec;
  if (const fs::path orphan = orphaned_checkpoint(target); !orphan.empty()) target = orphan;
  if (!fs::exists(target, ec)) fail(target, "checkpoint directory does not exist");
  if (!fs::is_directory(target, ec)) fail(target, "is not a directory");
  const fs::path mpath = target / kManifestName;
  const Manifest m = read_manifest(mpath);
  validate_manifest(m, mpath);
  if (expected) {
    check_layout(m, *expected, mpath);
  } else {
    ParamLayout built;
    try {
      built = build_param_layout(m.config);
    } catch (const std::exception& e) {
      fail(mpath, std::string("the model config in the manifest is invalid: ") + e.what());
    }
    check_layout(m, built, mpath);
  }
  // Everything goes into locals; the caller sees a state only if all passed.
  TrainingState s;
  s.config = m.config;
  s.seed = m.seed;
  s.step = m.step;
  s.data_cursor = m.data_cursor;
  s.rng_state = m.rng_state;
  for (const ManifestFile& f : m.files) {
    std::vector<float> buf = read_tensor_file(target, f, m);
    (f.role == 0 ? s.params : f.role == 1 ? s.adam_m : s.adam_v) = std::move(buf);
  }
  return s;
}

}  // namespace

CheckpointError::CheckpointError(const std::string& file, const std::string& problem)
    : std::runtime_error("checkpoint: " + file + ": " + problem), file_(file) {}

uint64_t checkpoint_hash(const void* data, size_t bytes, uint64_t seed) {
  constexpr uint64_t P1 = 0x9e3779b185ebca87ull, P2 = 0xc2b2ae3d27d4eb4full;
  constexpr uint64_t P3 = 0x165667b19e3779f9ull, P4 = 0x85ebca77c2b2ae63ull;
  auto rotl = [](uint64_t x, int r) { return (x << r) | (x >> (64 - r)); };
  auto avalanche = [](uint64_t x) {
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  };
  auto load = [](const unsigned char* p) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    return v;
  };
  const auto* p = static_cast<const unsigned char*>(data);
  // Four independent lanes so the multiplies pipeline (~several GB/s).
  uint64_t lane[4] = {seed + P1, seed + P2, seed ^ P3, seed - P4};
  size_t i = 0;
  for (; i + 32 <= bytes; i += 32)
    for (int k = 0; k < 4; ++k) lane[k] = rotl(lane[k] + load(p + i + 8 * k) * P2, 31) * P1;
  uint64_t h = static_cast<uint64_t>(bytes) * P4 + seed;
  for (int k = 0; k < 4; ++k) h = rotl(h ^ avalanche(lane[k]), 27) * P1 + P3;
  for (; i + 8 <= bytes; i += 8) h = rotl(h ^ avalanche(load(p + i)), 27) * P1 + P4;
  if (i < bytes) {
    uint64_t tail = 0;
    std::memcpy(&tail, p + i, bytes - i);
    h = rotl(h ^ avalanche(tail ^ (static_cast<uint64_t>(bytes - i) << 56)), 27) * P1 + P4;
  }
  return avalanche(h);
}

int clean_checkpoint_leftovers(const std::string& dir) {
  try {
    return recover_and_clean(normalize(dir));
  } catch (const CheckpointError&) {
    return 0;  // not a usable name: nothing of ours can be beside it
  }
}

bool checkpoint_exists(const std::string& dir) {
  std::error_code ec;
  return !dir.empty() && fs::is_regular_file(fs::path(dir) / kManifestName, ec);
}

void save_checkpoint(const std::string& dir, const TrainingState& state, const ParamLayout& layout) {
  const UninterruptedWrite whole;  // a second Ctrl-C ends the process after the save, not inside it
  const fs::path target = normalize(dir);
  const int64_t total = layout.total();
  if (static_cast<int64_t>(state.params.size()) != total)
    fail(target, "cannot save: params has " + std::to_string(state.params.size()) +
                     " floats, the layout needs " + std::to_string(total));
  const bool with_adam = !state.adam_m.empty() || !state.adam_v.empty();
  if (with_adam && (static_cast<int64_t>(state.adam_m.size()) != total ||
                    static_cast<int64_t>(state.adam_v.size()) != total))
    fail(target, "cannot save: adam_m/adam_v must both be empty or both hold " + std::to_string(total) +
                     " floats");
  for (const ParamEntry& e : layout.entries())
    if (e.offset < 0 || e.numel < 0 || e.offset + e.numel > total)
      fail(target, "cannot save: layout entry '" + e.name + "' lies outside the buffer");

  std::error_code ec;
  if (fs::exists(target, ec)) {
    if (!fs::is_directory(target, ec)) fail(target, "exists and is not a directory");
    if (!checkpoint_exists(target.string()) && !fs::is_empty(target, ec))
      fail(target, "refusing to replace a non-empty directory that is not a checkpoint (no " +
                       std::string(kManifestName) + ")");
  }
  const fs::path parent = target.parent_path().empty() ? fs::path(".") : target.parent_path();
  fs::create_directories(parent, ec);
  if (ec) fail(parent, "cannot create directory: " + ec.message());
  recover_and_clean(target);

  static std::atomic<uint64_t> counter{0};
  const std::string suffix = std::to_string(::getpid()) + "-" + std::to_string(counter++);
  DirGuard tmp{parent / (target.filename().string() + ".tmp-" + suffix)};
  fs::remove_all(tmp.path, ec);
  if (!fs::create_directory(tmp.path, ec)) fail(tmp.path, "cannot create directory: " + ec.message());

  capnp::MallocMessageBuilder message;
  auto root = message.initRoot<schemas::CheckpointManifest>();
  root.setFormatVersion(kFormatVersion);
  write_config(root.initConfig(), state.config);
  root.setSeed(state.seed);
  root.setStep(state.step);
  root.setDataCursor(state.data_cursor);
  root.setRngState(capnp::Data::Reader(reinterpret_cast<const kj::byte*>(state.rng_state.data()),
                                       state.rng_state.size()));
  root.setParamCount(total);
  const auto& entries = layout.entries();
  auto tensors = root.initTensors(static_cast<unsigned>(entries.size()));
  for (size_t i = 0; i < entries.size(); ++i) {
    auto t = tensors[static_cast<unsigned>(i)];
    t.setName(entries[i].name);
    auto shape = t.initShape(static_cast<unsigned>(entries[i].shape.size()));
    for (size_t d = 0; d < entries[i].shape.size(); ++d) shape.set(static_cast<unsigned>(d), entries[i].shape[d]);
    t.setOffset(entries[i].offset);
    t.setNumel(entries[i].numel);
    t.setTrainable(entries[i].trainable);
    t.setDecay(entries[i].decay);
  }
  const std::vector<float>* buffers[3] = {&state.params, &state.adam_m, &state.adam_v};
  const schemas::TensorRole roles[3] = {schemas::TensorRole::PARAMS, schemas::TensorRole::ADAM_M,
                                        schemas::TensorRole::ADAM_V};
  const int n_files = with_adam ? 3 : 1;
  auto files = root.initFiles(static_cast<unsigned>(n_files));
  std::vector<char> compressed;
  for (int r = 0; r < n_files; ++r) {
    const std::vector<float>& buf = *buffers[r];
    const fs::path path = tmp.path / kFileNames[r];
    const size_t raw = buf.size() * sizeof(float);
    compressed.resize(ZSTD_compressBound(raw));
    const size_t n = ZSTD_compress(compressed.data(), compressed.size(), buf.data(), raw, kZstdLevel);
    if (ZSTD_isError(n)) fail(path, std::string("zstd compression failed: ") + ZSTD_getErrorName(n));
    write_file_durable(path, compressed.data(), n);
    auto f = files[static_cast<unsigned>(r)];
    f.setRole(roles[r]);
    f.setFileName(kFileNames[r]);
    f.setNumel(total);
    f.setCompressedBytes(n);
    f.setFileHash(checkpoint_hash(compressed.data(), n));
    auto hashes = f.initTensorHashes(static_cast<unsigned>(entries.size()));
    for (size_t i = 0; i < entries.size(); ++i)
      hashes.set(static_cast<unsigned>(i), checkpoint_hash(buf.data() + entries[i].offset,
                                                           static_cast<size_t>(entries[i].numel) * sizeof(float)));
  }
  // The manifest goes last: a directory with a manifest has all its files.
  const kj::Array<capnp::word> words = capnp::messageToFlatArray(message);
  const kj::ArrayPtr<const kj::byte> body = words.asBytes();
  std::string manifest(reinterpret_cast<const char*>(body.begin()), body.size());
  const uint64_t h = checkpoint_hash(manifest.data(), manifest.size());
  manifest.append(kMagic, 8);
  manifest.append(reinterpret_cast<const char*>(&h), 8);
  write_file_durable(tmp.path / kManifestName, manifest.data(), manifest.size());
  fsync_dir(tmp.path);

  // Swap into place. After an exchange, tmp holds the old checkpoint.
  // TROUPE_CHECKPOINT_NO_EXCHANGE forces the fallback (tests; filesystems
  // where RENAME_EXCHANGE misbehaves).
  const bool use_exchange = std::getenv("TROUPE_CHECKPOINT_NO_EXCHANGE") == nullptr;
  if (!fs::exists(target, ec)) {
    if (std::rename(tmp.path.c_str(), target.c_str()) != 0)
      fail(target, "cannot rename the new checkpoint into place: " + errno_text());
    tmp.armed = false;
  } else if (!use_exchange ||
             ::renameat2(AT_FDCWD, tmp.path.c_str(), AT_FDCWD, target.c_str(), RENAME_EXCHANGE) != 0) {
    if (use_exchange && errno != EINVAL && errno != ENOSYS && errno != ENOTSUP)
      fail(target, "cannot swap the new checkpoint into place: " + errno_text());
    // No RENAME_EXCHANGE here: move the old one away, the new one in, then
    // drop the old. A crash between the renames leaves only <dir>.old-*:
    // loads read it and the next save renames it back (orphaned_checkpoint).
    DirGuard old{parent / (target.filename().string() + ".old-" + suffix), false};
    if (std::rename(target.c_str(), old.path.c_str()) != 0)
      fail(target, "cannot move the old checkpoint away: " + errno_text());
    if (std::rename(tmp.path.c_str(), target.c_str()) != 0) {
      const std::string err = errno_text();
      std::rename(old.path.c_str(), target.c_str());  // put the old one back
      fail(target, "cannot rename the new checkpoint into place: " + err);
    }
    tmp.armed = false;
    old.armed = true;
  }
  fsync_dir(parent);
}

TrainingState load_checkpoint(const std::string& dir, const ParamLayout& expected) {
  return load_impl(dir, &expected);
}

TrainingState load_checkpoint(const std::string& dir) { return load_impl(dir, nullptr); }

std::string config_difference(const ModelConfig& a, const ModelConfig& b) {
  std::ostringstream os;
  os.precision(17);
  auto cmp = [&](const char* name, const auto& x, const auto& y) {
    if (os.tellp() == 0 && !(x == y)) os << name << ": " << x << " vs " << y;
  };
  cmp("vocab_size", a.vocab_size, b.vocab_size);
  cmp("d_model", a.d_model, b.d_model);
  cmp("n_layers", a.n_layers, b.n_layers);
  cmp("n_heads", a.n_heads, b.n_heads);
  cmp("seq_len", a.seq_len, b.seq_len);
  cmp("ffn", std::string(ffn_name(a.ffn)), std::string(ffn_name(b.ffn)));
  cmp("dense_hidden", a.dense_hidden, b.dense_hidden);
  cmp("n_experts", a.n_experts, b.n_experts);
  cmp("top_k", a.top_k, b.top_k);
  cmp("expert_hidden", a.expert_hidden, b.expert_hidden);
  cmp("shared_experts", a.shared_experts, b.shared_experts);
  cmp("balance", std::string(moe::balance_name(a.balance)), std::string(moe::balance_name(b.balance)));
  cmp("aux_loss_alpha", a.aux_loss_alpha, b.aux_loss_alpha);
  cmp("bias_update_rate", a.bias_update_rate, b.bias_update_rate);
  cmp("capacity_factor", a.capacity_factor, b.capacity_factor);
  cmp("tie_embeddings", a.tie_embeddings, b.tie_embeddings);
  cmp("rope_theta", a.rope_theta, b.rope_theta);
  cmp("norm_eps", a.norm_eps, b.norm_eps);
  cmp("init_std", a.init_std, b.init_std);
  // The tokenizer, by kind and identity (the hash of its model file).
  const auto tokenizer = [](const ModelConfig& c) {
    if (c.tokenizer_kind.empty()) return std::string("the built-in task's own");
    if (c.tokenizer_kind != "sentencepiece") return c.tokenizer_kind;
    return "sentencepiece " + tokenizer_hash_hex(tokenizer_hash(c.tokenizer_model));
  };
  cmp("tokenizer", tokenizer(a), tokenizer(b));
  return os.str();
}

}  // namespace troupe::model
