// A user's data as JSONL: one JSON object per line, read strictly. Every
// problem is an error naming file:line and what was expected (malformed JSON,
// a missing field, a wrong type, invalid UTF-8, a line over kMaxJsonlLineBytes,
// a file with no record); a UTF-8 BOM, CRLF line ends and blank lines are
// accepted. The held-out split is a hash of each line's text, so it never
// depends on where the line stands in the file.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

namespace troupe::model {

// what(): "<file>:<line>: <problem>" (line 0: the file as a whole).
class JsonlError : public std::runtime_error {
 public:
  JsonlError(const std::string& file, int64_t line, const std::string& problem);
};

inline constexpr int64_t kMaxJsonlLineBytes = int64_t{1} << 20;  // 1 MiB: a prompt far beyond any seq_len

struct JsonlRecord {
  int64_t line = 0;         // 1-based line in its file
  std::string first;        // the prompt
  std::string second;       // the completion (SFT) or the answer (RL)
  std::string meta_json;    // the "meta" value as JSON text ("null" when absent)
  uint64_t line_hash = 0;   // of the line's text (CR and BOM removed): the split's key
};

// Reads every record of `path`: each line an object with string fields
// `first` and `second` (and, with `meta`, an optional "meta" of any type).
// Throws JsonlError.
std::vector<JsonlRecord> read_jsonl(const std::string& path, const std::string& first, const std::string& second,
                                    bool meta);

// True when a record belongs to the held-out share `fraction` (in [0, 1)):
// a fixed function of its line's hash.
bool jsonl_held_out(const JsonlRecord& r, double fraction);

// A permutation of [0, n) that changes with `key` (seed and epoch): entry i of
// it, in O(1) and a pure function of (key, n, i) (a Feistel network over the
// next power of two, cycle-walking back into [0, n)).
int64_t jsonl_permute(uint64_t key, int64_t n, int64_t i);

// The record training index `index` (0, 1, ...) takes from n training
// records: epoch index / n visits every record once, in the permutation of
// (seed, salt, epoch). A pure function of its arguments; `salt` keeps SFT rows
// and RL prompts of one seed in different orders.
int64_t jsonl_training_record(uint64_t seed, uint64_t salt, int64_t n, int64_t index);

}  // namespace troupe::model
