// bench_generate: generation tokens/s of the KV cache (model/kv_generate.hpp)
// against today's full-recompute Generator (model/generate.hpp), same model,
// prompts, seeds and sampling, 64 new tokens per prompt (no eos, so every
// sequence makes exactly that many). Rows:
//   recompute, batch 1   the baseline: one prompt at a time, full forward per token
//   kv, batch 1          the same prompts one at a time through the KV cache
//   kv, batch B          all prompts in one batch (prompts of mixed lengths)
// The ratio column is same-run tokens/s over the baseline; "same tokens"
// says whether the sequences equal the baseline's (they should, up to a draw
// landing within float rounding of a boundary). Model: the quickstart MoE
// config (d_model 128, 4 layers, 8 experts top-2, seq 128, vocab 256) with
// random weights; addition-style prompts of 6 to 12 tokens.
//
//   bench_generate [--backend host|opencl] [--threads N] [--batch B] [--new N] [--reps R] [--json PATH] [--profile]
// --profile: per-op time of one more batched KV run (host ops are synchronous).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/blas_core.hpp"
#include "bench/train_step_profile.hpp"
#include "model/generate.hpp"
#include "model/kv_generate.hpp"
#include "model/params.hpp"
#include "model/weights.hpp"

using namespace troupe;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Row {
  std::string name;
  int64_t batch = 0;
  int64_t tokens = 0;
  double seconds = 0.0;  // best of reps
  bool same = true;
  double tps() const { return static_cast<double>(tokens) / seconds; }
};

}  // namespace

