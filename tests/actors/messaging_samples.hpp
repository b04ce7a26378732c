// Deterministic sample messages of every Envelope kind, and checkers that
// compare every field of a received message with what the same seed builds.
// Shared by the messaging tests, the two-process test and bench/messaging.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "actors/transport/envelope.hpp"

namespace troupe::testing {

struct SampleSpec {
  uint64_t seed = 1;
  uint32_t rows = 4;       // token rows (tensors are [rows, width])
  uint32_t width = 8;      // values per row
  bool compressible = false;  // draw floats from 16 values so zstd has something to find
};

// Every kind this build knows, in discriminant order.
std::vector<Envelope::Kind> all_kinds();

// Builds a valid envelope of `kind` whose every field is drawn from spec.seed.
Envelope make_sample(Envelope::Kind kind, const SampleSpec& spec);

// Compares every field of `env` with make_sample(kind, spec). Returns the
// mismatches, one per line; empty when everything matches.
std::string check_sample(const Envelope& env, Envelope::Kind kind, const SampleSpec& spec);

// Serializes like CAF does across processes (binary_serializer over the
// inspect overload) and back. deserialize returns the CAF stream error, if any.
std::vector<char> caf_serialize(const Envelope& env);
caf::error caf_deserialize(const std::vector<char>& bytes, Envelope& out);

}  // namespace troupe::testing
