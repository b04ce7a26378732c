// Load-aware expert placement: contiguous shards and EPLB with replicas
// (see placement.hpp).
#include "moe/placement.hpp"

#include <algorithm>
#include <queue>
#include <utility>
#include <stdexcept>
#include <string>

namespace troupe::moe {

namespace {

void check(std::span<const double> loads, const std::vector<int64_t>& b) {
  const int64_t E = static_cast<int64_t>(loads.size());
  bool ok = b.size() >= 2 && b.front() == 0 && b.back() == E;
  for (size_t i = 1; ok && i < b.size(); ++i) ok = b[i] > b[i - 1];
  if (!ok) throw std::invalid_argument("expert bounds must rise strictly from 0 to n_experts (" + std::to_string(E) + ")");
}

std::vector<double> shard_sums(std::span<const double> loads, const std::vector<int64_t>& b) {
  std::vector<double> out(b.size() - 1, 0.0);
  for (size_t s = 0; s + 1 < b.size(); ++s)
    for (int64_t e = b[s]; e < b[s + 1]; ++e) out[s] += loads[static_cast<size_t>(e)];
  return out;
}

}  // namespace

std::vector<int64_t> even_bounds(int64_t n_experts, int shards) {
  if (shards < 1 || shards > n_experts) throw std::invalid_argument("even_bounds: bad shard count");
  std::vector<int64_t> b{0};
  const int64_t base = n_experts / shards, extra = n_experts % shards;
  for (int s = 0; s < shards; ++s) b.push_back(b.back() + base + (s < extra ? 1 : 0));
  return b;
}

std::vector<int64_t> rebalance_bounds(std::span<const double> loads, const std::vector<int64_t>& bounds, int max_moves,
                                      int* moves) {
  check(loads, bounds);
  std::vector<int64_t> b = bounds;
  int done = 0;
  for (; done < max_moves; ++done) {
    const std::vector<double> sum = shard_sums(loads, b);
    const size_t hot = static_cast<size_t>(std::max_element(sum.begin(), sum.end()) - sum.begin());
    if (b[hot + 1] - b[hot] < 2) break;  // a single expert cannot be split further
    // Candidates: its first expert to the left neighbour, its last to the right.
    double best = sum[hot];
    int side = 0;
    if (hot > 0) {
      const double x = loads[static_cast<size_t>(b[hot])];
      const double worse = std::max(sum[hot] - x, sum[hot - 1] + x);
      if (worse < best) best = worse, side = -1;
    }
    if (hot + 2 < b.size()) {
      const double x = loads[static_cast<size_t>(b[hot + 1] - 1)];
      const double worse = std::max(sum[hot] - x, sum[hot + 1] + x);
      if (worse < best) best = worse, side = +1;
    }
    if (side == 0) break;  // no single move lowers the hottest shard's pair
    if (side < 0) ++b[hot];
    else --b[hot + 1];
  }
  if (moves) *moves = done;
  return b;
}

std::vector<int64_t> remove_shard_bounds(const std::vector<int64_t>& bounds, int shard) {
  const int S = static_cast<int>(bounds.size()) - 1;
  if (S < 2 || shard < 0 || shard >= S)
    throw std::invalid_argument("remove_shard_bounds: shard " + std::to_string(shard) + " of " + std::to_string(S) +
                                " (needs >= 2 shards)");
  const auto k = static_cast<size_t>(shard);
  // Erasing b[k] merges the shard into its left neighbour, b[k+1] into its right one.
  bool left = shard == S - 1;
  if (shard > 0 && shard < S - 1) left = bounds[k] - bounds[k - 1] <= bounds[k + 2] - bounds[k + 1];
  std::vector<int64_t> b = bounds;
  b.erase(b.begin() + static_cast<int64_t>(left ? k : k + 1));
  return b;
}

double bounds_imbalance(std::span<const double> loads, const std::vector<int64_t>& bounds) {
  check(loads, bounds);
  const std::vector<double> sum = shard_sums(loads, bounds);
  double total = 0.0, most = 0.0;
  for (double x : sum) total += x, most = std::max(most, x);
  return total > 0.0 ? most * static_cast<double>(sum.size()) / total : 0.0;
}

std::pair<int64_t, int64_t> copy_rows(int64_t rows, int holders, int copy) {
  if (holders < 1 || copy < 0 || copy >= holders || rows < 0)
    throw std::invalid_argument("copy_rows: copy " + std::to_string(copy) + " of " + std::to_string(holders));
  return {rows * copy / holders, rows * (copy + 1) / holders};
}

std::pair<int64_t, int64_t> share_rows(int64_t rows, std::span<const int> weights, int holders, int copy) {
  if (weights.empty()) return copy_rows(rows, holders, copy);
  if (static_cast<int>(weights.size()) != holders || copy < 0 || copy >= holders || rows < 0)
    throw std::invalid_argument("share_rows: copy " + std::to_string(copy) + " of " + std::to_string(holders) +
                                " holders with " + std::to_string(weights.size()) + " weights");
  int64_t before = 0, total = 0;
  for (int j = 0; j < holders; ++j) {
    if (weights[static_cast<size_t>(j)] < 0) throw std::invalid_argument("share_rows: a negative weight");
    if (j < copy) before += weights[static_cast<size_t>(j)];
    total += weights[static_cast<size_t>(j)];
  }
  if (total != kShareTotal)
    throw std::invalid_argument("share_rows: weights sum to " + std::to_string(total) + ", not " + std::to_string(kShareTotal));
  return {rows * before / kShareTotal, rows * (before + weights[static_cast<size_t>(copy)]) / kShareTotal};
}

std::vector<int> expert_holders(const std::vector<int64_t>& bounds, const std::vector<std::vector<int64_t>>& copies,
                                int64_t expert) {
  std::vector<int> out;
  for (size_t s = 0; s + 1 < bounds.size(); ++s) {
    const bool home = expert >= bounds[s] && expert < bounds[s + 1];
    const bool copy = s < copies.size() && std::binary_search(copies[s].begin(), copies[s].end(), expert);
    if (home || copy) out.push_back(static_cast<int>(s));
  }
  return out;
}

std::vector<double> replicated_shard_loads(std::span<const double> loads, const std::vector<int64_t>& bounds,
                                           const Replication& r) {
  check(loads, bounds);
  std::vector<double> out(bounds.size() - 1, 0.0);
  for (size_t e = 0; e < loads.size(); ++e) {
    const std::vector<int> h = expert_holders(bounds, r.copies, static_cast<int64_t>(e));
    const bool shared = e < r.shares.size() && !r.shares[e].empty();
    for (size_t j = 0; j < h.size(); ++j)
      out[static_cast<size_t>(h[j])] += shared ? loads[e] * r.shares[e][j] / kShareTotal
                                               : loads[e] / static_cast<double>(h.size());
  }
  return out;
}

double replicated_imbalance(std::span<const double> loads, const std::vector<int64_t>& bounds, const Replication& r) {
  const std::vector<double> sum = replicated_shard_loads(loads, bounds, r);
  double total = 0.0, most = 0.0;
  for (double x : sum) total += x, most = std::max(most, x);
  return total > 0.0 ? most * static_cast<double>(sum.size()) / total : 0.0;
}

Replication place_copies(std::span<const double> loads, const std::vector<int64_t>& bounds, int redundant) {
  check(loads, bounds);
  const int64_t E = static_cast<int64_t>(loads.size());
  const size_t S = bounds.size() - 1;
  if (redundant < 0 || redundant > E || (redundant > 0 && S < 2))
    throw std::invalid_argument("place_copies: " + std::to_string(redundant) + " redundant copies for " +
                                std::to_string(E) + " experts on " + std::to_string(S) + " shard(s)");
  // held[e][s]: the load of expert e that shard s takes (its home all of it).
  std::vector<std::vector<double>> held(static_cast<size_t>(E), std::vector<double>(S, 0.0));
  std::vector<std::vector<bool>> holds(static_cast<size_t>(E), std::vector<bool>(S, false));
  std::vector<double> sum(S, 0.0);
  double total = 0.0;
  for (size_t s = 0; s < S; ++s)
    for (int64_t e = bounds[s]; e < bounds[s + 1]; ++e) {
      held[static_cast<size_t>(e)][s] = loads[static_cast<size_t>(e)];
      holds[static_cast<size_t>(e)][s] = true;
      sum[s] += loads[static_cast<size_t>(e)];
      total += loads[static_cast<size_t>(e)];
    }
  const double mean = total / static_cast<double>(S);
  Replication r;
  r.copies.assign(S, {});
  for (int made = 0; made < redundant && total > 0.0; ++made) {
    const size_t hi = static_cast<size_t>(std::max_element(sum.begin(), sum.end()) - sum.begin());
    const size_t lo = static_cast<size_t>(std::min_element(sum.begin(), sum.end()) - sum.begin());
    if (sum[hi] - mean <= 1e-9 * mean) break;
    int64_t pick = -1;
    for (int64_t e = 0; e < E; ++e)
      if (holds[static_cast<size_t>(e)][hi] && !holds[static_cast<size_t>(e)][lo] &&
          held[static_cast<size_t>(e)][hi] > 0.0 &&
          (pick < 0 || held[static_cast<size_t>(e)][hi] > held[static_cast<size_t>(pick)][hi]))
        pick = e;
    if (pick < 0) break;
    auto& h = held[static_cast<size_t>(pick)];
    const double x = std::min({sum[hi] - mean, mean - sum[lo], h[hi]});
    // A move below the shares' grain would give the copy no rows: the shards
    // are as balanced as shares can make them.
    if (!(x > 0.0) || x < loads[static_cast<size_t>(pick)] / kShareTotal) break;
    h[hi] -= x;
    h[lo] += x;
    sum[hi] -= x;
    sum[lo] += x;
    holds[static_cast<size_t>(pick)][lo] = true;
    r.copies[lo].insert(std::lower_bound(r.copies[lo].begin(), r.copies[lo].end(), pick), pick);
  }
  // Shares: each shared expert's holders get weights in proportion to the
  // load they took, rounded down; the remainder goes to the largest.
  r.shares.assign(static_cast<size_t>(E), {});
  for (int64_t e = 0; e < E; ++e) {
    const auto& h = held[static_cast<size_t>(e)];
    const double load = loads[static_cast<size_t>(e)];
    std::vector<int> w;
    for (size_t s = 0; s < S; ++s)
      if (holds[static_cast<size_t>(e)][s]) w.push_back(load > 0.0 ? static_cast<int>(h[s] / load * kShareTotal) : 0);
    if (w.size() < 2 || !(load > 0.0)) continue;
    int given = 0;
    for (int x : w) given += x;
    *std::max_element(w.begin(), w.end()) += kShareTotal - given;
    r.shares[static_cast<size_t>(e)] = std::move(w);
  }
  return r;
}

namespace {

// One physical copy of a logical expert waiting for a slot.
struct Copy {
  double weight;
  int64_t expert;
};

bool holds(const std::vector<int64_t>& slots, int64_t e) { return std::find(slots.begin(), slots.end(), e) != slots.end(); }

// Greedy packing: heaviest copy first onto the least loaded device with a
// free slot, avoiding devices that already hold that expert when possible
// (two copies on one device would add nothing). `load` and `p.slots` hold
// what is already placed; every device ends with `slots_per_device` copies.
void pack(std::vector<Copy> copies, size_t slots_per_device, std::vector<double>& load, ReplicatedPlacement& p) {
  std::sort(copies.begin(), copies.end(), [](const Copy& a, const Copy& b) {
    return a.weight != b.weight ? a.weight > b.weight : a.expert < b.expert;
  });
  using Entry = std::pair<double, size_t>;  // (load, device): least loaded, then lowest device, on top
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> open;
  for (size_t d = 0; d < p.slots.size(); ++d)
    if (p.slots[d].size() < slots_per_device) open.push({load[d], d});
  std::vector<Entry> skipped;
  for (const Copy& c : copies) {
    if (open.empty()) throw std::logic_error("eplb: more copies than free slots");
    skipped.clear();
    while (!open.empty() && holds(p.slots[open.top().second], c.expert)) {
      skipped.push_back(open.top());
      open.pop();
    }
    Entry pick;
    if (open.empty()) {  // every device with room holds it already: take the least loaded anyway
      pick = skipped.front();
      skipped.erase(skipped.begin());
    } else {
      pick = open.top();
      open.pop();
    }
    for (const Entry& x : skipped) open.push(x);
    const size_t d = pick.second;
    p.slots[d].push_back(c.expert);
    load[d] += c.weight;
    if (p.slots[d].size() < slots_per_device) open.push({load[d], d});
  }
}

// Local search after the greedy packing: while some copy on the most loaded
// device can trade places with a lighter copy on a less loaded device so that
// both end below the old maximum, make the best such trade with the least
// loaded device that has one (slot counts do not change). Greedy packing
// with equal counts per device leaves its last, lightest copies no choice;
// these trades fix most of what that costs. Stops once the maximum is at
// most `good_enough` (the incremental variant's target: each trade moves two
// copies).
void refine(std::span<const double> loads, ReplicatedPlacement& p, std::vector<double>& load, double good_enough) {
  const size_t D = p.slots.size();
  auto w = [&](int64_t e) { return loads[static_cast<size_t>(e)] / p.replicas[static_cast<size_t>(e)]; };
  std::vector<size_t> order(D);
  for (size_t round = 0; round < 4 * D; ++round) {
    const size_t hot = static_cast<size_t>(std::max_element(load.begin(), load.end()) - load.begin());
    if (load[hot] <= good_enough) return;
    for (size_t d = 0; d < D; ++d) order[d] = d;
    std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return load[a] != load[b] ? load[a] < load[b] : a < b; });
    bool traded = false;
    for (size_t d : order) {
      if (d == hot || load[d] >= load[hot]) break;
      double best = load[hot];
      size_t bi = 0, bj = 0;
      for (size_t i = 0; i < p.slots[hot].size(); ++i)
        for (size_t j = 0; j < p.slots[d].size(); ++j) {
          const int64_t a = p.slots[hot][i], b = p.slots[d][j];
          const double delta = w(a) - w(b);
          if (delta <= 0 || a == b) continue;
          const double worse = std::max(load[hot] - delta, load[d] + delta);
          if (worse < best && !holds(p.slots[d], a) && !holds(p.slots[hot], b)) best = worse, bi = i, bj = j;
        }
      if (best < load[hot]) {
        const double delta = w(p.slots[hot][bi]) - w(p.slots[d][bj]);
        std::swap(p.slots[hot][bi], p.slots[d][bj]);
        load[hot] -= delta;
        load[d] += delta;
        traded = true;
        break;
      }
    }
    if (!traded) return;
  }
}

