// bench_pipeline_real: step time of the actor runtime (actors/runtime.hpp) on
// this machine (1 device sequential; 2 devices 1F1B, DualPipe, DualPipeV,
// ZB-H1, ...), quickstart model (model::ModelConfig defaults), addition data,
// batch 16, host backend, 1 OpenBLAS thread per device, against
// model::Trainer on one device in the same run; runtime rows use one
// optimizer shard per device. Every engine is built first,
// warmed up (2 steps), then stepped round-robin (one step each per round) so
// that load drift on a shared machine hits all of them alike; the table shows
// the median over the rounds (and the fastest step, the least disturbed).
//
// Derived columns:
//   speedup   = trainer median / engine median
//   overhead  = (runtime sequential, 1 device) / trainer - 1: what the actors,
//               envelopes and copies cost when nothing runs in parallel
//   ceiling   = the best speedup the schedule allows as the runtime runs it:
//               its op lists on actors/pipeline_sim with F = 1, a full
//               backward BW = 2 per stage, split into B = 1 (input
//               gradients) and W = 1 (weight gradients, deferred: the
//               runtime runs them as separate ops) and FB = F + BW (F and B
//               are not overlapped), no latency;
//               ceiling = (sum of all op costs) / makespan.
//   envelopes = pipeline Envelopes per step (activations + gradients) counted
//               from the op lists the stage actors execute; "msgs" adds the
//               rest of the protocol of actors/context.hpp (data,
//               start, loss, grad/param slices, norms, step-ok, device
//               completions), derived from that description, not counted:
//               the runtime has no message counter.
//
//   bench_pipeline_real [--steps N] [--warmup N] [--json PATH] [--only SUBSTRING] [--trace-dir DIR]
//                       [--caf-stealing]
// --only keeps the Trainer (the baseline) and the runtime rows whose name
// contains SUBSTRING (for profiling one engine with perf); it prints the
// table only (no summary, no JSON). --trace-dir records each runtime's device
// trace and writes it as DIR/<engine>.json (Chrome trace, actors/device/trace.hpp).
// The "no B/W split" rows run zb1p and dualpipe with
// RuntimeOptions::split_backward = false (every B the full backward, W
// empty), so the split's before/after is a same-run ratio.
// --caf-stealing adds the first four runtime rows again on CAF's default
// work-stealing scheduler (TROUPE_CAF_SCHEDULER=stealing, see
// actors/transport/caf_scheduler.hpp), stepped in the same rounds: before/after in one
// run, so load drift on a shared machine hits both alike.
#include <sys/resource.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "bench/bench_stats.hpp"
#include "kernels/blas_core.hpp"
#include "actors/schedule/pipeline_sim.hpp"
#include "actors/runtime.hpp"
#include "actors/schedule/schedule.hpp"
#include "model/trainer.hpp"

using namespace troupe;

