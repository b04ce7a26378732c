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

#include "actors/envelope.hpp"

CAF_BEGIN_TYPE_ID_BLOCK(troupe, caf::first_custom_type_id)

  CAF_ADD_TYPE_ID(troupe, (troupe::Envelope))

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
