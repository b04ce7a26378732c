// TCP_NODELAY on the middleman's connections (actors/transport/tcp_nodelay.hpp):
// a connected socket gets the flag, a connection accepted from a marked
// listening socket has it without being visited, other sockets are left
// alone, and TROUPE_TCP_NODELAY=0 turns it off.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdlib>

#include "actors/transport/tcp_nodelay.hpp"

using troupe::set_tcp_nodelay_on_all_sockets;

namespace {

int nodelay(int fd) {
  int v = -1;
  socklen_t len = sizeof(v);
  EXPECT_EQ(::getsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &v, &len), 0);
  return v;
}

// A loopback listening socket on a port the OS picks.
int listener(uint16_t& port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  EXPECT_EQ(::listen(fd, 4), 0);
  socklen_t len = sizeof(a);
  EXPECT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
  port = ntohs(a.sin_port);
  return fd;
}

int connect_to(uint16_t port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  EXPECT_EQ(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)), 0);
  return fd;
}

}  // namespace

TEST(TcpNodelay, MarksConnectionsAndAcceptedOnesInherit) {
  ::unsetenv("TROUPE_TCP_NODELAY");
  uint16_t port = 0;
  const int l = listener(port);
  int pair[2];
  ASSERT_EQ(::socketpair(AF_UNIX, SOCK_STREAM, 0, pair), 0);
  EXPECT_GE(set_tcp_nodelay_on_all_sockets(), 1);  // marks the listener (Unix sockets are skipped)
  const int c = connect_to(port);                   // opened after the call: not marked yet
  const int s = ::accept(l, nullptr, nullptr);
  ASSERT_GE(s, 0);
  EXPECT_EQ(nodelay(c), 0);
  EXPECT_NE(nodelay(s), 0) << "an accepted connection inherits the listener's TCP_NODELAY";
  EXPECT_GE(set_tcp_nodelay_on_all_sockets(), 3);
  EXPECT_NE(nodelay(c), 0);
  for (int fd : {l, c, s, pair[0], pair[1]}) ::close(fd);
}

TEST(TcpNodelay, OffWhenTheEnvironmentSaysSo) {
  ::setenv("TROUPE_TCP_NODELAY", "0", 1);
  uint16_t port = 0;
  const int l = listener(port);
  const int c = connect_to(port);
  EXPECT_EQ(set_tcp_nodelay_on_all_sockets(), 0);
  EXPECT_EQ(nodelay(c), 0);
  ::unsetenv("TROUPE_TCP_NODELAY");
  ::close(c);
  ::close(l);
}
