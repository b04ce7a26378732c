// bench_pipeline_sim: pipeline schedules on the discrete-event simulator.
//   1. measured bubble vs the published formula, every schedule, PP up to 32,
//      with costs that meet the formulas' conditions (F=2 B=3 W=1 FB=4);
//   2. the same with costs that do not (F=3 B=5 W=1 FB=7): 1F1B and ZB-H1
//      still match, the DualPipe family does not, and the table says by how much;
//   3. 1,024 simulated devices: PP 32 x 32 data-parallel pipelines with seeded
//      per-device speed jitter, and one PP=1024 pipeline; wall time to generate
//      the op lists and to simulate one step.
// Prints tables and writes JSON (argv[1], default bench_pipeline_sim.json).
//
// Bubble = makespan - busy time of the least busy rank (pipeline_sim.hpp);
// DualPipeV formulas use the README's PP = stages = 2 x ranks.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "actors/schedule/pipeline_sim.hpp"
#include "actors/schedule/schedule.hpp"

using namespace troupe::sched;

namespace {

using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

double formula(Kind kind, int ranks, int chunks, const OpCosts& c) {
  switch (kind) {
    case Kind::sequential: return double(chunks) * (ranks - 1) * (c.f + c.b);
    case Kind::one_f_one_b: return (ranks - 1) * (c.f + c.b);
    case Kind::zb1p: return (ranks - 1) * (c.f + c.b - 2 * c.w);
    case Kind::dualpipe: return (ranks / 2 - 1) * (c.fb + c.b - 3 * c.w);
    case Kind::dualpipev: return ((2 * ranks) / 2 - 1) * (c.fb + c.b - 3 * c.w);
  }
  return 0;
}

const char* formula_text(Kind kind) {
  switch (kind) {
    case Kind::sequential: return "C(PP-1)(F+B)";
    case Kind::one_f_one_b: return "(PP-1)(F+B)";
    case Kind::zb1p: return "(PP-1)(F+B-2W)";
    case Kind::dualpipe: return "(PP/2-1)(FB+B-3W)";
    case Kind::dualpipev: return "(S/2-1)(FB+B-3W), S=2PP";
  }
  return "";
}

struct Row {
  std::string schedule;
  int ranks, stages, chunks;
  double makespan, bubble_max, bubble_min, formula, bubble_share;
};

std::vector<Row> bubble_table(const OpCosts& c, const char* title) {
  std::printf("\n%s (F=%g B=%g W=%g FB=%g, latency 0)\n", title, c.f, c.b, c.w, c.fb);
  std::printf("%-10s %4s %6s %5s %9s %9s %9s %9s %6s %7s\n", "schedule", "PP", "stages", "C",
              "makespan", "bubble", "min rank", "formula", "match", "idle %");
  std::vector<Row> rows;
  for (Kind kind : {Kind::sequential, Kind::one_f_one_b, Kind::zb1p, Kind::dualpipe, Kind::dualpipev})
    for (int pp : {2, 4, 8, 16, 32}) {
      const int chunks = 2 * pp;  // valid for every kind, >= 2PP for the DualPipe family
      const Layout l = make_layout(kind, pp, chunks);
      const SimResult res = simulate(make_all_schedules(kind, pp, chunks), c);
      if (!res.completed) {
        std::printf("%s pp=%d: did not complete: %s%s\n", std::string(to_string(kind)).c_str(), pp,
                    res.error.c_str(), res.deadlock.c_str());
        continue;
      }
      Row r{std::string(to_string(kind)), pp, l.num_stages, chunks, res.makespan, res.max_bubble(),
            res.min_bubble(), formula(kind, pp, chunks, c), 0};
      r.bubble_share = r.bubble_max / r.makespan;
      const bool match = std::fabs(r.bubble_max - r.formula) < 1e-9;
      std::printf("%-10s %4d %6d %5d %9g %9g %9g %9g %6s %6.1f%%\n", r.schedule.c_str(), pp,
                  r.stages, chunks, r.makespan, r.bubble_max, r.bubble_min, r.formula,
                  match ? "yes" : "NO", 100 * r.bubble_share);
      rows.push_back(r);
    }
  return rows;
}

struct BigRun {
  std::string what, schedule;
  int devices, pp, dp, chunks;
  size_t ops;
  double gen_s, sim_s, step_time, ideal_step_time, mean_group_time;
};

// PP x DP devices: DP independent pipelines (they only meet at the gradient
// reduction after the step), each device with a seeded speed factor in
// [0.95, 1.05]; the step ends when the slowest pipeline ends.
BigRun data_parallel_run(Kind kind, int pp, int dp, int chunks, const OpCosts& c, int reps) {
  BigRun b{"PP x DP", std::string(to_string(kind)), pp * dp, pp, dp, chunks, 0, 0, 0, 0, 0, 0};
  std::mt19937_64 rng(20240531);
  std::uniform_real_distribution<double> jitter(0.95, 1.05);
  std::vector<std::vector<double>> scale(dp, std::vector<double>(pp));
  for (auto& g : scale)
    for (double& s : g) s = jitter(rng);
  std::vector<double> gen, sim;
  for (int rep = 0; rep < reps; ++rep) {
    auto t0 = Clock::now();
    // Every pipeline has the same op lists; the runtime would build one per
    // group, so the timing does too.
    std::vector<std::vector<std::vector<Op>>> lists(dp);
    for (int g = 0; g < dp; ++g) lists[g] = make_all_schedules(kind, pp, chunks);
    gen.push_back(seconds_since(t0));
    t0 = Clock::now();
    double worst = 0, sum = 0;
    b.ops = 0;
    for (int g = 0; g < dp; ++g) {
      SimOptions opt;
      opt.rank_scale = scale[g];
      const SimResult res = simulate(lists[g], c, opt);
      if (!res.completed) std::printf("group %d did not complete: %s\n", g, res.error.c_str());
      worst = std::max(worst, res.makespan);
      sum += res.makespan;
      b.ops += res.ops_run;
    }
    sim.push_back(seconds_since(t0));
    b.step_time = worst;
    b.mean_group_time = sum / dp;
  }
  b.ideal_step_time = simulate(make_all_schedules(kind, pp, chunks), c).makespan;
  std::sort(gen.begin(), gen.end());
  std::sort(sim.begin(), sim.end());
  b.gen_s = gen[gen.size() / 2];
  b.sim_s = sim[sim.size() / 2];
  return b;
}

BigRun single_pipeline_run(Kind kind, int pp, int chunks, const OpCosts& c, int reps) {
  BigRun b{"one pipeline", std::string(to_string(kind)), pp, pp, 1, chunks, 0, 0, 0, 0, 0, 0};
  std::vector<double> gen, sim;
  for (int rep = 0; rep < reps; ++rep) {
    auto t0 = Clock::now();
    const auto lists = make_all_schedules(kind, pp, chunks);
    gen.push_back(seconds_since(t0));
    t0 = Clock::now();
    const SimResult res = simulate(lists, c);
    sim.push_back(seconds_since(t0));
    if (!res.completed) std::printf("did not complete: %s\n", res.error.c_str());
    b.ops = res.ops_run;
    b.step_time = b.ideal_step_time = b.mean_group_time = res.makespan;
  }
  std::sort(gen.begin(), gen.end());
  std::sort(sim.begin(), sim.end());
  b.gen_s = gen[gen.size() / 2];
  b.sim_s = sim[sim.size() / 2];
  return b;
}

void print_big(const std::vector<BigRun>& runs) {
  std::printf("\n1,024 simulated devices (F=2 B=3 W=1 FB=4; PPxDP: per-device speed x[0.95,1.05], seed 20240531)\n");
  std::printf("%-13s %-10s %5s %4s %5s %9s %9s %9s %9s %10s %10s\n", "run", "schedule", "PP", "DP",
              "C", "ops", "step", "no jitter", "gen ms", "sim ms", "Mops/s");
  for (const BigRun& b : runs)
    std::printf("%-13s %-10s %5d %4d %5d %9zu %9.1f %9.1f %9.2f %10.2f %10.2f\n", b.what.c_str(),
                b.schedule.c_str(), b.pp, b.dp, b.chunks, b.ops, b.step_time, b.ideal_step_time,
                1e3 * b.gen_s, 1e3 * b.sim_s, b.ops / b.sim_s / 1e6);
}

void json_rows(std::ostream& o, const std::vector<Row>& rows) {
  for (size_t i = 0; i < rows.size(); ++i) {
    const Row& r = rows[i];
    o << "    {\"schedule\": \"" << r.schedule << "\", \"pp\": " << r.ranks << ", \"stages\": " << r.stages
      << ", \"chunks\": " << r.chunks << ", \"makespan\": " << r.makespan << ", \"bubble\": " << r.bubble_max
      << ", \"bubble_min_rank\": " << r.bubble_min << ", \"formula\": " << r.formula
      << ", \"formula_text\": \"" << formula_text(parse_kind(r.schedule)) << "\", \"match\": "
      << (std::fabs(r.bubble_max - r.formula) < 1e-9 ? "true" : "false") << "}"
      << (i + 1 < rows.size() ? ",\n" : "\n");
  }
}

void json_costs(std::ostream& o, const OpCosts& c) {
  o << "{\"F\": " << c.f << ", \"B\": " << c.b << ", \"W\": " << c.w << ", \"FB\": " << c.fb
    << ", \"latency\": " << c.latency << "}";
}

}  // namespace

