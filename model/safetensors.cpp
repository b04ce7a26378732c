// safetensors writer and strict reader. The reader treats the file as
// untrusted: a tiny JSON parser for exactly the subset safetensors headers use
// (objects, arrays, strings, non-negative integers), UTF-8 validation, size
// limits, and offset checks, all before any tensor data is copied.
#include "model/safetensors.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

namespace troupe::model {

static_assert(std::endian::native == std::endian::little, "safetensors data is little endian");

namespace {

constexpr uint64_t kMaxHeader = 100'000'000;  // the reference implementation's limit
constexpr int kMaxDepth = 8;

// ---- strict JSON subset -------------------------------------------------------

struct Json {
  enum Kind { kObject, kArray, kString, kInteger } kind = kObject;
  std::string str;                                  // kString
  uint64_t num = 0;                                 // kInteger
  std::vector<std::pair<std::string, Json>> members;  // kObject, in file order
  std::vector<Json> items;                          // kArray
};

class JsonParser {
 public:
  JsonParser(const std::string& text, const std::string& file) : s_(text), file_(file) {}

  Json parse_document() {
    Json v = value(0);
    skip_ws();
    if (i_ != s_.size()) error("unexpected characters after the header object");
    return v;
  }

 private:
  [[noreturn]] void error(const std::string& what) const {
    throw SafetensorsError("safetensors: " + file_ + ": bad header JSON at byte " + std::to_string(i_) + ": " +
                           what);
  }
  void skip_ws() {
    while (i_ < s_.size() && (s_[i_] == ' ' || s_[i_] == '\t' || s_[i_] == '\n' || s_[i_] == '\r')) ++i_;
  }
  char peek() {
    skip_ws();
    if (i_ >= s_.size()) error("unexpected end of header");
    return s_[i_];
  }
  void expect(char c) {
    if (peek() != c) error(std::string("expected '") + c + "'");
    ++i_;
  }

  Json value(int depth) {
    if (depth > kMaxDepth) error("nesting too deep");
    const char c = peek();
    if (c == '{') return object(depth);
    if (c == '[') return array(depth);
    if (c == '"') {
      Json v;
      v.kind = Json::kString;
      v.str = string();
      return v;
    }
    if (c >= '0' && c <= '9') return integer();
    if (c == '-') error("negative numbers are not allowed in a safetensors header");
    error("unsupported JSON value (expected object, array, string or integer)");
  }

  Json object(int depth) {
    Json v;
    v.kind = Json::kObject;
    expect('{');
    std::set<std::string> keys;
    if (peek() == '}') {
      ++i_;
      return v;
    }
    for (;;) {
      if (peek() != '"') error("expected a string key");
      std::string key = string();
      if (!keys.insert(key).second) error("duplicate key \"" + key + "\"");
      expect(':');
      v.members.emplace_back(std::move(key), value(depth + 1));
      if (peek() == ',') {
        ++i_;
        continue;
      }
      expect('}');
      return v;
    }
  }

  Json array(int depth) {
    Json v;
    v.kind = Json::kArray;
    expect('[');
    if (peek() == ']') {
      ++i_;
      return v;
    }
    for (;;) {
      v.items.push_back(value(depth + 1));
      if (peek() == ',') {
        ++i_;
        continue;
      }
      expect(']');
      return v;
    }
  }

  Json integer() {
    Json v;
    v.kind = Json::kInteger;
    const size_t start = i_;
    while (i_ < s_.size() && s_[i_] >= '0' && s_[i_] <= '9') {
      const uint64_t d = static_cast<uint64_t>(s_[i_] - '0');
      if (v.num > (UINT64_MAX - d) / 10) error("integer too large");
      v.num = v.num * 10 + d;
      ++i_;
    }
    if (i_ - start > 1 && s_[start] == '0') error("integer with a leading zero");
    if (i_ < s_.size() && (s_[i_] == '.' || s_[i_] == 'e' || s_[i_] == 'E')) error("expected an integer");
    return v;
  }

  unsigned hex4() {
    if (i_ + 4 > s_.size()) error("truncated \\u escape");
    unsigned v = 0;
    for (int k = 0; k < 4; ++k) {
      const char c = s_[i_++];
      v <<= 4;
      if (c >= '0' && c <= '9') v |= static_cast<unsigned>(c - '0');
      else if (c >= 'a' && c <= 'f') v |= static_cast<unsigned>(c - 'a' + 10);
      else if (c >= 'A' && c <= 'F') v |= static_cast<unsigned>(c - 'A' + 10);
      else error("bad \\u escape");
    }
    return v;
  }

