// bench_sim_actors: how long it takes to simulate one training step of a
// 1,024-device topology (PP 32 x DP 32) through the sim actors
// (actors/sim/sim_runtime.hpp: one CAF actor per device, Envelopes between them)
// vs the discrete-event simulator (actors/schedule/pipeline_sim.hpp) on the same op
// lists and costs, measured in the same run; and whether both give the same
// virtual step time and per-device busy times (they must).
// Prints a table and writes JSON (argv[1], default bench_sim_actors.json).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "actors/schedule/pipeline_sim.hpp"
#include "actors/sim/sim_runtime.hpp"

using namespace troupe;

namespace {

using Clock = std::chrono::steady_clock;

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

struct Row {
  std::string schedule;
  int pp, dp, chunks;
  uint64_t messages;          // between devices, one step
  int64_t actor_step_ns;      // virtual
  double des_step;            // virtual, from the DES
  bool equal;                 // step time and every device's busy time agree
  double actor_step_s;        // wall, median over steps after the first
  double actor_first_step_s;  // wall, first step (cold mailboxes and maps)
  double actor_total_s;       // wall, whole simulate(): spawn, steps, shutdown
  double des_s;               // wall, DES of all DP pipelines, median
};

Row run(sched::Kind kind, int pp, int dp, int chunks, int steps, int reps) {
  const sim::StageCost cost{2000, 3000, 1000};  // ns: F, full B, W
  const int64_t latency = 100;
  Row r{std::string(sched::to_string(kind)), pp, dp, chunks, 0, 0, 0, true, 0, 0, 0, 0};

  sim::SimOptions o;
  o.kind = kind;
  o.stages = pp;
  o.chunks = chunks;
  o.replicas = dp;
  o.steps = steps;
  o.stage_costs = {cost};
  o.link_latency_ns = latency;
  o.d_model = 4096;
  std::vector<double> step_s, first_s, total_s;
  sim::SimResult a;
  for (int rep = 0; rep < reps; ++rep) {
    a = sim::simulate(o);
    if (!a.completed) {
      std::printf("%s: actor simulation failed: %s\n", r.schedule.c_str(), a.error.c_str());
      r.equal = false;
      return r;
    }
    first_s.push_back(a.steps.front().wall_seconds);
    for (size_t s = 1; s < a.steps.size(); ++s) step_s.push_back(a.steps[s].wall_seconds);
    total_s.push_back(a.wall_seconds);
  }
  r.messages = a.steps.front().messages;
  r.actor_step_ns = a.makespan;
  r.actor_step_s = median(step_s);
  r.actor_first_step_s = median(first_s);
  r.actor_total_s = median(total_s);

  // The DES: every data-parallel pipeline on its own (they only meet at the
  // optimizer step), op lists built beforehand as the actors' are.
  sched::OpCosts oc;
  oc.f = double(cost.f), oc.b = double(cost.b), oc.w = double(cost.w), oc.fb = double(cost.f + cost.b);
  oc.latency = double(latency);
  const auto lists = sched::make_all_schedules(kind, pp, chunks);
  std::vector<double> des_s;
  sched::SimResult d;
  for (int rep = 0; rep < reps * steps; ++rep) {
    const auto t0 = Clock::now();
    for (int g = 0; g < dp; ++g) d = sched::simulate(lists, oc);
    des_s.push_back(std::chrono::duration<double>(Clock::now() - t0).count());
  }
  r.des_s = median(des_s);
  r.des_step = d.makespan;
  r.equal = d.completed && double(a.makespan) == d.makespan;
  for (int dev = 0; dev < a.devices && r.equal; ++dev) r.equal = double(a.busy[dev]) == d.busy[dev % pp];
  return r;
}

}  // namespace

int main(int argc, char** argv) {
  const std::string out = argc > 1 ? argv[1] : "bench_sim_actors.json";
  std::vector<Row> rows;
  for (sched::Kind k : {sched::Kind::one_f_one_b, sched::Kind::zb1p, sched::Kind::dualpipe, sched::Kind::dualpipev})
    rows.push_back(run(k, 32, 32, 64, 4, 3));

  std::printf("\n1,024 sim devices (PP 32 x DP 32, C = 64 per replica; F=2 B=3 W=1 us, latency 0.1 us)\n");
  std::printf("wall times: actor step = median of steps 2-4 of 3 runs; DES = all 32 pipelines, median of 12\n");
  std::printf("%-10s %4s %4s %4s %9s %12s %6s %11s %11s %11s %9s %9s\n", "schedule", "PP", "DP", "C", "msgs/step",
              "step (virt)", "equal", "actor ms", "1st step ms", "actor tot s", "DES ms", "actor/DES");
  for (const Row& r : rows)
    std::printf("%-10s %4d %4d %4d %9llu %9.3f ms %6s %11.2f %11.2f %11.3f %9.2f %9.1f\n", r.schedule.c_str(), r.pp,
                r.dp, r.chunks, static_cast<unsigned long long>(r.messages), double(r.actor_step_ns) / 1e6,
                r.equal ? "yes" : "NO", 1e3 * r.actor_step_s, 1e3 * r.actor_first_step_s, r.actor_total_s,
                1e3 * r.des_s, r.actor_step_s / r.des_s);

  std::ofstream o(out);
  o << "{\n  \"bench\": \"sim_actors\",\n  \"costs_ns\": {\"F\": 2000, \"B\": 3000, \"W\": 1000, \"latency\": 100},\n"
    << "  \"rows\": [\n";
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    o << "    {\"schedule\": \"" << r.schedule << "\", \"pp\": " << r.pp << ", \"dp\": " << r.dp
      << ", \"chunks\": " << r.chunks << ", \"messages_per_step\": " << r.messages
      << ", \"virtual_step_ns\": " << r.actor_step_ns << ", \"des_step_ns\": " << r.des_step
      << ", \"equal\": " << (r.equal ? "true" : "false") << ", \"actor_step_seconds\": " << r.actor_step_s
      << ", \"actor_first_step_seconds\": " << r.actor_first_step_s << ", \"actor_total_seconds\": " << r.actor_total_s
      << ", \"des_step_seconds\": " << r.des_s << "}" << (i + 1 < rows.size() ? ",\n" : "\n");
  }
  o << "  ]\n}\n";
  std::printf("\nwrote %s\n", out.c_str());
  bool all_equal = true;
  for (const Row& r : rows) all_equal = all_equal && r.equal;
  return o && all_equal ? 0 : 1;
}
