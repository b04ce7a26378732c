// Dispatch/Combine codec (actors/transport/moe_messages.hpp): good messages pass with
// the right per-expert counts; each kind of malformed message (wrong token
// count, unknown or foreign expert id, truncated bytes, wrong width,
// mismatched list lengths, ungrouped rows, bad echo) is rejected with its own
// message; a seeded fuzz loop of byte flips and truncations of encoded
// dispatches never crashes and never lets an invariant-breaking dispatch through.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <cstdlib>
#include <random>

#include "actors/transport/moe_messages.hpp"

namespace troupe::runtime {
namespace {

// Shard 1 of 2 over 8 experts: owns [4, 8); d_model 4, 6 tokens, top-2.
ShardView view() {
  ShardView v;
  v.replica = 0;
  v.layer = 3;
  v.shard = 1;
  v.expert_begin = 4;
  v.expert_end = 8;
  v.width = 4;
  v.tokens = 6;
  v.top_k = 2;
  return v;
}

MoeKey key(bool backward = false) {
  MoeKey k;
  k.step = 7;
  k.microbatch = 2;
  k.layer = 3;
  k.shard = 1;
  k.stage = 1;
  k.backward = backward;
  k.chunk = 0;
  k.replica = 0;
  k.attempt = 0;
  k.dispatch_id = 42;
  return k;
}

struct Rows {
  std::vector<uint32_t> experts{4, 4, 5, 7, 7};
  std::vector<uint32_t> tokens{0, 3, 1, 2, 5};
  std::vector<float> weights{0.5f, 0.25f, 1.0f, 0.75f, 0.1f};
  uint32_t width = 4;
  std::vector<float> values() const {
    std::vector<float> v(experts.size() * width);
    for (size_t i = 0; i < v.size(); ++i) v[i] = 0.125f * static_cast<float>(i);
    return v;
  }
  Envelope build(const MoeKey& k = key()) const {
    return make_dispatch(k, width, values(), experts, weights, tokens);
  }
};

std::string rejected(const caf::expected<CheckedDispatch>& r) {
  EXPECT_FALSE(r) << "expected a rejection";
  return r ? std::string() : to_string(r.error());
}

TEST(MoeMessages, GoodDispatchPassesWithCounts) {
  Rows rows;
  auto r = check_dispatch(rows.build(), view());
  ASSERT_TRUE(r) << to_string(r.error());
  EXPECT_EQ(r->id, key());
  EXPECT_EQ(r->counts, (std::vector<int64_t>{2, 1, 0, 2}));
  const auto vals = tensor_f32(r->msg->getRows());
  EXPECT_EQ(std::vector<float>(vals.begin(), vals.end()), rows.values());
  EXPECT_EQ(r->msg->getCombineWeights()[3], 0.75f);
}

TEST(MoeMessages, EmptyDispatchIsValid) {
  Rows rows;
  rows.experts.clear();
  rows.tokens.clear();
  rows.weights.clear();
  auto r = check_dispatch(rows.build(), view());
  ASSERT_TRUE(r) << to_string(r.error());
  EXPECT_EQ(r->counts, (std::vector<int64_t>{0, 0, 0, 0}));
}

TEST(MoeMessages, WrongTokenCountRejected) {
  // numRows disagreeing with the tensor: caught by envelope validation.
  Envelope e = Envelope::build<schemas::Dispatch>([](schemas::Dispatch::Builder d) {
    write_moe_key(d.initId(), key());
    d.setNumRows(3);
    d.setWidth(4);
    const int64_t shape[2] = {2, 4};
    std::vector<float> v(8, 1.0f);
    set_tensor_f32(d.initRows(), shape, v);
    d.initExpertIds(3);
    d.initCombineWeights(3);
    d.initTokenIndex(3);
  });
  EXPECT_NE(rejected(check_dispatch(e, view())).find("dispatch.rows: shape [2,4] != [numRows=3"), std::string::npos);

  // More rows than tokens x min(top_k, owned experts) can produce.
  Rows many;
  many.experts.assign(13, 4);
  many.tokens.resize(13);
  many.weights.assign(13, 1.0f);
  for (uint32_t i = 0; i < 13; ++i) many.experts[i] = 4 + i / 4, many.tokens[i] = i % 4;
  EXPECT_NE(rejected(check_dispatch(many.build(), view())).find("13 rows, more than tokens 6 x min(top_k 2"),
            std::string::npos);

  // A token index outside the microbatch.
  Rows far;
  far.tokens[4] = 6;
  EXPECT_NE(rejected(check_dispatch(far.build(), view())).find("row 4: token index 6 >= tokens 6"), std::string::npos);
}

TEST(MoeMessages, UnknownAndForeignExpertRejected) {
  Rows unknown;
  unknown.experts[4] = 9;  // no such expert (E = 8)
  EXPECT_NE(rejected(check_dispatch(unknown.build(), view())).find("expert id 9 is not owned by shard 1 (experts [4, 8))"),
            std::string::npos);
  Rows foreign;
  foreign.experts[0] = 3;  // shard 0's expert
  EXPECT_NE(rejected(check_dispatch(foreign.build(), view())).find("row 0: expert id 3 is not owned"), std::string::npos);
}

// A shard holding copies of experts 1 and 2 besides its range [4, 8): their
// rows come first (ids ascending) and count at their place in the merged order.
TEST(MoeMessages, CopiesAreOwnedInIdOrder) {
  ShardView v = view();
  v.copies = {1, 2};
  Rows rows;
  rows.experts = {1, 2, 2, 4, 7};
  rows.tokens = {0, 1, 4, 3, 5};
  auto r = check_dispatch(rows.build(), v);
  ASSERT_TRUE(r) << to_string(r.error());
  EXPECT_EQ(r->counts, (std::vector<int64_t>{1, 2, 1, 0, 0, 1}));
  Rows foreign = rows;
  foreign.experts[0] = 0;  // not copied here
  EXPECT_NE(rejected(check_dispatch(foreign.build(), v)).find("expert id 0 is not owned by shard 1 (experts [4, 8) and 2 copies)"),
            std::string::npos);
  Rows unordered = rows;
  unordered.experts = {2, 1, 4, 4, 7};
  EXPECT_NE(rejected(check_dispatch(unordered.build(), v)).find("rows must be grouped by expert"), std::string::npos);
}

TEST(MoeMessages, TruncatedBytesRejected) {
  const std::vector<uint8_t> frame = Rows().build().encode();
  for (size_t cut : {size_t{0}, size_t{7}, kFrameHeaderBytes, frame.size() / 2, frame.size() - 1}) {
    auto d = Envelope::decode(frame.data(), cut);
    ASSERT_FALSE(d) << "a frame cut to " << cut << " of " << frame.size() << " bytes decoded";
    // The transport turns a failed decode into an invalid envelope: the check reports its error.
    const std::string why = rejected(check_dispatch(Envelope::invalid(d.error()), view()));
    EXPECT_NE(why.find("envelope"), std::string::npos) << why;
  }
  auto whole = Envelope::decode(frame.data(), frame.size());
  ASSERT_TRUE(whole);
  EXPECT_TRUE(check_dispatch(*whole, view()));
}

TEST(MoeMessages, WrongWidthRejected) {
  Rows r;
  r.width = 5;
  EXPECT_NE(rejected(check_dispatch(r.build(), view())).find("width 5 != d_model 4"), std::string::npos);
}

TEST(MoeMessages, MismatchedListLengthsRejected) {
  Rows r;
  r.weights.pop_back();
  EXPECT_NE(rejected(check_dispatch(r.build(), view())).find("dispatch.combineWeights: 4 entries for 5 rows"),
            std::string::npos);
  Rows t;
  t.tokens.push_back(1);
  EXPECT_NE(rejected(check_dispatch(t.build(), view())).find("dispatch.tokenIndex: 6 entries for 5 rows"),
            std::string::npos);
}

TEST(MoeMessages, UngroupedRowsAndRepeatedTokensRejected) {
  Rows order;
  order.experts = {4, 5, 4, 7, 7};
  EXPECT_NE(rejected(check_dispatch(order.build(), view())).find("rows must be grouped by expert"), std::string::npos);
  Rows twice;
  twice.tokens = {3, 3, 1, 2, 5};
  EXPECT_NE(rejected(check_dispatch(twice.build(), view())).find("each token once per expert"), std::string::npos);
  Rows nan;
  nan.weights[2] = std::nanf("");
  EXPECT_NE(rejected(check_dispatch(nan.build(), view())).find("row 2: combine weight is not finite"), std::string::npos);
}

TEST(MoeMessages, MisaddressedRejected) {
  MoeKey k = key();
  k.layer = 2;
  EXPECT_NE(rejected(check_dispatch(Rows().build(k), view())).find("this is replica 0 layer 3 shard 1"), std::string::npos);
  Envelope other = Envelope::build<schemas::Stop>([](schemas::Stop::Builder) {});
  EXPECT_NE(rejected(check_dispatch(other, view())).find("asked for dispatch"), std::string::npos);
}

TEST(MoeMessages, CombineEchoChecked) {
  const Rows rows;
  const MoeKey k = key(true);
  std::vector<float> out(rows.experts.size() * 4, 1.0f), wg(rows.experts.size(), 0.5f);
  auto ok = check_combine(make_combine(k, 4, out, rows.tokens, wg), k, 4, rows.tokens);
  ASSERT_TRUE(ok) << to_string(ok.error());

  auto why = [&](const Envelope& e) {
    auto r = check_combine(e, k, 4, rows.tokens);
    EXPECT_FALSE(r);
    return r ? std::string() : to_string(r.error());
  };
  MoeKey other = k;
  other.microbatch = 3;
  EXPECT_NE(why(make_combine(other, 4, out, rows.tokens, wg)).find("does not echo the dispatch"), std::string::npos);
  std::vector<uint32_t> short_tokens(rows.tokens.begin(), rows.tokens.end() - 1);
  std::vector<float> short_out(out.begin(), out.end() - 4), short_wg(wg.begin(), wg.end() - 1);
  EXPECT_NE(why(make_combine(k, 4, short_out, short_tokens, short_wg)).find("4 rows for a dispatch of 5"),
            std::string::npos);
  std::vector<uint32_t> swapped = rows.tokens;
  std::swap(swapped[0], swapped[1]);
  EXPECT_NE(why(make_combine(k, 4, out, swapped, wg)).find("row 0: token index 3 does not echo"), std::string::npos);
  EXPECT_NE(why(make_combine(k, 4, out, rows.tokens, {})).find("combine.weightGrads: 0 entries for 5 rows"), std::string::npos);
  std::vector<float> wide(rows.experts.size() * 5, 1.0f);
  EXPECT_NE(why(make_combine(k, 5, wide, rows.tokens, wg)).find("width 5 != d_model 4"), std::string::npos);
  // Forward combines carry no weight gradients.
  const MoeKey f = key(false);
  auto fr = check_combine(make_combine(f, 4, out, rows.tokens, wg), f, 4, rows.tokens);
  ASSERT_FALSE(fr);
  EXPECT_NE(to_string(fr.error()).find("weightGrads: must be empty in forward"), std::string::npos);
}

// Byte flips and truncations of an encoded dispatch: each outcome is a
// rejection or a dispatch that satisfies every invariant the shard relies on.
TEST(MoeMessages, FuzzedDispatchesNeverCrash) {
  const std::vector<uint8_t> frame = Rows().build().encode();
  // TROUPE_FUZZ_SEED / TROUPE_FUZZ_ITERATIONS explore further (bench/fuzz_long.sh).
  const char* seed_env = std::getenv("TROUPE_FUZZ_SEED");
  const char* iter_env = std::getenv("TROUPE_FUZZ_ITERATIONS");
  std::mt19937_64 rng(seed_env ? std::strtoull(seed_env, nullptr, 10) : 2024);
  const int iterations = iter_env ? static_cast<int>(std::strtol(iter_env, nullptr, 10)) : 20000;
  const ShardView v = view();
  size_t accepted = 0, rejected_n = 0;
  for (int it = 0; it < iterations; ++it) {
    std::vector<uint8_t> f = frame;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int j = 0; j < flips; ++j) {
      // Leave the frame header alone most of the time so the flips reach the message.
      const size_t lo = (rng() % 8 == 0) ? 0 : kFrameHeaderBytes;
      const size_t pos = lo + rng() % (f.size() - lo);
      f[pos] ^= static_cast<uint8_t>(1u << (rng() % 8));
    }
    if (rng() % 10 == 0) f.resize(rng() % f.size());
    auto d = Envelope::decode(f.data(), f.size());
    const Envelope e = d ? *d : Envelope::invalid(d.error());
    auto r = check_dispatch(e, v);
    if (!r) {
      ++rejected_n;
      continue;
    }
    ++accepted;
    const auto m = r->msg.get();
    const uint32_t n = m.getNumRows();
    ASSERT_EQ(tensor_f32(m.getRows()).size(), static_cast<size_t>(n) * v.width);
    int64_t sum = 0;
    for (int64_t c : r->counts) sum += c;
    ASSERT_EQ(sum, n);
    for (uint32_t i = 0; i < n; ++i) {
      ASSERT_GE(m.getExpertIds()[i], v.expert_begin);
      ASSERT_LT(m.getExpertIds()[i], v.expert_end);
      ASSERT_LT(m.getTokenIndex()[i], v.tokens);
    }
  }
  EXPECT_GT(rejected_n, 0u);
  EXPECT_GT(accepted, 0u);  // flips inside row values keep a dispatch valid
  std::printf("fuzz: %zu accepted, %zu rejected\n", accepted, rejected_n);
}

}  // namespace
}  // namespace troupe::runtime