  static void put_utf8(std::string& out, unsigned cp) {
    if (cp < 0x80) {
      out.push_back(static_cast<char>(cp));
    } else if (cp < 0x800) {
      out.push_back(static_cast<char>(0xc0 | (cp >> 6)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else if (cp < 0x10000) {
      out.push_back(static_cast<char>(0xe0 | (cp >> 12)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    } else {
      out.push_back(static_cast<char>(0xf0 | (cp >> 18)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3f)));
      out.push_back(static_cast<char>(0x80 | (cp & 0x3f)));
    }
  }

  std::string string() {
    expect('"');
    std::string out;
    for (;;) {
      if (i_ >= s_.size()) error("unterminated string");
      const char c = s_[i_++];
      if (c == '"') return out;
      if (static_cast<unsigned char>(c) < 0x20) error("control character in a string");
      if (c != '\\') {
        out.push_back(c);
        continue;
      }
      if (i_ >= s_.size()) error("unterminated escape");
      switch (s_[i_++]) {
        case '"': out.push_back('"'); break;
        case '\\': out.push_back('\\'); break;
        case '/': out.push_back('/'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'u': {
          unsigned cp = hex4();
          if (cp >= 0xd800 && cp < 0xdc00) {  // high surrogate: a low one must follow
            if (i_ + 2 > s_.size() || s_[i_] != '\\' || s_[i_ + 1] != 'u') error("unpaired surrogate");
            i_ += 2;
            const unsigned lo = hex4();
            if (lo < 0xdc00 || lo >= 0xe000) error("unpaired surrogate");
            cp = 0x10000 + ((cp - 0xd800) << 10) + (lo - 0xdc00);
          } else if (cp >= 0xdc00 && cp < 0xe000) {
            error("unpaired surrogate");
          }
          put_utf8(out, cp);
          break;
        }
        default: error("bad escape");
      }
    }
  }

  const std::string& s_;
  const std::string& file_;
  size_t i_ = 0;
};

// Strict UTF-8 check (no overlongs, no surrogates, <= U+10FFFF).
bool valid_utf8(const std::string& s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    int n = 0;
    unsigned cp = 0;
    if (c < 0x80) { ++i; continue; }
    if ((c & 0xe0) == 0xc0) { n = 1; cp = c & 0x1f; }
    else if ((c & 0xf0) == 0xe0) { n = 2; cp = c & 0x0f; }
    else if ((c & 0xf8) == 0xf0) { n = 3; cp = c & 0x07; }
    else return false;
    if (i + static_cast<size_t>(n) >= s.size()) return false;  // truncated sequence
    for (int k = 1; k <= n; ++k) {
      const auto cc = static_cast<unsigned char>(s[i + static_cast<size_t>(k)]);
      if ((cc & 0xc0) != 0x80) return false;
      cp = (cp << 6) | (cc & 0x3f);
    }
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10ffff ||
        (cp >= 0xd800 && cp < 0xe000))
      return false;
    i += static_cast<size_t>(n) + 1;
  }
  return true;
}

void json_string(std::ostringstream& os, const std::string& s) {
  os << '"';
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      os << '\\' << c;
    } else if (static_cast<unsigned char>(c) < 0x20) {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\u%04x", static_cast<unsigned>(c));
      os << buf;
    } else {
      os << c;
    }
  }
  os << '"';
}

// ---- file helpers ---------------------------------------------------------------

void write_all(int fd, const char* p, size_t n, const std::string& path) {
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0 && errno == EINTR) continue;
    if (w < 0) throw SafetensorsError("safetensors: " + path + ": write failed: " + std::strerror(errno));
    p += w;
    n -= static_cast<size_t>(w);
  }
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i) out += ',';
    out += std::to_string(s[i]);
  }
  return out + "]";
}

struct TensorInfo {
  std::string name;
  std::vector<int64_t> shape;
  uint64_t begin = 0, end = 0;
};

std::vector<int64_t> read_shape(const Json& v, const std::string& fail_prefix) {
  if (v.kind != Json::kArray) throw SafetensorsError(fail_prefix + "\"shape\" must be an array");
  std::vector<int64_t> shape;
  for (const Json& d : v.items) {
    if (d.kind != Json::kInteger || d.num > (uint64_t{1} << 40))
      throw SafetensorsError(fail_prefix + "\"shape\" must hold non-negative integers");
    shape.push_back(static_cast<int64_t>(d.num));
  }
  return shape;
}

}  // namespace

