// The synchronous / decoupled RL model (see rl_sim.hpp).
#include "actors/sim/rl_sim.hpp"

#include "actors/sim/sim_hash.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <queue>
#include <stdexcept>

namespace troupe::sim {

namespace {

double unit(uint64_t bits) { return (static_cast<double>(bits >> 11) + 0.5) * (1.0 / 9007199254740992.0); }

// One device's slots: when each is next free (a min-heap).
class Slots {
 public:
  explicit Slots(int64_t n) {
    for (int64_t i = 0; i < n; ++i) free_.push(0);
  }
  // Runs a job of `ns` that may not start before `ready`; returns its end.
  int64_t run(int64_t ready, int64_t ns) {
    const int64_t start = std::max(free_.top(), ready);
    free_.pop();
    free_.push(start + ns);
    return start + ns;
  }

 private:
  std::priority_queue<int64_t, std::vector<int64_t>, std::greater<int64_t>> free_;
};

// `generators`: how many devices generate at once (> 1: the parallel cost).
int64_t completion_ns(const RlSimOptions& o, int64_t len, int generators) {
  return len * decode_ns_per_token(o, generators) + o.reward_ns;
}

}  // namespace

int64_t decode_ns_per_token(const RlSimOptions& o, int generators) {
  return generators > 1 && o.parallel_decode_ns_per_token > 0 ? o.parallel_decode_ns_per_token : o.decode_ns_per_token;
}

int64_t train_step_ns(const RlSimOptions& o, int64_t tokens, int trainers) {
  const int64_t per = trainers > 1 && o.parallel_train_ns_per_token > 0 ? o.parallel_train_ns_per_token
                                                                      : o.train_ns_per_token;
  // Rounded up: a step never takes less than its share.
  return (tokens * per + trainers - 1) / trainers + o.train_step_ns;
}

void validate(const RlSimOptions& o) {
  auto require = [](bool ok, const char* what) {
    if (!ok) throw std::invalid_argument(std::string("rl sim: ") + what);
  };
  require(o.devices >= 2, "needs at least 2 devices (decoupled splits them)");
  require(o.steps >= 1, "steps must be >= 1");
  require(o.completions >= 1, "completions per step must be >= 1");
  require(o.max_tokens >= 1, "max_tokens must be >= 1");
  require(o.mean_tokens >= 1 && std::isfinite(o.mean_tokens), "mean_tokens must be >= 1");
  require(o.sigma >= 0 && o.sigma <= 4, "sigma must be in [0, 4]");
  require(o.slots >= 1, "slots must be >= 1");
  require(o.decode_ns_per_token >= 0 && o.reward_ns >= 0 && o.train_ns_per_token >= 0 && o.sync_ns >= 0 &&
              o.parallel_decode_ns_per_token >= 0 && o.parallel_train_ns_per_token >= 0 && o.train_step_ns >= 0,
          "costs must be >= 0");
}

std::vector<int64_t> completion_lengths(const RlSimOptions& o, int step) {
  // Log-normal with the given mean: mu = ln(mean) - sigma^2 / 2.
  const double mu = std::log(o.mean_tokens) - 0.5 * o.sigma * o.sigma;
  std::vector<int64_t> out(static_cast<size_t>(o.completions));
  for (int64_t i = 0; i < o.completions; ++i) {
    const uint64_t base = splitmix(o.seed ^ splitmix(static_cast<uint64_t>(step) * 0x100000001b3ull + static_cast<uint64_t>(i)));
    // Box-Muller from two uniforms of this (seed, step, index) alone.
    const double u1 = unit(splitmix(base)), u2 = unit(splitmix(base + 1));
    const double z = std::sqrt(-2.0 * std::log(u1)) * std::cos(6.283185307179586 * u2);
    const double len = std::exp(mu + o.sigma * z);
    out[static_cast<size_t>(i)] = std::clamp<int64_t>(static_cast<int64_t>(std::llround(len)), 1, o.max_tokens);
  }
  return out;
}

RlSimResult simulate_synchronous(const RlSimOptions& o) {
  validate(o);
  RlSimResult r;
  r.mode = "synchronous";
  r.generators = r.trainers = o.devices;
  r.version_lag.assign(1, 0);
  int64_t t = 0;
  double gen_work = 0, train_work = 0;
  for (int s = 0; s < o.steps; ++s) {
    const std::vector<int64_t> lens = completion_lengths(o, s);
    std::vector<Slots> dev(static_cast<size_t>(o.devices), Slots(o.slots));
    int64_t gen_end = t, tokens = 0;
    for (size_t i = 0; i < lens.size(); ++i) {
      const int64_t ns = completion_ns(o, lens[i], o.devices);
      gen_end = std::max(gen_end, dev[i % dev.size()].run(t, ns));
      tokens += lens[i];
      gen_work += static_cast<double>(ns);
    }
    r.version_lag[0] += o.completions;  // always the current version
    r.tokens += tokens;
    const int64_t tr = train_step_ns(o, tokens, o.devices);
    train_work += static_cast<double>(tr);
    t = gen_end + tr;
    r.step_end_ns.push_back(t);
  }
  r.makespan_ns = t;
  // Busy shares over the whole run (each device alternates the two phases).
  const double span = static_cast<double>(std::max<int64_t>(t, 1));
  r.generate_busy = gen_work / (span * static_cast<double>(o.devices * o.slots));
  r.train_busy = train_work / span;
  return r;
}

namespace {

// Every step's completion lengths, drawn once for the many splits
// best_decoupled tries.
using StepLengths = std::vector<std::vector<int64_t>>;

StepLengths all_lengths(const RlSimOptions& o) {
  StepLengths out;
  for (int s = 0; s < o.steps; ++s) out.push_back(completion_lengths(o, s));
  return out;
}

RlSimResult decoupled_on(const RlSimOptions& o, int eta, int generators, const StepLengths& step_lengths);

}  // namespace

RlSimResult simulate_decoupled(const RlSimOptions& o, int eta, int generators) {
  validate(o);
  return decoupled_on(o, eta, generators, all_lengths(o));
}

namespace {

RlSimResult decoupled_on(const RlSimOptions& o, int eta, int generators, const StepLengths& step_lengths) {
  if (eta < 0) throw std::invalid_argument("rl sim: eta must be >= 0");
  if (generators < 1 || generators >= o.devices)
    throw std::invalid_argument("rl sim: generators must be in [1, devices - 1], got " + std::to_string(generators));
  const int trainers = o.devices - generators;
  RlSimResult r;
  r.eta = eta;
  r.generators = generators;
  r.trainers = trainers;
  r.mode = "decoupled eta=" + std::to_string(eta) + " G=" + std::to_string(generators);
  r.version_lag.assign(static_cast<size_t>(eta) + 1, 0);
  std::vector<Slots> gen(static_cast<size_t>(generators), Slots(o.slots));
  // published[v]: when version v reaches the generators (v = 0: the start).
  std::vector<int64_t> published(static_cast<size_t>(o.steps) + 1, 0);
  // Completions of step s need version max(0, s - eta), published after the
  // trainer finishes step s - eta - 1: generate every step whose version is
  // out before training the next one, in step order (a slot takes them in
  // order, so one not yet admitted holds its slot back: a pause, no loss).
  int64_t train_end = 0;
  double gen_work = 0, train_work = 0;
  int generated = 0;  // steps whose completions are placed
  std::vector<int64_t> ready(static_cast<size_t>(o.steps), 0), tokens(static_cast<size_t>(o.steps), 0);
  size_t next_gen = 0;  // round-robin over generators, across steps
  for (int s = 0; s < o.steps; ++s) {
    // Place every step whose policy version is known by now.
    while (generated < o.steps && generated - eta <= s) {
      const int g = generated;
      const int version = std::max(0, g - eta);
      const int64_t admit = published[static_cast<size_t>(version)];
      const std::vector<int64_t>& lens = step_lengths[static_cast<size_t>(g)];
      int64_t end = admit, tok = 0;
      for (int64_t len : lens) {
        const int64_t ns = completion_ns(o, len, generators);
        end = std::max(end, gen[next_gen].run(admit, ns));
        next_gen = (next_gen + 1) % gen.size();
        tok += len;
        gen_work += static_cast<double>(ns);
      }
      ready[static_cast<size_t>(g)] = end;
      tokens[static_cast<size_t>(g)] = tok;
      r.version_lag[static_cast<size_t>(g - version)] += o.completions;
      r.tokens += tok;
      ++generated;
    }
    const int64_t start = std::max(train_end, ready[static_cast<size_t>(s)]);
    const int64_t tr = train_step_ns(o, tokens[static_cast<size_t>(s)], trainers);
    train_work += static_cast<double>(tr);
    train_end = start + tr;
    r.step_end_ns.push_back(train_end);
    published[static_cast<size_t>(s) + 1] = train_end + o.sync_ns;
  }
  r.makespan_ns = train_end;
  const double span = static_cast<double>(std::max<int64_t>(train_end, 1));
  r.generate_busy = gen_work / (span * static_cast<double>(generators * o.slots));
  r.train_busy = train_work / span;
  return r;
}

}  // namespace

RlSimResult best_decoupled(const RlSimOptions& o, int eta) {
  validate(o);
  if (eta < 0) throw std::invalid_argument("rl sim: eta must be >= 0");
  const StepLengths lens = all_lengths(o);
  auto better = [](const RlSimResult& a, const RlSimResult& b) { return a.makespan_ns < b.makespan_ns; };
  int stride = std::max(1, o.devices / 64);
  RlSimResult best = decoupled_on(o, eta, 1, lens);
  for (int g = stride; g < o.devices; g += stride) {
    RlSimResult r = decoupled_on(o, eta, g, lens);
    if (better(r, best)) best = std::move(r);
  }
  // Refine around the best grid point on grids 8x finer each time, down to
  // single devices (every split within one stride at 1,024 devices or fewer).
  while (stride > 1) {
    const int finer = std::max(1, stride / 8);
    const int lo = std::max(1, best.generators - stride), hi = std::min(o.devices - 1, best.generators + stride);
    for (int g = lo; g <= hi; g += finer) {
      RlSimResult r = decoupled_on(o, eta, g, lens);
      if (better(r, best)) best = std::move(r);
    }
    stride = finer;
  }
  return best;
}

}  // namespace troupe::sim
