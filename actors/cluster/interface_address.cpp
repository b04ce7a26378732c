// [topology] interface as a subnet: parsing, and this host's address in it.
#include "actors/cluster/interface_address.hpp"

#include <arpa/inet.h>
#include <ifaddrs.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <stdexcept>

namespace troupe::runtime {
namespace {

struct Subnet {
  uint32_t network = 0;  // host byte order, masked
  uint32_t mask = 0;
};

bool is_subnet_shaped(const std::string& s) { return s.find('/') != std::string::npos; }

// Parses "a.b.c.d/n"; returns "" on success.
std::string parse_subnet(const std::string& s, Subnet& out) {
  const size_t slash = s.find('/');
  const std::string addr = s.substr(0, slash), bits = s.substr(slash + 1);
  in_addr a{};
  if (::inet_pton(AF_INET, addr.c_str(), &a) != 1)
    return "'" + s + "' is not an IPv4 subnet: '" + addr + "' is not an IPv4 address (expected e.g. \"10.77.0.0/24\")";
  if (bits.empty() || bits.size() > 2 || bits.find_first_not_of("0123456789") != std::string::npos ||
      std::atoi(bits.c_str()) < 1 || std::atoi(bits.c_str()) > 32)
    return "'" + s + "' is not an IPv4 subnet: the prefix length '" + bits + "' must be 1..32";
  const int n = std::atoi(bits.c_str());
  out.mask = n == 32 ? 0xffffffffu : ~(0xffffffffu >> n);
  out.network = ntohl(a.s_addr) & out.mask;
  return "";
}

}  // namespace

std::string interface_subnet_error(const std::string& interface) {
  if (!is_subnet_shaped(interface)) return "";
  Subnet s;
  return parse_subnet(interface, s);
}

std::string interface_error(const std::string& interface) {
  if (interface.empty())
    return "an empty interface would bind every interface, IPv4 and IPv6; write \"0.0.0.0\" to mean that, or name "
           "an address of this host (\"127.0.0.1\", the default, for one host) or a subnet (\"10.77.0.0/24\")";
  if (is_subnet_shaped(interface)) return interface_subnet_error(interface);
  if (interface == "0.0.0.0") return "";
  // A name or an address: it must resolve, and one of its addresses must be
  // this host's (a socket binds to it), as CAF's bind will need at run time.
  addrinfo hints{};
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  if (const int rc = ::getaddrinfo(interface.c_str(), nullptr, &hints, &found); rc != 0)
    return "'" + interface + "' is neither an address nor a name this host resolves (" + ::gai_strerror(rc) +
           "); expected an address of this host, \"0.0.0.0\" or a subnet";
  bool bound = false;
  for (addrinfo* a = found; a && !bound; a = a->ai_next) {
    const int fd = ::socket(a->ai_family, SOCK_STREAM, 0);
    if (fd < 0) continue;
    bound = ::bind(fd, a->ai_addr, a->ai_addrlen) == 0;  // port 0: any free port
    ::close(fd);
  }
  ::freeaddrinfo(found);
  if (!bound)
    return "'" + interface + "' is not an address of this host (nothing can bind to it); name one of its own "
           "addresses, \"0.0.0.0\" or a subnet";
  return "";
}

std::string resolve_interface(const std::string& interface) {
  if (!is_subnet_shaped(interface)) return interface;
  Subnet net;
  if (auto err = parse_subnet(interface, net); !err.empty()) throw std::runtime_error(err);
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) throw std::runtime_error("cannot list this host's interfaces (getifaddrs)");
  std::string found, seen;
  for (ifaddrs* i = list; i; i = i->ifa_next) {
    if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
    const auto* in = reinterpret_cast<const sockaddr_in*>(i->ifa_addr);
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &in->sin_addr, text, sizeof(text));
    seen += (seen.empty() ? "" : ", ") + std::string(text) + " (" + i->ifa_name + ")";
    if (found.empty() && (ntohl(in->sin_addr.s_addr) & net.mask) == net.network) found = text;
  }
  ::freeifaddrs(list);
  if (found.empty())
    throw std::runtime_error("[topology] interface = \"" + interface + "\": this host has no IPv4 address in that subnet (it has: " +
                             (seen.empty() ? std::string("none") : seen) + ")");
  return found;
}

}  // namespace troupe::runtime
