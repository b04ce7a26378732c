// bench_bw_split: what the B/W split of model::Stage costs and how a
// backward divides into B (input gradients) and W (weight gradients), on the
// quickstart model (ModelConfig defaults), one micro-batch of the pipeline
// bench (batch 4 of batch 16 / 4 micro-batches), host backend, 1 OpenBLAS
// thread. Each round runs, on a forwarded slot, the full backward and (after
// a fresh forward) B then W, so load drift hits both alike; the table shows
// the medians over the rounds. The W share is what the pipeline sim's
// `weight_ms` models, and (B + W) / full - 1 is the split's own cost (the
// copies of the residual gradient W needs, its operands no longer in cache).
// --profile adds the per-op time of each variant (bench/train_step_profile.hpp).
//   bench_bw_split [--rounds N] [--stages S] [--profile]   (S = 1: the whole model; 2: stage 0 of 2)
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_stats.hpp"
#include "kernels/backend.hpp"
#include "kernels/blas_core.hpp"
#include "model/params.hpp"
#include "model/stage.hpp"
#include "model/weights.hpp"
#include "bench/train_step_profile.hpp"

using namespace troupe;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

using troupe::bench::median;

using troupe::bench::load_average;

}  // namespace

int main(int argc, char** argv) {
  kernels::configure_openblas(argv);
  int rounds = 20, stages = 1;
  bool profile = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--rounds" && i + 1 < argc) rounds = std::atoi(argv[++i]);
    else if (a == "--stages" && i + 1 < argc) stages = std::atoi(argv[++i]);
    else if (a == "--profile") profile = true;
    else {
      std::fprintf(stderr, "usage: bench_bw_split [--rounds N] [--stages 1|2] [--profile]\n");
      return 2;
    }
  }
  if (rounds < 1 || (stages != 1 && stages != 2)) {
    std::fprintf(stderr, "--rounds must be >= 1, --stages 1 or 2\n");
    return 2;
  }
  const model::ModelConfig c;  // the quickstart model
  kernels::BackendOptions bo;
  bo.threads = 1;
  auto prof = std::make_unique<bench::ProfilingBackend>(kernels::make_backend(bo));
  bench::ProfilingBackend& pb = *prof;
  std::map<std::string, bench::OpStat> full_ops, split_ops;
  auto take = [&](std::map<std::string, bench::OpStat>& into) {
    for (const auto& [op, st] : pb.stats()) {
      into[op].calls += st.calls;
      into[op].seconds += st.seconds;
    }
    pb.reset();
  };
  std::unique_ptr<kernels::Backend> be = std::move(prof);
  const model::ParamLayout lay = model::build_param_layout(c);
  const kernels::Tensor params = be->from_f32({lay.total()}, model::init_params(lay, c, 7));
  const kernels::Tensor grads = be->zeros({lay.total()});
  const model::ModelWeights w = model::bind_weights(lay, c, params), g = model::bind_weights(lay, c, grads);
  const int64_t batch = 4;
  const auto ranges = model::split_layers(c.n_layers, stages);
  // Stage 0 of `stages` (with S = 2 it has no LM head: the backward starts
  // from an upstream gradient, as in the pipeline).
  model::Stage st(*be, c, batch, ranges[0].first, ranges[0].second, true, stages == 1, 1);
  const int64_t T = st.tokens();
  std::vector<int32_t> in(static_cast<size_t>(T)), tg(static_cast<size_t>(T));
  for (int64_t t = 0; t < T; ++t) {
    in[t] = static_cast<int32_t>((t * 7 + 3) % c.vocab_size);
    tg[t] = static_cast<int32_t>((t * 3 + 1) % c.vocab_size);
  }
  std::vector<float> dout(stages == 1 ? 0 : static_cast<size_t>(T * c.d_model));
  for (size_t i = 0; i < dout.size(); ++i) dout[i] = 1e-3f * static_cast<float>(static_cast<int>(i % 13) - 6);
  const std::span<const int32_t> targets = stages == 1 ? std::span<const int32_t>(tg) : std::span<const int32_t>();
  std::vector<double> full, b, wt;
  const std::string load0 = load_average();
  const int64_t arena_unsplit = st.arena_elements();  // activations + backward scratch
  int64_t arena_split = 0;                            // + the slot's kept dY (taken at its first B)
  for (int r = 0; r < rounds + 2; ++r) {  // 2 warm-up rounds
    st.forward_tokens(0, w, in, targets);
    pb.reset();
    double t0 = now();
    st.backward(0, w, g, dout, 1.0 / static_cast<double>(T), 0.25);
    const double t_full = now() - t0;
    if (r >= 2) take(full_ops);
    st.forward_tokens(0, w, in, targets);
    pb.reset();
    t0 = now();
    st.backward_input(0, w, g, dout, 1.0 / static_cast<double>(T), 0.25);
    const double t1 = now();
    st.backward_weights(0);
    const double t2 = now();
    arena_split = st.arena_elements();
    if (r >= 2) take(split_ops);
    if (r < 2) continue;
    full.push_back(t_full);
    b.push_back(t1 - t0);
    wt.push_back(t2 - t1);
  }
  std::vector<double> bw(b.size());
  for (size_t i = 0; i < b.size(); ++i) bw[i] = b[i] + wt[i];
  const double mf = median(full) * 1e3, mb = median(b) * 1e3, mw = median(wt) * 1e3, mbw = median(bw) * 1e3;
  std::printf("bench_bw_split: quickstart model, layers [%lld, %lld) of %lld, micro-batch of %lld tokens, host, 1 thread\n",
              static_cast<long long>(ranges[0].first), static_cast<long long>(ranges[0].second),
              static_cast<long long>(c.n_layers), static_cast<long long>(T));
  std::printf("%d rounds (+2 warm-up); load average before: %s, after: %s\n\n", rounds, load0.c_str(),
              load_average().c_str());
  std::printf("%-28s %9s\n", "pass (median ms)", "ms");
  std::printf("%-28s %9.2f\n", "full backward", mf);
  std::printf("%-28s %9.2f\n", "B (input gradients)", mb);
  std::printf("%-28s %9.2f\n", "W (weight gradients)", mw);
  std::printf("%-28s %9.2f\n", "B + W", mbw);
  std::printf("\nW share of B + W: %.1f%%; split cost (B + W) / full - 1: %+.1f%%\n", 100.0 * mw / mbw,
              100.0 * (mbw / mf - 1.0));
  std::printf("stage arena: %.1f MB, + %.1f MB of kept dY per slot with the split\n",
              static_cast<double>(arena_unsplit) * 4e-6, static_cast<double>(arena_split - arena_unsplit) * 4e-6);
  if (profile) {
    std::printf("\n%-26s %10s %10s %8s %8s   (ms per pass, mean over the rounds)\n", "op", "full", "B + W", "calls",
                "calls");
    std::map<std::string, int> names;
    for (const auto& [op, s2] : full_ops) names[op] = 1;
    for (const auto& [op, s2] : split_ops) names[op] = 1;
    for (const auto& [op, one] : names) {
      const bench::OpStat f = full_ops.count(op) ? full_ops.at(op) : bench::OpStat{};
      const bench::OpStat sp = split_ops.count(op) ? split_ops.at(op) : bench::OpStat{};
      std::printf("%-26s %10.3f %10.3f %8.0f %8.0f\n", op.c_str(), f.seconds / rounds * 1e3, sp.seconds / rounds * 1e3,
                  f.calls / rounds, sp.calls / rounds);
    }
  }
  return 0;
}