void check_loads(std::span<const double> loads) {
  if (loads.empty()) throw std::invalid_argument("eplb: no experts");
  for (double x : loads)
    if (!(x >= 0.0)) throw std::invalid_argument("eplb: expert loads must be >= 0");
}

}  // namespace

std::vector<int> replicate_hottest(std::span<const double> loads, int64_t physical, int max_replicas) {
  check_loads(loads);
  const int64_t E = static_cast<int64_t>(loads.size());
  if (physical < E) throw std::invalid_argument("eplb: fewer physical slots (" + std::to_string(physical) + ") than experts (" + std::to_string(E) + ")");
  if (max_replicas < 1) throw std::invalid_argument("eplb: max_replicas must be >= 1");
  std::vector<int> r(static_cast<size_t>(E), 1);
  // Largest loads[e] / r[e] on top, ties to the lowest expert.
  auto less = [&](int64_t a, int64_t b) {
    const double x = loads[static_cast<size_t>(a)] / r[static_cast<size_t>(a)];
    const double y = loads[static_cast<size_t>(b)] / r[static_cast<size_t>(b)];
    return x != y ? x < y : a > b;
  };
  std::priority_queue<int64_t, std::vector<int64_t>, decltype(less)> hot(less);
  for (int64_t e = 0; e < E; ++e)
    if (max_replicas > 1) hot.push(e);
  for (int64_t extra = physical - E; extra > 0 && !hot.empty(); --extra) {
    const int64_t e = hot.top();
    hot.pop();
    if (++r[static_cast<size_t>(e)] < max_replicas) hot.push(e);
  }
  return r;
}

