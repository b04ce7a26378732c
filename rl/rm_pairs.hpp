// Pairs for the reward model's Bradley–Terry loss (rl.rm_loss =
// "bradley_terry"; docs/rl.md "Learned reward model"): within one prompt's group
// of labelled completions, each completion the verifier accepts against each
// one it rejects. A group that is all right or all wrong gives no pair (and
// is counted, because a pairwise RM learns nothing from it). The pair set is
// a pure function of the examples; the trainer draws it in a seeded order.
//
// The loss of a pair is -log sigmoid(s_pos - s_neg): the probability, under
// the Bradley–Terry model, that the accepted completion is preferred. Only
// differences of scores enter, so it leaves the score's offset free; the
// pairwise accuracy (s_pos > s_neg) is the metric that matches it.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "rl/reward_model.hpp"

namespace troupe::rl {

struct RmGroupCounts {
  int64_t groups = 0;     // distinct prompts
  int64_t all_right = 0;  // groups whose completions are all accepted: no pair
  int64_t all_wrong = 0;  // groups whose completions are all rejected: no pair
  int64_t pairs = 0;
};

struct RmPairSet {
  std::vector<RmPair> pairs;  // group by group (first appearance), then accepted-major, in example order
  RmGroupCounts counts;
};

// Groups the examples by prompt_index and pairs every accepted completion of
// a group with every rejected one.
RmPairSet make_pairs(std::span<const RmExample> examples);

// Mean Bradley–Terry loss over pairs, in float64: mean_i softplus(-(p_i - n_i)),
// written stably. d_pos / d_neg (resized; optional) get d mean / d p_i =
// -sigmoid(n_i - p_i) / count and d mean / d n_i = +sigmoid(n_i - p_i) / count.
double bradley_terry_loss(std::span<const double> s_pos, std::span<const double> s_neg, std::vector<double>* d_pos,
                          std::vector<double>* d_neg);

// What scores say about pairs: the share with s_pos > s_neg (a tie is wrong;
// chance is 50%) and the mean Bradley–Terry loss. No pairs: all zero.
struct RmPairAccuracy {
  int64_t pairs = 0;
  double accuracy = 0.0;
  double loss = 0.0;
};
RmPairAccuracy rm_pair_accuracy(std::span<const double> scores, std::span<const RmPair> pairs);

}  // namespace troupe::rl
