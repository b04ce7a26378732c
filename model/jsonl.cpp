// JSONL reading for a user's data (jsonl.hpp): strict, with file:line errors.
#include "model/jsonl.hpp"

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "model/tokenizer.hpp"

namespace troupe::model {

namespace {

// Index of the first byte that is not valid UTF-8, or -1.
int64_t invalid_utf8_at(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t n = 0;
    uint32_t cp = 0;
    if (c < 0x80) { ++i; continue; }
    if ((c & 0xE0) == 0xC0) { n = 1; cp = c & 0x1F; }
    else if ((c & 0xF0) == 0xE0) { n = 2; cp = c & 0x0F; }
    else if ((c & 0xF8) == 0xF0) { n = 3; cp = c & 0x07; }
    else return static_cast<int64_t>(i);
    for (size_t k = 1; k <= n; ++k) {
      if (i + k >= s.size()) return static_cast<int64_t>(i);
      const auto d = static_cast<unsigned char>(s[i + k]);
      if ((d & 0xC0) != 0x80) return static_cast<int64_t>(i);
      cp = (cp << 6) | (d & 0x3F);
    }
    // Overlong forms, surrogates and code points past U+10FFFF are not UTF-8.
    if ((n == 1 && cp < 0x80) || (n == 2 && cp < 0x800) || (n == 3 && cp < 0x10000) || cp > 0x10FFFF ||
        (cp >= 0xD800 && cp <= 0xDFFF))
      return static_cast<int64_t>(i);
    i += n + 1;
  }
  return -1;
}

const char* type_name(const nlohmann::json& v) {
  switch (v.type()) {
    case nlohmann::json::value_t::null: return "null";
    case nlohmann::json::value_t::boolean: return "a boolean";
    case nlohmann::json::value_t::string: return "a string";
    case nlohmann::json::value_t::array: return "an array";
    case nlohmann::json::value_t::object: return "an object";
    default: return "a number";
  }
}

std::string field_names(const nlohmann::json& o) {
  std::string s;
  for (auto it = o.begin(); it != o.end(); ++it) s += (s.empty() ? "" : ", ") + ("\"" + it.key() + "\"");
  return s.empty() ? "none" : s;
}

}  // namespace

JsonlError::JsonlError(const std::string& file, int64_t line, const std::string& problem)
    : std::runtime_error(file + (line > 0 ? ":" + std::to_string(line) : std::string()) + ": " + problem) {}

std::vector<JsonlRecord> read_jsonl(const std::string& path, const std::string& first, const std::string& second,
                                    bool meta) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw JsonlError(path, 0, "cannot open the JSONL file (missing or unreadable)");
  std::vector<JsonlRecord> out;
  std::string line;
  int64_t number = 0;
  // getline into a string that grows: cap a line before holding all of a huge one.
  while (true) {
    line.clear();
    char c;
    bool any = false;
    while (in.get(c)) {
      any = true;
      if (c == '\n') break;
      if (static_cast<int64_t>(line.size()) >= kMaxJsonlLineBytes)
        throw JsonlError(path, number + 1,
                         "line is longer than " + std::to_string(kMaxJsonlLineBytes) +
                             " bytes (1 MiB); one record per line, and no record needs that much");
      line.push_back(c);
    }
    if (!any) break;
    ++number;
    if (number == 1 && line.rfind("\xEF\xBB\xBF", 0) == 0) line.erase(0, 3);  // a UTF-8 BOM
    if (!line.empty() && line.back() == '\r') line.pop_back();                // CRLF
    if (line.find_first_not_of(" \t") == std::string::npos) continue;         // blank lines
    if (const int64_t at = invalid_utf8_at(line); at >= 0)
      throw JsonlError(path, number, "invalid UTF-8 at byte " + std::to_string(at + 1) + " of the line");
    nlohmann::json o;
    try {
      o = nlohmann::json::parse(line);
    } catch (const nlohmann::json::parse_error& e) {
      std::string what = e.what();
      if (const auto p = what.find("parse error"); p != std::string::npos) what = what.substr(p);
      throw JsonlError(path, number, "not valid JSON (" + what + ")");
    }
    if (!o.is_object()) throw JsonlError(path, number, std::string("expected a JSON object, got ") + type_name(o));
    JsonlRecord r;
    r.line = number;
    for (const auto& [name, into] : {std::pair<const std::string&, std::string*>{first, &r.first},
                                     std::pair<const std::string&, std::string*>{second, &r.second}}) {
      const auto it = o.find(name);
      if (it == o.end())
        throw JsonlError(path, number, "no \"" + name + "\" field (the line has " + field_names(o) + ")");
      if (!it->is_string())
        throw JsonlError(path, number, "\"" + name + "\" is " + type_name(*it) + "; expected a string");
      *into = it->get<std::string>();
    }
    r.meta_json = "null";
    if (meta)
      if (const auto it = o.find("meta"); it != o.end()) r.meta_json = it->dump();
    r.line_hash = tokenizer_hash(line);
    out.push_back(std::move(r));
  }
  if (in.bad()) throw JsonlError(path, number, "read error");
  if (out.empty()) throw JsonlError(path, 0, "holds no record (an empty file, or only blank lines)");
  return out;
}

bool jsonl_held_out(const JsonlRecord& r, double fraction) {
  // The top 53 bits of a mixed hash as a uniform number in [0, 1).
  uint64_t x = r.line_hash ^ 0x6a09e667f3bcc909ull;
  x = (x ^ (x >> 33)) * 0xff51afd7ed558ccdull;
  x = (x ^ (x >> 33)) * 0xc4ceb9fe1a85ec53ull;
  x ^= x >> 33;
  return static_cast<double>(x >> 11) * 0x1.0p-53 < fraction;
}

int64_t jsonl_training_record(uint64_t seed, uint64_t salt, int64_t n, int64_t index) {
  const uint64_t epoch = static_cast<uint64_t>(index / n);
  return jsonl_permute(seed * 0x100000001b3ull + epoch + salt, n, index % n);
}

int64_t jsonl_permute(uint64_t key, int64_t n, int64_t i) {
  if (n <= 1) return 0;
  int bits = 1;
  while ((int64_t{1} << bits) < n) ++bits;
  const int lo_bits = bits / 2, hi_bits = bits - lo_bits;
  const uint64_t lo_mask = (uint64_t{1} << lo_bits) - 1, hi_mask = (uint64_t{1} << hi_bits) - 1;
  auto round_fn = [key](uint64_t v, int r) {
    uint64_t x = v + key * 0x9e3779b97f4a7c15ull + static_cast<uint64_t>(r) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
    return x ^ (x >> 31);
  };
  auto v = static_cast<uint64_t>(i);
  do {  // cycle-walk: a bijection on [0, 2^bits) applied until the value lands in [0, n)
    // An unbalanced Feistel network: each round mixes one half into the other.
    uint64_t hi = v >> lo_bits, lo = v & lo_mask;
    for (int r = 0; r < 4; ++r) {
      if (r % 2 == 0) hi = (hi ^ round_fn(lo, r)) & hi_mask;
      else lo = (lo ^ round_fn(hi, r)) & lo_mask;
    }
    v = (hi << lo_bits) | lo;
  } while (v >= static_cast<uint64_t>(n));
  return static_cast<int64_t>(v);
}

}  // namespace troupe::model
