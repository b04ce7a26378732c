// bench_train_step: training throughput (tokens/s) and model FLOP utilisation
// of the single-process trainer on one device, for the quickstart config and
// a d_model 256 config, with OpenBLAS on 1 and 2 threads. MFU = model FLOPs
// per second / the cblas_sgemm peak measured in the same run with the same
// thread count (median step; the best step is shown too, since on a shared
// machine it is the least disturbed). A per-op profile (a timing wrapper around the backend) shows
// where a step's time goes.
//
//   bench_train_step [--quick] [--steps N] [--json PATH] [--threads 1,2] [--no-profile]
#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "kernels/blas_core.hpp"
#include "bench/train_step_profile.hpp"
#include "model/data.hpp"
#include "model/decoder.hpp"
#include "model/params.hpp"
#include "model/trainer.hpp"
#include "model/weights.hpp"

using namespace troupe;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Options {
  bool quick = false;
  bool profile = true;
  int steps = 12;
  std::string json = "bench_train_step.json";
  std::vector<int> threads = {1, 2};
};

struct NamedConfig {
  std::string name;
  model::ModelConfig model;
  int64_t batch = 16;
};

std::vector<NamedConfig> configs() {
  NamedConfig q{"quickstart", model::ModelConfig{}, 16};  // the defaults are the quickstart
  NamedConfig d{"d256", model::ModelConfig{}, 16};
  d.model.d_model = 256;
  d.model.n_heads = 8;
  d.model.expert_hidden = 512;
  return {q, d};
}

// Best cblas_sgemm GFLOP/s over square sizes, median of a few repetitions, on
// `threads` OpenBLAS threads (troupe's backend runs OpenBLAS single-threaded
// and splits GEMMs over its own threads; the peak is OpenBLAS's own).
double sgemm_peak_gflops(int threads, bool quick) {
  openblas_set_num_threads(threads);
  double best = 0.0;
  for (int n : {256, 512, 1024}) {
    std::vector<float> a(static_cast<size_t>(n) * n, 0.5f), b(a), c(a.size());
    const int reps = quick ? 3 : (n == 1024 ? 5 : 20);
    std::vector<double> t;
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n,
                0.0f, c.data(), n);
    for (int r = 0; r < reps; ++r) {
      const double t0 = now();
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n,
                  b.data(), n, 0.0f, c.data(), n);
      t.push_back(now() - t0);
    }
    std::sort(t.begin(), t.end());
    best = std::max(best, 2.0 * n * n * n / t[t.size() / 2] / 1e9);
  }
  openblas_set_num_threads(1);  // as the host backend runs it
  return best;
}

struct Row {
  std::string config;
  int threads = 1;
  double step_s = 0, best_step_s = 0, tokens_per_s = 0, best_tokens_per_s = 0;
  double model_gflops = 0, peak_gflops = 0, mfu = 0;
  double flops_per_token = 0;
};

Row measure(const NamedConfig& nc, int threads, const Options& o) {
  model::TrainOptions t;
  t.model = nc.model;
  t.data.source = troupe::model::DataKind::addition;  // vocab 14 < 256: tokens are valid ids of the model
  t.data.batch_size = nc.batch;
  t.steps = 1000;
  t.eval_every = 0;
  t.backend.kind = kernels::BackendKind::host;
  t.backend.threads = threads;
  model::Trainer tr(t);
  tr.step();  // warm-up: page faults, OpenBLAS buffers
  tr.step();
  std::vector<double> times;
  const int steps = o.quick ? 3 : o.steps;
  for (int i = 0; i < steps; ++i) times.push_back(tr.step().step_seconds);
  std::sort(times.begin(), times.end());
  Row r;
  r.config = nc.name;
  r.threads = threads;
  r.step_s = times[times.size() / 2];
  r.best_step_s = times.front();  // on a shared machine the fastest step is the least disturbed
  const double tokens = static_cast<double>(nc.batch * nc.model.seq_len);
  r.tokens_per_s = tokens / r.step_s;
  r.best_tokens_per_s = tokens / r.best_step_s;
  r.flops_per_token = model::train_flops_per_token(nc.model);
  r.model_gflops = r.flops_per_token * r.tokens_per_s / 1e9;
  r.peak_gflops = sgemm_peak_gflops(threads, o.quick);  // after the run: same thread count, warm
  r.mfu = r.model_gflops / r.peak_gflops;
  return r;
}