namespace {

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

struct Engine {
  std::string name;
  std::string schedule;  // "" for the Trainer
  int stages = 1, devices = 1;
  int64_t microbatches = 4;
  std::function<void()> step;
  std::vector<double> times;
  double user_s = 0, sys_s = 0;  // process CPU time spent during this engine's timed steps
  // Derived from the schedule (0 for the Trainer).
  double ceiling = 1.0;
  int64_t pipeline_envelopes = 0, local_handoffs = 0, messages = 0;
};

model::TrainOptions base_options(int64_t microbatches) {
  model::TrainOptions t;  // ModelConfig defaults = the quickstart model
  t.data.source = troupe::model::DataKind::addition;
  t.data.batch_size = 16;
  t.microbatches = microbatches;
  t.steps = 1000;  // the LR schedule's span; only a few steps run
  t.eval_every = 0;
  t.backend.kind = kernels::BackendKind::host;
  t.backend.threads = 1;
  return t;
}

// Ceiling, pipeline envelopes and an estimate of all actor messages per step
// for one replica and `shards` optimizer shards (see the comment at the top).
void derive(Engine& e, int shards) {
  const sched::Kind kind = sched::parse_kind(e.schedule);
  const int C = static_cast<int>(e.microbatches);
  const sched::Layout sl = sched::make_layout(kind, e.stages, C);
  const auto ops = sched::make_all_schedules(kind, e.stages, C);
  const sched::OpCosts costs{.f = 1, .b = 2, .w = 1, .fb = 3, .latency = 0};
  const sched::SimResult sim = sched::simulate(ops, costs);
  if (!sim.completed) throw std::runtime_error("simulation of " + e.name + " failed: " + sim.error + sim.deadlock);
  double work = 0;
  int64_t nops = 0;
  for (size_t r = 0; r < ops.size(); ++r) {
    work += sim.busy[r];
    for (const sched::Op& op : ops[r]) {
      ++nops;
      for (const sched::Msg& m : op.send) (m.peer == static_cast<int>(r) ? e.local_handoffs : e.pipeline_envelopes) += 1;
    }
  }
  e.ceiling = work / sim.makespan;
  const int64_t P = e.stages, S = shards, forwards = static_cast<int64_t>(C) * sl.num_stages;
  e.messages = C                          // data micro-batches
               + P                        // start
               + forwards                 // one loss report per forward
               + e.pipeline_envelopes + e.local_handoffs
               + P + S + S + S * P + P    // grad slices (>= 1 per rank), gnorm, clip, param slices, step-ok
               + 2                        // step request + reply
               + nops + P + P + 2 * S;    // device completions: per op, grad upload, param load, shard (norm, AdamW)
}

// Process CPU time (user, system) so far, all threads.
std::pair<double, double> cpu_times() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto sec = [](const timeval& t) { return static_cast<double>(t.tv_sec) + 1e-6 * static_cast<double>(t.tv_usec); };
  return {sec(u.ru_utime), sec(u.ru_stime)};
}

using troupe::bench::median;

using troupe::bench::load_average;

}  // namespace

