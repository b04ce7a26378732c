// See tcp_nodelay.hpp.
#include "actors/transport/tcp_nodelay.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <sys/stat.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace troupe {

int set_tcp_nodelay_on_all_sockets() {
  if (const char* v = std::getenv("TROUPE_TCP_NODELAY"); v != nullptr && std::string(v) == "0") return 0;
  int n = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator("/proc/self/fd", ec)) {
    const std::string name = e.path().filename().string();
    char* end = nullptr;
    const long fd = std::strtol(name.c_str(), &end, 10);
    if (end == name.c_str() || *end != '\0' || fd < 0) continue;
    struct stat st {};
    if (::fstat(static_cast<int>(fd), &st) != 0 || !S_ISSOCK(st.st_mode)) continue;
    int domain = 0, type = 0, proto = 0;
    socklen_t len = sizeof(int);
    if (::getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_DOMAIN, &domain, &len) != 0) continue;
    len = sizeof(int);
    if (::getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_TYPE, &type, &len) != 0) continue;
    len = sizeof(int);
    if (::getsockopt(static_cast<int>(fd), SOL_SOCKET, SO_PROTOCOL, &proto, &len) != 0) continue;
    if ((domain != AF_INET && domain != AF_INET6) || type != SOCK_STREAM || proto != IPPROTO_TCP) continue;
    const int one = 1;
    if (::setsockopt(static_cast<int>(fd), IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one)) == 0) ++n;
  }
  return n;
}

}  // namespace troupe