int main(int argc, char** argv) {
  troupe::kernels::configure_openblas(argv);  // OpenBLAS set up as `troupe` runs it
  kernels::BackendOptions bo;
  int64_t batch = 16, max_new = 64;
  int reps = 2;
  std::string json = "bench_generate.json";
  bool profile = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_generate: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--backend") bo.kind = kernels::parse_backend_kind(next());
    else if (a == "--threads") bo.threads = std::stoi(next());
    else if (a == "--batch") batch = std::stoll(next());
    else if (a == "--new") max_new = std::stoll(next());
    else if (a == "--reps") reps = std::stoi(next());
    else if (a == "--json") json = next();
    else if (a == "--profile") profile = true;
    else {
      std::fprintf(stderr, "usage: bench_generate [--backend host|opencl] [--threads N] [--batch B] [--new N] [--reps R] [--json PATH] [--profile]\n");
      return 2;
    }
  }
  auto be = std::make_unique<bench::ProfilingBackend>(kernels::make_backend(bo));
  const model::ModelConfig cfg;  // the quickstart
  const model::ParamLayout layout = model::build_param_layout(cfg);
  const kernels::Tensor flat = be->from_f32({layout.total()}, model::init_params(layout, cfg, 7));
  const model::ModelWeights w = model::bind_weights(layout, cfg, flat);

  // "EOS a+b=" shaped prompts: 6..12 tokens of digits and symbols.
  std::vector<std::vector<int32_t>> prompts;
  for (int64_t b = 0; b < batch; ++b) {
    std::vector<int32_t> p{1};
    const int64_t n = 5 + b % 7;
    for (int64_t i = 0; i < n; ++i) p.push_back(static_cast<int32_t>(16 + (b * 7 + i * 3) % 10));
    prompts.push_back(p);
  }
  model::SamplingOptions sampling;  // temperature 1, full vocabulary
  model::GenerateOptions go;
  go.max_new_tokens = max_new;
  go.sampling = sampling;
  auto seeds = [&] {
    std::vector<model::SamplerRng> r;
    for (int64_t b = 0; b < batch; ++b) r.emplace_back(1000 + static_cast<uint64_t>(b));
    return r;
  };

  std::vector<std::vector<int32_t>> base(static_cast<size_t>(batch));
  Row rec{"recompute", 1}, kv1{"kv", 1}, kvb{"kv", batch};
  model::Generator old(*be, cfg, /*kv_cache=*/false);
  model::BatchGenerator gen(*be, cfg);
  for (int r = 0; r < reps; ++r) {
    // Baseline.
    auto rng = seeds();
    double t0 = now();
    int64_t n = 0;
    for (int64_t b = 0; b < batch; ++b) {
      base[b] = old.generate(w, prompts[b], max_new, sampling, rng[b]);
      n += static_cast<int64_t>(base[b].size());
    }
    be->synchronize();
    double dt = now() - t0;
    if (r == 0 || dt < rec.seconds) rec.seconds = dt;
    rec.tokens = n;
    // KV, one prompt at a time.
    rng = seeds();
    t0 = now();
    n = 0;
    for (int64_t b = 0; b < batch; ++b) {
      const auto out = gen.generate(w, {prompts[b]}, std::span(&rng[b], 1), go);
      n += static_cast<int64_t>(out[0].tokens.size());
      kv1.same = kv1.same && out[0].tokens == base[b];
    }
    be->synchronize();
    dt = now() - t0;
    if (r == 0 || dt < kv1.seconds) kv1.seconds = dt;
    kv1.tokens = n;
    // KV, the whole batch.
    rng = seeds();
    t0 = now();
    const auto outs = gen.generate(w, prompts, rng, go);
    be->synchronize();
    dt = now() - t0;
    if (r == 0 || dt < kvb.seconds) kvb.seconds = dt;
    n = 0;
    for (int64_t b = 0; b < batch; ++b) {
      n += static_cast<int64_t>(outs[b].tokens.size());
      kvb.same = kvb.same && outs[b].tokens == base[b];
    }
    kvb.tokens = n;
  }

  std::printf("bench_generate: backend %s, threads %d, %lld prompts (6-12 tokens), %lld new tokens each, best of %d\n",
              be->name().c_str(), bo.threads, static_cast<long long>(batch), static_cast<long long>(max_new), reps);
  std::printf("%-10s %6s %8s %10s %12s %8s %11s\n", "method", "batch", "tokens", "seconds", "tokens/s", "ratio", "same tokens");
  std::ostringstream js;
  js << "{\"bench\":\"generate\",\"backend\":\"" << be->name() << "\",\"threads\":" << bo.threads
     << ",\"prompts\":" << batch << ",\"new_tokens\":" << max_new << ",\"rows\":[";
  bool first = true;
  for (const Row* r : {&rec, &kv1, &kvb}) {
    const double ratio = r->tps() / rec.tps();
    std::printf("%-10s %6lld %8lld %10.3f %12.1f %7.1fx %11s\n", r->name.c_str(),
                static_cast<long long>(r->batch), static_cast<long long>(r->tokens), r->seconds,
                r->tps(), ratio, r->same ? "yes" : "no");
    js << (first ? "" : ",") << "{\"method\":\"" << r->name << "\",\"batch\":" << r->batch
       << ",\"tokens\":" << r->tokens << ",\"seconds\":" << r->seconds << ",\"tokens_per_s\":" << r->tps()
       << ",\"ratio_vs_recompute\":" << ratio << ",\"same_tokens\":" << (r->same ? "true" : "false") << "}";
    first = false;
  }
  js << "]}\n";
  if (profile) {
    be->reset();
    auto rng = seeds();
    const double t0 = now();
    gen.generate(w, prompts, rng, go);
    const double total = now() - t0;
    std::printf("\nprofile of one batched KV run (%.3f s):\n", total);
    for (const auto& [op, st] : be->stats())
      std::printf("  %-20s %8.0f calls %9.4f s %5.1f%%\n", op.c_str(), st.calls, st.seconds,
                  100.0 * st.seconds / total);
  }
  std::ofstream(json) << js.str();
  std::printf("wrote %s\n", json.c_str());
  return 0;
}