void evaluate_placement(std::span<const double> loads, ReplicatedPlacement& p) {
  p.device_load.assign(p.slots.size(), 0.0);
  double total = 0.0;
  p.max_load = 0.0;
  for (size_t d = 0; d < p.slots.size(); ++d) {
    for (int64_t e : p.slots[d]) p.device_load[d] += loads[static_cast<size_t>(e)] / p.replicas[static_cast<size_t>(e)];
    total += p.device_load[d];
    p.max_load = std::max(p.max_load, p.device_load[d]);
  }
  p.mean_load = p.slots.empty() ? 0.0 : total / static_cast<double>(p.slots.size());
}

ReplicatedPlacement eplb_placement(std::span<const double> loads, int devices, int slots_per_device) {
  if (devices < 1 || slots_per_device < 1) throw std::invalid_argument("eplb: devices and slots per device must be >= 1");
  // A device holds distinct experts, so it cannot have more slots than there are experts.
  if (static_cast<size_t>(slots_per_device) > loads.size()) throw std::invalid_argument("eplb: more slots per device than experts");
  ReplicatedPlacement p;
  p.replicas = replicate_hottest(loads, static_cast<int64_t>(devices) * slots_per_device, devices);
  std::vector<Copy> copies;
  for (size_t e = 0; e < loads.size(); ++e)
    for (int k = 0; k < p.replicas[e]; ++k) copies.push_back({loads[e] / p.replicas[e], static_cast<int64_t>(e)});
  p.slots.assign(static_cast<size_t>(devices), {});
  std::vector<double> load(static_cast<size_t>(devices), 0.0);
  pack(std::move(copies), static_cast<size_t>(slots_per_device), load, p);
  refine(loads, p, load, 0.0);
  evaluate_placement(loads, p);
  return p;
}

