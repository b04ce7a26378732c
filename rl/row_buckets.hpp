// How a step's training rows go into length buckets (rl.row_buckets), and
// the buckets onto data-parallel devices (rl/trainer.cpp). Plain functions
// of the rows' padded lengths: no math, no actors, so they are tested alone
// (tests/rl/rl_row_buckets_test.cpp).
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace troupe::rl {

// `padded`: each row's length as its bucket would pad it, sorted ascending.
// Returns min(k, rows) buckets as [begin, end) spans of consecutive rows, in
// order, each padded to its last row's length, with the fewest padded tokens
// in all (dynamic programming over the boundaries between runs of equal
// lengths: a boundary inside a run saves nothing). When the rows have fewer
// distinct lengths than k (the addition task's 5-token answers), the bucket
// with the most rows is split in halves until there are k, so that every
// data-parallel device gets rows. For searches too large to run every step
// (k x runs^2 > 5e7), equal row counts instead.
std::vector<std::pair<int64_t, int64_t>> length_buckets(const std::vector<int64_t>& padded, int64_t k);

// Each bucket's device: the costliest first to the device with the least
// cost so far (ties: the earlier bucket, the lower device), so that every
// device gets about the same padded tokens.
std::vector<int64_t> deal_buckets(const std::vector<int64_t>& costs, int64_t devices);

}  // namespace troupe::rl
