// THE CAF type-ID block of troupe: every custom message type and atom that
// actors exchange is registered here, once, so all processes agree on names
// and IDs. Later work appends atoms and types at the END of the block (IDs are
// assigned in order; inserting in the middle would renumber the rest).
//
// Wiring: call troupe::register_caf_types(cfg) on every actor_system_config
// (it adds the block and the "envelope" error category), and load the
// middleman where processes talk to each other.
#pragma once

#include <caf/actor_system_config.hpp>
#include <caf/message.hpp>
#include <caf/type_id.hpp>

#include <cstdint>
#include <vector>

#include "actors/transport/envelope.hpp"

CAF_BEGIN_TYPE_ID_BLOCK(troupe, caf::first_custom_type_id)

  CAF_ADD_TYPE_ID(troupe, (troupe::Envelope))

  // Runtime control plane (actors/context.hpp): in CAF 0.17 atoms
  // take no type IDs, so these do not renumber anything.
  CAF_ADD_ATOM(troupe, troupe::rt, step_atom, "rt_step")
  CAF_ADD_ATOM(troupe, troupe::rt, start_atom, "rt_start")
  CAF_ADD_ATOM(troupe, troupe::rt, done_atom, "rt_done")
  CAF_ADD_ATOM(troupe, troupe::rt, loss_atom, "rt_loss")
  CAF_ADD_ATOM(troupe, troupe::rt, gnorm_atom, "rt_gnorm")
  CAF_ADD_ATOM(troupe, troupe::rt, clip_atom, "rt_clip")
  CAF_ADD_ATOM(troupe, troupe::rt, stepok_atom, "rt_stepok")
  CAF_ADD_ATOM(troupe, troupe::rt, fail_atom, "rt_fail")
  CAF_ADD_ATOM(troupe, troupe::rt, params_atom, "rt_params")
  CAF_ADD_ATOM(troupe, troupe::rt, dropped_atom, "rt_dropped")
  // Supervision, snapshots and replay (actors/supervision/supervisor.hpp).
  CAF_ADD_ATOM(troupe, troupe::rt, arm_atom, "rt_arm")
  CAF_ADD_ATOM(troupe, troupe::rt, restore_atom, "rt_restore")
  CAF_ADD_ATOM(troupe, troupe::rt, snapshot_atom, "rt_snap")
  CAF_ADD_ATOM(troupe, troupe::rt, fault_atom, "rt_fault")

  // Across processes (actors/cluster/runtime_cluster.cpp): each process's directory.
  CAF_ADD_ATOM(troupe, troupe::rt, lookup_atom, "rt_lookup")
  CAF_ADD_ATOM(troupe, troupe::rt, register_atom, "rt_reg")
  CAF_ADD_ATOM(troupe, troupe::rt, watch_atom, "rt_watch")
  CAF_ADD_ATOM(troupe, troupe::rt, shutdown_atom, "rt_shut")
  CAF_ADD_ATOM(troupe, troupe::rt, tick_atom, "rt_tick")
  CAF_ADD_ATOM(troupe, troupe::rt, wait_atom, "rt_wait")
  CAF_ADD_ATOM(troupe, troupe::rt, lost_atom, "rt_lost")
  CAF_ADD_ATOM(troupe, troupe::rt, abort_atom, "rt_abort")

  // Expert parallelism: per-micro-batch expert loads, rank -> coordinator.
  CAF_ADD_ATOM(troupe, troupe::rt, load_atom, "rt_load")
  CAF_ADD_TYPE_ID(troupe, (std::vector<int64_t>))

  // The name an actor goes by (actors/plan.hpp), for checks against the plan.
  CAF_ADD_ATOM(troupe, troupe::rt, name_atom, "rt_name")
  CAF_ADD_ATOM(troupe, troupe::rt, deadline_atom, "rt_dline")
  // A step message damaged in flight, dropped by its receiver (and the count).
  CAF_ADD_ATOM(troupe, troupe::rt, corrupt_atom, "rt_corrupt")
  // Scale events (actors/supervision/elastic.cpp): coordinator <- runtime,
  // and the coordinator's "are your weights loaded?" to a new expert shard.
  CAF_ADD_ATOM(troupe, troupe::rt, rescale_atom, "rt_rescale")
  // A custom loss head's per-token report: last-stage rank -> coordinator.
  CAF_ADD_ATOM(troupe, troupe::rt, head_atom, "rt_head")
  // The coordinator's own check of the adaptive message deadline (coordinator.cpp).
  CAF_ADD_ATOM(troupe, troupe::rt, quiet_atom, "rt_quiet")
  // The loss detector's report of a sequence gap (interposer.hpp): -> coordinator.
  CAF_ADD_ATOM(troupe, troupe::rt, gap_atom, "rt_gap")
  // Heartbeats between directories (runtime_cluster.cpp): process p > 0 -> process 0.
  CAF_ADD_ATOM(troupe, troupe::rt, beat_atom, "rt_beat")
  CAF_ADD_TYPE_ID(troupe, (std::vector<double>))

CAF_END_TYPE_ID_BLOCK(troupe)

namespace troupe {

// Adds the troupe type-ID block and renders "envelope" errors by name.
inline void register_caf_types(caf::actor_system_config& cfg) {
  cfg.add_message_types<caf::id_block::troupe>();
  cfg.add_error_category(envelope_error_category,
                         [](uint8_t code, caf::atom_value, const caf::message& ctx) {
                           std::string out = "envelope: ";
                           out += to_string(static_cast<envelope_errc>(code));
                           if (ctx.size() == 1 && ctx.match_element<std::string>(0)) {
                             out += " (";
                             out += ctx.get_as<std::string>(0);
                             out += ")";
                           }
                           return out;
                         });
}

}  // namespace troupe