ReplicatedPlacement eplb_incremental(std::span<const double> loads, const ReplicatedPlacement& current, double tolerance) {
  const size_t D = current.slots.size();
  if (D == 0 || current.replicas.size() != loads.size()) throw std::invalid_argument("eplb: the current placement does not fit the loads");
  const size_t S = current.slots.front().size();
  for (const auto& s : current.slots)
    if (s.size() != S) throw std::invalid_argument("eplb: incremental placement needs equal slots per device");
  ReplicatedPlacement p;
  p.replicas = replicate_hottest(loads, static_cast<int64_t>(D * S), static_cast<int>(D));
  double total = 0.0;
  for (double x : loads) total += x;
  const double target = total / static_cast<double>(D) * (1.0 + tolerance);
  auto weight = [&](int64_t e) { return loads[static_cast<size_t>(e)] / p.replicas[static_cast<size_t>(e)]; };
  // Candidates to stay: the current copies, at most the new replica count of
  // each expert (the lowest devices' copies first), heaviest first.
  struct Held {
    double weight;
    int64_t expert;
    size_t device;
  };
  std::vector<Held> held;
  std::vector<int> left = p.replicas;
  for (size_t d = 0; d < D; ++d)
    for (int64_t e : current.slots[d])
      if (left[static_cast<size_t>(e)] > 0) {
        --left[static_cast<size_t>(e)];
        held.push_back({weight(e), e, d});
      }
  std::sort(held.begin(), held.end(), [](const Held& a, const Held& b) {
    if (a.weight != b.weight) return a.weight > b.weight;
    return a.expert != b.expert ? a.expert < b.expert : a.device < b.device;
  });
  p.slots.assign(D, {});
  std::vector<double> load(D, 0.0);
  std::vector<int> placed(loads.size(), 0);
  for (const Held& h : held)
    if (load[h.device] + h.weight <= target && !holds(p.slots[h.device], h.expert)) {
      p.slots[h.device].push_back(h.expert);
      load[h.device] += h.weight;
      ++placed[static_cast<size_t>(h.expert)];
    }
  std::vector<Copy> rest;
  for (size_t e = 0; e < loads.size(); ++e)
    for (int k = placed[e]; k < p.replicas[e]; ++k) rest.push_back({weight(static_cast<int64_t>(e)), static_cast<int64_t>(e)});
  pack(std::move(rest), S, load, p);
  refine(loads, p, load, target);
  evaluate_placement(loads, p);
  return p;
}

