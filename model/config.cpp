// Names of the configuration enums (config.hpp): the spellings specs and
// checkpoint manifests use.
#include "model/config.hpp"

#include <stdexcept>
#include <string>

namespace troupe::model {

const char* ffn_name(Ffn ffn) { return ffn == Ffn::dense ? "dense" : "moe"; }

const char* lr_schedule_name(LrSchedule schedule) {
  return schedule == LrSchedule::cosine ? "cosine" : "constant";
}

const char* data_kind_name(DataKind kind) {
  switch (kind) {
    case DataKind::addition: return "addition";
    case DataKind::addition_plain: return "addition_plain";
    case DataKind::text: return "text";
    case DataKind::scratchpad: return "scratchpad";
    case DataKind::jsonl: return "jsonl";
  }
  return "?";
}

Ffn parse_ffn(std::string_view name) {
  if (name == "dense") return Ffn::dense;
  if (name == "moe") return Ffn::moe;
  throw std::invalid_argument("unknown ffn \"" + std::string(name) + "\" (expected \"dense\" or \"moe\")");
}

DataKind parse_data_kind(std::string_view name) {
  for (DataKind k : {DataKind::addition, DataKind::addition_plain, DataKind::text, DataKind::scratchpad, DataKind::jsonl})
    if (name == data_kind_name(k)) return k;
  throw std::runtime_error("data: unknown source '" + std::string(name) +
                           "' (expected \"text\", \"addition\", \"addition_plain\", \"scratchpad\" or \"jsonl\")");
}

}  // namespace troupe::model
