// Bradley–Terry pairs, loss and pairwise accuracy (see rm_pairs.hpp).
#include "rl/rm_pairs.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <stdexcept>
#include <string>

namespace troupe::rl {

namespace {

// -log sigmoid(z) = softplus(-z), stable for any finite z.
double softplus_neg(double z) { return std::max(-z, 0.0) + std::log1p(std::exp(-std::abs(z))); }

double sigmoid(double z) { return z >= 0 ? 1.0 / (1.0 + std::exp(-z)) : std::exp(z) / (1.0 + std::exp(z)); }

}  // namespace

RmPairSet make_pairs(std::span<const RmExample> ex) {
  // Group members in example order; groups in order of first appearance (the
  // data is prompt-major, so this is the data's own order).
  std::map<int64_t, size_t> slot;
  std::vector<std::vector<int64_t>> right, wrong;
  for (size_t i = 0; i < ex.size(); ++i) {
    const auto [it, fresh] = slot.emplace(ex[i].prompt_index, right.size());
    if (fresh) {
      right.emplace_back();
      wrong.emplace_back();
    }
    (ex[i].label ? right : wrong)[it->second].push_back(static_cast<int64_t>(i));
  }
  RmPairSet out;
  out.counts.groups = static_cast<int64_t>(right.size());
  for (size_t g = 0; g < right.size(); ++g) {
    if (wrong[g].empty()) ++out.counts.all_right;
    if (right[g].empty()) ++out.counts.all_wrong;
    for (int64_t p : right[g])
      for (int64_t n : wrong[g]) out.pairs.push_back({p, n});
  }
  out.counts.pairs = static_cast<int64_t>(out.pairs.size());
  return out;
}

double bradley_terry_loss(std::span<const double> sp, std::span<const double> sn, std::vector<double>* dp,
                          std::vector<double>* dn) {
  if (sp.size() != sn.size() || sp.empty())
    throw std::invalid_argument("bradley_terry_loss: " + std::to_string(sp.size()) + " accepted and " +
                                std::to_string(sn.size()) + " rejected scores (need the same, non-zero count)");
  const double n = static_cast<double>(sp.size());
  if (dp) dp->assign(sp.size(), 0.0);
  if (dn) dn->assign(sp.size(), 0.0);
  double sum = 0.0;
  for (size_t i = 0; i < sp.size(); ++i) {
    if (!std::isfinite(sp[i]) || !std::isfinite(sn[i]))
      throw std::invalid_argument("bradley_terry_loss: pair " + std::to_string(i) + " has a score that is not finite");
    const double margin = sp[i] - sn[i];
    sum += softplus_neg(margin);
    // d softplus(-m) / d m = -sigmoid(-m).
    const double g = sigmoid(-margin) / n;
    if (dp) (*dp)[i] = -g;
    if (dn) (*dn)[i] = g;
  }
  return sum / n;
}

RmPairAccuracy rm_pair_accuracy(std::span<const double> scores, std::span<const RmPair> pairs) {
  RmPairAccuracy a;
  a.pairs = static_cast<int64_t>(pairs.size());
  if (pairs.empty()) return a;
  std::vector<double> sp, sn;
  sp.reserve(pairs.size());
  sn.reserve(pairs.size());
  int64_t right = 0;
  for (const RmPair& p : pairs) {
    if (p.pos < 0 || p.neg < 0 || static_cast<size_t>(std::max(p.pos, p.neg)) >= scores.size())
      throw std::invalid_argument("rm_pair_accuracy: a pair indexes past the " + std::to_string(scores.size()) + " scores");
    sp.push_back(scores[static_cast<size_t>(p.pos)]);
    sn.push_back(scores[static_cast<size_t>(p.neg)]);
    right += sp.back() > sn.back();
  }
  a.accuracy = static_cast<double>(right) / static_cast<double>(a.pairs);
  a.loss = bradley_terry_loss(sp, sn, nullptr, nullptr);
  return a;
}

}  // namespace troupe::rl
