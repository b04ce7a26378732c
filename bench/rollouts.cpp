// bench_rollouts: one RL step's rollouts on the reasoning task (scratchpad
// addition, long-tailed completions), generated five ways from the same
// prompts and seeds, in one run:
//   static               the whole step as one batch (BatchGenerator, BLAS
//                        GEMMs): every sequence waits for the longest one
//   slots N, N/2, N/4    continuous batching (model/continuous_batch.hpp)
//                        with batch-invariant GEMMs, the RL default
//   slots N, BLAS        the same with OpenBLAS's GEMMs (not slot-invariant):
//                        the invariant kernel's cost
// and two steps on a generator's PolicyCopy, one after the other against
// side by side (the next step taking the slots the first one's tail frees).
// Columns: tokens, seconds (best of reps), tokens/s, ratio to static,
// forward steps, mean live rows per step, and whether the tokens equal the
// slots-N run's (they must for every invariant row).
//
//   bench_rollouts [--checkpoint DIR] [--digits D] [--prompts P] [--group G] [--max-new N]
//                  [--threads T] [--reps R] [--json PATH]
// Without --checkpoint, a fresh initialisation of the reasoning SFT spec's model.
#include <chrono>
#include <cstdio>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "bench/train_step_profile.hpp"
#include "kernels/blas_core.hpp"
#include "model/checkpoint.hpp"
#include "model/continuous_batch.hpp"
#include "model/kv_generate.hpp"
#include "model/params.hpp"
#include "model/weights.hpp"
#include "rl/group.hpp"
#include "rl/rollout_step.hpp"
#include "rl/trainer.hpp"

using namespace troupe;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

struct Row {
  std::string name;
  int64_t tokens = 0, forwards = 0, rows = 0;
  double seconds = 0.0;
  bool same = true;
  double tps() const { return static_cast<double>(tokens) / seconds; }
};

}  // namespace

