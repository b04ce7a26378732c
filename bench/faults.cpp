// bench_faults: what faults cost the actor runtime in one process: goodput at
// one fault per 10 steps (the goal: >= 90%), the mean time to repair
// per role when actors are killed (goal: <= 100 ms for stateless roles, <= 1 s
// for stateful ones, in-process), and what the Envelope frame's CRC-32
// trailer (which turns a flipped bit into a rejected message) costs per MiB.
//
// The model is small enough for a step of a few tens of ms on 2 devices
// (2 stages 1F1B, 2 optimizer shards, 2 expert shards per MoE layer), so a
// run of many faults fits in a minute. Each fault run is checked bitwise
// against the fault-free run (final parameters), and its [chaos] schedule
// comes from a fixed seed. The step deadline (which finds lost messages) is
// set from the fault-free run: 4 x its slowest step, at least 50 ms.
//
//   bench_faults [--steps N] [--json PATH]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "kernels/blas_core.hpp"
#include "actors/plan.hpp"
#include "actors/runtime.hpp"
#include "actors/transport/envelope.hpp"

using namespace troupe;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

runtime::RuntimeOptions base_options(int64_t steps) {
  runtime::RuntimeOptions o;
  auto& t = o.train;
  t.model.vocab_size = 16;
  t.model.d_model = 64;
  t.model.n_layers = 4;
  t.model.n_heads = 4;
  t.model.seq_len = 32;
  t.model.ffn = model::Ffn::moe;
  t.model.n_experts = 4;
  t.model.top_k = 2;
  t.model.expert_hidden = 64;
  t.data.source = model::DataKind::addition;
  t.data.digits = 3;
  t.data.batch_size = 16;
  t.microbatches = 4;
  t.steps = steps;
  t.eval_every = 0;
  t.seed = 1;
  t.backend.kind = kernels::BackendKind::host;
  t.backend.threads = 1;
  o.schedule = sched::Kind::one_f_one_b;
  o.stages = 2;
  o.devices = 2;
  o.optimizer_shards = 2;
  o.expert_shards = 2;
  o.max_restarts = 1000;
  return o;
}

struct Result {
  std::string name;
  size_t faults = 0;
  runtime::FaultSummary summary;
  double slowest = 0.0, wall = 0.0;
  bool bitwise = true;
  std::vector<float> params;
};

Result run(const std::string& name, const runtime::RuntimeOptions& o, const std::vector<float>* ref) {
  Result r;
  r.name = name;
  r.faults = o.faults.size();
  runtime::Runtime rt(o);
  const double t0 = now();
  for (int64_t s = 0; s < o.train.steps; ++s) r.slowest = std::max(r.slowest, rt.step().step_seconds);
  r.wall = now() - t0;
  r.summary = rt.fault_summary();
  r.params = rt.state().params;
  if (ref) r.bitwise = ref->size() == r.params.size() && std::memcmp(ref->data(), r.params.data(), ref->size() * 4) == 0;
  return r;
}

std::string mttr_cell(const runtime::FaultSummary& s, const char* role) {
  auto it = s.repairs.find(role);
  if (it == s.repairs.end()) return "-";
  char b[64];
  std::snprintf(b, sizeof b, "%.1f (%lld, max %.1f)", 1e3 * it->second.mean(), static_cast<long long>(it->second.count),
                1e3 * it->second.max_seconds);
  return b;
}

// Median seconds of `f` over `n` runs.
template <class F>
double median_of(int n, F&& f) {
  std::vector<double> t;
  for (int i = 0; i < n; ++i) {
    const double a = now();
    f();
    t.push_back(now() - a);
  }
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

}  // namespace

