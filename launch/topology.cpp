// Placement rules (see DESIGN.md "data path"); processes and devices of the
// runtime's actors come from actors/cluster/placement.hpp, the runtime's own placement:
// - devices are split into contiguous blocks, one block per process;
// - pipeline rank s of replica r runs on device (r*stages + s) mod devices;
// - sequential/1f1b: rank s holds stage s;
//   dualpipe: device i holds stage i of copy A and stage PP-1-i of copy B;
//   dualpipev: the layers form 2*PP chunks, device i holds chunks i and 2PP-1-i;
// - with one expert shard the experts run inside their stage; with more, each
//   replica has expert_shards actors per MoE layer (shard k: a contiguous
//   range, the first n_experts % shards shards one expert more), going
//   round-robin over the devices from the device of the rank whose first-copy
//   stage owns the layer (as actors/supervision/runtime.cpp spawns them);
// - optimizer shards own contiguous ranges of the flat parameter buffer and are
//   spread round-robin over all devices.
#include "launch/topology.hpp"

#include <algorithm>
#include <map>
#include <sstream>

#include "actors/cluster/placement.hpp"
#include "actors/schedule/schedule.hpp"
#include "model/params.hpp"
#include "model/stage.hpp"

namespace troupe::launch {

std::vector<std::pair<int64_t, int64_t>> split_even(int64_t n, int64_t parts) {
  std::vector<std::pair<int64_t, int64_t>> out;
  for (int64_t p = 0; p < parts; ++p) out.emplace_back(p * n / parts, (p + 1) * n / parts);
  return out;
}

static std::string range_text(const char* what, int64_t begin, int64_t end) {
  std::ostringstream os;
  os << what << ' ' << begin << ".." << (end - 1);
  return os.str();
}

Topology resolve_topology(const Spec& spec) {
  const auto& t = spec.topology;
  const auto& m = spec.model;
  Topology topo;
  topo.parameters = model::build_param_layout(m).total();
  runtime::Placement place =
      runtime::make_placement(static_cast<int>(t.devices), static_cast<int>(t.processes), static_cast<int>(t.stages),
                              static_cast<int>(t.data_parallel), static_cast<int>(t.optimizer_shards),
                              device_process_list(spec));
  auto process_of = [&](int64_t device) -> int64_t { return place.device_process[static_cast<size_t>(device)]; };
  const bool v_shape = t.schedule == "dualpipev";
  const int64_t chunks = v_shape ? 2 * t.stages : t.stages;
  // The runtime's own layer split (model::split_layers) and expert-shard
  // placement (runtime::place_experts): a MoE layer's shards start at the
  // device of the rank holding the layer's first-copy stage.
  const auto layer_chunks = model::split_layers(m.n_layers, chunks);
  if (m.ffn == "moe" && t.expert_shards > 1) {
    sched::Layout sl;  // stage_rank needs only the kind and the ranks (the chunk count is checked elsewhere)
    sl.kind = sched::parse_kind(t.schedule);
    sl.num_ranks = static_cast<int>(t.stages);
    std::vector<int> layers, layer_rank;
    for (int64_t l = 0; l < m.n_layers; ++l) {
      int64_t c = 0;
      while (layer_chunks[static_cast<size_t>(c)].second <= l) ++c;
      layers.push_back(static_cast<int>(l));
      layer_rank.push_back(sched::stage_rank(sl, 0, static_cast<int>(c)));
    }
    runtime::place_experts(place, layers, layer_rank, static_cast<int>(t.expert_shards));
  }
  for (int64_t d = 0; d < t.devices; ++d) topo.devices.push_back({d, process_of(d), t.device_kind});

  topo.actors.push_back({"coordinator", "coordinator", -1, 0,
                         "drives steps, loads the data (" + std::to_string(spec.data.batch_size) + " sequences/step in " +
                             std::to_string(t.microbatches * t.data_parallel) + " microbatches), collects metrics"});

  for (int64_t r = 0; r < t.data_parallel; ++r) {
    // Pipeline rank s of replica r runs on device (r*stages + s) mod devices (as actors/supervision/runtime.cpp places it).
    auto device_of_rank = [&](int64_t s) -> int64_t {
      return place.rank_device[static_cast<size_t>(r)][static_cast<size_t>(s)];
    };
    std::string rep;  // (built with append: GCC 12 warns falsely on "r" + to_string)
    if (t.data_parallel > 1) rep.append("r").append(std::to_string(r)).append(":");
    // (chunk index, copy label, device) for every stage actor of this replica.
    struct StagePlace { int64_t chunk; std::string copy; int64_t device; };
    std::vector<StagePlace> places;
    for (int64_t s = 0; s < t.stages; ++s) {
      if (t.schedule == "dualpipe") {
        places.push_back({s, "A", device_of_rank(s)});
        places.push_back({t.stages - 1 - s, "B", device_of_rank(s)});
      } else if (v_shape) {
        places.push_back({s, "", device_of_rank(s)});
        places.push_back({2 * t.stages - 1 - s, "", device_of_rank(s)});
      } else {
        places.push_back({s, "", device_of_rank(s)});
      }
    }
    for (const auto& pl : places) {
      const auto [lb, le] = layer_chunks[static_cast<size_t>(pl.chunk)];
      std::string detail = range_text("layers", lb, le);
      if (pl.chunk == 0) detail += " +embedding";
      if (pl.chunk == chunks - 1) detail += " +head";
      // With one expert shard the experts run inside the stage actor.
      if (m.ffn == "moe" && t.expert_shards == 1) detail += " +experts";
      const std::string id = "stage:" + rep + std::to_string(pl.chunk) + pl.copy;
      topo.actors.push_back({id, "stage", pl.device, process_of(pl.device), detail});
    }
    if (m.ffn == "moe" && t.expert_shards > 1) {
      std::vector<std::pair<int64_t, int64_t>> expert_ranges;  // the expert-shard actors' split
      for (int64_t sh = 0, b = 0; sh < t.expert_shards; ++sh) {
        const int64_t n = m.n_experts / t.expert_shards + (sh < m.n_experts % t.expert_shards ? 1 : 0);
        expert_ranges.emplace_back(b, b + n);
        b += n;
      }
      for (size_t x = 0; x < place.expert_ids.size(); ++x) {
        const auto [l, sh] = place.expert_ids[x];
        const int64_t dev = place.expert_device[static_cast<size_t>(r)][x];
        const auto [eb, ee] = expert_ranges[static_cast<size_t>(sh)];
        // The detail names the actor as [[faults]] targets it.
        topo.actors.push_back({"experts:" + rep + "L" + std::to_string(l) + ":S" + std::to_string(sh), "experts", dev,
                               process_of(dev),
                               range_text("experts", eb, ee) + " (" +
                                   runtime::expert_name(static_cast<int>(r), l, sh, static_cast<int>(t.data_parallel)) + ")"});
      }
    }
  }
  const auto param_ranges = split_even(topo.parameters, t.optimizer_shards);
  for (int64_t o = 0; o < t.optimizer_shards; ++o) {
    const int64_t dev = place.shard_device[static_cast<size_t>(o)];
    const auto [pb, pe] = param_ranges[static_cast<size_t>(o)];
    topo.actors.push_back({"optimizer:" + std::to_string(o), "optimizer", dev, process_of(dev),
                           "AdamW on params [" + std::to_string(pb) + ", " + std::to_string(pe) + ")"});
  }
  return topo;
}

std::string format_topology(const Spec& spec, const Topology& topo) {
  const auto& t = spec.topology;
  std::ostringstream os;
  os << "topology of " << spec.source << ": " << t.processes << " process(es), " << t.devices << " "
     << t.device_kind << " device(s), " << t.stages << " stage(s), schedule " << t.schedule << ", "
     << t.microbatches << " microbatch(es), " << t.expert_shards << " expert shard(s)/MoE layer, "
     << t.optimizer_shards << " optimizer shard(s), " << t.data_parallel << " replica(s); "
     << topo.parameters << " parameters; " << topo.actors.size() << " actors\n";
  size_t width = 0;
  for (const auto& a : topo.actors) width = std::max(width, a.id.size());
  for (int64_t p = 0; p < t.processes; ++p) {
    os << "process " << p << "\n";
    auto print = [&](const ActorPlan& a) {
      os << "    " << a.id << std::string(width + 2 - a.id.size(), ' ') << a.detail << "\n";
    };
    os << "  control\n";
    for (const auto& a : topo.actors)
      if (a.process == p && a.device < 0) print(a);
    for (const auto& d : topo.devices) {
      if (d.process != p) continue;
      os << "  device " << d.index << " (" << d.kind << ")\n";
      for (const auto& a : topo.actors)
        if (a.device == d.index) print(a);
    }
  }
  return os.str();
}

}  // namespace troupe::launch
