// One [[elastic]] scale event, the value the spec parser (launch/spec.cpp)
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

}  // namespace troupe::runtime