int main(int argc, char** argv) {
  troupe::kernels::configure_openblas(argv);  // OpenBLAS set up as `troupe` runs it
  int64_t steps = 100;
  std::string json;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--steps" && i + 1 < argc) steps = std::atoll(argv[++i]);
    else if (a == "--json" && i + 1 < argc) json = argv[++i];
    else {
      std::fprintf(stderr, "usage: bench_faults [--steps N] [--json PATH]\n");
      return 2;
    }
  }

  runtime::RuntimeOptions base = base_options(steps);
  const Result ref = run("fault-free", base, nullptr);
  const double deadline = std::max(0.05, 4.0 * ref.slowest);
  std::printf("fault-free: %lld steps in %.2f s (step %.1f ms mean, %.1f ms slowest); step_deadline = %.0f ms\n\n",
              static_cast<long long>(steps), ref.wall, 1e3 * ref.summary.useful_seconds / static_cast<double>(steps),
              1e3 * ref.slowest, 1e3 * deadline);
  base.step_deadline = deadline;
  const runtime::Plan plan = runtime::make_plan(base);

  struct Config {
    std::string name;
    double mean;
    std::vector<runtime::FaultKind> kinds;
    std::vector<runtime::Role> roles;
  };
  using K = runtime::FaultKind;
  using R = runtime::Role;
  const std::vector<Config> configs = {
      {"every kind, 1 per 10 steps", 10, {}, {}},
      {"no lost messages, 1 per 10", 10, {K::kill, K::duplicate, K::delay, K::pause, K::slow, K::partition}, {}},
      {"lost messages only, 1 per 10", 10, {K::drop, K::corrupt}, {}},
      {"partition only, 1 per 10", 10, {K::partition}, {}},
      {"kill stage, 1 per 5", 5, {K::kill}, {R::Rank}},
      {"kill optimizer, 1 per 5", 5, {K::kill}, {R::Optimizer}},
      {"kill expert, 1 per 5", 5, {K::kill}, {R::Expert}},
  };
  std::vector<Result> results;
  std::printf("%-30s %6s %9s %8s %8s %8s  %-24s %-24s %-24s %s\n", "run", "faults", "replays", "lost s", "wall s",
              "goodput", "MTTR stage ms (n, max)", "MTTR optimizer ms", "MTTR expert ms", "bitwise");
  for (const Config& c : configs) {
    runtime::ChaosOptions ch;
    ch.seed = 42;
    ch.mean_steps_between_faults = c.mean;
    ch.kinds = c.kinds;
    ch.roles = c.roles;
    runtime::RuntimeOptions o = base;
    o.faults = runtime::chaos_schedule(ch, plan, steps);
    Result r = run(c.name, o, &ref.params);
    const auto& s = r.summary;
    std::printf("%-30s %6zu %9lld %8.2f %8.2f %7.1f%%  %-24s %-24s %-24s %s\n", r.name.c_str(), r.faults,
                static_cast<long long>(s.replays), s.lost_seconds(), s.wall_seconds, 100.0 * s.goodput(),
                mttr_cell(s, "stage").c_str(), mttr_cell(s, "optimizer").c_str(), mttr_cell(s, "expert").c_str(),
                r.bitwise ? "yes" : "NO");
    results.push_back(std::move(r));
  }

  // The CRC-32 trailer: encode + decode of an Activations Envelope, with and without it.
  std::printf("\nEnvelope frame encode + decode, raw (never compressed), median of 5 (ms):\n");
  std::printf("%10s %10s %10s %8s\n", "MiB", "no CRC", "CRC-32", "extra");
  struct CrcRow {
    double mib, plain, crc;
  };
  std::vector<CrcRow> crc_rows;
  for (const int64_t rows : {int64_t{256}, int64_t{16384}}) {
    const int64_t width = 1024;
    std::vector<float> v(static_cast<size_t>(rows * width));
    for (size_t i = 0; i < v.size(); ++i) v[i] = static_cast<float>(i % 977) * 0.25f;
    const Envelope e = Envelope::build<schemas::Activations>([&](schemas::Activations::Builder b) {
      const int64_t shape[2] = {rows, width};
      set_tensor_f32(b.initHidden(), shape, v);
    });
    auto time_it = [&](bool checksum) {
      EncodeOptions opts;
      opts.compress_threshold = SIZE_MAX;
      opts.checksum = checksum;
      return median_of(5, [&] {
        const std::vector<uint8_t> f = e.encode(opts);
        auto back = Envelope::decode(f.data(), f.size());
        if (!back) std::abort();
      });
    };
    const double plain = time_it(false), crc = time_it(true);
    const double mib = static_cast<double>(e.flat_size()) / (1 << 20);
    std::printf("%10.1f %10.2f %10.2f %7.1f%%\n", mib, 1e3 * plain, 1e3 * crc, 100.0 * (crc / plain - 1));
    crc_rows.push_back({mib, plain, crc});
  }

  if (!json.empty()) {
    std::ofstream f(json);
    f << "{\"steps\":" << steps << ",\"step_deadline_s\":" << deadline << ",\"runs\":[";
    for (size_t i = 0; i < results.size(); ++i) {
      const auto& r = results[i];
      const auto& s = r.summary;
      f << (i ? "," : "") << "{\"name\":\"" << r.name << "\",\"faults\":" << r.faults << ",\"replays\":" << s.replays
        << ",\"lost_s\":" << s.lost_seconds() << ",\"wall_s\":" << s.wall_seconds << ",\"goodput\":" << s.goodput()
        << ",\"bitwise\":" << (r.bitwise ? "true" : "false") << ",\"mttr_ms\":{";
      bool first = true;
      for (const auto& [role, rep] : s.repairs) {
        f << (first ? "" : ",") << "\"" << role << "\":" << 1e3 * rep.mean();
        first = false;
      }
      f << "}}";
    }
    f << "],\"crc\":[";
    for (size_t i = 0; i < crc_rows.size(); ++i)
      f << (i ? "," : "") << "{\"mib\":" << crc_rows[i].mib << ",\"plain_ms\":" << 1e3 * crc_rows[i].plain
        << ",\"crc_ms\":" << 1e3 * crc_rows[i].crc << "}";
    f << "]}\n";
  }
  bool ok = true;
  for (const auto& r : results) ok = ok && r.bitwise;
  return ok ? 0 : 1;
}