// Trainer steps through the profiling wrapper: seconds per op per step, and
// the step's wall time (the rest is host work between ops).
std::vector<std::pair<std::string, bench::OpStat>> profile(const NamedConfig& nc, int threads,
                                                           const Options& o, double* total,
                                                           double* step_s) {
  model::TrainOptions t;
  t.model = nc.model;
  t.data.source = troupe::model::DataKind::addition;
  t.data.batch_size = nc.batch;
  t.steps = 1000;
  t.eval_every = 0;
  t.backend.threads = threads;
  auto wrapped = std::make_unique<bench::ProfilingBackend>(kernels::make_backend(t.backend));
  bench::ProfilingBackend* be = wrapped.get();
  model::Trainer tr(t, std::move(wrapped));
  tr.step();  // warm-up
  be->reset();
  const int reps = o.quick ? 2 : 5;
  *step_s = 0;
  for (int i = 0; i < reps; ++i) *step_s += tr.step().step_seconds / reps;
  auto stats = be->stats();
  *total = 0;
  for (auto& [name, s] : stats) {
    s.seconds /= reps;
    s.calls /= reps;
    s.flops /= reps;
    *total += s.seconds;
  }
  std::vector<std::pair<std::string, bench::OpStat>> out(stats.begin(), stats.end());
  std::sort(out.begin(), out.end(),
            [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  return out;
}

}  // namespace

int main(int argc, char** argv) {
  troupe::kernels::configure_openblas(argv);  // OpenBLAS set up as `troupe` runs it
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--quick") {
      o.quick = true;
    } else if (a == "--no-profile") {
      o.profile = false;
    } else if (a == "--steps") {
      o.steps = std::max(1, std::atoi(next().c_str()));
    } else if (a == "--json") {
      o.json = next();
    } else if (a == "--threads") {
      o.threads.clear();
      std::stringstream ss(next());
      for (std::string t; std::getline(ss, t, ',');) o.threads.push_back(std::max(1, std::atoi(t.c_str())));
    } else {
      std::fprintf(stderr, "usage: bench_train_step [--quick] [--steps N] [--json PATH] [--threads 1,2] [--no-profile]\n");
      return 2;
    }
  }

  std::vector<Row> rows;
  std::printf("%-11s %7s %10s %11s %11s %12s %12s %7s\n", "config", "threads", "step ms",
              "tokens/s", "best tok/s", "model GF/s", "sgemm GF/s", "MFU");
  for (const NamedConfig& nc : configs()) {
    for (int th : o.threads) {
      const Row r = measure(nc, th, o);
      rows.push_back(r);
      std::printf("%-11s %7d %10.1f %11.0f %11.0f %12.1f %12.1f %6.1f%%\n", r.config.c_str(),
                  r.threads, r.step_s * 1e3, r.tokens_per_s, r.best_tokens_per_s, r.model_gflops,
                  r.peak_gflops, 100.0 * r.mfu);
      std::fflush(stdout);
    }
  }

  std::ostringstream js;
  js << "{\n  \"bench\": \"train_step\",\n  \"rows\": [\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    js << "    {\"config\": \"" << r.config << "\", \"threads\": " << r.threads
       << ", \"step_seconds\": " << r.step_s << ", \"best_step_seconds\": " << r.best_step_s
       << ", \"tokens_per_second\": " << r.tokens_per_s
       << ", \"best_tokens_per_second\": " << r.best_tokens_per_s
       << ", \"model_flops_per_token\": " << r.flops_per_token
       << ", \"model_gflops\": " << r.model_gflops << ", \"sgemm_peak_gflops\": " << r.peak_gflops
       << ", \"mfu\": " << r.mfu << "}" << (i + 1 < rows.size() ? "," : "") << "\n";
  }
  js << "  ],\n  \"profile\": [\n";
  if (o.profile) {
    bool first = true;
    for (const NamedConfig& nc : configs()) {
      const int th = o.threads.back();
      double total = 0, step_s = 0;
      const auto ops = profile(nc, th, o, &total, &step_s);
      std::printf("\nprofile: %s, %d thread(s), one training step: %.1f ms, of which %.1f ms in backend ops\n",
                  nc.name.c_str(), th, step_s * 1e3, total * 1e3);
      // The sgemm peak of this thread count, measured with the rows above.
      double peak = 0;
      for (const Row& r : rows)
        if (r.config == nc.name && r.threads == th) peak = r.peak_gflops;
      std::printf("  %-22s %8s %9s %7s %8s %7s\n", "op", "calls", "ms", "share", "GF/s", "% peak");
      double gemm_s = 0, gemm_flops = 0;
      for (const auto& [name, s] : ops) {
        std::printf("  %-22s %8.0f %9.2f %6.1f%%", name.c_str(), s.calls, s.seconds * 1e3, 100.0 * s.seconds / total);
        if (s.flops > 0 && s.seconds > 0)
          std::printf(" %8.1f %6.1f%%", s.flops / s.seconds / 1e9, 100.0 * s.flops / s.seconds / 1e9 / peak);
        std::printf("\n");
        if (s.flops > 0) {
          gemm_s += s.seconds;
          gemm_flops += s.flops;
        }
        js << (first ? "" : ",\n") << "    {\"config\": \"" << nc.name << "\", \"threads\": " << th
           << ", \"op\": \"" << name << "\", \"calls\": " << s.calls << ", \"seconds\": " << s.seconds
           << ", \"flops\": " << s.flops << "}";
        first = false;
      }
      // Where the MFU goes: the model's FLOPs of this step against the peak,
      // the GEMMs' own rate, and what the MFU would be with either half
      // of the step removed (the GEMMs at the sgemm peak; every other op
      // and the host work between ops free).
      const double model_flops = model::train_flops_per_token(nc.model) * static_cast<double>(nc.batch * nc.model.seq_len);
      const double other_s = step_s - gemm_s;
      std::printf("  MFU ledger (peak %.1f GF/s): this step %.1f%%; GEMMs %.1f%% of the step at %.1f%% of peak "
                  "(%.2f of the model's %.2f GFLOP); other ops and host work %.1f ms\n",
                  peak, 100.0 * model_flops / step_s / 1e9 / peak, 100.0 * gemm_s / step_s,
                  100.0 * gemm_flops / gemm_s / 1e9 / peak, gemm_flops / 1e9, model_flops / 1e9, other_s * 1e3);
      std::printf("  MFU with GEMMs at peak: %.1f%%; with everything but the GEMMs free: %.1f%%\n",
                  100.0 * model_flops / (gemm_flops / (peak * 1e9) + other_s) / 1e9 / peak,
                  100.0 * model_flops / gemm_s / 1e9 / peak);
    }
  }
  js << "\n  ]\n}\n";
  std::ofstream(o.json) << js.str();
  std::printf("\nwrote %s\n", o.json.c_str());
  return 0;
}
