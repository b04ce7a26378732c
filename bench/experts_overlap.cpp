// bench_experts_overlap: step time of the actor runtime with expert shards,
// quickstart model (model::ModelConfig defaults: 8 experts top-2, d_model
// 128, 4 layers, seq 128), addition data, batch 16 in 4 micro-batches,
// DualPipe or 1F1B over 2 host devices (1 OpenBLAS thread each), 2 optimizer
// shards, each schedule:
//   trainer        model::Trainer, one device (reference)
//   in-stage       runtime, experts inside the stage actors (expert_shards 0)
//   shards+overlap runtime, 4 expert-shard actors per MoE layer; while a
//                  part waits for its experts the device runs other ready
//                  work (the other part of a DualPipe FB pair, the next op)
//   shards serial  the same without overlap (RuntimeOptions::overlap =
//                  false: ops and the parts of an FB pair one at a time)
// Every engine is built, warmed up, then stepped round-robin (one step each
// per round) so load drift on a shared machine hits all alike; the table
// shows the median step and ratios measured in this run:
//   overlap gain  = (shards serial) / (shards+overlap) median
//   vs in-stage   = (in-stage, same schedule) / (engine) median
//
//   bench_experts_overlap [--steps N] [--warmup N] [--json PATH]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "bench/bench_stats.hpp"
#include "kernels/blas_core.hpp"
#include "actors/runtime.hpp"
#include "model/trainer.hpp"

using namespace troupe;

namespace {

double now() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

using troupe::bench::median;

struct Engine {
  std::string name;
  std::function<void()> step;
  std::vector<double> times;
};

}  // namespace

int main(int argc, char** argv) {
  troupe::kernels::configure_openblas(argv);  // OpenBLAS set up as `troupe` runs it
  int steps = 10, warmup = 2;
  std::string json = "bench_experts_overlap.json";
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    auto next = [&]() -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "%s needs a value\n", a.c_str());
        std::exit(2);
      }
      return argv[++i];
    };
    if (a == "--steps") steps = std::atoi(next());
    else if (a == "--warmup") warmup = std::atoi(next());
    else if (a == "--json") json = next();
    else {
      std::fprintf(stderr, "usage: bench_experts_overlap [--steps N] [--warmup N] [--json PATH]\n");
      return 2;
    }
  }
  runtime::RuntimeOptions o;
  auto& t = o.train;
  t.data.source = troupe::model::DataKind::addition;
  t.data.digits = 3;
  t.data.batch_size = 16;
  t.microbatches = 4;
  t.steps = 1000;  // the LR schedule's horizon; only a few are run
  t.eval_every = 0;
  t.backend.threads = 1;
  o.schedule = sched::Kind::dualpipe;
  o.stages = 2;
  o.devices = 2;
  o.optimizer_shards = 2;

  std::vector<std::unique_ptr<model::Trainer>> trainers;
  std::vector<std::unique_ptr<runtime::Runtime>> runtimes;
  std::vector<Engine> engines;
  trainers.push_back(std::make_unique<model::Trainer>(t));
  engines.push_back({"trainer (1 device)", [tr = trainers.back().get()] { tr->step(); }, {}});
  struct Variant {
    const char* name;
    const char* schedule;
    int shards;
    bool overlap;
  };
  for (const Variant& v : {Variant{"dualpipe, experts in-stage", "dualpipe", 0, true},
                           Variant{"dualpipe, 4 shards+overlap", "dualpipe", 4, true},
                           Variant{"dualpipe, 4 shards serial", "dualpipe", 4, false},
                           Variant{"1f1b, experts in-stage", "1f1b", 0, true},
                           Variant{"1f1b, 4 shards+overlap", "1f1b", 4, true},
                           Variant{"1f1b, 4 shards serial", "1f1b", 4, false}}) {
    o.schedule = sched::parse_kind(v.schedule);
    o.expert_shards = v.shards;
    o.overlap = v.overlap;
    runtimes.push_back(std::make_unique<runtime::Runtime>(o));
    engines.push_back({v.name, [rt = runtimes.back().get()] { rt->step(); }, {}});
  }
  for (int w = 0; w < warmup; ++w)
    for (Engine& e : engines) e.step();
  for (int s = 0; s < steps; ++s)
    for (Engine& e : engines) {
      const double t0 = now();
      e.step();
      e.times.push_back(now() - t0);
    }
  const double tokens = static_cast<double>(t.data.batch_size * t.model.seq_len);
  const double overlap = median(engines[2].times), serial = median(engines[3].times);
  const double overlap_1f1b = median(engines[5].times), serial_1f1b = median(engines[6].times);
  std::printf("bench_experts_overlap: %d rounds after %d warm-up, 2 devices, 2 stages, 4 microbatches\n", steps, warmup);
  std::printf("%-30s %12s %12s %10s %12s\n", "engine", "median ms", "fastest ms", "tok/s", "vs in-stage");
  std::ofstream out(json);
  out << "{\"bench\":\"experts_overlap\",\"steps\":" << steps << ",\"engines\":[";
  for (size_t i = 0; i < engines.size(); ++i) {
    const Engine& e = engines[i];
    const double m = median(e.times), f = *std::min_element(e.times.begin(), e.times.end());
    const double in_stage = median(engines[i < 4 ? 1 : 4].times);  // same schedule, experts in the stages
    std::printf("%-30s %12.1f %12.1f %10.0f %12.2f\n", e.name.c_str(), 1e3 * m, 1e3 * f, tokens / m, in_stage / m);
    out << (i ? "," : "") << "{\"name\":\"" << e.name << "\",\"median_s\":" << m << ",\"fastest_s\":" << f
        << ",\"tokens_per_s\":" << tokens / m << "}";
  }
  out << "],\"overlap_gain_dualpipe\":" << serial / overlap << ",\"overlap_gain_1f1b\":" << serial_1f1b / overlap_1f1b
      << "}\n";
  std::printf("overlap gain (serial / overlap): dualpipe %.3f, 1f1b %.3f\n", serial / overlap, serial_1f1b / overlap_1f1b);
  std::printf("JSON: %s\n", json.c_str());
  return 0;
}