int main(int argc, char** argv) {
  kernels::configure_openblas(argv);
  std::string checkpoint, json = "bench_rollouts.json";
  int64_t digits = 24, prompts = 16, group = 4, max_new = 243;
  int reps = 2;
  kernels::BackendOptions bo;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "bench_rollouts: %s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--checkpoint") checkpoint = next();
    else if (a == "--digits") digits = std::stoll(next());
    else if (a == "--prompts") prompts = std::stoll(next());
    else if (a == "--group") group = std::stoll(next());
    else if (a == "--max-new") max_new = std::stoll(next());
    else if (a == "--threads") bo.threads = std::stoi(next());
    else if (a == "--reps") reps = std::stoi(next());
    else if (a == "--json") json = next();
    else {
      std::fprintf(stderr,
                   "usage: bench_rollouts [--checkpoint DIR] [--digits D] [--prompts P] [--group G] [--max-new N] "
                   "[--threads T] [--reps R] [--json PATH]\n");
      return 2;
    }
  }
  model::ModelConfig cfg;
  std::vector<float> params;
  if (!checkpoint.empty()) {
    model::TrainingState st = model::load_checkpoint(checkpoint);
    cfg = st.config;
    params = std::move(st.params);
  } else {  // bench/results/reasoning_sft.toml's model
    cfg.vocab_size = 16;
    cfg.d_model = 128;
    cfg.n_layers = 4;
    cfg.n_heads = 4;
    cfg.seq_len = 320;
    cfg.ffn = model::Ffn::dense;
    cfg.tie_embeddings = false;
    params = model::init_params(model::build_param_layout(cfg), cfg, 1);
  }
  auto prof = std::make_unique<bench::ProfilingBackend>(kernels::make_backend(bo));
  bench::ProfilingBackend& be = *prof;
  const model::ParamLayout layout = model::build_param_layout(cfg);
  const kernels::Tensor flat = be.from_f32({layout.total()}, params);
  const model::ModelWeights w = model::bind_weights(layout, cfg, flat);

  rl::RlConfig rl;
  rl.prompts_per_step = prompts;
  rl.group_size = group;
  rl.max_new_tokens = max_new;
  model::DataConfig data;
  data.source = model::DataKind::scratchpad;
  data.digits = digits;
  data.eval_problems = 0;
  const std::unique_ptr<rl::Task> task = rl::make_task(rl, data, 1);
  const int64_t N = prompts * group;

  auto step_layout = [&](int64_t step, std::vector<std::vector<int32_t>>& rows, std::vector<model::SamplerRng>& rngs) {
    rows.clear();
    rngs.clear();
    for (int64_t g = 0; g < prompts; ++g) {
      const rl::GroupId id{1, step, g};
      const rl::Prompt p = task->train_prompt(rl::prompt_index(id, prompts));
      for (int64_t k = 0; k < group; ++k) {
        rows.push_back(p.tokens);
        rngs.emplace_back(rl::sampler_seed(id, k));
      }
    }
  };
  model::GenerateOptions go;
  go.max_new_tokens = max_new;
  go.eos = task->eos_token();

  std::vector<Row> rows;
  std::vector<std::vector<int32_t>> reference;  // slots-N tokens
  auto count = [](const std::vector<model::Completion>& out) {
    int64_t n = 0;
    for (const auto& c : out) n += static_cast<int64_t>(c.tokens.size());
    return n;
  };
  auto continuous = [&](const std::string& name, int64_t slots, bool invariant) {
    be.allow_batch_invariant(invariant);
    Row r{name};
    model::ContinuousBatch cb(be, cfg, slots);
    for (int rep = 0; rep < reps; ++rep) {
      std::vector<std::vector<int32_t>> ps;
      std::vector<model::SamplerRng> rngs;
      step_layout(0, ps, rngs);
      const double t0 = now();
      cb.start(ps, rngs, go);
      while (cb.step(w, 0)) {
      }
      const double dt = now() - t0;
      r.forwards = cb.counters().steps;
      r.rows = cb.counters().rows;
      const auto out = cb.finish();
      if (rep == 0 || dt < r.seconds) r.seconds = dt;
      r.tokens = count(out);
      if (reference.empty())
        for (const auto& c : out) reference.push_back(c.tokens);
      for (size_t i = 0; i < out.size(); ++i) r.same = r.same && out[i].tokens == reference[i];
    }
    be.allow_batch_invariant(true);
    return r;
  };
  Row slots_n = continuous("slots " + std::to_string(N), N, true);
  {
    Row r{"static"};
    model::BatchGenerator gen(be, cfg);
    for (int rep = 0; rep < reps; ++rep) {
      std::vector<std::vector<int32_t>> ps;
      std::vector<model::SamplerRng> rngs;
      step_layout(0, ps, rngs);
      const double t0 = now();
      const auto out = gen.generate(w, ps, rngs, go);
      const double dt = now() - t0;
      if (rep == 0 || dt < r.seconds) r.seconds = dt;
      r.tokens = count(out);
      int64_t longest = 0;
      for (const auto& c : out) longest = std::max<int64_t>(longest, static_cast<int64_t>(c.tokens.size()));
      r.forwards = longest;  // one prefill, then a decode step per token of the longest
      r.rows = longest * N;
      for (size_t i = 0; i < out.size(); ++i) r.same = r.same && out[i].tokens == reference[i];
    }
    rows.push_back(r);
  }
  rows.push_back(slots_n);
  rows.push_back(continuous("slots " + std::to_string(N / 2), std::max<int64_t>(1, N / 2), true));
  rows.push_back(continuous("slots " + std::to_string(N / 4), std::max<int64_t>(1, N / 4), true));
  rows.push_back(continuous("slots " + std::to_string(N) + ", BLAS", N, false));

  // Two steps on a generator's copy: one after the other, then side by side.
  rl::PolicyCopy copy(cfg, bo, N);
  copy.load(params, 0);
  for (bool overlap : {false, true}) {
    Row r{overlap ? "2 steps side by side" : "2 steps one after other"};
    for (int rep = 0; rep < reps; ++rep) {
      const double t0 = now();
      int64_t tokens = 0, started = 0, done = 0;
      while (done < 2) {
        if (started < 2 && (overlap ? copy.can_begin() : !copy.generating())) {
          copy.begin(*task, rl, 1, started++);
          continue;
        }
        copy.decode();
        while (auto f = copy.take_finished()) {
          tokens += f->rollouts.tokens();
          ++done;
        }
      }
      const double dt = now() - t0;
      if (rep == 0 || dt < r.seconds) r.seconds = dt;
      r.tokens = tokens;
    }
    rows.push_back(r);
  }

  std::printf("bench_rollouts: %s, threads %d, %lld prompts x %lld, digits %lld, max_new_tokens %lld, best of %d\n",
              checkpoint.empty() ? "fresh init" : checkpoint.c_str(), bo.threads, static_cast<long long>(prompts),
              static_cast<long long>(group), static_cast<long long>(digits), static_cast<long long>(max_new), reps);
  std::printf("%-26s %8s %9s %10s %7s %9s %10s %6s\n", "method", "tokens", "seconds", "tokens/s", "ratio", "forwards",
              "live rows", "same");
  std::ostringstream js;
  js << "{\"bench\":\"rollouts\",\"checkpoint\":\"" << checkpoint << "\",\"threads\":" << bo.threads
     << ",\"prompts\":" << prompts << ",\"group\":" << group << ",\"digits\":" << digits << ",\"rows\":[";
  const double base = rows.front().tps();
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    const double live = r.forwards ? static_cast<double>(r.rows) / static_cast<double>(r.forwards) : 0.0;
    std::printf("%-26s %8lld %9.3f %10.0f %6.2fx %9lld %10.1f %6s\n", r.name.c_str(), static_cast<long long>(r.tokens),
                r.seconds, r.tps(), r.tps() / base, static_cast<long long>(r.forwards), live,
                r.name.rfind("2 steps", 0) == 0 ? "-" : (r.same ? "yes" : "no"));
    js << (i ? "," : "") << "{\"method\":\"" << r.name << "\",\"tokens\":" << r.tokens << ",\"seconds\":" << r.seconds
       << ",\"tokens_per_s\":" << r.tps() << ",\"ratio_vs_static\":" << r.tps() / base << ",\"forwards\":" << r.forwards
       << ",\"mean_live_rows\":" << live << ",\"same_tokens\":" << (r.same ? "true" : "false") << "}";
  }
  js << "]}\n";
  std::ofstream(json) << js.str();
  std::printf("wrote %s\n", json.c_str());
  return 0;
}
