// Validation of a Cap'n Proto Message before any actor reads it: a
// structural pass (every pointer followed under traversal and nesting limits)
// and the schema-level invariants of each kind (tensor bytes = shape x dtype,
// per-row lists as long as the row count, ...). Everything that can throw
// (kj::Exception from Cap'n Proto, std::bad_alloc) is caught here and turned
// into an envelope error.
#include <string>

#include <capnp/any.h>
#include <kj/exception.h>

#include "actors/transport/envelope_internal.hpp"

namespace troupe::detail {
namespace {

using schemas::DType;
using schemas::Direction;

struct Violation {
  std::string what;
};

[[noreturn]] void violate(std::string what) { throw Violation{std::move(what)}; }

std::string shape_str(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) {
    if (i > 0) out.push_back(',');
    out.append(std::to_string(s[i]));
  }
  out.push_back(']');
  return out;
}

// Checks one tensor: known dtype, non-negative dims, bytes = numel * size.
// Returns its shape. `required` tensors must be present.
std::vector<int64_t> check_tensor(bool present, schemas::Tensor::Reader t, const std::string& what,
                                  bool required) {
  if (!present) {
    if (required) violate(what + ": missing");
    return {};
  }
  const size_t esize = dtype_size(t.getDtype());
  if (esize == 0) violate(what + ": unknown dtype " + std::to_string(static_cast<unsigned>(t.getDtype())));
  auto dims = t.getShape();
  if (dims.size() > 8) violate(what + ": rank " + std::to_string(dims.size()) + " > 8");
  std::vector<int64_t> shape;
  unsigned __int128 numel = 1;
  for (int64_t d : dims) {
    if (d < 0) violate(what + ": negative dimension " + std::to_string(d));
    shape.push_back(d);
    numel *= static_cast<uint64_t>(d);
    if (numel > (uint64_t{1} << 40)) violate(what + ": " + shape_str(shape) + "... has too many elements");
  }
  const auto data = t.getData();
  if (numel * esize != data.size())
    violate(what + ": shape " + shape_str(shape) + " x " + std::to_string(esize) + " bytes != " +
            std::to_string(data.size()) + " data bytes");
  return shape;
}

void expect_dtype(schemas::Tensor::Reader t, DType dt, const std::string& what) {
  if (t.getDtype() != dt) violate(what + ": dtype " + std::to_string(static_cast<unsigned>(t.getDtype())));
}

void expect_direction(Direction d, const std::string& what) {
  if (d != Direction::FORWARD && d != Direction::BACKWARD)
    violate(what + ": unknown direction " + std::to_string(static_cast<unsigned>(d)));
}

// rows must be f32 [numRows, width].
void check_rows(bool present, schemas::Tensor::Reader t, uint32_t num_rows, uint32_t width,
                const std::string& what) {
  auto shape = check_tensor(present, t, what, true);
  expect_dtype(t, DType::F32, what);
  if (shape.size() != 2 || shape[0] != num_rows || shape[1] != width)
    violate(what + ": shape " + shape_str(shape) + " != [numRows=" + std::to_string(num_rows) +
            ", width=" + std::to_string(width) + "]");
}

void check_list_len(size_t got, uint32_t want, const std::string& what) {
  if (got != want)
    violate(what + ": " + std::to_string(got) + " entries for " + std::to_string(want) + " rows");
}

void check_range(schemas::ParamRange::Reader r, bool present, const std::string& what) {
  if (!present) violate(what + ": missing");
  if (r.getOffset() + r.getCount() < r.getOffset()) violate(what + ": offset + count overflows");
}

void check_slice(bool tensor_present, schemas::Tensor::Reader t, schemas::ParamRange::Reader r,
                 const std::string& what) {
  auto shape = check_tensor(tensor_present, t, what, true);
  expect_dtype(t, DType::F32, what);
  if (shape.size() != 1 || static_cast<uint64_t>(shape[0]) != r.getCount())
    violate(what + ": shape " + shape_str(shape) + " != [range.count=" + std::to_string(r.getCount()) + "]");
}

// Token tensors next to a hidden state: optional, i32 [tokens].
void check_tokens(bool present, schemas::Tensor::Reader t, int64_t tokens, const std::string& what) {
  if (!present) return;
  auto shape = check_tensor(true, t, what, true);
  expect_dtype(t, DType::I32, what);
  if (shape.size() != 1 || shape[0] != tokens)
    violate(what + ": shape " + shape_str(shape) + " != [" + std::to_string(tokens) + "]");
}

// A rollout's own consistency: one prompt per group id, a whole number of
// completions per group, one log-prob and one version per completion token,
// a known stop reason. What only the coordinator knows (group size, seed,
// step, vocabulary, the admissible versions) is checked there (rl_wire.cpp).
void check_rollout(schemas::RlRollout::Reader r) {
  const auto ids = r.getIds();
  const auto prompts = r.getPrompts();
  const auto comps = r.getCompletions();
  if (prompts.size() != ids.size())
    violate("rlRollout.prompts: " + std::to_string(prompts.size()) + " prompts for " + std::to_string(ids.size()) + " group ids");
  if (ids.size() == 0 ? comps.size() != 0 : comps.size() % ids.size() != 0)
    violate("rlRollout.completions: " + std::to_string(comps.size()) + " completions are not a whole number per group (" +
            std::to_string(ids.size()) + " groups)");
  for (unsigned i = 0; i < prompts.size(); ++i) {
    (void)prompts[i].getTokens();
    (void)prompts[i].getAnswer();
  }
  for (unsigned i = 0; i < comps.size(); ++i) {
    auto c = comps[i];
    const size_t n = c.getTokens().size();
    if (c.getLogprobs().size() != n || c.getVersions().size() != n)
      violate("rlRollout.completions[" + std::to_string(i) + "]: " + std::to_string(n) + " tokens, " +
              std::to_string(c.getLogprobs().size()) + " log-probs, " + std::to_string(c.getVersions().size()) + " versions");
    if (c.getStop() > 2) violate("rlRollout.completions[" + std::to_string(i) + "].stop: unknown stop reason " + std::to_string(c.getStop()));
  }
}

void check_payload(schemas::Message::Reader m) {
  (void)m.getHeader().getSeq();
  switch (m.which()) {
    case schemas::Message::ACTIVATIONS: {
      auto a = m.getActivations();
      expect_direction(a.getTag().getDirection(), "activations.tag");
      if (a.getTag().getDirection() != Direction::FORWARD) violate("activations.tag: direction is not forward");
      auto h = check_tensor(a.hasHidden(), a.getHidden(), "activations.hidden", true);
      expect_dtype(a.getHidden(), DType::F32, "activations.hidden");
      if (h.size() != 2) violate("activations.hidden: rank " + std::to_string(h.size()) + " != 2");
      check_tokens(a.hasTokenIds(), a.getTokenIds(), h[0], "activations.tokenIds");
      check_tokens(a.hasTargets(), a.getTargets(), h[0], "activations.targets");
      if (a.hasTokenData()) {
        auto d = check_tensor(true, a.getTokenData(), "activations.tokenData", true);
        expect_dtype(a.getTokenData(), DType::F64, "activations.tokenData");
        if (d.size() != 2 || d[0] != h[0])
          violate("activations.tokenData: shape " + shape_str(d) + " is not [" + std::to_string(h[0]) + ", columns]");
      }
      return;
    }
    case schemas::Message::GRADIENTS: {
      auto g = m.getGradients();
      expect_direction(g.getTag().getDirection(), "gradients.tag");
      if (g.getTag().getDirection() != Direction::BACKWARD) violate("gradients.tag: direction is not backward");
      auto s = check_tensor(g.hasGrad(), g.getGrad(), "gradients.grad", true);
      expect_dtype(g.getGrad(), DType::F32, "gradients.grad");
      if (s.size() != 2) violate("gradients.grad: rank " + std::to_string(s.size()) + " != 2");
      return;
    }
    case schemas::Message::DISPATCH: {
      auto d = m.getDispatch();
      expect_direction(d.getId().getDirection(), "dispatch.id");
      const uint32_t n = d.getNumRows();
      check_rows(d.hasRows(), d.getRows(), n, d.getWidth(), "dispatch.rows");
      check_list_len(d.getExpertIds().size(), n, "dispatch.expertIds");
      check_list_len(d.getCombineWeights().size(), n, "dispatch.combineWeights");
      check_list_len(d.getTokenIndex().size(), n, "dispatch.tokenIndex");
      return;
    }
    case schemas::Message::COMBINE: {
      auto c = m.getCombine();
      expect_direction(c.getId().getDirection(), "combine.id");
      const uint32_t n = c.getNumRows();
      check_rows(c.hasRows(), c.getRows(), n, c.getWidth(), "combine.rows");
      check_list_len(c.getTokenIndex().size(), n, "combine.tokenIndex");
      const size_t wg = c.getWeightGrads().size();
      if (c.getId().getDirection() == Direction::FORWARD && wg != 0)
        violate("combine.weightGrads: must be empty in forward");
      if (c.getId().getDirection() == Direction::BACKWARD) check_list_len(wg, n, "combine.weightGrads");
      return;
    }
    case schemas::Message::GRAD_SLICE: {
      auto g = m.getGradSlice();
      check_range(g.getRange(), g.hasRange(), "gradSlice.range");
      check_slice(g.hasGrads(), g.getGrads(), g.getRange(), "gradSlice.grads");
      return;
    }
    case schemas::Message::PARAM_SLICE: {
      auto p = m.getParamSlice();
      check_range(p.getRange(), p.hasRange(), "paramSlice.range");
      check_slice(p.hasParams(), p.getParams(), p.getRange(), "paramSlice.params");
      return;
    }
    case schemas::Message::SNAPSHOT: {
      auto s = m.getSnapshot();
      (void)s.getActor();  // Text getters check NUL termination
      (void)s.getState();
      return;
    }
    case schemas::Message::RESTORE: {
      auto r = m.getRestore();
      (void)r.getActor();
      (void)r.getState();
      return;
    }
    case schemas::Message::STOP:
      (void)m.getStop().getReason();
      return;
    case schemas::Message::STATUS_REQUEST:
      (void)m.getStatusRequest().getRequestId();  // the struct pointer itself must be sound
      return;
    case schemas::Message::STATUS_REPLY: {
      auto s = m.getStatusReply();
      (void)s.getActor();
      (void)s.getRole();
      (void)s.getLastError();
      if (static_cast<unsigned>(s.getPhase()) > static_cast<unsigned>(schemas::ActorPhase::FAILED))
        violate("statusReply.phase: unknown phase " + std::to_string(static_cast<unsigned>(s.getPhase())));
      return;
    }
    case schemas::Message::ERROR_REPORT: {
      auto e = m.getErrorReport();
      (void)e.getActor();
      (void)e.getMessage();
      if (static_cast<unsigned>(e.getKind()) > static_cast<unsigned>(schemas::ErrorKind::INVALID_STATE))
        violate("errorReport.kind: unknown kind " + std::to_string(static_cast<unsigned>(e.getKind())));
      return;
    }
    case schemas::Message::RL_WEIGHTS: {
      auto w = m.getRlWeights();
      if (w.getVersion() < 0) violate("rlWeights.version: negative (" + std::to_string(w.getVersion()) + ")");
      auto s = check_tensor(w.hasParams(), w.getParams(), "rlWeights.params", true);
      expect_dtype(w.getParams(), DType::F32, "rlWeights.params");
      if (s.size() != 1) violate("rlWeights.params: rank " + std::to_string(s.size()) + " != 1");
      return;
    }
    case schemas::Message::RL_ROLLOUT: check_rollout(m.getRlRollout()); return;
  }
  // Not reached for known kinds: check_payload's caller rejects unknown ones first.
}

// Maps a Cap'n Proto exception to the most specific envelope error.
caf::error classify(const kj::Exception& e) {
  std::string desc = e.getDescription().cStr();
  if (desc.find("traversal limit") != std::string::npos) return make_error(envelope_errc::traversal_limit, desc);
  if (desc.find("deeply-nested") != std::string::npos) return make_error(envelope_errc::nesting_limit, desc);
  return make_error(envelope_errc::malformed_message, desc);
}

}  // namespace