void export_safetensors(const std::string& path, const ParamLayout& layout, const std::vector<float>& params,
                        const std::map<std::string, std::string>& metadata) {
  if (static_cast<int64_t>(params.size()) != layout.total())
    throw SafetensorsError("safetensors: " + path + ": params has " + std::to_string(params.size()) +
                           " floats, the layout needs " + std::to_string(layout.total()));
  std::ostringstream os;
  os << '{';
  bool first = true;
  if (!metadata.empty()) {
    os << "\"__metadata__\":{";
    for (auto it = metadata.begin(); it != metadata.end(); ++it) {
      if (it != metadata.begin()) os << ',';
      json_string(os, it->first);
      os << ':';
      json_string(os, it->second);
    }
    os << '}';
    first = false;
  }
  uint64_t offset = 0;
  for (const ParamEntry& e : layout.entries()) {
    if (e.name == "__metadata__")
      throw SafetensorsError("safetensors: " + path + ": a tensor cannot be named __metadata__");
    if (e.offset < 0 || e.numel < 0 || e.offset + e.numel > layout.total())
      throw SafetensorsError("safetensors: " + path + ": layout entry '" + e.name + "' lies outside the buffer");
    if (!first) os << ',';
    first = false;
    json_string(os, e.name);
    os << ":{\"dtype\":\"F32\",\"shape\":[";
    for (size_t d = 0; d < e.shape.size(); ++d) os << (d ? "," : "") << e.shape[d];
    const uint64_t bytes = static_cast<uint64_t>(e.numel) * sizeof(float);
    os << "],\"data_offsets\":[" << offset << ',' << offset + bytes << "]}";
    offset += bytes;
  }
  os << '}';
  std::string header = std::move(os).str();
  header.append((8 - header.size() % 8) % 8, ' ');  // data starts 8-byte aligned
  const uint64_t n = header.size();

  const std::string tmp = path + ".tmp-" + std::to_string(::getpid());
  const int fd = ::open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw SafetensorsError("safetensors: " + tmp + ": cannot create: " + std::strerror(errno));
  try {
    write_all(fd, reinterpret_cast<const char*>(&n), 8, tmp);
    write_all(fd, header.data(), header.size(), tmp);
    for (const ParamEntry& e : layout.entries())
      write_all(fd, reinterpret_cast<const char*>(params.data() + e.offset),
                static_cast<size_t>(e.numel) * sizeof(float), tmp);
    if (::fsync(fd) != 0) throw SafetensorsError("safetensors: " + tmp + ": fsync failed: " + std::strerror(errno));
  } catch (...) {
    ::close(fd);
    ::unlink(tmp.c_str());
    throw;
  }
  if (::close(fd) != 0 || std::rename(tmp.c_str(), path.c_str()) != 0) {
    const std::string err = std::strerror(errno);
    ::unlink(tmp.c_str());
    throw SafetensorsError("safetensors: " + path + ": cannot write: " + err);
  }
  // Make the rename durable.
  std::filesystem::path parent = std::filesystem::path(path).parent_path();
  if (parent.empty()) parent = ".";
  const int dfd = ::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    ::fsync(dfd);
    ::close(dfd);
  }
}

