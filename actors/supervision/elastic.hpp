// One [[elastic]] scale event, the value the spec parser (launch/spec/)
// and the runtime (RuntimeOptions::elastic, actors/supervision/elastic.cpp)
// share. Plain data: no CAF.
#pragma once

#include <cstdint>

namespace troupe::runtime {

// From 1-based step `at_step` on, every MoE layer has `expert_shards`
// expert-shard actors (>= 1: unlike the initial RuntimeOptions::expert_shards,
// 1 means one actor holding all the layer's experts, not experts inside the
// stages). The change is made at the boundary before that step.
struct ElasticEvent {
  int64_t at_step = 0;
  int expert_shards = 0;
};

// [experts] policy: how the runtime places experts on their shards.
enum class ExpertPolicy { static_split, eplb };
inline const char* expert_policy_name(ExpertPolicy p) { return p == ExpertPolicy::eplb ? "eplb" : "static"; }

// [experts] on_failure: what an expert shard that breaks its restart budget
// does to the run. stop: the run fails (the supervisor escalates, as for any
// actor); shrink: the shard's slot is removed from every MoE layer (the plan
// keeps one shard count for all layers), its experts join a neighbouring
// shard, loaded from the committed snapshot, and the step is replayed.
enum class ExpertOnFailure { stop, shrink };
inline const char* expert_on_failure_name(ExpertOnFailure f) { return f == ExpertOnFailure::shrink ? "shrink" : "stop"; }

}  // namespace troupe::runtime
