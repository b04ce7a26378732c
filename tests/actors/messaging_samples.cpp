// Sample messages of every kind: fill_* writes fields from a seeded generator,
// check_* draws the same sequence and compares field by field. The two must
// consume the generator in the same order; each pair sits side by side.
#include "tests/actors/messaging_samples.hpp"

#include <algorithm>
#include <cstring>
#include <sstream>

#include <caf/binary_deserializer.hpp>
#include <caf/binary_serializer.hpp>

namespace troupe::testing {
namespace {

using namespace troupe::schemas;

// splitmix64: tiny, deterministic, good enough to make every field distinct.
struct Gen {
  uint64_t s;
  bool compressible;
  uint64_t u64() {
    uint64_t z = (s += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    return z ^ (z >> 31);
  }
  uint32_t u32() { return static_cast<uint32_t>(u64()); }
  bool bit() { return (u64() & 1) != 0; }
  float f32() {
    if (compressible) return static_cast<float>(u64() % 16) * 0.25f;
    return static_cast<float>(static_cast<int64_t>(u64() % 2000001) - 1000000) * 1e-4f;
  }
  std::string text(size_t n) {
    std::string t;
    for (size_t i = 0; i < n; ++i) t.push_back(static_cast<char>('a' + u64() % 26));
    return t;
  }
};

struct Checker {
  std::ostringstream out;
  template <class A, class B>
  void eq(const char* what, const A& got, const B& want) {
    if (!(got == want)) out << what << ": got " << got << ", want " << want << "\n";
  }
};

// -- tensors ---------------------------------------------------------------------

void fill_f32(Tensor::Builder t, Gen& g, std::vector<int64_t> shape) {
  int64_t n = 1;
  for (auto d : shape) n *= d;
  std::vector<float> v(static_cast<size_t>(n));
  for (auto& x : v) x = g.f32();
  set_tensor_f32(t, shape, v);
}
void check_f32(Checker& c, const char* what, Tensor::Reader t, Gen& g, std::vector<int64_t> shape) {
  c.eq(what, static_cast<int>(t.getDtype()), static_cast<int>(DType::F32));
  if (tensor_shape(t) != shape) c.out << what << ": shape differs\n";
  auto v = tensor_f32(t);
  size_t n = 1;
  for (auto d : shape) n *= static_cast<size_t>(d);
  if (v.size() != n) {
    c.out << what << ": " << v.size() << " values, want " << n << "\n";
    return;
  }
  size_t bad = 0;
  for (size_t i = 0; i < n; ++i) bad += (v[i] != g.f32());
  if (bad) c.out << what << ": " << bad << " of " << n << " values differ\n";
}
void fill_i32(Tensor::Builder t, Gen& g, int64_t n) {
  std::vector<int32_t> v(static_cast<size_t>(n));
  for (auto& x : v) x = static_cast<int32_t>(g.u32() % 50000);
  set_tensor_i32(t, std::vector<int64_t>{n}, v);
}
void check_i32(Checker& c, const char* what, Tensor::Reader t, Gen& g, int64_t n) {
  c.eq(what, static_cast<int>(t.getDtype()), static_cast<int>(DType::I32));
  auto v = tensor_i32(t);
  if (v.size() != static_cast<size_t>(n) || tensor_shape(t) != std::vector<int64_t>{n}) {
    c.out << what << ": wrong size\n";
    return;
  }
  size_t bad = 0;
  for (auto x : v) bad += (x != static_cast<int32_t>(g.u32() % 50000));
  if (bad) c.out << what << ": " << bad << " values differ\n";
}

// -- identities ------------------------------------------------------------------

void fill_tag(PipelineTag::Builder t, Gen& g, Direction dir) {
  t.setStep(g.u64());
  t.setMicrobatch(g.u32());
  t.setStage(g.u32());
  t.setDirection(dir);
  t.setChunk(g.u32());
  t.setReplica(g.u32());
  t.setAttempt(g.u32());
}
void check_tag(Checker& c, PipelineTag::Reader t, Gen& g, Direction dir) {
  c.eq("tag.step", t.getStep(), g.u64());
  c.eq("tag.microbatch", t.getMicrobatch(), g.u32());
  c.eq("tag.stage", t.getStage(), g.u32());
  c.eq("tag.direction", static_cast<int>(t.getDirection()), static_cast<int>(dir));
  c.eq("tag.chunk", t.getChunk(), g.u32());
  c.eq("tag.replica", t.getReplica(), g.u32());
  c.eq("tag.attempt", t.getAttempt(), g.u32());
}

Direction draw_dir(Gen& g) { return g.bit() ? Direction::BACKWARD : Direction::FORWARD; }

void fill_moe_id(MoeId::Builder id, Gen& g, Direction dir) {
  id.setStep(g.u64());
  id.setMicrobatch(g.u32());
  id.setLayer(g.u32());
  id.setShard(g.u32());
  id.setStage(g.u32());
  id.setDirection(dir);
  id.setChunk(g.u32());
  id.setReplica(g.u32());
  id.setAttempt(g.u32());
  id.setDispatchId(g.u64());
}
void check_moe_id(Checker& c, MoeId::Reader id, Gen& g, Direction dir) {
  c.eq("id.step", id.getStep(), g.u64());
  c.eq("id.microbatch", id.getMicrobatch(), g.u32());
  c.eq("id.layer", id.getLayer(), g.u32());
  c.eq("id.shard", id.getShard(), g.u32());
  c.eq("id.stage", id.getStage(), g.u32());
  c.eq("id.direction", static_cast<int>(id.getDirection()), static_cast<int>(dir));
  c.eq("id.chunk", id.getChunk(), g.u32());
  c.eq("id.replica", id.getReplica(), g.u32());
  c.eq("id.attempt", id.getAttempt(), g.u32());
  c.eq("id.dispatchId", id.getDispatchId(), g.u64());
}

// -- payloads, fill then check ------------------------------------------------------

void fill(Message::Builder m, Envelope::Kind kind, Gen& g, uint32_t rows, uint32_t width) {
  auto h = m.initHeader();
  h.setSender(g.u64());
  h.setSeq(g.u64());
  h.setSentNs(g.u64());
  const int64_t r = rows, w = width;
  switch (kind) {
    case Message::ACTIVATIONS: {
      auto a = m.initActivations();
      fill_tag(a.initTag(), g, Direction::FORWARD);
      fill_f32(a.initHidden(), g, {r, w});
      fill_i32(a.initTokenIds(), g, r);
      fill_i32(a.initTargets(), g, r);
      break;
    }
    case Message::GRADIENTS: {
      auto x = m.initGradients();
      fill_tag(x.initTag(), g, Direction::BACKWARD);
      fill_f32(x.initGrad(), g, {r, w});
      x.setLossSum(static_cast<double>(g.u32()) * 0.5);
      x.setTokenCount(g.u64());
      break;
    }
    case Message::DISPATCH: {
      auto d = m.initDispatch();
      fill_moe_id(d.initId(), g, draw_dir(g));
      d.setNumRows(rows);
      d.setWidth(width);
      fill_f32(d.initRows(), g, {r, w});
      auto e = d.initExpertIds(rows);
      auto cw = d.initCombineWeights(rows);
      auto ti = d.initTokenIndex(rows);
      for (uint32_t i = 0; i < rows; ++i) {
        e.set(i, g.u32() % 256);
        cw.set(i, g.f32());
        ti.set(i, g.u32());
      }
      break;
    }
    case Message::COMBINE: {
      auto c = m.initCombine();
      const Direction dir = draw_dir(g);
      fill_moe_id(c.initId(), g, dir);
      c.setNumRows(rows);
      c.setWidth(width);
      fill_f32(c.initRows(), g, {r, w});
      auto ti = c.initTokenIndex(rows);
      for (uint32_t i = 0; i < rows; ++i) ti.set(i, g.u32());
      if (dir == Direction::BACKWARD) {
        auto wg = c.initWeightGrads(rows);
        for (uint32_t i = 0; i < rows; ++i) wg.set(i, g.f32());
      }
      break;
    }
    case Message::GRAD_SLICE: {
      auto s = m.initGradSlice();
      s.setStep(g.u64());
      s.setReplica(g.u32());
      s.setShard(g.u32());
      s.setStage(g.u32());
      auto range = s.initRange();
      range.setOffset(g.u32());
      range.setCount(static_cast<uint64_t>(r * w));
      fill_f32(s.initGrads(), g, {r * w});
      s.setMicrobatches(g.u32());
      s.setAttempt(g.u32());
      break;
    }
    case Message::PARAM_SLICE: {
      auto s = m.initParamSlice();
      s.setStep(g.u64());
      s.setReplica(g.u32());
      s.setShard(g.u32());
      auto range = s.initRange();
      range.setOffset(g.u32());
      range.setCount(static_cast<uint64_t>(r * w));
      fill_f32(s.initParams(), g, {r * w});
      break;
    }
    case Message::SNAPSHOT:
    case Message::RESTORE: {
      const uint64_t id = g.u64(), step = g.u64();
      const std::string actor = g.text(12);
      std::vector<uint8_t> state(static_cast<size_t>(r * w));
      for (auto& b : state) b = static_cast<uint8_t>(g.compressible ? g.u64() % 4 : g.u64());
      auto put = [&](auto s) {
        s.setSnapshotId(id);
        s.setStep(step);
        s.setActor(actor);
        auto d = s.initState(static_cast<unsigned>(state.size()));
        if (!state.empty()) std::memcpy(d.begin(), state.data(), state.size());
      };
      if (kind == Message::SNAPSHOT) put(m.initSnapshot());
      else put(m.initRestore());
      break;
    }
    case Message::STOP: {
      auto s = m.initStop();
      s.setReason(g.text(20));
      s.setGraceful(g.bit());
      break;
    }
    case Message::STATUS_REQUEST:
      m.initStatusRequest().setRequestId(g.u64());
      break;
    case Message::STATUS_REPLY: {
      auto s = m.initStatusReply();
      s.setRequestId(g.u64());
      s.setActor(g.text(10));
      s.setRole(g.text(6));
      s.setPhase(static_cast<ActorPhase>(g.u32() % 5));
      s.setStep(g.u64());
      s.setHandled(g.u64());
      s.setDropped(g.u64());
      s.setLastError(g.text(30));
      break;
    }
    case Message::ERROR_REPORT: {
      auto e = m.initErrorReport();
      e.setKind(static_cast<ErrorKind>(g.u32() % 6));
      e.setActor(g.text(10));
      e.setStep(g.u64());
      e.setMessage(g.text(40));
      e.setCode(g.u32());
      e.setFatal(g.bit());
      break;
    }
    case Message::RL_WEIGHTS: {
      auto x = m.initRlWeights();
      x.setVersion(static_cast<int64_t>(g.u32()));
      fill_f32(x.initParams(), g, {r * w});
      break;
    }
    case Message::RL_ROLLOUT: {
      // r groups of 2 completions, each max(1, w / 4) tokens long (under the
      // bulk path's smallest slot at the sizes the bulk test uses).
      auto x = m.initRlRollout();
      x.setStep(static_cast<int64_t>(g.u32()));
      x.setVersion(static_cast<int64_t>(g.u32()));
      auto ids = x.initIds(static_cast<unsigned>(r));
      auto prompts = x.initPrompts(static_cast<unsigned>(r));
      for (unsigned i = 0; i < ids.size(); ++i) {
        ids[i].setSeed(g.u64());
        ids[i].setStep(static_cast<int64_t>(g.u32()));
        ids[i].setIndex(static_cast<int64_t>(g.u32()));
        prompts[i].setIndex(static_cast<int64_t>(g.u32()));
        auto t = prompts[i].initTokens(3);
        for (unsigned j = 0; j < 3; ++j) t.set(j, static_cast<int32_t>(g.u32() % 50000));
        prompts[i].initAnswer(1).set(0, static_cast<int32_t>(g.u32() % 50000));
      }
      auto comps = x.initCompletions(static_cast<unsigned>(2 * r));
      for (unsigned i = 0; i < comps.size(); ++i) {
        const auto n = static_cast<unsigned>(std::max<int64_t>(1, w / 4));
        auto t = comps[i].initTokens(n);
        auto lp = comps[i].initLogprobs(n);
        auto v = comps[i].initVersions(n);
        for (unsigned j = 0; j < t.size(); ++j) {
          t.set(j, static_cast<int32_t>(g.u32() % 50000));
          lp.set(j, g.f32());
          v.set(j, static_cast<int64_t>(g.u32()));
        }
        comps[i].setStop(static_cast<uint8_t>(g.u32() % 3));
      }
      x.setGenSeconds(g.f32());
      x.setGenerator(g.u32());
      x.setSyncBytes(static_cast<int64_t>(g.u32()));
      break;
    }
  }
}

void check(Checker& c, Message::Reader m, Envelope::Kind kind, Gen& g, uint32_t rows, uint32_t width) {
  c.eq("header.sender", m.getHeader().getSender(), g.u64());
  c.eq("header.seq", m.getHeader().getSeq(), g.u64());
  c.eq("header.sentNs", m.getHeader().getSentNs(), g.u64());
  c.eq("kind", static_cast<int>(m.which()), static_cast<int>(kind));
  if (m.which() != kind) return;
  const int64_t r = rows, w = width;
  switch (kind) {
    case Message::ACTIVATIONS: {
      auto a = m.getActivations();
      check_tag(c, a.getTag(), g, Direction::FORWARD);
      check_f32(c, "activations.hidden", a.getHidden(), g, {r, w});
      check_i32(c, "activations.tokenIds", a.getTokenIds(), g, r);
      check_i32(c, "activations.targets", a.getTargets(), g, r);
      break;
    }
    case Message::GRADIENTS: {
      auto x = m.getGradients();
      check_tag(c, x.getTag(), g, Direction::BACKWARD);
      check_f32(c, "gradients.grad", x.getGrad(), g, {r, w});
      c.eq("gradients.lossSum", x.getLossSum(), static_cast<double>(g.u32()) * 0.5);
      c.eq("gradients.tokenCount", x.getTokenCount(), g.u64());
      break;
    }
    case Message::DISPATCH: {
      auto d = m.getDispatch();
      check_moe_id(c, d.getId(), g, draw_dir(g));
      c.eq("dispatch.numRows", d.getNumRows(), rows);
      c.eq("dispatch.width", d.getWidth(), width);
      check_f32(c, "dispatch.rows", d.getRows(), g, {r, w});
      auto e = d.getExpertIds();
      auto cw = d.getCombineWeights();
      auto ti = d.getTokenIndex();
      // Compare lengths before reading elements: a message that differs (e.g.
      // fewer entries than rows) must be reported, not read past its end.
      c.eq("dispatch.expertIds.size", e.size(), rows);
      c.eq("dispatch.combineWeights.size", cw.size(), rows);
      c.eq("dispatch.tokenIndex.size", ti.size(), rows);
      for (uint32_t i = 0; i < rows && i < e.size() && i < cw.size() && i < ti.size(); ++i) {
        c.eq("dispatch.expertIds[i]", e[i], g.u32() % 256);
        c.eq("dispatch.combineWeights[i]", cw[i], g.f32());
        c.eq("dispatch.tokenIndex[i]", ti[i], g.u32());
      }
      break;
    }
    case Message::COMBINE: {
      auto x = m.getCombine();
      const Direction dir = draw_dir(g);
      check_moe_id(c, x.getId(), g, dir);
      c.eq("combine.numRows", x.getNumRows(), rows);
      c.eq("combine.width", x.getWidth(), width);
      check_f32(c, "combine.rows", x.getRows(), g, {r, w});
      auto ti = x.getTokenIndex();
      c.eq("combine.tokenIndex.size", ti.size(), rows);
      for (uint32_t i = 0; i < rows && i < ti.size(); ++i) c.eq("combine.tokenIndex[i]", ti[i], g.u32());
      auto wg = x.getWeightGrads();
      c.eq("combine.weightGrads.size", wg.size(), dir == Direction::BACKWARD ? rows : 0u);
      if (dir == Direction::BACKWARD)
        for (uint32_t i = 0; i < rows && i < wg.size(); ++i) c.eq("combine.weightGrads[i]", wg[i], g.f32());
      break;
    }
    case Message::GRAD_SLICE: {
      auto s = m.getGradSlice();
      c.eq("gradSlice.step", s.getStep(), g.u64());
      c.eq("gradSlice.replica", s.getReplica(), g.u32());
      c.eq("gradSlice.shard", s.getShard(), g.u32());
      c.eq("gradSlice.stage", s.getStage(), g.u32());
      c.eq("gradSlice.range.offset", s.getRange().getOffset(), uint64_t{g.u32()});
      c.eq("gradSlice.range.count", s.getRange().getCount(), static_cast<uint64_t>(r * w));
      check_f32(c, "gradSlice.grads", s.getGrads(), g, {r * w});
      c.eq("gradSlice.microbatches", s.getMicrobatches(), g.u32());
      c.eq("gradSlice.attempt", s.getAttempt(), g.u32());
      break;
    }
    case Message::PARAM_SLICE: {
      auto s = m.getParamSlice();
      c.eq("paramSlice.step", s.getStep(), g.u64());
      c.eq("paramSlice.replica", s.getReplica(), g.u32());
      c.eq("paramSlice.shard", s.getShard(), g.u32());
      c.eq("paramSlice.range.offset", s.getRange().getOffset(), uint64_t{g.u32()});
      c.eq("paramSlice.range.count", s.getRange().getCount(), static_cast<uint64_t>(r * w));
      check_f32(c, "paramSlice.params", s.getParams(), g, {r * w});
      break;
    }
    case Message::SNAPSHOT:
    case Message::RESTORE: {
      const uint64_t id = g.u64(), step = g.u64();
      const std::string actor = g.text(12);
      std::vector<uint8_t> state(static_cast<size_t>(r * w));
      for (auto& b : state) b = static_cast<uint8_t>(g.compressible ? g.u64() % 4 : g.u64());
      auto cmp = [&](auto s) {
        c.eq("snapshotId", s.getSnapshotId(), id);
        c.eq("step", s.getStep(), step);
        c.eq("actor", std::string(s.getActor().cStr()), actor);
        auto d = s.getState();
        if (d.size() != state.size() || (d.size() > 0 && std::memcmp(d.begin(), state.data(), d.size()) != 0))
          c.out << "state bytes differ\n";
      };
      if (kind == Message::SNAPSHOT) cmp(m.getSnapshot());
      else cmp(m.getRestore());
      break;
    }
    case Message::STOP: {
      auto s = m.getStop();
      c.eq("stop.reason", std::string(s.getReason().cStr()), g.text(20));
      c.eq("stop.graceful", s.getGraceful(), g.bit());
      break;
    }
    case Message::STATUS_REQUEST:
      c.eq("statusRequest.requestId", m.getStatusRequest().getRequestId(), g.u64());
      break;
    case Message::STATUS_REPLY: {
      auto s = m.getStatusReply();
      c.eq("statusReply.requestId", s.getRequestId(), g.u64());
      c.eq("statusReply.actor", std::string(s.getActor().cStr()), g.text(10));
      c.eq("statusReply.role", std::string(s.getRole().cStr()), g.text(6));
      c.eq("statusReply.phase", static_cast<unsigned>(s.getPhase()), g.u32() % 5);
      c.eq("statusReply.step", s.getStep(), g.u64());
      c.eq("statusReply.handled", s.getHandled(), g.u64());
      c.eq("statusReply.dropped", s.getDropped(), g.u64());
      c.eq("statusReply.lastError", std::string(s.getLastError().cStr()), g.text(30));
      break;
    }
    case Message::ERROR_REPORT: {
      auto e = m.getErrorReport();
      c.eq("errorReport.kind", static_cast<unsigned>(e.getKind()), g.u32() % 6);
      c.eq("errorReport.actor", std::string(e.getActor().cStr()), g.text(10));
      c.eq("errorReport.step", e.getStep(), g.u64());
      c.eq("errorReport.message", std::string(e.getMessage().cStr()), g.text(40));
      c.eq("errorReport.code", e.getCode(), g.u32());
      c.eq("errorReport.fatal", e.getFatal(), g.bit());
      break;
    }
    case Message::RL_WEIGHTS: {
      auto x = m.getRlWeights();
      c.eq("rlWeights.version", x.getVersion(), static_cast<int64_t>(g.u32()));
      check_f32(c, "rlWeights.params", x.getParams(), g, {r * w});
      break;
    }
    case Message::RL_ROLLOUT: {
      auto x = m.getRlRollout();
      c.eq("rlRollout.step", x.getStep(), static_cast<int64_t>(g.u32()));
      c.eq("rlRollout.version", x.getVersion(), static_cast<int64_t>(g.u32()));
      auto ids = x.getIds();
      auto prompts = x.getPrompts();
      c.eq("rlRollout.ids.size", ids.size(), static_cast<unsigned>(r));
      c.eq("rlRollout.prompts.size", prompts.size(), static_cast<unsigned>(r));
      for (unsigned i = 0; i < ids.size() && i < prompts.size(); ++i) {
        c.eq("rlRollout.ids.seed", ids[i].getSeed(), g.u64());
        c.eq("rlRollout.ids.step", ids[i].getStep(), static_cast<int64_t>(g.u32()));
        c.eq("rlRollout.ids.index", ids[i].getIndex(), static_cast<int64_t>(g.u32()));
        c.eq("rlRollout.prompts.index", prompts[i].getIndex(), static_cast<int64_t>(g.u32()));
        auto t = prompts[i].getTokens();
        c.eq("rlRollout.prompts.tokens.size", t.size(), 3u);
        for (unsigned j = 0; j < 3 && j < t.size(); ++j) c.eq("rlRollout.prompts.tokens", t[j], static_cast<int32_t>(g.u32() % 50000));
        c.eq("rlRollout.prompts.answer", prompts[i].getAnswer()[0], static_cast<int32_t>(g.u32() % 50000));
      }
      auto comps = x.getCompletions();
      c.eq("rlRollout.completions.size", comps.size(), static_cast<unsigned>(2 * r));
      for (unsigned i = 0; i < comps.size(); ++i) {
        auto t = comps[i].getTokens();
        auto lp = comps[i].getLogprobs();
        auto v = comps[i].getVersions();
        c.eq("rlRollout.completions.tokens.size", t.size(), static_cast<unsigned>(std::max<int64_t>(1, w / 4)));
        for (unsigned j = 0; j < t.size(); ++j) {
          c.eq("rlRollout.completions.tokens", t[j], static_cast<int32_t>(g.u32() % 50000));
          c.eq("rlRollout.completions.logprobs", lp[j], g.f32());
          c.eq("rlRollout.completions.versions", v[j], static_cast<int64_t>(g.u32()));
        }
        c.eq("rlRollout.completions.stop", static_cast<unsigned>(comps[i].getStop()), g.u32() % 3);
      }
      c.eq("rlRollout.genSeconds", x.getGenSeconds(), static_cast<double>(g.f32()));
      c.eq("rlRollout.generator", x.getGenerator(), g.u32());
      c.eq("rlRollout.syncBytes", x.getSyncBytes(), static_cast<int64_t>(g.u32()));
      break;
    }
  }
}

}  // namespace

std::vector<Envelope::Kind> all_kinds() {
  std::vector<Envelope::Kind> out;
  for (unsigned k = 0; k <= static_cast<unsigned>(kLastKnownKind); ++k) out.push_back(static_cast<Envelope::Kind>(k));
  return out;
}

Envelope make_sample(Envelope::Kind kind, const SampleSpec& spec) {
  Gen g{spec.seed, spec.compressible};
  // Size the first segment for the tensors so big samples are one segment.
  const uint64_t words = 1024 + 2ull * spec.rows * spec.width;
  return Envelope::build_message([&](Message::Builder m) { fill(m, kind, g, spec.rows, spec.width); },
                                 static_cast<unsigned>(std::min<uint64_t>(words, 1u << 28)));
}

std::string check_sample(const Envelope& env, Envelope::Kind kind, const SampleSpec& spec) {
  auto msg = env.message();
  if (!msg) return "cannot read envelope: " + caf::to_string(msg.error()) + "\n";
  Checker c;
  Gen g{spec.seed, spec.compressible};
  check(c, msg->get(), kind, g, spec.rows, spec.width);
  return c.out.str();
}

std::vector<char> caf_serialize(const Envelope& env) {
  std::vector<char> buf;
  caf::binary_serializer sink{nullptr, buf};
  Envelope copy = env;
  if (auto err = sink(copy)) return {};
  return buf;
}

caf::error caf_deserialize(const std::vector<char>& bytes, Envelope& out) {
  caf::binary_deserializer source{nullptr, bytes};
  return source(out);
}

}  // namespace troupe::testing
