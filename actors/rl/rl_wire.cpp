// Cap'n Proto encoding of the decoupled RL messages (see rl_wire.hpp).
#include "actors/rl/rl_wire.hpp"

#include <cmath>
#include <cstring>
#include <string>

#include "actors/plan.hpp"
#include "schemas/rl.capnp.h"

namespace troupe::runtime::rlwire {

static_assert(kRlMaxMessageBytes == DecodeLimits{}.max_message_bytes, "the spec check's bound is the envelope's");

namespace {

caf::error bad(const std::string& what) { return make_error(envelope_errc::schema_violation, what); }

}  // namespace

Envelope encode_weights(const rlmsg::Weights& w) {
  const std::span<const float> p = w.values();
  // One segment sized for the tensor (the bulk plane sends it in one piece),
  // whose bytes are copied in once, without zeroing them first.
  const size_t bytes = p.size() * sizeof(float);
  return Envelope::build_blob<schemas::RlWeights>(bytes, [&](schemas::RlWeights::Builder b) {
    b.setVersion(w.version);
    auto data = init_tensor_f32_blob(b.initParams(), static_cast<int64_t>(p.size()));
    if (bytes > 0) std::memcpy(data.begin(), p.data(), bytes);
    return data;
  });
}

caf::expected<rlmsg::Weights> decode_weights(const Envelope& env, size_t parameters) {
  auto r = env.read<schemas::RlWeights>();
  if (!r) return r.error();
  const std::span<const float> v = tensor_f32((*r)->getParams());
  if (v.size() != parameters)
    return bad("rlWeights.params: " + std::to_string(v.size()) + " values for a model of " + std::to_string(parameters) +
               " parameters");
  // No copy: the values stay in the received message (word-aligned), which
  // the weights keep alive.
  auto holder = std::make_shared<const Read<schemas::RlWeights>>(*r);
  return rlmsg::Weights{(*r)->getVersion(), std::shared_ptr<const float>(holder, v.data()), v.size()};
}

Envelope encode_rollout(const rlmsg::Rollout& x) {
  const rl::StepRollouts& s = *x.r;
  return Envelope::build<schemas::RlRollout>([&](schemas::RlRollout::Builder b) {
    b.setStep(s.step);
    b.setVersion(s.version);
    auto ids = b.initIds(static_cast<unsigned>(s.ids.size()));
    for (unsigned i = 0; i < ids.size(); ++i) {
      ids[i].setSeed(s.ids[i].seed);
      ids[i].setStep(s.ids[i].step);
      ids[i].setIndex(s.ids[i].index);
    }
    auto prompts = b.initPrompts(static_cast<unsigned>(s.prompts.size()));
    for (unsigned i = 0; i < prompts.size(); ++i) {
      const rl::Prompt& p = s.prompts[i];
      prompts[i].setIndex(p.index);
      auto t = prompts[i].initTokens(static_cast<unsigned>(p.tokens.size()));
      for (unsigned j = 0; j < t.size(); ++j) t.set(j, p.tokens[j]);
      auto a = prompts[i].initAnswer(static_cast<unsigned>(p.answer.size()));
      for (unsigned j = 0; j < a.size(); ++j) a.set(j, p.answer[j]);
    }
    auto comps = b.initCompletions(static_cast<unsigned>(s.completions.size()));
    for (unsigned i = 0; i < comps.size(); ++i) {
      const model::Completion& c = s.completions[i];
      auto t = comps[i].initTokens(static_cast<unsigned>(c.tokens.size()));
      auto lp = comps[i].initLogprobs(static_cast<unsigned>(c.logprobs.size()));
      auto v = comps[i].initVersions(static_cast<unsigned>(c.versions.size()));
      for (unsigned j = 0; j < t.size(); ++j) t.set(j, c.tokens[j]);
      for (unsigned j = 0; j < lp.size(); ++j) lp.set(j, c.logprobs[j]);
      for (unsigned j = 0; j < v.size(); ++j) v.set(j, c.versions[j]);
      comps[i].setStop(static_cast<uint8_t>(c.stop));
    }
    b.setGenSeconds(s.gen_seconds);
    b.setGenerator(static_cast<uint32_t>(x.generator));
    b.setBusySeconds(x.busy_seconds);
    b.setSyncSeconds(x.sync_seconds);
    b.setSyncBytes(x.sync_bytes);
    b.setLoads(x.loads);
    b.setPausedSeconds(x.paused_seconds);
    b.setSwitches(x.switches);
  });
}

RolloutBounds rollout_bounds(const model::ModelConfig& model, const rl::RlConfig& rl, uint64_t seed, int64_t first_step,
                             int64_t steps) {
  RolloutBounds b;
  b.seed = seed;
  b.first_step = first_step;
  b.steps = steps;
  b.prompts_per_step = rl.prompts_per_step;
  b.group_size = rl.group_size;
  b.max_new_tokens = rl.max_new_tokens;
  b.vocab = model.vocab_size;
  b.seq_len = model.seq_len;
  b.generators = rl.generators;
  return b;
}

caf::expected<rlmsg::Rollout> decode_rollout(const Envelope& env, const RolloutBounds& b) {
  auto rd = env.read<schemas::RlRollout>();
  if (!rd) return rd.error();
  const schemas::RlRollout::Reader m = **rd;
  const int64_t step = m.getStep();
  if (step < b.first_step || step >= b.steps)
    return bad("rlRollout.step: " + std::to_string(step) + " is outside this run's steps [" + std::to_string(b.first_step) +
               ", " + std::to_string(b.steps) + ")");
  // Versions: none negative and none past what the run can publish (its
  // last step). Not "none past the step": in latest mode a step dealt again
  // (a restarted buffer or reward actor) may be sampled after the trainer
  // trained it, with newer versions; admission drops it as a duplicate
  // before it checks the window, as for a generator in this process.
  auto version_ok = [&](int64_t v) { return v >= 0 && v <= b.steps; };
  if (!version_ok(m.getVersion()))
    return bad("rlRollout.version: " + std::to_string(m.getVersion()) + " outside this run's versions 0.." +
               std::to_string(b.steps));
  if (m.getGenerator() >= static_cast<uint32_t>(b.generators))
    return bad("rlRollout.generator: " + std::to_string(m.getGenerator()) + " (the run has " + std::to_string(b.generators) + ")");
  const auto ids = m.getIds();
  const auto prompts = m.getPrompts();
  const auto comps = m.getCompletions();
  if (static_cast<int64_t>(ids.size()) != b.prompts_per_step || static_cast<int64_t>(comps.size()) != b.prompts_per_step * b.group_size)
    return bad("rlRollout: " + std::to_string(ids.size()) + " groups and " + std::to_string(comps.size()) +
               " completions, expected " + std::to_string(b.prompts_per_step) + " and " +
               std::to_string(b.prompts_per_step * b.group_size));
  auto in_vocab = [&](int32_t t) { return t >= 0 && t < b.vocab; };
  auto out = std::make_shared<rl::StepRollouts>();
  out->step = step;
  out->version = m.getVersion();
  out->gen_seconds = m.getGenSeconds();
  for (unsigned i = 0; i < ids.size(); ++i) {
    const rl::GroupId id{ids[i].getSeed(), ids[i].getStep(), ids[i].getIndex()};
    if (id.seed != b.seed || id.step != step || id.index != static_cast<int64_t>(i))
      return bad("rlRollout.ids[" + std::to_string(i) + "]: (seed " + std::to_string(id.seed) + ", step " + std::to_string(id.step) +
                 ", index " + std::to_string(id.index) + ") is not group " + std::to_string(i) + " of step " + std::to_string(step));
    out->ids.push_back(id);
    rl::Prompt p;
    p.index = prompts[i].getIndex();
    for (int32_t t : prompts[i].getTokens()) p.tokens.push_back(t);
    for (int32_t t : prompts[i].getAnswer()) p.answer.push_back(t);
    if (p.tokens.empty() || static_cast<int64_t>(p.tokens.size()) >= b.seq_len)
      return bad("rlRollout.prompts[" + std::to_string(i) + "]: " + std::to_string(p.tokens.size()) + " tokens (1.." +
                 std::to_string(b.seq_len - 1) + " allowed)");
    for (int32_t t : p.tokens)
      if (!in_vocab(t)) return bad("rlRollout.prompts[" + std::to_string(i) + "]: token " + std::to_string(t) + " outside the vocabulary");
    for (int32_t t : p.answer)
      if (!in_vocab(t)) return bad("rlRollout.prompts[" + std::to_string(i) + "].answer: token " + std::to_string(t) + " outside the vocabulary");
    if (b.task) {
      const rl::Prompt want = b.task->train_prompt(rl::prompt_index(id, b.prompts_per_step));
      if (p.index != want.index || p.tokens != want.tokens || p.answer != want.answer)
        return bad("rlRollout.prompts[" + std::to_string(i) + "]: not the task's prompt " + std::to_string(want.index) +
                   " of group " + std::to_string(i) + " of step " + std::to_string(step));
      p = want;  // with what is never sent: a user's task's text, answer and meta (rl/task.hpp)
    }
    out->prompts.push_back(std::move(p));
  }
  for (unsigned i = 0; i < comps.size(); ++i) {
    const auto c = comps[i];
    const std::string where = "rlRollout.completions[" + std::to_string(i) + "]";
    model::Completion x;
    if (c.getTokens().size() == 0) return bad(where + ": no tokens (a generator samples at least one)");
    if (static_cast<int64_t>(c.getTokens().size()) > b.max_new_tokens)
      return bad(where + ": " + std::to_string(c.getTokens().size()) + " tokens > max_new_tokens " + std::to_string(b.max_new_tokens));
    // A generator stops at a full context: a longer row could not be
    // trained on (the trainer would fail the whole run on it).
    const size_t prompt = out->prompts[static_cast<size_t>(i / b.group_size)].tokens.size();
    if (static_cast<int64_t>(prompt + c.getTokens().size()) > b.seq_len)
      return bad(where + ": " + std::to_string(prompt) + " prompt + " + std::to_string(c.getTokens().size()) +
                 " new tokens > seq_len " + std::to_string(b.seq_len));
    for (int32_t t : c.getTokens()) {
      if (!in_vocab(t)) return bad(where + ": token " + std::to_string(t) + " outside the vocabulary");
      x.tokens.push_back(t);
    }
    for (float lp : c.getLogprobs()) {
      if (!std::isfinite(lp) || lp > 0.0f) return bad(where + ": log-prob " + std::to_string(lp) + " is not finite and <= 0");
      x.logprobs.push_back(lp);
    }
    for (int64_t v : c.getVersions()) {
      if (!version_ok(v))
        return bad(where + ": token version " + std::to_string(v) + " outside this run's versions 0.." + std::to_string(b.steps));
      if (v < out->version)
        return bad(where + ": token version " + std::to_string(v) + " older than the version " + std::to_string(out->version) +
                   " the rollout started with");
      x.versions.push_back(v);
    }
    x.stop = static_cast<model::StopReason>(c.getStop());
    out->completions.push_back(std::move(x));
  }
  rlmsg::Rollout r;
  r.r = std::move(out);
  r.generator = static_cast<int>(m.getGenerator());
  r.busy_seconds = m.getBusySeconds();
  r.sync_seconds = m.getSyncSeconds();
  r.sync_bytes = m.getSyncBytes();
  r.loads = m.getLoads();
  r.paused_seconds = m.getPausedSeconds();
  r.switches = m.getSwitches();
  return r;
}

}  // namespace troupe::runtime::rlwire
