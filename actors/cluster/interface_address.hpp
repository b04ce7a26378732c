// The address a process binds its CAF port to, from [topology] interface.
// Besides a literal address ("127.0.0.1", "0.0.0.0"), the key takes an IPv4
// subnet in CIDR form ("10.77.0.0/24"): every process then binds to its own
// address inside that subnet, found on its own interfaces. One spec thus
// serves several hosts on a private network, where a literal address could
// name only one of them and "0.0.0.0" would listen on every interface.
#pragma once

#include <string>

namespace troupe::runtime {

// "" when `interface` is not CIDR-shaped or is a well-formed IPv4 subnet;
// otherwise what is wrong with it (for the spec's error).
std::string interface_subnet_error(const std::string& interface);

// "" when `interface` can be used on this host: "0.0.0.0", a well-formed
// subnet, or a name or address one of whose addresses a socket here can bind
// to. Otherwise why not (an empty string is refused: it would bind every
// interface, IPv4 and IPv6, without saying so).
std::string interface_error(const std::string& interface);

// The address to bind to and advertise: `interface` itself unless it is a
// subnet, else this host's IPv4 address inside it. Throws naming the subnet
// and the addresses this host has when none of them is inside.
std::string resolve_interface(const std::string& interface);

}  // namespace troupe::runtime