int main(int argc, char** argv) {
  troupe::kernels::configure_openblas(argv);  // OpenBLAS set up as `troupe` runs it
  int steps = 10, warmup = 2;
  std::string json = "bench_pipeline_real.json";
  std::string only, trace_dir;
  bool caf_stealing = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> std::string {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--steps") steps = std::atoi(next().c_str());
    else if (a == "--warmup") warmup = std::atoi(next().c_str());
    else if (a == "--json") json = next();
    else if (a == "--only") only = next();
    else if (a == "--trace-dir") trace_dir = next();
    else if (a == "--caf-stealing") caf_stealing = true;
    else {
      std::fprintf(stderr, "usage: bench_pipeline_real [--steps N] [--warmup N] [--json PATH] [--only SUBSTRING] [--trace-dir DIR] [--caf-stealing]\n");
      return 2;
    }
  }
  if (steps < 1 || warmup < 0) {
    std::fprintf(stderr, "--steps must be >= 1 and --warmup >= 0\n");
    return 2;
  }

  try {
    std::vector<Engine> engines;
    std::vector<std::unique_ptr<model::Trainer>> trainers;
    std::vector<std::unique_ptr<runtime::Runtime>> runtimes;
    {
      Engine e;
      e.name = "trainer, 1 device";
      trainers.push_back(std::make_unique<model::Trainer>(base_options(4)));
      model::Trainer* t = trainers.back().get();
      e.step = [t] { t->step(); };
      engines.push_back(std::move(e));
    }
    // One ZeRO-1 optimizer shard per device (as launch/specs/pipeline_1f1b.toml
    // does), so that the optimizer step is split over the devices.
    struct Spec { std::string name, schedule; int stages, devices; int64_t mb; int shards; bool stealing = false; bool split = true; };
    std::vector<Spec> specs = {
        {"runtime sequential, 1 dev", "sequential", 1, 1, 4, 1},
        {"runtime 1f1b, 2 dev", "1f1b", 2, 2, 4, 2},
        {"runtime dualpipe, 2 dev", "dualpipe", 2, 2, 4, 2},
        {"runtime dualpipev, 2 dev", "dualpipev", 2, 2, 4, 2},
        {"runtime zb1p, 2 dev", "zb1p", 2, 2, 4, 2},
        // The same without the B/W split (B runs the full backward, W is
        // empty: the runtime before the split), stepped in the same rounds.
        {"runtime zb1p, 2 dev, no B/W split", "zb1p", 2, 2, 4, 2, false, false},
        {"runtime dualpipe, 2 dev, no B/W split", "dualpipe", 2, 2, 4, 2, false, false},
        // Extra rows: the same 2-stage split on one device (the pipeline's
        // messages without the parallelism), 8 micro-batches (a higher
        // ceiling, smaller matmuls), and 1F1B with one optimizer shard (the
        // whole optimizer step on device 0, as this bench ran before).
        {"runtime 1f1b, 2 st on 1 dev", "1f1b", 2, 1, 4, 1},
        {"runtime 1f1b, 2 dev, mb 8", "1f1b", 2, 2, 8, 2},
        {"runtime 1f1b, 2 dev, 1 shard", "1f1b", 2, 2, 4, 1},
    };
    if (caf_stealing) {
      // The same runtimes on CAF's default scheduler (what the runtime used
      // before actors/transport/caf_scheduler.hpp), stepped in the same rounds.
      const std::vector<Spec> before = specs;
      for (size_t i = 0; i < 4; ++i) {
        Spec b = before[i];
        b.name += ", CAF steal";
        b.stealing = true;
        specs.push_back(b);
      }
    }
    for (const Spec& s : specs) {
      if (!only.empty() && s.name.find(only) == std::string::npos) continue;
      runtime::RuntimeOptions o;
      o.train = base_options(s.mb);
      o.schedule = sched::parse_kind(s.schedule);
      o.stages = s.stages;
      o.devices = s.devices;
      o.optimizer_shards = s.shards;
      o.record_trace = !trace_dir.empty();
      o.split_backward = s.split;
      Engine e;
      e.name = s.name;
      e.schedule = s.schedule;
      e.stages = s.stages;
      e.devices = s.devices;
      e.microbatches = s.mb;
      derive(e, s.shards);
      // The scheduler is read from the environment when the actor system is made.
      if (s.stealing) ::setenv("TROUPE_CAF_SCHEDULER", "stealing", 1);
      runtimes.push_back(std::make_unique<runtime::Runtime>(o));
      if (s.stealing) ::unsetenv("TROUPE_CAF_SCHEDULER");
      runtime::Runtime* r = runtimes.back().get();
      e.step = [r] { r->step(); };
      engines.push_back(std::move(e));
    }

    const std::string load_before = load_average();
    for (int w = 0; w < warmup; ++w)
      for (Engine& e : engines) e.step();
    for (int s = 0; s < steps; ++s)
      for (Engine& e : engines) {
        const auto c0 = cpu_times();
        const double t0 = now();
        e.step();
        e.times.push_back(now() - t0);
        const auto c1 = cpu_times();
        e.user_s += c1.first - c0.first;
        e.sys_s += c1.second - c0.second;
      }
    const std::string load_after = load_average();
    if (!trace_dir.empty())
      for (size_t i = 0; i < runtimes.size(); ++i) {
        std::string file;
        for (char ch : engines[i + 1].name) file += std::isalnum(static_cast<unsigned char>(ch)) ? ch : '_';
        runtimes[i]->write_trace(trace_dir + "/" + file + ".json");
      }

    const double base = median(engines[0].times);
    std::printf("bench_pipeline_real: quickstart model, addition, batch 16, host backend, 1 OpenBLAS thread per device\n");
    std::printf("%d warm-up + %d timed steps per engine, round-robin; load average before: %s, after: %s\n\n",
                warmup, steps, load_before.c_str(), load_after.c_str());
    std::printf("%-38s %5s %8s %8s %8s %8s %8s %8s %9s %6s %6s\n", "engine", "mb", "med ms", "best ms", "speedup",
                "ceiling", "user ms", "sys ms", "envelopes", "local", "msgs");
    for (const Engine& e : engines) {
      const double med = median(e.times);
      const double best = *std::min_element(e.times.begin(), e.times.end());
      const double user = e.user_s / static_cast<double>(steps) * 1e3, sys = e.sys_s / static_cast<double>(steps) * 1e3;
      if (e.schedule.empty())
        std::printf("%-38s %5lld %8.1f %8.1f %8.2f %8s %8.1f %8.1f %9s %6s %6s\n", e.name.c_str(),
                    static_cast<long long>(e.microbatches), med * 1e3, best * 1e3, 1.0, "-", user, sys, "-", "-", "-");
      else
        std::printf("%-38s %5lld %8.1f %8.1f %8.2f %8.2f %8.1f %8.1f %9lld %6lld %6lld\n", e.name.c_str(),
                    static_cast<long long>(e.microbatches), med * 1e3, best * 1e3, base / med, e.ceiling, user, sys,
                    static_cast<long long>(e.pipeline_envelopes), static_cast<long long>(e.local_handoffs),
                    static_cast<long long>(e.messages));
    }
    if (!only.empty()) return 0;  // a partial run: no summary, no JSON
    const double overhead = median(engines[1].times) / base - 1.0;
    const double per_msg_us = (median(engines[1].times) - base) / static_cast<double>(engines[1].messages) * 1e6;
    std::printf("\nruntime overhead (sequential 1 dev / trainer - 1): %+.1f%% (%.1f ms per step)\n", overhead * 100,
                (median(engines[1].times) - base) * 1e3);
    std::printf("overhead / messages of that step (~%lld): %.0f us per message (an upper bound: copies of the\n"
                "parameter and gradient buffers into envelopes are counted in it too)\n",
                static_cast<long long>(engines[1].messages), per_msg_us);
    const double d = median(engines[3].times), f = median(engines[2].times);
    std::printf("dualpipe / 1f1b step time: %.2f\n", d / f);
    if (caf_stealing) {
      std::printf("CAF work-stealing (CAF's default) / work-sharing (the runtime's) step time:");
      for (size_t i = 0; i < 4; ++i)
        std::printf(" %s %.2f%s", engines[i + 1].schedule.c_str(),
                    median(engines[engines.size() - 4 + i].times) / median(engines[i + 1].times), i < 3 ? "," : "\n");
    }

    std::ostringstream js;
    js << "{\n  \"bench\": \"pipeline_real\",\n  \"steps\": " << steps << ",\n  \"warmup\": " << warmup
       << ",\n  \"load_before\": \"" << load_before << "\",\n  \"load_after\": \"" << load_after
       << "\",\n  \"overhead\": " << overhead << ",\n  \"overhead_us_per_message\": " << per_msg_us
       << ",\n  \"dualpipe_over_1f1b\": " << d / f << ",\n  \"engines\": [\n";
    for (size_t i = 0; i < engines.size(); ++i) {
      const Engine& e = engines[i];
      js << "    {\"name\": \"" << e.name << "\", \"schedule\": \"" << (e.schedule.empty() ? "trainer" : e.schedule)
         << "\", \"stages\": " << e.stages << ", \"devices\": " << e.devices << ", \"microbatches\": " << e.microbatches
         << ", \"median_s\": " << median(e.times) << ", \"best_s\": " << *std::min_element(e.times.begin(), e.times.end())
         << ", \"speedup\": " << base / median(e.times) << ", \"user_cpu_s_per_step\": " << e.user_s / steps
         << ", \"sys_cpu_s_per_step\": " << e.sys_s / steps << ", \"ceiling\": " << e.ceiling
         << ", \"pipeline_envelopes\": " << e.pipeline_envelopes << ", \"local_handoffs\": " << e.local_handoffs
         << ", \"messages_derived\": " << e.messages << ", \"times_s\": [";
      for (size_t k = 0; k < e.times.size(); ++k) js << (k ? ", " : "") << e.times[k];
      js << "]}" << (i + 1 < engines.size() ? "," : "") << "\n";
    }
    js << "  ]\n}\n";
    std::ofstream out(json);
    if (!out) throw std::runtime_error("cannot write " + json);
    out << js.str();
    std::printf("wrote %s\n", json.c_str());
  } catch (const std::exception& ex) {
    std::fprintf(stderr, "bench_pipeline_real: %s\n", ex.what());
    return 1;
  }
  return 0;
}
