// The decoupled RL messages across processes (actors/rl/rl_wire.hpp): weights
// and rollouts survive encode -> frame bytes -> decode bit for bit, and a
// hostile or broken rollout or weight message is refused with an error that
// names what is wrong (never a crash, never a half-read rollout).
#include <cmath>
#include <limits>
#include <string>

#include <gtest/gtest.h>

#include <caf/all.hpp>

#include "actors/cluster/runtime_cluster_internal.hpp"
#include "actors/rl/rl_wire.hpp"
#include "schemas/rl.capnp.h"

namespace troupe::test {
namespace {

using runtime::rlmsg::Rollout;
using runtime::rlmsg::Weights;
namespace rlwire = runtime::rlwire;

// Through the bytes another process would receive.
Envelope over_the_wire(const Envelope& e) {
  const std::vector<uint8_t> frame = e.encode();
  auto back = Envelope::decode(frame.data(), frame.size());
  EXPECT_TRUE(back) << caf::to_string(back.error());
  return back ? *back : Envelope{};
}

rlwire::RolloutBounds bounds() {
  rlwire::RolloutBounds b;
  b.seed = 42;
  b.first_step = 0;
  b.steps = 10;
  b.prompts_per_step = 2;
  b.group_size = 3;
  b.max_new_tokens = 4;
  b.vocab = 16;
  b.seq_len = 32;
  b.generators = 2;
  return b;
}

// A consistent rollout of step 5 sampled by versions 4 and 5.
Rollout sample_rollout() {
  auto s = std::make_shared<rl::StepRollouts>();
  s->step = 5;
  s->version = 4;
  s->gen_seconds = 0.125;
  for (int64_t g = 0; g < 2; ++g) {
    s->ids.push_back(rl::GroupId{42, 5, g});
    s->prompts.push_back(rl::Prompt{10 + g, {1, 2, static_cast<int32_t>(3 + g)}, {9, 12}});
  }
  for (int i = 0; i < 6; ++i) {
    model::Completion c;
    for (int t = 0; t <= i % 4; ++t) {
      c.tokens.push_back((i + t) % 16);
      c.logprobs.push_back(-0.1f * static_cast<float>(t + 1) - 1e-7f * static_cast<float>(i));
      c.versions.push_back(t == 0 ? 4 : 5);
    }
    c.stop = static_cast<model::StopReason>(i % 3);
    s->completions.push_back(c);
  }
  Rollout r;
  r.r = s;
  r.generator = 1;
  r.busy_seconds = 0.5;
  r.sync_seconds = 0.01;
  r.sync_bytes = 4096;
  r.loads = 2;
  r.paused_seconds = 0.25;
  r.switches = 1;
  return r;
}

TEST(RlWire, WeightsRoundTripBitwise) {
  std::vector<float> p(1000);
  for (size_t i = 0; i < p.size(); ++i) p[i] = std::ldexp(static_cast<float>(i) - 500.5f, static_cast<int>(i % 40) - 20);
  p[7] = -0.0f;
  p[8] = std::numeric_limits<float>::denorm_min();
  const Weights w = Weights::of(17, std::make_shared<const std::vector<float>>(p));
  auto back = rlwire::decode_weights(over_the_wire(rlwire::encode_weights(w)), p.size());
  ASSERT_TRUE(back) << caf::to_string(back.error());
  EXPECT_EQ(back->version, 17);
  ASSERT_EQ(back->size, p.size());
  EXPECT_EQ(std::memcmp(back->data.get(), p.data(), p.size() * sizeof(float)), 0);
}

TEST(RlWire, WeightsOfAnotherModelAreRefused) {
  const Weights w = Weights::of(3, std::make_shared<const std::vector<float>>(std::vector<float>(10, 1.0f)));
  auto back = rlwire::decode_weights(over_the_wire(rlwire::encode_weights(w)), 11);
  ASSERT_FALSE(back);
  EXPECT_NE(caf::to_string(back.error()).find("10 values for a model of 11 parameters"), std::string::npos)
      << caf::to_string(back.error());
  // A rollout envelope is not weights.
  EXPECT_FALSE(rlwire::decode_weights(rlwire::encode_rollout(sample_rollout()), 10));
  // Negative versions fail the envelope's own validation.
  auto neg = Envelope::build<schemas::RlWeights>([](schemas::RlWeights::Builder b) {
    b.setVersion(-1);
    set_tensor_f32(b.initParams(), std::vector<int64_t>{1}, std::vector<float>{1.0f});
  });
  EXPECT_FALSE(neg.ok());
}

TEST(RlWire, RolloutRoundTripBitwise) {
  const Rollout r = sample_rollout();
  auto back = rlwire::decode_rollout(over_the_wire(rlwire::encode_rollout(r)), bounds());
  ASSERT_TRUE(back) << caf::to_string(back.error());
  const rl::StepRollouts &a = *r.r, &b = *back->r;
  EXPECT_EQ(b.step, a.step);
  EXPECT_EQ(b.version, a.version);
  EXPECT_EQ(b.gen_seconds, a.gen_seconds);
  EXPECT_EQ(b.ids, a.ids);
  ASSERT_EQ(b.prompts.size(), a.prompts.size());
  for (size_t i = 0; i < a.prompts.size(); ++i) {
    EXPECT_EQ(b.prompts[i].index, a.prompts[i].index);
    EXPECT_EQ(b.prompts[i].tokens, a.prompts[i].tokens);
    EXPECT_EQ(b.prompts[i].answer, a.prompts[i].answer);
  }
  ASSERT_EQ(b.completions.size(), a.completions.size());
  for (size_t i = 0; i < a.completions.size(); ++i) {
    EXPECT_EQ(b.completions[i].tokens, a.completions[i].tokens);
    EXPECT_EQ(b.completions[i].versions, a.completions[i].versions);
    EXPECT_EQ(b.completions[i].stop, a.completions[i].stop);
    ASSERT_EQ(b.completions[i].logprobs.size(), a.completions[i].logprobs.size());
    EXPECT_EQ(std::memcmp(b.completions[i].logprobs.data(), a.completions[i].logprobs.data(),
                          a.completions[i].logprobs.size() * sizeof(float)),
              0);
  }
  EXPECT_EQ(back->generator, r.generator);
  EXPECT_EQ(back->busy_seconds, r.busy_seconds);
  EXPECT_EQ(back->sync_seconds, r.sync_seconds);
  EXPECT_EQ(back->sync_bytes, r.sync_bytes);
  EXPECT_EQ(back->loads, r.loads);
  EXPECT_EQ(back->paused_seconds, r.paused_seconds);
  EXPECT_EQ(back->switches, r.switches);
}

// Each hostile change, and the words its error must contain.
struct Hostile {
  const char* name;
  void (*mutate)(rl::StepRollouts&, Rollout&);
  const char* expect;
};

// The task the sample rollout's prompts come from (step 5, 2 prompts per
// step: training prompts 10 and 11).
class SampleTask final : public rl::Task {
 public:
  std::string describe() const override { return "sample"; }
  rl::Prompt train_prompt(int64_t i) const override { return rl::Prompt{i, {1, 2, static_cast<int32_t>(3 + i - 10)}, {9, 12}}; }
  std::vector<rl::Prompt> eval_prompts(int64_t) const override { return {}; }
  const rl::Verifier& verifier() const override { throw std::logic_error("not scored here"); }
  int32_t eos_token() const override { return 12; }
};

// With the task known, a prompt or answer other than the group's is refused:
// the verifier would score against the answer the rollout carries.
TEST(RlWire, PromptsMustBeTheTasksOwn) {
  SampleTask task;
  rlwire::RolloutBounds b = bounds();
  b.task = &task;
  EXPECT_TRUE(rlwire::decode_rollout(rlwire::encode_rollout(sample_rollout()), b));
  for (int which = 0; which < 3; ++which) {
    Rollout r = sample_rollout();
    auto s = std::make_shared<rl::StepRollouts>(*r.r);
    if (which == 0) s->prompts[1].answer = {8, 12};   // an easier answer
    if (which == 1) s->prompts[0].tokens[2] = 7;      // another problem
    if (which == 2) s->prompts[1].index = 3;          // another prompt's number
    r.r = s;
    auto back = rlwire::decode_rollout(rlwire::encode_rollout(r), b);
    ASSERT_FALSE(back) << which;
    EXPECT_NE(caf::to_string(back.error()).find("not the task's prompt"), std::string::npos) << caf::to_string(back.error());
  }
}

TEST(RlWire, HostileRolloutsAreRefusedByName) {
  const Hostile cases[] = {
      {"step past the run", [](rl::StepRollouts& s, Rollout&) { s.step = 10; }, "outside this run's steps"},
      {"version past the run", [](rl::StepRollouts& s, Rollout&) { s.version = 11; },
       "rlRollout.version: 11 outside this run's versions 0..10"},
      {"unknown generator", [](rl::StepRollouts&, Rollout& r) { r.generator = 2; }, "rlRollout.generator: 2"},
      {"another run's seed", [](rl::StepRollouts& s, Rollout&) { s.ids[1].seed = 7; }, "is not group 1 of step 5"},
      {"groups swapped", [](rl::StepRollouts& s, Rollout&) { std::swap(s.ids[0], s.ids[1]); }, "is not group 0 of step 5"},
      {"a group missing", [](rl::StepRollouts& s, Rollout&) {
         s.ids.pop_back();
         s.prompts.pop_back();
         s.completions.resize(3);
       }, "1 groups and 3 completions, expected 2 and 6"},
      {"token outside the vocabulary", [](rl::StepRollouts& s, Rollout&) { s.completions[2].tokens[0] = 16; },
       "completions[2]: token 16 outside the vocabulary"},
      {"prompt token outside the vocabulary", [](rl::StepRollouts& s, Rollout&) { s.prompts[0].tokens[1] = -3; },
       "prompts[0]: token -3 outside the vocabulary"},
      {"empty prompt", [](rl::StepRollouts& s, Rollout&) { s.prompts[1].tokens.clear(); }, "prompts[1]: 0 tokens"},
      {"too many new tokens", [](rl::StepRollouts& s, Rollout&) {
         auto& c = s.completions[0];
         c.tokens.assign(5, 1);
         c.logprobs.assign(5, -1.0f);
         c.versions.assign(5, 5);
       }, "5 tokens > max_new_tokens 4"},
      {"positive log-prob", [](rl::StepRollouts& s, Rollout&) { s.completions[3].logprobs[0] = 0.5f; }, "is not finite and <= 0"},
      {"NaN log-prob", [](rl::StepRollouts& s, Rollout&) { s.completions[3].logprobs[0] = std::nanf(""); }, "is not finite and <= 0"},
      {"token from past the run", [](rl::StepRollouts& s, Rollout&) { s.completions[1].versions[0] = 11; },
       "token version 11 outside this run's versions 0..10"},
      {"negative token version", [](rl::StepRollouts& s, Rollout&) { s.completions[1].versions[0] = -1; },
       "token version -1 outside"},
      {"row past the context", [](rl::StepRollouts& s, Rollout&) { s.prompts[1].tokens.assign(30, 1); },
       "completions[3]: 30 prompt + 4 new tokens > seq_len 32"},
      {"empty completion", [](rl::StepRollouts& s, Rollout&) {
         s.completions[4].tokens.clear();
         s.completions[4].logprobs.clear();
         s.completions[4].versions.clear();
       }, "completions[4]: no tokens"},
      {"token older than the rollout", [](rl::StepRollouts& s, Rollout&) { s.completions[5].versions[0] = 3; },
       "token version 3 older than the version 4 the rollout started with"},
  };
  for (const Hostile& h : cases) {
    Rollout r = sample_rollout();
    auto s = std::make_shared<rl::StepRollouts>(*r.r);
    h.mutate(*s, r);
    r.r = s;
    auto back = rlwire::decode_rollout(over_the_wire(rlwire::encode_rollout(r)), bounds());
    ASSERT_FALSE(back) << h.name << " was accepted";
    const std::string text = caf::to_string(back.error());
    EXPECT_NE(text.find(h.expect), std::string::npos) << h.name << ": " << text;
    EXPECT_EQ(envelope_error_code(back.error()), envelope_errc::schema_violation) << h.name;
  }
}

// latest: a step dealt again after the trainer trained it (a restarted
// buffer) is sampled with versions newer than the step. It is a duplicate
// for the ledger to drop, not a broken generator: refusing it here made the
// generator restart, the step be dealt again, and the run fail.
TEST(RlWire, DuplicateSampledAfterItsStepWasTrainedIsAccepted) {
  Rollout r = sample_rollout();
  auto s = std::make_shared<rl::StepRollouts>(*r.r);
  s->version = 7;
  for (model::Completion& c : s->completions) c.versions.assign(c.tokens.size(), 7);
  r.r = s;
  auto back = rlwire::decode_rollout(over_the_wire(rlwire::encode_rollout(r)), bounds());
  ASSERT_TRUE(back) << caf::to_string(back.error());
  EXPECT_EQ(back->r->version, 7);
  EXPECT_EQ(back->r->completions[0].versions, std::vector<int64_t>{7});
}

// What the envelope's own validation refuses before the receiver looks:
// per-token lists of different lengths, an unknown stop reason, a partial group.
TEST(RlWire, InconsistentRolloutsFailEnvelopeValidation) {
  auto build = [](auto&& fill) { return Envelope::build<schemas::RlRollout>(fill); };
  auto lengths = build([](schemas::RlRollout::Builder b) {
    b.initIds(1);
    b.initPrompts(1);
    auto c = b.initCompletions(1);
    c[0].initTokens(2);
    c[0].initLogprobs(1);
    c[0].initVersions(2);
  });
  ASSERT_FALSE(lengths.ok());
  EXPECT_NE(caf::to_string(lengths.error()).find("2 tokens, 1 log-probs, 2 versions"), std::string::npos)
      << caf::to_string(lengths.error());
  auto stop = build([](schemas::RlRollout::Builder b) {
    b.initIds(1);
    b.initPrompts(1);
    b.initCompletions(1)[0].setStop(3);
  });
  EXPECT_FALSE(stop.ok());
  auto partial = build([](schemas::RlRollout::Builder b) {
    b.initIds(2);
    b.initPrompts(2);
    b.initCompletions(3);
  });
  ASSERT_FALSE(partial.ok());
  EXPECT_NE(caf::to_string(partial.error()).find("not a whole number per group"), std::string::npos);
  auto prompts = build([](schemas::RlRollout::Builder b) {
    b.initIds(2);
    b.initPrompts(1);
  });
  EXPECT_FALSE(prompts.ok());
  // And a damaged frame is rejected as damaged (a lost message, retried).
  std::vector<uint8_t> frame = rlwire::encode_rollout(sample_rollout()).encode();
  frame[frame.size() / 2] ^= 0x10;
  auto damaged = Envelope::decode(frame.data(), frame.size());
  ASSERT_FALSE(damaged);
  EXPECT_TRUE(damaged_in_flight(damaged.error()));
}

// The envelopes take the shared-memory path only when every process,
// process 0 included, is on one host: generators on another host than
// process 0 (even all on one host of their own) get them over TCP.
TEST(RlWire, SharedMemoryOnlyWithProcessZeroOnTheSameHost) {
  using E = std::vector<std::pair<std::string, uint16_t>>;
  EXPECT_TRUE(runtime::all_on_one_host(E{{"10.0.0.1", 0}, {"10.0.0.1", 4000}}));
  EXPECT_TRUE(runtime::all_on_one_host(E{{"a", 0}, {"a", 1}, {"a", 2}}));
  EXPECT_FALSE(runtime::all_on_one_host(E{{"10.0.0.1", 0}, {"10.0.0.2", 4000}}));
  EXPECT_FALSE(runtime::all_on_one_host(E{{"a", 0}, {"b", 1}, {"b", 2}}));
}

}  // namespace
}  // namespace troupe::test