ReplicatedPlacement contiguous_placement(std::span<const double> loads, int devices) {
  const std::vector<int64_t> b = even_bounds(static_cast<int64_t>(loads.size()), devices);
  ReplicatedPlacement p;
  p.replicas.assign(loads.size(), 1);
  p.slots.resize(static_cast<size_t>(devices));
  for (size_t d = 0; d < p.slots.size(); ++d)
    for (int64_t e = b[d]; e < b[d + 1]; ++e) p.slots[d].push_back(e);
  evaluate_placement(loads, p);
  return p;
}

std::vector<int64_t> copies_received(const ReplicatedPlacement& from, const ReplicatedPlacement& to) {
  std::vector<int64_t> got(to.slots.size(), 0);
  for (size_t d = 0; d < to.slots.size(); ++d) {
    std::vector<int64_t> had = d < from.slots.size() ? from.slots[d] : std::vector<int64_t>();
    for (int64_t e : to.slots[d]) {
      auto it = std::find(had.begin(), had.end(), e);
      if (it == had.end()) ++got[d];
      else had.erase(it);  // each held copy covers one
    }
  }
  return got;
}

int64_t copies_moved(const ReplicatedPlacement& from, const ReplicatedPlacement& to) {
  int64_t moved = 0;
  for (int64_t n : copies_received(from, to)) moved += n;
  return moved;
}

}  // namespace troupe::moe
