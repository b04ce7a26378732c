// Expert parallelism on sim devices (see ep_sim.hpp): skewed, drifting
// expert loads; static, EPLB and perfectly balanced placements timed on a
// virtual clock.
#include "actors/sim/ep_sim.hpp"

#include <algorithm>
#include <cmath>
#include <stdexcept>

#include "actors/sim/sim_hash.hpp"
#include "moe/placement.hpp"

namespace troupe::sim {
namespace {

uint64_t draw(uint64_t seed, uint64_t a, uint64_t b, uint64_t c) { return splitmix(splitmix(splitmix(splitmix(seed) ^ a) ^ b) ^ c); }

double copies_per_device(const EpSimOptions& o) {
  return static_cast<double>(o.tokens) * static_cast<double>(o.top_k) / o.devices;
}

int64_t ns(double x) { return static_cast<int64_t>(std::llround(x)); }

// Time to send `copies` expert copies (parameters and Adam moments) over one link.
double migration_ns(const EpSimOptions& o, int64_t copies) {
  if (copies == 0) return 0.0;
  const double bytes = static_cast<double>(copies) * 3.0 * static_cast<double>(o.d_model * o.expert_hidden) *
                       static_cast<double>(o.bytes_per_param);
  return static_cast<double>(o.link_latency_ns) + (o.link_bytes_per_ns > 0 ? bytes / o.link_bytes_per_ns : 0.0);
}

void finish(EpSimResult& r) {
  r.total_ns = 0;
  for (int64_t x : r.step_ns) r.total_ns += x;
}

}  // namespace

void validate(const EpSimOptions& o) {
  auto bad = [](const std::string& what) { throw std::invalid_argument("ep sim: " + what); };
  if (o.devices < 1) bad("devices must be >= 1");
  if (o.experts < o.devices) bad("experts must be >= devices (the static placement gives every device one)");
  if (o.slots_per_device < 1 || static_cast<int64_t>(o.devices) * o.slots_per_device < o.experts || o.slots_per_device > o.experts)
    bad("slots_per_device must be <= experts and devices * slots_per_device >= experts");
  if (o.layers < 1 || o.steps < 1 || o.tokens < 1) bad("layers, steps and tokens must be >= 1");
  if (o.top_k < 1 || o.top_k > o.experts) bad("top_k must be in 1..experts");
  if (o.d_model < 1 || o.expert_hidden < 1) bad("d_model and expert_hidden must be >= 1");
  if (!(o.flops_per_ns > 0) || o.link_bytes_per_ns < 0 || o.link_latency_ns < 0) bad("bad device or link rate");
  if (!(o.zipf >= 0) || o.drift_every < 0 || !(o.drift >= 0 && o.drift <= 1)) bad("bad zipf or drift");
  if (!(o.ema > 0 && o.ema <= 1)) bad("ema must be in (0, 1]");
  if (o.rebalance_every < 1 || !(o.tolerance >= 0) || o.bytes_per_param < 0 || !(o.imbalance_threshold >= 0))
    bad("bad rebalance settings");
}

double ep_flops_per_copy(const EpSimOptions& o) {
  // SwiGLU expert: three d_model x expert_hidden matmuls, 2 FLOPs per MAC,
  // forward plus a backward of twice the forward.
  return 18.0 * static_cast<double>(o.d_model) * static_cast<double>(o.expert_hidden);
}

int64_t ep_layer_ns(const EpSimOptions& o, const std::vector<double>& copies) {
  const double flops = ep_flops_per_copy(o), sent = copies_per_device(o);
  const double token_bytes = 4.0 * static_cast<double>(o.d_model);
  double slowest = 0;
  for (double n : copies) {
    const double a2a = static_cast<double>(o.link_latency_ns) +
                       (o.link_bytes_per_ns > 0 ? std::max(sent, n) * token_bytes / o.link_bytes_per_ns : 0.0);
    slowest = std::max(slowest, n * flops / o.flops_per_ns + 4.0 * a2a);
  }
  return ns(slowest);
}

EpLoads::EpLoads(const EpSimOptions& o) : o_(o) {
  validate(o);
  const size_t E = static_cast<size_t>(o.experts);
  share_.resize(E);
  double sum = 0;
  for (size_t r = 0; r < E; ++r) sum += share_[r] = 1.0 / std::pow(static_cast<double>(r + 1), o.zipf);
  for (double& x : share_) x /= sum;
  order_.resize(static_cast<size_t>(o.layers));
  for (size_t l = 0; l < order_.size(); ++l) {
    auto& ord = order_[l];
    ord.resize(E);
    for (size_t e = 0; e < E; ++e) ord[e] = static_cast<int64_t>(e);
    for (size_t i = E - 1; i > 0; --i) std::swap(ord[i], ord[draw(o.seed, l, ~0ULL, i) % (i + 1)]);  // Fisher-Yates
  }
  loads_.assign(order_.size(), std::vector<double>(E, 0.0));
}

const std::vector<std::vector<double>>& EpLoads::next() {
  const double copies = static_cast<double>(o_.tokens) * static_cast<double>(o_.top_k);
  const uint64_t E = static_cast<uint64_t>(o_.experts);
  for (size_t l = 0; l < order_.size(); ++l) {
    auto& ord = order_[l];
    if (step_ > 0 && o_.drift_every > 0 && step_ % o_.drift_every == 0) {
      // Gradual drift: the expert at rank r (from 0) trades places with one
      // at rank r+1..2r+1, so a rank moves by at most a factor of two.
      const int64_t pairs = std::llround(o_.drift * static_cast<double>(o_.experts) / 2.0);
      for (int64_t j = 0; j < pairs; ++j) {
        const uint64_t r = draw(o_.seed, l, static_cast<uint64_t>(step_), 2 * static_cast<uint64_t>(j)) % E;
        const uint64_t r2 = std::min(E - 1, r + 1 + draw(o_.seed, l, static_cast<uint64_t>(step_), 2 * static_cast<uint64_t>(j) + 1) % (r + 1));
        std::swap(ord[r], ord[r2]);
      }
    }
    for (size_t r = 0; r < ord.size(); ++r) loads_[l][static_cast<size_t>(ord[r])] = copies * share_[r];
  }
  ++step_;
  return loads_;
}

EpSimResult simulate_ep_static(const EpSimOptions& o) {
  EpLoads gen(o);
  EpSimResult r;
  r.placement = "static";
  for (int s = 0; s < o.steps; ++s) {
    const auto& loads = gen.next();
    int64_t t = 0;
    double imb = 0;
    for (const auto& layer : loads) {
      const moe::ReplicatedPlacement p = moe::contiguous_placement(layer, o.devices);
      t += ep_layer_ns(o, p.device_load);
      imb += p.imbalance();
    }
    r.step_ns.push_back(t);
    r.imbalance.push_back(imb / o.layers);
  }
  finish(r);
  return r;
}

EpSimResult simulate_ep_balanced(const EpSimOptions& o) {
  validate(o);
  EpSimResult r;
  r.placement = "balanced";
  const std::vector<double> even(static_cast<size_t>(o.devices), copies_per_device(o));
  r.step_ns.assign(static_cast<size_t>(o.steps), ep_layer_ns(o, even) * o.layers);
  r.imbalance.assign(static_cast<size_t>(o.steps), 1.0);
  finish(r);
  return r;
}

EpSimResult simulate_ep_eplb(const EpSimOptions& o) {
  EpLoads gen(o);
  EpSimResult r;
  r.placement = "eplb";
  const size_t L = static_cast<size_t>(o.layers);
  // Before any measurement: the placement for uniform loads.
  const std::vector<double> flat(static_cast<size_t>(o.experts), 1.0);
  std::vector<moe::ReplicatedPlacement> cur(L, moe::eplb_placement(flat, o.devices, o.slots_per_device));
  std::vector<std::vector<double>> avg;  // moving average of the measured loads, per layer
  int after_steps = 0, planned_n = 0;
  for (int s = 0; s < o.steps; ++s) {
    const auto& loads = gen.next();
    double stall = 0;
    bool moved = false;
    // The first rebalance comes after one step of measurements (before it
    // the placement is for uniform loads), then every rebalance_every steps,
    // and in between for a layer whose placement, under the moving average,
    // has drifted past imbalance_threshold.
    const bool periodic = s == 1 || (s > 0 && s % o.rebalance_every == 0);
    if (s > 0) {
      // Between steps: each layer's candidate from the moving average. A
      // layer moves only when the predicted gain over the next
      // rebalance_every steps beats its own migration time; the stall is
      // the busiest receiving link over all the layers that move.
      std::vector<int64_t> received(static_cast<size_t>(o.devices), 0);
      for (size_t l = 0; l < L; ++l) {
        moe::evaluate_placement(avg[l], cur[l]);
        if (!periodic && !(o.imbalance_threshold > 0 && cur[l].imbalance() > o.imbalance_threshold)) continue;
        moe::ReplicatedPlacement cand = moe::eplb_incremental(avg[l], cur[l], o.tolerance);
        const double gain = static_cast<double>(ep_layer_ns(o, cur[l].device_load) - ep_layer_ns(o, cand.device_load)) *
                            o.rebalance_every;
        const std::vector<int64_t> got = moe::copies_received(cur[l], cand);
        const int64_t busiest = *std::max_element(got.begin(), got.end());
        if (gain <= migration_ns(o, busiest)) {
          ++r.skipped;
          continue;
        }
        for (size_t d = 0; d < got.size(); ++d) received[d] += got[d], r.copies_moved += got[d];
        r.planned += cand.imbalance();
        ++planned_n;
        cur[l] = std::move(cand);
        ++r.rebalances;
        moved = true;
      }
      stall = migration_ns(o, *std::max_element(received.begin(), received.end()));
    }
    int64_t t = 0;
    double imb = 0;
    for (size_t l = 0; l < L; ++l) {
      moe::evaluate_placement(loads[l], cur[l]);
      t += ep_layer_ns(o, cur[l].device_load);
      imb += cur[l].imbalance();
    }
    const int64_t st = ns(stall);
    r.stall_ns += st;
    r.max_stall_ns = std::max(r.max_stall_ns, st);
    r.step_ns.push_back(t + st);
    r.imbalance.push_back(imb / o.layers);
    if (moved) r.after_rebalance += r.imbalance.back(), ++after_steps;
    // The measurement of this step joins the moving average.
    if (avg.empty()) avg = loads;
    else
      for (size_t l = 0; l < L; ++l)
        for (size_t e = 0; e < avg[l].size(); ++e) avg[l][e] += o.ema * (loads[l][e] - avg[l][e]);
  }
  if (after_steps) r.after_rebalance /= after_steps;
  if (planned_n) r.planned /= planned_n;
  finish(r);
  return r;
}

}  // namespace troupe::sim