std::vector<float> import_safetensors(const std::string& path, const ParamLayout& layout,
                                      std::map<std::string, std::string>* metadata) {
  const std::string pre = "safetensors: " + path + ": ";
  std::error_code ec;
  // Checked before opening (a FIFO would block) and reading (a huge file
  // would exhaust memory): a file this import accepts holds only the
  // layout's tensors, as F32, after a header of at most kMaxHeader bytes.
  if (!std::filesystem::exists(path, ec)) throw SafetensorsError(pre + "cannot open file (it does not exist)");
  if (!std::filesystem::is_regular_file(path, ec))
    throw SafetensorsError(pre + "not a regular file (a directory, FIFO, device or socket)");
  const uintmax_t size = std::filesystem::file_size(path, ec);
  const uintmax_t most = 8 + kMaxHeader + static_cast<uintmax_t>(layout.total()) * sizeof(float);
  if (!ec && size > most)
    throw SafetensorsError(pre + std::to_string(size) + " bytes, more than a file of this model's " +
                           std::to_string(layout.total()) + " F32 parameters can be (" + std::to_string(most) + ")");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw SafetensorsError(pre + "cannot open file");
  std::ostringstream buf;
  buf << in.rdbuf();
  const std::string file = std::move(buf).str();
  if (file.size() < 8) throw SafetensorsError(pre + "too short for a header length (" + std::to_string(file.size()) + " bytes)");
  uint64_t n = 0;
  std::memcpy(&n, file.data(), 8);
  if (n > kMaxHeader) throw SafetensorsError(pre + "header length " + std::to_string(n) + " exceeds the 100 MB limit");
  if (n > file.size() - 8)
    throw SafetensorsError(pre + "header length " + std::to_string(n) + " runs past the end of the file (" +
                           std::to_string(file.size()) + " bytes)");
  const std::string header = file.substr(8, n);
  if (header.empty() || header[0] != '{') throw SafetensorsError(pre + "header does not start with '{'");
  if (!valid_utf8(header)) throw SafetensorsError(pre + "header is not valid UTF-8");
  const Json root = JsonParser(header, path).parse_document();
  const uint64_t data_size = file.size() - 8 - n;

  std::vector<TensorInfo> tensors;
  std::map<std::string, std::string> meta;
  for (const auto& [key, v] : root.members) {
    if (key == "__metadata__") {
      if (v.kind != Json::kObject) throw SafetensorsError(pre + "__metadata__ must be an object");
      for (const auto& [mk, mv] : v.members) {
        if (mv.kind != Json::kString)
          throw SafetensorsError(pre + "__metadata__ value for \"" + mk + "\" must be a string");
        meta[mk] = mv.str;
      }
      continue;
    }
    const std::string tp = pre + "tensor '" + key + "': ";
    if (v.kind != Json::kObject) throw SafetensorsError(tp + "entry must be an object");
    const Json *dtype = nullptr, *shape = nullptr, *offsets = nullptr;
    for (const auto& [field, fv] : v.members) {
      if (field == "dtype") dtype = &fv;
      else if (field == "shape") shape = &fv;
      else if (field == "data_offsets") offsets = &fv;
      else throw SafetensorsError(tp + "unknown field \"" + field + "\"");
    }
    if (!dtype || !shape || !offsets) throw SafetensorsError(tp + "needs dtype, shape and data_offsets");
    if (dtype->kind != Json::kString) throw SafetensorsError(tp + "dtype must be a string");
    if (dtype->str != "F32") throw SafetensorsError(tp + "dtype " + dtype->str + " is not supported (only F32)");
    TensorInfo t;
    t.name = key;
    t.shape = read_shape(*shape, tp);
    if (offsets->kind != Json::kArray || offsets->items.size() != 2 ||
        offsets->items[0].kind != Json::kInteger || offsets->items[1].kind != Json::kInteger)
      throw SafetensorsError(tp + "data_offsets must be [begin, end]");
    t.begin = offsets->items[0].num;
    t.end = offsets->items[1].num;
    if (t.begin > t.end || t.end > data_size)
      throw SafetensorsError(tp + "data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) +
                             "] are out of bounds (data area is " + std::to_string(data_size) + " bytes)");
    uint64_t numel = 1;
    for (int64_t d : t.shape) {
      if (d != 0 && numel > (uint64_t{1} << 40) / static_cast<uint64_t>(d))
        throw SafetensorsError(tp + "shape is too large");
      numel *= static_cast<uint64_t>(d);
    }
    if (numel * sizeof(float) != t.end - t.begin)
      throw SafetensorsError(tp + "data_offsets span " + std::to_string(t.end - t.begin) + " bytes, shape needs " +
                             std::to_string(numel * sizeof(float)));
    tensors.push_back(std::move(t));
  }

  // Offsets must tile [0, data_size) exactly.
  std::vector<const TensorInfo*> by_offset;
  for (const TensorInfo& t : tensors) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  uint64_t at = 0;
  for (const TensorInfo* t : by_offset) {
    if (t->begin < at) throw SafetensorsError(pre + "tensor '" + t->name + "' overlaps the previous tensor");
    if (t->begin > at)
      throw SafetensorsError(pre + "gap of " + std::to_string(t->begin - at) + " bytes before tensor '" + t->name + "'");
    at = t->end;
  }
  if (at != data_size)
    throw SafetensorsError(pre + "tensor data ends at byte " + std::to_string(at) + " but the data area is " +
                           std::to_string(data_size) + " bytes");

  // Names and shapes against the layout.
  std::map<std::string, const TensorInfo*> by_name;
  for (const TensorInfo& t : tensors) by_name[t.name] = &t;
  for (const TensorInfo& t : tensors)
    if (!layout.find(t.name)) throw SafetensorsError(pre + "tensor '" + t.name + "' is not in the model's layout");
  std::vector<float> out(static_cast<size_t>(layout.total()), 0.0f);
  const char* data = file.data() + 8 + n;
  for (const ParamEntry& e : layout.entries()) {
    const auto it = by_name.find(e.name);
    if (it == by_name.end()) throw SafetensorsError(pre + "tensor '" + e.name + "' is missing");
    if (it->second->shape != e.shape)
      throw SafetensorsError(pre + "tensor '" + e.name + "' has shape " + shape_text(it->second->shape) +
                             ", the layout needs " + shape_text(e.shape));
    std::memcpy(out.data() + e.offset, data + it->second->begin, static_cast<size_t>(e.numel) * sizeof(float));
    // A NaN or Inf weight would train (or evaluate) to NaN with no word of where it came from.
    for (int64_t i = 0; i < e.numel; ++i)
      if (!std::isfinite(out[static_cast<size_t>(e.offset + i)]))
        throw SafetensorsError(pre + "tensor '" + e.name + "' holds a non-finite value (" +
                               std::to_string(out[static_cast<size_t>(e.offset + i)]) + ") at element " +
                               std::to_string(i));
  }
  if (metadata) *metadata = std::move(meta);
  return out;
}

}  // namespace troupe::model
