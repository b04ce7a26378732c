// Dispatch / Combine codec and receiver-side checks (see moe_messages.hpp).
#include "actors/transport/moe_messages.hpp"

#include <algorithm>
#include <cmath>

namespace troupe::runtime {
namespace {

caf::error violation(const std::string& what) { return make_error(envelope_errc::schema_violation, what); }

std::string range_str(uint32_t b, uint32_t e) {
  std::string out(1, '[');  // appended piecewise: GCC 12 warns (-Wrestrict) on "[" + string
  out += std::to_string(b);
  out += ", ";
  out += std::to_string(e);
  out += ')';
  return out;
}

}  // namespace

MoeKey read_moe_key(schemas::MoeId::Reader id) {
  MoeKey k;
  k.step = id.getStep();
  k.microbatch = id.getMicrobatch();
  k.layer = id.getLayer();
  k.shard = id.getShard();
  k.stage = id.getStage();
  k.backward = id.getDirection() == schemas::Direction::BACKWARD;
  k.chunk = id.getChunk();
  k.replica = id.getReplica();
  k.attempt = id.getAttempt();
  k.dispatch_id = id.getDispatchId();
  return k;
}

void write_moe_key(schemas::MoeId::Builder id, const MoeKey& k) {
  id.setStep(k.step);
  id.setMicrobatch(k.microbatch);
  id.setLayer(k.layer);
  id.setShard(k.shard);
  id.setStage(k.stage);
  id.setDirection(k.backward ? schemas::Direction::BACKWARD : schemas::Direction::FORWARD);
  id.setChunk(k.chunk);
  id.setReplica(k.replica);
  id.setAttempt(k.attempt);
  id.setDispatchId(k.dispatch_id);
}

std::string to_string(const MoeKey& k) {
  return std::string(k.backward ? "backward" : "forward") + " step " + std::to_string(k.step) + "/attempt " +
         std::to_string(k.attempt) + " replica " + std::to_string(k.replica) + " chunk " +
         std::to_string(k.chunk) + " mb " + std::to_string(k.microbatch) + " layer " + std::to_string(k.layer) +
         " shard " + std::to_string(k.shard) + " stage " + std::to_string(k.stage) + " id " +
         std::to_string(k.dispatch_id);
}

Envelope make_dispatch(const MoeKey& id, uint32_t width, std::span<const float> rows,
                       std::span<const uint32_t> expert_ids, std::span<const float> combine_weights,
                       std::span<const uint32_t> token_index) {
  const uint32_t n = static_cast<uint32_t>(expert_ids.size());
  // One first segment large enough for the rows: no copy into a second segment.
  const size_t words = (rows.size_bytes() + 3 * 4 * n) / 8 + 64;
  return Envelope::build<schemas::Dispatch>(
      [&](schemas::Dispatch::Builder d) {
        write_moe_key(d.initId(), id);
        d.setNumRows(n);
        d.setWidth(width);
        const int64_t shape[2] = {static_cast<int64_t>(n), static_cast<int64_t>(width)};
        set_tensor_f32(d.initRows(), shape, rows);
        auto ex = d.initExpertIds(n);
        for (uint32_t i = 0; i < n; ++i) ex.set(i, expert_ids[i]);
        auto cw = d.initCombineWeights(static_cast<unsigned>(combine_weights.size()));
        for (size_t i = 0; i < combine_weights.size(); ++i) cw.set(static_cast<unsigned>(i), combine_weights[i]);
        auto ti = d.initTokenIndex(static_cast<unsigned>(token_index.size()));
        for (size_t i = 0; i < token_index.size(); ++i) ti.set(static_cast<unsigned>(i), token_index[i]);
      },
      static_cast<unsigned>(std::min<size_t>(words, 1u << 28)));
}

Envelope make_combine(const MoeKey& id, uint32_t width, std::span<const float> rows,
                      std::span<const uint32_t> token_index, std::span<const float> weight_grads) {
  const uint32_t n = static_cast<uint32_t>(token_index.size());
  const size_t words = (rows.size_bytes() + 2 * 4 * n) / 8 + 64;
  return Envelope::build<schemas::Combine>(
      [&](schemas::Combine::Builder c) {
        write_moe_key(c.initId(), id);
        c.setNumRows(n);
        c.setWidth(width);
        const int64_t shape[2] = {static_cast<int64_t>(n), static_cast<int64_t>(width)};
        set_tensor_f32(c.initRows(), shape, rows);
        auto ti = c.initTokenIndex(n);
        for (uint32_t i = 0; i < n; ++i) ti.set(i, token_index[i]);
        auto wg = c.initWeightGrads(static_cast<unsigned>(weight_grads.size()));
        for (size_t i = 0; i < weight_grads.size(); ++i) wg.set(static_cast<unsigned>(i), weight_grads[i]);
      },
      static_cast<unsigned>(std::min<size_t>(words, 1u << 28)));
}

caf::expected<CheckedDispatch> check_dispatch(const Envelope& e, const ShardView& v) {
  auto r = e.read<schemas::Dispatch>();
  if (!r) return std::move(r.error());
  auto d = r->get();
  const MoeKey id = read_moe_key(d.getId());
  const std::string where = "dispatch (" + to_string(id) + ")";
  if (id.replica != v.replica || id.layer != v.layer || id.shard != v.shard)
    return violation(where + ": addressed to replica " + std::to_string(id.replica) + " layer " +
                     std::to_string(id.layer) + " shard " + std::to_string(id.shard) + ", this is replica " +
                     std::to_string(v.replica) + " layer " + std::to_string(v.layer) + " shard " +
                     std::to_string(v.shard));
  if (d.getWidth() != v.width)
    return violation(where + ": width " + std::to_string(d.getWidth()) + " != d_model " + std::to_string(v.width));
  const uint32_t n = d.getNumRows();
  // The owned ids in order: the range, with the copies merged in.
  std::vector<uint32_t> ids(v.copies);
  for (uint32_t x = v.expert_begin; x < v.expert_end; ++x) ids.push_back(x);
  std::sort(ids.begin(), ids.end());
  const uint32_t owned = static_cast<uint32_t>(ids.size());
  const uint64_t max_rows = static_cast<uint64_t>(v.tokens) * std::min(v.top_k, owned);
  if (n > max_rows)
    return violation(where + ": " + std::to_string(n) + " rows, more than tokens " + std::to_string(v.tokens) +
                     " x min(top_k " + std::to_string(v.top_k) + ", owned experts " + std::to_string(owned) +
                     ") = " + std::to_string(max_rows));
  // The envelope validator checked these lengths; the tensor shape too.
  const auto ex = d.getExpertIds();
  const auto ti = d.getTokenIndex();
  const auto cw = d.getCombineWeights();
  if (ex.size() != n || ti.size() != n || cw.size() != n)
    return violation(where + ": list lengths do not match numRows " + std::to_string(n));
  CheckedDispatch out{*r, id, std::vector<int64_t>(owned, 0)};
  uint32_t prev_e = 0, prev_t = 0;
  for (uint32_t i = 0; i < n; ++i) {
    const uint32_t x = ex[i], t = ti[i];
    const std::string row = where + ": row " + std::to_string(i);
    const auto at = std::lower_bound(ids.begin(), ids.end(), x);
    if (at == ids.end() || *at != x)
      return violation(row + ": expert id " + std::to_string(x) + " is not owned by shard " +
                       std::to_string(v.shard) + " (experts " + range_str(v.expert_begin, v.expert_end) +
                       (v.copies.empty() ? "" : " and " + std::to_string(v.copies.size()) + " copies") + ")");
    if (t >= v.tokens)
      return violation(row + ": token index " + std::to_string(t) + " >= tokens " + std::to_string(v.tokens));
    if (i > 0 && x < prev_e)
      return violation(row + ": expert id " + std::to_string(x) + " after " + std::to_string(prev_e) +
                       " (rows must be grouped by expert, ascending)");
    if (i > 0 && x == prev_e && t <= prev_t)
      return violation(row + ": token index " + std::to_string(t) + " after " + std::to_string(prev_t) +
                       " for expert " + std::to_string(x) + " (token order, each token once per expert)");
    if (!std::isfinite(cw[i])) return violation(row + ": combine weight is not finite");
    ++out.counts[static_cast<size_t>(at - ids.begin())];
    prev_e = x;
    prev_t = t;
  }
  return out;
}

caf::expected<Read<schemas::Combine>> check_combine(const Envelope& e, const MoeKey& sent, uint32_t width,
                                                    std::span<const uint32_t> token_index) {
  auto r = e.read<schemas::Combine>();
  if (!r) return std::move(r.error());
  auto c = r->get();
  const MoeKey id = read_moe_key(c.getId());
  if (!(id == sent))
    return violation("combine: id (" + to_string(id) + ") does not echo the dispatch (" + to_string(sent) + ")");
  const std::string where = "combine (" + to_string(id) + ")";
  if (c.getWidth() != width)
    return violation(where + ": width " + std::to_string(c.getWidth()) + " != d_model " + std::to_string(width));
  const uint32_t n = c.getNumRows();
  if (n != token_index.size())
    return violation(where + ": " + std::to_string(n) + " rows for a dispatch of " +
                     std::to_string(token_index.size()));
  const auto ti = c.getTokenIndex();
  if (ti.size() != n) return violation(where + ": tokenIndex length " + std::to_string(ti.size()));
  for (uint32_t i = 0; i < n; ++i)
    if (ti[i] != token_index[i])
      return violation(where + ": row " + std::to_string(i) + ": token index " + std::to_string(ti[i]) +
                       " does not echo the dispatch's " + std::to_string(token_index[i]));
  const auto wg = c.getWeightGrads();
  if (sent.backward) {
    if (wg.size() != n) return violation(where + ": " + std::to_string(wg.size()) + " weight gradients for " +
                                         std::to_string(n) + " rows");
    for (uint32_t i = 0; i < n; ++i)
      if (!std::isfinite(wg[i])) return violation(where + ": row " + std::to_string(i) + ": weight gradient is not finite");
  } else if (wg.size() != 0) {
    return violation(where + ": weight gradients in a forward combine");
  }
  return *r;
}

}  // namespace troupe::runtime
