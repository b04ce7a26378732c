// run.mode = "rl" on sim devices: synchronous against decoupled RL on the
// virtual clock of actors/sim/rl_sim.hpp (`troupe validate` prints the
// model, `troupe run` the comparison table and metrics lines). No math runs.
#include <cstdio>
#include <spdlog/spdlog.h>

#include "actors/sim/rl_sim.hpp"
#include "actors/sim/sim_costs.hpp"
#include "launch/observe/progress.hpp"
#include "launch/sim_plan.hpp"

namespace troupe::launch {
namespace {

double sec(int64_t ns) { return static_cast<double>(ns) / 1e9; }

}  // namespace

sim::RlSimOptions rl_sim_options(const Spec& s) {
  sim::RlSimOptions o;
  o.devices = static_cast<int>(s.topology.devices);
  o.steps = static_cast<int>(s.run.steps);
  o.completions = s.rl.prompts_per_step * s.rl.group_size;
  o.max_tokens = s.sim.rl_max_tokens;
  o.mean_tokens = s.sim.rl_mean_tokens;
  o.sigma = s.sim.rl_sigma;
  o.slots = s.sim.rl_slots;
  o.decode_ns_per_token = sim::ms_to_ns(s.sim.rl_decode_ms_per_token);
  o.reward_ns = sim::ms_to_ns(s.sim.rl_reward_ms);
  o.train_ns_per_token = sim::ms_to_ns(s.sim.rl_train_ms_per_token);
  o.parallel_decode_ns_per_token = sim::ms_to_ns(s.sim.rl_parallel_decode_ms_per_token);
  o.parallel_train_ns_per_token = sim::ms_to_ns(s.sim.rl_parallel_train_ms_per_token);
  o.train_step_ns = sim::ms_to_ns(s.sim.rl_train_step_ms);
  o.sync_ns = sim::ms_to_ns(s.sim.rl_sync_ms);
  o.seed = static_cast<uint64_t>(s.run.seed);
  return o;
}

std::string format_rl_sim_plan(const Spec& s) {
  const sim::RlSimOptions o = rl_sim_options(s);
  char buf[1024];
  std::snprintf(buf, sizeof buf,
                "sim RL (timings only, no math): %d devices, %d step(s) of %lld completions (%lld prompts x %lld), "
                "lengths log-normal mean %g sigma %g capped at %lld tokens\n"
                "  decode %g ms per step for up to %lld sequences per device, reward %g ms per completion, "
                "train %g ms per token per device + %g ms a step, weight sync %g ms\n"
                "  with several devices in a phase at once: decode %g ms, train %g ms per token (0: as alone)\n"
                "  compares: synchronous (all devices generate, then all train) against decoupled fixed-lag "
                "eta = 0, 1, 2, 4 (generators and trainers split; the best split for each eta)\n",
                o.devices, o.steps, static_cast<long long>(o.completions), static_cast<long long>(s.rl.prompts_per_step),
                static_cast<long long>(s.rl.group_size), o.mean_tokens, o.sigma, static_cast<long long>(o.max_tokens),
                s.sim.rl_decode_ms_per_token, static_cast<long long>(o.slots), s.sim.rl_reward_ms,
                s.sim.rl_train_ms_per_token, s.sim.rl_train_step_ms, s.sim.rl_sync_ms,
                s.sim.rl_parallel_decode_ms_per_token, s.sim.rl_parallel_train_ms_per_token);
  return buf;
}

int run_rl_sim(const Spec& s, MetricsWriter& metrics) {
  const sim::RlSimOptions o = rl_sim_options(s);
  spdlog::info("sim RL on {} devices: synchronous against decoupled (eta 0, 1, 2, 4); no math runs, timings only",
               o.devices);
  std::vector<sim::RlSimResult> rows;
  rows.push_back(sim::simulate_synchronous(o));
  for (int eta : {0, 1, 2, 4}) {
    rows.push_back(sim::best_decoupled(o, eta));
    spdlog::info("simulated {}", rows.back().mode);
  }
  const double base = static_cast<double>(rows.front().makespan_ns);
  std::printf("\nsim RL summary (virtual time; no math ran): %d devices, %d steps of %lld completions\n", o.devices,
              o.steps, static_cast<long long>(o.completions));
  std::printf("  %-26s %10s %12s %9s %12s %12s %s\n", "topology", "gen/train", "step s", "speedup", "gen busy",
              "train busy", "version lag (share of completions at lag 0..eta)");
  for (const auto& r : rows) {
    std::string lag;
    int64_t all = 0;
    for (int64_t n : r.version_lag) all += n;
    for (size_t i = 0; i < r.version_lag.size(); ++i) {
      char b[32];
      std::snprintf(b, sizeof b, "%s%.2f", i ? " " : "", all ? static_cast<double>(r.version_lag[i]) / static_cast<double>(all) : 0.0);
      lag += b;
    }
    const double step_s = sec(r.makespan_ns) / o.steps;
    const double speedup = base / static_cast<double>(std::max<int64_t>(r.makespan_ns, 1));
    std::printf("  %-26s %4d/%-5d %12.3f %8.2fx %11.1f%% %11.1f%% %s\n", r.mode.c_str(), r.generators, r.trainers, step_s,
                speedup, 100 * r.generate_busy, 100 * r.train_busy, lag.c_str());
    metrics.write_line(JsonObject()
                           .add("type", std::string("sim_rl"))
                           .add("topology", r.mode)
                           .add("eta", static_cast<int64_t>(r.eta))
                           .add("generators", static_cast<int64_t>(r.generators))
                           .add("trainers", static_cast<int64_t>(r.trainers))
                           .add("step_seconds", step_s)
                           .add("speedup_vs_synchronous", speedup)
                           .add("generate_busy", r.generate_busy)
                           .add("train_busy", r.train_busy)
                           .str());
  }
  // The why, in the model's terms: three lower bounds on a step, set
  // against what was simulated. A synchronous step pays the latency of its
  // longest completion and then trains with nothing generating; decoupled,
  // eta + 1 steps' generations are in flight at once, so the latency bound
  // is shared by eta + 1 steps, and the step is bounded instead by the
  // generators' throughput or the trainers'.
  const auto first = sim::completion_lengths(o, 0);
  int64_t longest = 0, tokens = 0;
  for (int64_t l : first) {
    longest = std::max(longest, l);
    tokens += l;
  }
  auto train_s = [&](int trainers) { return sec(sim::train_step_ns(o, tokens, trainers)); };
  auto decode_ns = [&](int generators) { return sim::decode_ns_per_token(o, generators); };
  const double latency = sec(longest * decode_ns(o.devices) + o.reward_ns);
  std::printf("  why: step 1's longest completion is %lld tokens (%.1fx the mean of %.0f): %.2f s of decoding that no "
              "synchronous step can shorten, then %.2f s of training on all devices\n",
              static_cast<long long>(longest), static_cast<double>(longest) * static_cast<double>(first.size()) / static_cast<double>(tokens),
              static_cast<double>(tokens) / static_cast<double>(first.size()), latency, train_s(o.devices));
  for (size_t i = 1; i < rows.size(); ++i) {
    const auto& r = rows[i];
    const double tr = train_s(r.trainers);
    const double lat = (sec(longest * decode_ns(r.generators) + o.reward_ns) + tr + sec(o.sync_ns)) / (r.eta + 1);
    const double gen = sec(tokens * decode_ns(r.generators)) / static_cast<double>(r.generators * o.slots);
    std::printf("       %-26s bounds per step: latency / (eta+1) %.2f s, generator throughput %.2f s, trainer %.2f s; "
                "simulated %.2f s\n",
                r.mode.c_str(), lat, gen, tr, sec(r.makespan_ns) / o.steps);
  }
  std::fflush(stdout);
  metrics.write_line(JsonObject().add("type", std::string("end")).add("sim", std::string("timings only")).add("steps", static_cast<int64_t>(o.steps)).str());
  spdlog::info("done: sim RL compared on {} devices; no parameters were computed, so no checkpoint", o.devices);
  return 0;
}

}  // namespace troupe::launch