caf::error validate_message(const std::vector<kj::ArrayPtr<const capnp::word>>& segments,
                            const DecodeLimits& limits, bool structural, Envelope::Kind* kind) {
  uint64_t words = 0;
  for (const auto& s : segments) words += s.size();
  capnp::ReaderOptions opts;
  opts.traversalLimitInWords = 2 * words + limits.traversal_slack_words;
  opts.nestingLimit = limits.nesting_limit;
  kj::ArrayPtr<const kj::ArrayPtr<const capnp::word>> segs(segments.data(), segments.size());
  try {
    if (structural) {
      // Follow every pointer once, whatever the schema says: out-of-bounds
      // pointers, cycles and over-deep nesting all fail here.
      capnp::SegmentArrayMessageReader reader(segs, opts);
      (void)reader.getRoot<capnp::AnyPointer>().targetSize();
    }
    capnp::SegmentArrayMessageReader reader(segs, opts);
    auto m = reader.getRoot<schemas::Message>();
    const auto which = static_cast<unsigned>(m.which());
    if (which > static_cast<unsigned>(kLastKnownKind))
      return make_error(envelope_errc::unknown_kind, "message kind " + std::to_string(which));
    check_payload(m);
    *kind = m.which();
    return caf::none;
  } catch (const Violation& v) {
    return make_error(envelope_errc::schema_violation, v.what);
  } catch (const kj::Exception& e) {
    return classify(e);
  } catch (const std::bad_alloc&) {
    return make_error(envelope_errc::too_large, "out of memory while validating");
  }
}

}  // namespace troupe::detail
