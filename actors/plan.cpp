// The topology plan (see plan.hpp): layers per stage, stages per rank,
// experts per shard, parameter ranges per actor, placement, names and the
// per-step message counts, each derived here once.
#include "actors/plan.hpp"

#include <algorithm>
#include <set>
#include <stdexcept>

#include "model/stage.hpp"
#include "moe/placement.hpp"
#include "rl/config.hpp"

namespace troupe::runtime {

ExpertRange expert_split(int64_t n_experts, int shards, int shard) {
  if (shards < 1 || shards > n_experts || shard < 0 || shard >= shards)
    throw std::invalid_argument("expert_split: " + std::to_string(shards) + " shards for " +
                                std::to_string(n_experts) + " experts, shard " + std::to_string(shard));
  const int64_t base = n_experts / shards, extra = n_experts % shards;
  const int64_t begin = shard * base + std::min<int64_t>(shard, extra);
  return {begin, begin + base + (shard < extra ? 1 : 0)};
}

// Declared in runtime.hpp; here so that the spec checks (no CAF) have it.
int expert_shards_at(const RuntimeOptions& o, int64_t step) {
  int n = o.expert_shards;
  for (const ElasticEvent& e : o.elastic)
    if (e.at_step <= step) n = e.expert_shards;
  return n;
}

int expert_owner(int64_t n_experts, int shards, int64_t expert) {
  for (int s = 0; s < shards; ++s)
    if (expert < expert_split(n_experts, shards, s).end) return s;
  throw std::invalid_argument("expert_owner: expert " + std::to_string(expert) + " >= " + std::to_string(n_experts));
}

std::array<Range, 3> expert_param_ranges(const model::ParamLayout& layout, const model::ModelConfig& c,
                                         int layer, ExpertRange r) {
  const int64_t per = c.expert_hidden * c.d_model;
  std::array<Range, 3> out;
  std::array<bool, 3> found{};
  for (const model::ParamEntry& e : layout.entries()) {
    const model::ParamTag& t = e.tag;
    if (t.role != model::ParamRole::Expert || t.layer != layer || t.expert != r.begin) continue;
    out[static_cast<size_t>(t.part)] = {e.offset, r.size() * per};
    found[static_cast<size_t>(t.part)] = true;
  }
  if (!found[0] || !found[1] || !found[2])
    throw std::out_of_range("expert_param_ranges: layer " + std::to_string(layer) + " has no routed expert " +
                            std::to_string(r.begin));
  return out;
}

std::vector<Range> expert_set_ranges(const model::ParamLayout& layout, const model::ModelConfig& c, int layer,
                                     const std::vector<int64_t>& experts) {
  std::vector<ExpertRange> runs;
  for (int64_t e : experts) {
    if (!runs.empty() && e < runs.back().end) throw std::invalid_argument("expert_set_ranges: experts not sorted");
    if (!runs.empty() && runs.back().end == e) ++runs.back().end;
    else runs.push_back({e, e + 1});
  }
  std::vector<std::array<Range, 3>> parts;
  for (const ExpertRange& r : runs) parts.push_back(expert_param_ranges(layout, c, layer, r));
  std::vector<Range> out;
  for (size_t part = 0; part < 3; ++part)
    for (const auto& p : parts) out.push_back(p[part]);
  return out;
}

const char* role_name(Role role) {
  switch (role) {
    case Role::Coordinator: return "coordinator";
    case Role::Optimizer: return "optimizer";
    case Role::Rank: return "stage";
    case Role::Expert: return "expert";
    case Role::Generator: return "generator";
    case Role::Reward: return "reward";
    case Role::RlCoordinator: return "rl_coordinator";
    case Role::Buffer: return "rollout_buffer";
    case Role::Trainer: return "trainer";
  }
  return "?";
}

namespace {

std::string range_text(const char* what, int64_t begin, int64_t end) {
  return std::string(what) + " " + std::to_string(begin) + ".." + std::to_string(end - 1);
}

// The stages rank `rank` holds: those its op list runs forward passes of.
std::vector<StageSlot> rank_stages(const Plan& p, int rank) {
  std::set<std::pair<int, int>> held;
  for (const sched::Op& op : sched::make_schedule(p.sl.kind, rank, p.sl.num_ranks, p.chunks))
    if (op.type == sched::OpType::F || op.type == sched::OpType::FB) held.insert({op.f.dir, op.f.stage});
  std::vector<StageSlot> out;
  for (const auto& [dir, stage] : held) {
    const auto [lb, le] = p.stage_layers[static_cast<size_t>(stage)];
    out.push_back({dir, stage, lb, le});
  }
  return out;
}

// Merged ranges of the layout entries a rank's stages touch: their layers
// (without the routed experts when expert shards hold them), the embedding
// at stage 0, the final norm and the head (or the tied embedding) at the last.
std::vector<Range> rank_params(const Plan& p, const model::ParamLayout& layout, const model::ModelConfig& c,
                               const std::vector<StageSlot>& stages) {
  using model::ParamRole;
  auto held = [&](const model::ParamEntry& e) {
    const model::ParamTag& t = e.tag;
    for (const StageSlot& s : stages) {
      const bool first = s.stage == 0, last = s.stage == p.sl.num_stages - 1;
      if (t.layer >= s.layer_begin && t.layer < s.layer_end)
        return !(p.expert_shards > 0 && t.role == ParamRole::Expert);
      if (first && t.role == ParamRole::Embedding) return true;
      if (last && (t.role == ParamRole::FinalNorm || t.role == ParamRole::Head ||
                   (c.tie_embeddings && t.role == ParamRole::Embedding)))
        return true;
    }
    return false;
  };
  std::vector<Range> out;
  for (const model::ParamEntry& e : layout.entries()) {  // layout order = offset order
    if (!held(e)) continue;
    if (!out.empty() && out.back().offset + out.back().count == e.offset) out.back().count += e.numel;
    else out.push_back({e.offset, e.numel});
  }
  return out;
}

std::string rank_detail(const Plan& p, const std::vector<StageSlot>& stages, bool experts_inside) {
  std::string out;
  for (const StageSlot& s : stages) {
    if (!out.empty()) out += ", ";
    if (stages.size() > 1)
      out += "stage " + std::to_string(s.stage) + (p.sl.num_dirs > 1 ? (s.dir == 0 ? "A " : "B ") : " ");
    out += range_text("layers", s.layer_begin, s.layer_end);
    if (s.stage == 0) out += " +embedding";
    if (s.stage == p.sl.num_stages - 1) out += " +head";
    if (experts_inside) out += " +experts";
  }
  return out;
}

bool meets(const std::vector<Range>& owned, Range r) {
  for (const Range& o : owned)
    if (intersect(o, r).count > 0) return true;
  return false;
}

// Messages rank `a` handles in one step when nothing fails.
uint32_t rank_messages(const Plan& p, int rank, bool split_backward) {
  const int last = p.sl.num_stages - 1;
  // Each part (F or B) of an op is its own device closure; with expert
  // shards a pass also stops at each MoE layer of its stage (one closure
  // more) and gets one Combine per shard there.
  auto part = [&](const sched::Chunk& c) {
    if (!p.expert_parallel()) return 1u;
    const auto [lb, le] = p.stage_layers[static_cast<size_t>(c.stage)];
    uint32_t moe = 0;
    for (int l : p.moe_layers) moe += l >= lb && l < le;
    return 1 + moe * (1 + static_cast<uint32_t>(p.expert_shards));
  };
  uint32_t n = 2;  // (start) and the completion of the gradient send
  const auto ops = sched::make_schedule(p.sl.kind, rank, p.sl.num_ranks, p.chunks);
  for (size_t i = 0; i < ops.size(); ++i) {
    const sched::Op& op = ops[i];
    const bool has_f = op.type == sched::OpType::F || op.type == sched::OpType::FB;
    const bool has_b = op.type == sched::OpType::BW || op.type == sched::OpType::FB || op.type == sched::OpType::B;
    if (has_f) n += 1 + part(op.f);  // its input activations and its pass
    if (has_b) n += part(op.b) + (op.b.stage < last ? 1 : 0);  // its pass and its output gradient
    // W: the weight pass's closure, none when it directly follows its own B
    // or the split is off (that B ran the full backward: actors/pipeline/rank_actor.cpp).
    if (op.type == sched::OpType::W && split_backward &&
        !(i > 0 && ops[i - 1].type == sched::OpType::B && ops[i - 1].b == op.b))
      ++n;
  }
  return n + 2 * static_cast<uint32_t>(p.num_shards());  // each slice and its load
}

}  // namespace

uint32_t Plan::gradient_slices(Range r) const {
  uint32_t n = 0;
  for (const auto& owned : rank_owned)
    for (const Range& o : owned) n += intersect(o, r).count > 0;
  for (const auto& owned : expert_owned)  // expert shards are gradient producers too
    for (const Range& o : owned) n += intersect(o, r).count > 0;
  return n;
}

uint32_t Plan::meeting_shards(const std::vector<Range>& owned) const {
  uint32_t n = 0;
  for (const Range& sr : shard_ranges) n += meets(owned, sr);
  return n;
}

const ActorPlan& Plan::shard(int i) const { return actors[static_cast<size_t>(1 + i)]; }

const ActorPlan& Plan::rank(int replica, int rank) const {
  return actors[static_cast<size_t>(1 + num_shards() + replica * sl.num_ranks + rank)];
}

const ActorPlan& Plan::expert(int replica, int producer) const {
  return actors[static_cast<size_t>(1 + num_shards() + data_parallel * sl.num_ranks + replica * num_producers() +
                                    producer)];
}

ExpertRange Plan::experts_of(int layer, int shard) const {
  for (size_t li = 0; li < moe_layers.size(); ++li)
    if (moe_layers[li] == layer && shard >= 0 && shard < expert_shards)
      return layer_experts[li][static_cast<size_t>(shard)];
  throw std::out_of_range("plan: no expert shard " + std::to_string(shard) + " of layer " + std::to_string(layer));
}

const std::vector<int64_t>& Plan::copies_of(int layer, int shard) const {
  for (size_t li = 0; li < moe_layers.size(); ++li)
    if (moe_layers[li] == layer && shard >= 0 && shard < expert_shards)
      return layer_copies[li][static_cast<size_t>(shard)];
  throw std::out_of_range("plan: no expert shard " + std::to_string(shard) + " of layer " + std::to_string(layer));
}

std::vector<int64_t> Plan::held_experts(int layer, int shard) const {
  const ExpertRange r = experts_of(layer, shard);
  std::vector<int64_t> out = copies_of(layer, shard);
  for (int64_t e = r.begin; e < r.end; ++e) out.push_back(e);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<int> Plan::holders(int layer, int64_t expert) const {
  std::vector<int> out;
  for (int s = 0; s < expert_shards; ++s) {
    const ExpertRange r = experts_of(layer, s);
    const std::vector<int64_t>& c = copies_of(layer, s);
    if ((expert >= r.begin && expert < r.end) || std::binary_search(c.begin(), c.end(), expert)) out.push_back(s);
  }
  return out;
}

std::pair<int64_t, int64_t> Plan::expert_rows(int layer, int64_t expert, int holders, int copy, int64_t rows) const {
  for (size_t li = 0; li < moe_layers.size(); ++li)
    if (moe_layers[li] == layer && li < layer_shares.size() && expert >= 0 &&
        static_cast<size_t>(expert) < layer_shares[li].size())
      return moe::share_rows(rows, layer_shares[li][static_cast<size_t>(expert)], holders, copy);
  return moe::copy_rows(rows, holders, copy);
}

bool Plan::replicated() const {
  for (const auto& layer : layer_copies)
    for (const auto& c : layer)
      if (!c.empty()) return true;
  return false;
}

int Plan::expert_producer(int layer, int shard) const {
  for (size_t li = 0; li < moe_layers.size(); ++li)
    if (moe_layers[li] == layer && shard >= 0 && shard < expert_shards)
      return static_cast<int>(li) * expert_shards + shard;
  return -1;
}

bool keeps_expert_shard(const Plan& from, const Plan& to, int replica, int producer) {
  if (from.expert_shards != to.expert_shards || producer < 0 || producer >= from.num_producers() ||
      producer >= to.num_producers() || replica < 0 || replica >= from.data_parallel || replica >= to.data_parallel)
    return false;
  const auto x = static_cast<size_t>(producer), r = static_cast<size_t>(replica);
  const auto [layer, shard] = from.placement.expert_ids[x];
  return to.placement.expert_ids[x] == from.placement.expert_ids[x] &&
         from.experts_of(layer, shard).begin == to.experts_of(layer, shard).begin &&
         from.experts_of(layer, shard).end == to.experts_of(layer, shard).end &&
         from.copies_of(layer, shard) == to.copies_of(layer, shard) &&
         from.placement.expert_device[r][x] == to.placement.expert_device[r][x];
}

ExpertLayout expert_layout(const Plan& p) {
  ExpertLayout x;
  x.shards = p.expert_shards;
  for (size_t li = 0; li < p.layer_experts.size(); ++li) {
    x.bounds.push_back(0);
    for (const ExpertRange& r : p.layer_experts[li]) x.bounds.push_back(r.end);
  }
  for (size_t li = 0; li < p.layer_copies.size(); ++li)
    for (size_t k = 0; k < p.layer_copies[li].size(); ++k)
      for (int64_t e : p.layer_copies[li][k])
        x.copies.insert(x.copies.end(), {static_cast<int64_t>(li), static_cast<int64_t>(k), e});
  for (size_t li = 0; li < p.layer_shares.size(); ++li)
    for (size_t e = 0; e < p.layer_shares[li].size(); ++e) {
      const std::vector<int>& w = p.layer_shares[li][e];
      if (w.empty()) continue;
      x.shares.insert(x.shares.end(), {static_cast<int64_t>(li), static_cast<int64_t>(e), static_cast<int64_t>(w.size())});
      x.shares.insert(x.shares.end(), w.begin(), w.end());
    }
  return x;
}

RuntimeOptions with_expert_layout(RuntimeOptions o, const ExpertLayout& x, size_t moe_layers) {
  o.expert_shards = x.shards;
  o.expert_bounds.clear();
  const size_t per = static_cast<size_t>(x.shards) + 1;
  if (x.shards < 1 || x.bounds.size() % per != 0) throw std::invalid_argument("expert bounds of the wrong size");
  for (size_t i = 0; i < x.bounds.size(); i += per)
    o.expert_bounds.emplace_back(x.bounds.begin() + static_cast<int64_t>(i), x.bounds.begin() + static_cast<int64_t>(i + per));
  o.expert_copies.clear();
  if (x.copies.size() % 3 != 0) throw std::invalid_argument("expert copies of the wrong size");
  if (!x.copies.empty())
    o.expert_copies.assign(moe_layers, std::vector<std::vector<int64_t>>(static_cast<size_t>(x.shards)));
  for (size_t i = 0; i < x.copies.size(); i += 3) {
    const int64_t li = x.copies[i], k = x.copies[i + 1];
    if (li < 0 || static_cast<size_t>(li) >= o.expert_copies.size() || k < 0 || k >= x.shards)
      throw std::invalid_argument("expert copy for MoE layer index " + std::to_string(li) + ", shard " + std::to_string(k));
    o.expert_copies[static_cast<size_t>(li)][static_cast<size_t>(k)].push_back(x.copies[i + 2]);
  }
  o.expert_shares.clear();
  const int64_t E = o.train.model.n_experts;
  if (!x.shares.empty()) o.expert_shares.assign(moe_layers, std::vector<std::vector<int>>(static_cast<size_t>(E)));
  for (size_t i = 0; i < x.shares.size();) {
    if (i + 3 > x.shares.size()) throw std::invalid_argument("expert shares of the wrong size");
    const int64_t li = x.shares[i], e = x.shares[i + 1], n = x.shares[i + 2];
    if (li < 0 || static_cast<size_t>(li) >= o.expert_shares.size() || e < 0 || e >= E || n < 1 ||
        i + 3 + static_cast<size_t>(n) > x.shares.size())
      throw std::invalid_argument("expert shares for MoE layer index " + std::to_string(li) + ", expert " + std::to_string(e));
    auto& w = o.expert_shares[static_cast<size_t>(li)][static_cast<size_t>(e)];
    for (int64_t j = 0; j < n; ++j) w.push_back(static_cast<int>(x.shares[i + 3 + static_cast<size_t>(j)]));
    i += 3 + static_cast<size_t>(n);
  }
  return o;
}

const ActorPlan* Plan::target(const FaultTarget& t) const {
  if (t.replica < 0 || t.index < 0) return nullptr;
  switch (t.role) {
    case Role::Rank:
      return t.replica < data_parallel && t.index < sl.num_ranks ? &rank(t.replica, t.index) : nullptr;
    case Role::Optimizer: return t.index < num_shards() ? &shard(t.index) : nullptr;
    case Role::Expert: {
      const int x = expert_producer(t.index, t.shard);
      return x >= 0 && t.replica < data_parallel ? &expert(t.replica, x) : nullptr;
    }
    case Role::Coordinator: return t.index == 0 ? &coordinator() : nullptr;
    case Role::Generator:
    case Role::Reward:
    case Role::RlCoordinator:
    case Role::Buffer:
    case Role::Trainer: return nullptr;  // RL actors (rl_actors) are the RL run's, never this runtime's
  }
  return nullptr;
}

const ActorPlan* Plan::find(const std::string& name) const {
  if (name == "coordinator") return &coordinator();
  const std::optional<FaultTarget> t = parse_fault_target(name);
  return t ? target(*t) : nullptr;
}

Plan make_plan(const RuntimeOptions& o) {
  const model::TrainOptions& t = o.train;
  const model::ModelConfig& c = t.model;
  const model::ParamLayout layout = model::build_param_layout(c);
  Plan p;
  p.data_parallel = o.data_parallel;
  p.expert_shards = o.expert_shards;
  p.chunks = static_cast<int>(t.microbatches / o.data_parallel);
  p.mb_batch = t.data.batch_size / t.microbatches;
  p.sl = sched::make_layout(o.schedule, o.stages, p.chunks);
  p.stage_layers = model::split_layers(c.n_layers, p.sl.num_stages);
  p.parameters = layout.total();
  if (o.expert_shards > 0)
    for (int64_t l = 0; l < c.n_layers; ++l) p.moe_layers.push_back(static_cast<int>(l));

  p.placement = make_placement(o.devices, o.processes, o.stages, o.data_parallel, o.optimizer_shards, o.device_process);
  if (o.expert_shards > 0) {
    // A MoE layer's shards start at the device of the rank whose first-copy
    // stage holds the layer.
    std::vector<int> layer_rank;
    for (int layer : p.moe_layers) {
      int stage = 0;
      while (p.stage_layers[static_cast<size_t>(stage)].second <= layer) ++stage;
      layer_rank.push_back(sched::stage_rank(p.sl, 0, stage));
    }
    place_experts(p.placement, p.moe_layers, layer_rank, o.expert_shards);
  }
  const Placement& pl = p.placement;
  for (int d = 0; d < o.devices; ++d) p.devices.push_back({d, pl.device_process[static_cast<size_t>(d)]});

  // The ranges: optimizer slices, expert shards' weights, ranks' stages.
  const int64_t P = layout.total();
  for (int i = 0; i < o.optimizer_shards; ++i) {
    const int64_t b = P * i / o.optimizer_shards, e = P * (i + 1) / o.optimizer_shards;
    p.shard_ranges.push_back({b, e - b});
  }
  // Each MoE layer's split: the given boundaries, else the even one.
  if (!o.expert_bounds.empty() && o.expert_bounds.size() != p.moe_layers.size())
    throw std::invalid_argument("expert_bounds: one list per MoE layer (" + std::to_string(p.moe_layers.size()) + ")");
  for (size_t li = 0; li < p.moe_layers.size(); ++li) {
    std::vector<ExpertRange> split;
    if (o.expert_bounds.empty()) {
      for (int k = 0; k < o.expert_shards; ++k) split.push_back(expert_split(c.n_experts, o.expert_shards, k));
    } else {
      const std::vector<int64_t>& b = o.expert_bounds[li];
      bool ok = b.size() == static_cast<size_t>(o.expert_shards) + 1 && b.front() == 0 && b.back() == c.n_experts;
      for (size_t k = 1; ok && k < b.size(); ++k) ok = b[k] > b[k - 1];
      if (!ok)
        throw std::invalid_argument("expert_bounds of MoE layer " + std::to_string(p.moe_layers[li]) + ": " +
                                    std::to_string(o.expert_shards + 1) + " boundaries rising strictly from 0 to " +
                                    std::to_string(c.n_experts));
      for (size_t k = 0; k + 1 < b.size(); ++k) split.push_back({b[k], b[k + 1]});
    }
    p.layer_experts.push_back(std::move(split));
  }
  // Each MoE layer's copies: per shard, sorted experts of other ranges.
  if (!o.expert_copies.empty() && o.expert_copies.size() != p.moe_layers.size())
    throw std::invalid_argument("expert_copies: one list per MoE layer (" + std::to_string(p.moe_layers.size()) + ")");
  for (size_t li = 0; li < p.moe_layers.size(); ++li) {
    std::vector<std::vector<int64_t>> copies(static_cast<size_t>(o.expert_shards));
    if (!o.expert_copies.empty()) {
      const auto& given = o.expert_copies[li];
      const std::string where = "expert_copies of MoE layer " + std::to_string(p.moe_layers[li]) + ": ";
      if (given.size() != copies.size())
        throw std::invalid_argument(where + "one list per shard (" + std::to_string(o.expert_shards) + ")");
      for (size_t s = 0; s < given.size(); ++s) {
        const ExpertRange home = p.layer_experts[li][s];
        for (size_t i = 0; i < given[s].size(); ++i) {
          const int64_t e = given[s][i];
          if (e < 0 || e >= c.n_experts || (e >= home.begin && e < home.end) || (i > 0 && e <= given[s][i - 1]))
            throw std::invalid_argument(where + "shard " + std::to_string(s) + " lists expert " + std::to_string(e) +
                                        ": copies must be sorted experts of other shards' ranges, each once");
        }
        copies[s] = given[s];
      }
    }
    p.layer_copies.push_back(std::move(copies));
  }
  // Each MoE layer's shares: per expert, one weight per holder (or none).
  if (!o.expert_shares.empty() && o.expert_shares.size() != p.moe_layers.size())
    throw std::invalid_argument("expert_shares: one list per MoE layer (" + std::to_string(p.moe_layers.size()) + ")");
  for (size_t li = 0; li < p.moe_layers.size(); ++li) {
    std::vector<std::vector<int>> shares(static_cast<size_t>(c.n_experts));
    if (!o.expert_shares.empty()) {
      const auto& given = o.expert_shares[li];
      const std::string where = "expert_shares of MoE layer " + std::to_string(p.moe_layers[li]) + ": ";
      if (given.size() != shares.size())
        throw std::invalid_argument(where + "one list per expert (" + std::to_string(c.n_experts) + ")");
      for (size_t e = 0; e < given.size(); ++e) {
        if (given[e].empty()) continue;
        int holders = 0, sum = 0;
        for (size_t s = 0; s < p.layer_copies[li].size(); ++s) {
          const ExpertRange home = p.layer_experts[li][s];
          const auto& cp = p.layer_copies[li][s];
          holders += (static_cast<int64_t>(e) >= home.begin && static_cast<int64_t>(e) < home.end) ||
                     std::binary_search(cp.begin(), cp.end(), static_cast<int64_t>(e));
        }
        bool ok = static_cast<int>(given[e].size()) == holders;
        for (int w : given[e]) ok = ok && w >= 0, sum += w;
        if (!ok || sum != moe::kShareTotal)
          throw std::invalid_argument(where + "expert " + std::to_string(e) + " needs one weight >= 0 per holder (" +
                                      std::to_string(holders) + "), summing to " + std::to_string(moe::kShareTotal));
      }
      shares = given;
    }
    p.layer_shares.push_back(std::move(shares));
  }
  for (size_t x = 0; x < pl.expert_ids.size(); ++x) {
    const auto [layer, shard] = pl.expert_ids[x];
    p.expert_owned.push_back(expert_set_ranges(layout, c, layer, p.held_experts(layer, shard)));
  }
  std::vector<std::vector<StageSlot>> stages;  // [rank]
  for (int k = 0; k < o.stages; ++k) {
    stages.push_back(rank_stages(p, k));
    p.rank_owned.push_back(rank_params(p, layout, c, stages.back()));
  }

  ActorPlan coord;
  coord.name = "coordinator";
  coord.role = Role::Coordinator;
  coord.process = pl.coordinator_process();
  coord.detail = "drives steps, loads the data (" + std::to_string(t.data.batch_size) + " sequences/step in " +
                 std::to_string(t.microbatches) + " microbatches), collects metrics, supervises";
  p.actors.push_back(coord);

  for (int i = 0; i < o.optimizer_shards; ++i) {
    ActorPlan a;
    a.name = shard_name(i);
    a.role = Role::Optimizer;
    a.index = i;
    a.device = pl.shard_device[static_cast<size_t>(i)];
    a.process = pl.shard_process(i);
    const Range range = p.shard_ranges[static_cast<size_t>(i)];
    a.params = {range};
    // Every replica's gradient slices, then the reduction's completion, the
    // (clip) and the update's completion.
    a.messages_per_step = static_cast<uint32_t>(o.data_parallel) * p.gradient_slices(range) + 3;
    a.detail = "AdamW on params [" + std::to_string(range.offset) + ", " + std::to_string(range.offset + range.count) + ")";
    p.actors.push_back(std::move(a));
  }

  for (int r = 0; r < o.data_parallel; ++r)
    for (int k = 0; k < o.stages; ++k) {
      ActorPlan a;
      a.name = rank_name(r, k, o.data_parallel);
      a.role = Role::Rank;
      a.replica = r;
      a.index = k;
      a.device = pl.rank_device[static_cast<size_t>(r)][static_cast<size_t>(k)];
      a.process = pl.rank_process(r, k);
      a.stages = stages[static_cast<size_t>(k)];
      a.params = p.rank_owned[static_cast<size_t>(k)];
      a.messages_per_step = rank_messages(p, k, o.split_backward);
      a.detail = rank_detail(p, a.stages, c.ffn == model::Ffn::moe && o.expert_shards == 0);
      p.actors.push_back(std::move(a));
    }

  for (int r = 0; r < o.data_parallel; ++r)
    for (size_t x = 0; x < pl.expert_ids.size(); ++x) {
      const auto [layer, shard] = pl.expert_ids[x];
      ActorPlan a;
      a.name = expert_name(r, layer, shard, o.data_parallel);
      a.role = Role::Expert;
      a.replica = r;
      a.index = static_cast<int>(x);
      a.device = pl.expert_device[static_cast<size_t>(r)][x];
      a.process = pl.expert_process(r, static_cast<int>(x));
      a.layer = layer;
      a.shard = shard;
      a.experts = p.experts_of(layer, shard);
      a.copies = p.copies_of(layer, shard);
      a.params = p.expert_owned[x];
      // Each micro-batch's forward and backward dispatch and their
      // completions, the gradient send's completion, then each ParamSlice
      // (from the optimizer shards meeting its ranges) and its load.
      a.messages_per_step = 4 * static_cast<uint32_t>(p.chunks) + 1 + 2 * p.meeting_shards(a.params);
      a.detail = range_text("experts", a.experts.begin, a.experts.end);
      if (!a.copies.empty()) {
        a.detail += " +copies";
        for (int64_t e : a.copies) a.detail += " " + std::to_string(e);
      }
      p.actors.push_back(std::move(a));
    }
  return p;
}

int rl_generator_device(int generator, int devices, int trainer_devices) {
  trainer_devices = std::max(1, trainer_devices);
  if (devices <= trainer_devices) return devices <= 1 ? 0 : generator % devices;
  return trainer_devices + generator % (devices - trainer_devices);
}

std::vector<ActorPlan> plan_rl_actors(const rl::RlConfig& c, int devices, int trainer_devices,
                                      const std::vector<int>& generator_process) {
  const int on_devices = std::max(1, trainer_devices);
  const std::string eta = std::to_string(c.max_staleness);
  const bool latest = c.sync == rl::SyncMode::latest;
  std::vector<ActorPlan> out;
  auto add = [&out](std::string name, Role role, int index, int device, std::string detail, int process = 0) {
    ActorPlan a;
    a.name = std::move(name);
    a.role = role;
    a.index = index;
    a.device = device;
    a.process = process;
    a.detail = std::move(detail);
    out.push_back(std::move(a));
  };
  add("rl_coordinator", Role::RlCoordinator, 0, -1,
      "deals step s to generator s % " + std::to_string(c.generators) +
          (latest ? " once version max(0, s - " + eta + ") is out; pushes every version to every generator"
                  : " with version max(0, s - " + eta + ")") +
          "; weight-sync deadlines; supervises generators and reward actors");
  add("rollout_buffer", Role::Buffer, 0, -1,
      (latest ? "admission (every token's version in [s - " + eta + ", s])"
              : "admission (version exactly max(0, s - " + eta + "))") +
          " and the ledger: each group (seed, step, index) admitted and trained once");
  add("trainer", Role::Trainer, 0, 0,
      "the policy update (loss " + std::string(loss_kind_name(c.policy.kind)) + ")" +
          (trainer_devices > 0 ? "; on the actor runtime's pipeline ranks, expert and optimizer shards, devices 0.." +
                                     std::to_string(on_devices - 1)
                               : std::string()) +
          "; publishes version v+1 after each step");
  for (int k = 0; k < c.generators; ++k)
    add("generator:" + std::to_string(k), Role::Generator, k, rl_generator_device(k, devices, on_devices),
        "policy copy + version; samples " + std::to_string(c.prompts_per_step) + " x " + std::to_string(c.group_size) +
            " completions per step (KV cache" + (latest ? "; takes new versions between decode steps)" : ")"),
        generator_process.empty() ? 0 : generator_process.at(static_cast<size_t>(k)));
  for (int k = 0; k < c.reward_actors; ++k) {
    if (c.reward == rl::RewardSource::model)
      add("reward_model:" + std::to_string(k), Role::Reward, k, -1,
          "the learned reward model " + c.reward_model + " (frozen; a step's completions in one batch), group advantages");
    else
      add("reward:" + std::to_string(k), Role::Reward, k, -1, "rule verifier and group advantages");
  }
  return out;
}

}  // namespace troupe::runtime
