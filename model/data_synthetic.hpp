// What the built-in synthetic tasks (data_addition.cpp, data_scratchpad.cpp)
// share: the splitmix64 streams every draw comes from (a draw is a pure
// function of its stream's starting state) and the packing of whole problems
// into a training row. Internal to model/.
#pragma once

#include <cstdint>
#include <vector>

namespace troupe::model::synthetic {

inline uint64_t mix64(uint64_t x) {  // splitmix64 finalizer
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

// A splitmix64 stream: a pure function of its starting state.
struct Stream {
  uint64_t s;
  uint64_t next() { return mix64(s += 0x9e3779b97f4a7c15ull); }
  // Uniform in [0, n).
  int64_t below(int64_t n) {
    return static_cast<int64_t>((static_cast<unsigned __int128>(next()) * static_cast<uint64_t>(n)) >> 64);
  }
  // Uniform in [0, 1).
  double unit() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
};

// One training row of seq tokens: EOS, then whole problems while they fit
// (never cut), then PAD. next(problem) writes the next problem's tokens into
// the cleared `problem` and returns where its answer starts: only answer
// tokens carry a target (inputs[t] predicts targets[t] = token t + 1).
template <class Next>
void pack_problems(int32_t* inputs, int32_t* targets, int64_t seq, int32_t eos, int32_t pad, Next next) {
  std::vector<int32_t> tok{eos};
  std::vector<uint8_t> loss{0};  // 1 = this token is a target
  tok.reserve(static_cast<size_t>(seq + 1));
  loss.reserve(static_cast<size_t>(seq + 1));
  std::vector<int32_t> problem;
  for (;;) {
    problem.clear();
    const size_t answer_at = next(problem);
    if (static_cast<int64_t>(tok.size() + problem.size()) > seq + 1) break;
    for (size_t i = 0; i < problem.size(); ++i) {
      tok.push_back(problem[i]);
      loss.push_back(i >= answer_at ? 1 : 0);
    }
  }
  tok.resize(static_cast<size_t>(seq + 1), pad);
  loss.resize(static_cast<size_t>(seq + 1), 0);
  for (int64_t t = 0; t < seq; ++t) {
    inputs[t] = tok[static_cast<size_t>(t)];
    targets[t] = loss[static_cast<size_t>(t + 1)] ? tok[static_cast<size_t>(t + 1)] : -1;
  }
}

}  // namespace troupe::model::synthetic
