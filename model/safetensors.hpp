// safetensors export/import of the flat parameter buffer, so weights move to
// and from PyTorch / Hugging Face tooling. Format (huggingface/safetensors):
//   8 bytes   N, little-endian uint64: header length
//   N bytes   JSON object: {"__metadata__": {str: str}, "<name>": {"dtype": "F32",
//             "shape": [...], "data_offsets": [begin, end]}, ...}; we pad it
//             with spaces so the data starts 8-byte aligned
//   rest      raw little-endian tensor bytes; offsets are relative to here
// Tensor names are the ParamLayout names. Import parses the header with a
// small strict JSON parser and checks everything before copying data.
#pragma once

#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "model/params.hpp"

namespace troupe::model {

class SafetensorsError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Writes params (the flat buffer, [layout.total()]) as float32 tensors, one per
// layout entry, in layout order, atomically (path.tmp-<pid>, fsync, rename).
// metadata lands in "__metadata__"; {"format": "pt"} is what transformers
// expects. Throws SafetensorsError.
void export_safetensors(const std::string& path, const ParamLayout& layout, const std::vector<float>& params,
                        const std::map<std::string, std::string>& metadata = {{"format", "pt"}});

// Reads a safetensors file into a flat buffer laid out as `layout`. Every
// layout entry must be present as F32 with the same shape, and no other tensor
// may be; the header must be well-formed and the data offsets must tile the
// data area exactly (in bounds, no overlap, no gap) as the reference
// implementation requires. Throws SafetensorsError naming the file and the
// tensor at fault.
std::vector<float> import_safetensors(const std::string& path, const ParamLayout& layout,
                                      std::map<std::string, std::string>* metadata = nullptr);

}  // namespace troupe::model