int main(int argc, char** argv) {
  const std::string out = argc > 1 ? argv[1] : "bench_pipeline_sim.json";
  OpCosts ok;  // F == B - W: the DualPipe formula's condition holds
  ok.f = 2, ok.b = 3, ok.w = 1, ok.fb = 4;
  OpCosts off;  // F != B - W
  off.f = 3, off.b = 5, off.w = 1, off.fb = 7;

  const auto rows_ok = bubble_table(ok, "Bubble vs formula, costs meeting every formula's conditions");
  const auto rows_off = bubble_table(off, "Bubble vs formula, F != B-W (DualPipe's formula assumes F == B-W)");

  std::vector<BigRun> big;
  for (Kind kind : {Kind::one_f_one_b, Kind::zb1p, Kind::dualpipe, Kind::dualpipev})
    big.push_back(data_parallel_run(kind, 32, 32, 128, ok, 5));
  big.push_back(single_pipeline_run(Kind::one_f_one_b, 1024, 2048, ok, 3));
  big.push_back(single_pipeline_run(Kind::dualpipe, 1024, 2048, ok, 3));
  print_big(big);

  std::ofstream o(out);
  o << "{\n  \"bench\": \"pipeline_sim\",\n  \"bubble_definition\": \"makespan - busy time of the least busy rank; all ranks start at 0; latency 0\",\n";
  o << "  \"costs_matching\": ";
  json_costs(o, ok);
  o << ",\n  \"rows_matching\": [\n";
  json_rows(o, rows_ok);
  o << "  ],\n  \"costs_off_condition\": ";
  json_costs(o, off);
  o << ",\n  \"rows_off_condition\": [\n";
  json_rows(o, rows_off);
  o << "  ],\n  \"large\": [\n";
  for (size_t i = 0; i < big.size(); ++i) {
    const BigRun& b = big[i];
    o << "    {\"run\": \"" << b.what << "\", \"schedule\": \"" << b.schedule << "\", \"devices\": " << b.devices
      << ", \"pp\": " << b.pp << ", \"dp\": " << b.dp << ", \"chunks\": " << b.chunks << ", \"ops\": " << b.ops
      << ", \"step_time\": " << b.step_time << ", \"step_time_no_jitter\": " << b.ideal_step_time
      << ", \"mean_pipeline_time\": " << b.mean_group_time << ", \"generate_seconds\": " << b.gen_s
      << ", \"simulate_seconds\": " << b.sim_s << "}" << (i + 1 < big.size() ? ",\n" : "\n");
  }
  o << "  ]\n}\n";
  std::printf("\nwrote %s\n", out.c_str());
  return o ? 0 : 1;
}
