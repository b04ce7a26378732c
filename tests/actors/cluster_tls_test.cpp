// Authenticated connections between processes (actors/cluster/cluster_tls.hpp):
// the cluster identity made, written and read back, with a clear error for
// every kind of bad key directory; and CAF's OpenSSL module with that
// identity: a peer holding the cluster key gets through, a peer with another
// key or with no TLS at all is refused, and the server keeps serving.
#include <sys/stat.h>

#include <caf/actor_system.hpp>
#include <caf/actor_system_config.hpp>
#include <caf/event_based_actor.hpp>
#include <caf/io/middleman.hpp>
#include <caf/openssl/publish.hpp>
#include <caf/openssl/remote_actor.hpp>
#include <caf/scoped_actor.hpp>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <memory>
#include <optional>
#include <string>

#include <gtest/gtest.h>

#include "actors/cluster/cluster_tls.hpp"

namespace troupe::test {
namespace {

namespace fs = std::filesystem;
using runtime::ClusterIdentity;

struct TempDir {
  fs::path path;
  TempDir() {
    std::string t = (fs::temp_directory_path() / "troupe-tls-test-XXXXXX").string();
    path = ::mkdtemp(t.data());
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

void put(const fs::path& p, const std::string& text) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out << text;
}

void expect_rejected(const std::string& dir, const std::string& want) {
  try {
    runtime::read_cluster_identity(dir);
    ADD_FAILURE() << "accepted " << dir;
  } catch (const std::invalid_argument& e) {
    EXPECT_NE(std::string(e.what()).find(want), std::string::npos) << e.what();
  }
}

TEST(ClusterTls, KeygenWritesAnIdentityThatReadsBack) {
  TempDir t;
  const ClusterIdentity a = runtime::make_cluster_identity(), b = runtime::make_cluster_identity();
  EXPECT_NE(a.key_pem, b.key_pem);
  EXPECT_NE(a.cert_pem.find("BEGIN CERTIFICATE"), std::string::npos);
  const std::string dir = (t.path / "key").string();
  runtime::write_cluster_identity(dir, a);
  const ClusterIdentity r = runtime::read_cluster_identity(dir);
  EXPECT_EQ(r.cert_pem, a.cert_pem);
  EXPECT_EQ(r.key_pem, a.key_pem);
  struct stat st {};
  ASSERT_EQ(::stat((fs::path(dir) / runtime::kClusterKeyFile).c_str(), &st), 0);
  EXPECT_EQ(st.st_mode & 0077, 0u) << "the key must be readable by its owner only";
  // Never overwrites a key.
  EXPECT_THROW(runtime::write_cluster_identity(dir, b), std::invalid_argument);
  EXPECT_EQ(runtime::read_cluster_identity(dir).key_pem, a.key_pem);
  for (const auto& e : fs::directory_iterator(t.path))
    EXPECT_EQ(e.path().filename().string().rfind(".troupe-keygen", 0), std::string::npos) << "left " << e.path();
}

TEST(ClusterTls, BadKeyDirectoriesAreClearErrors) {
  TempDir t;
  const ClusterIdentity a = runtime::make_cluster_identity(), b = runtime::make_cluster_identity();
  expect_rejected((t.path / "absent").string(), "not a directory");
  put(t.path / "file", "x");
  expect_rejected((t.path / "file").string(), "not a directory");
  const fs::path d = t.path / "d";
  fs::create_directory(d);
  expect_rejected(d.string(), "cluster.pem: no such file");
  put(d / "cluster.pem", a.cert_pem);
  expect_rejected(d.string(), "cluster.key: no such file");
  fs::create_directory(d / "cluster.key");
  expect_rejected(d.string(), "cluster.key: not a regular file");
  fs::remove(d / "cluster.key");
  put(d / "cluster.key", b.key_pem);  // another identity's key
  expect_rejected(d.string(), "does not belong to");
  put(d / "cluster.key", "not a key");
  expect_rejected(d.string(), "not an unencrypted PEM private key");
  put(d / "cluster.key", a.key_pem);
  put(d / "cluster.pem", "-----BEGIN CERTIFICATE-----\ngarbage\n-----END CERTIFICATE-----\n");
  expect_rejected(d.string(), "not a PEM certificate");
  put(d / "cluster.pem", std::string(70 * 1024, 'x'));
  expect_rejected(d.string(), "more than a PEM certificate can be");
  put(d / "cluster.pem", a.cert_pem);
  EXPECT_NO_THROW(runtime::read_cluster_identity(d.string()));
}

// One actor system, optionally with TLS and an identity.
struct Node {
  std::unique_ptr<runtime::IdentityFiles> files;
  caf::actor_system_config cfg;
  std::unique_ptr<caf::actor_system> sys;
  explicit Node(const ClusterIdentity* id) {
    cfg.load<caf::io::middleman>();
    cfg.set("middleman.connection-timeout", caf::timespan{std::chrono::seconds(5)});
    if (id) {
      files = std::make_unique<runtime::IdentityFiles>(*id);
      runtime::configure_tls(cfg, *files);
    }
    sys = std::make_unique<caf::actor_system>(cfg);
  }
};

caf::actor connect(Node& client, uint16_t port, bool tls) {
  auto h = tls ? caf::openssl::remote_actor(*client.sys, "127.0.0.1", port)
               : client.sys->middleman().remote_actor("127.0.0.1", port);
  return h ? *h : caf::actor{};
}

// Asks `server` 41 + 1 over an existing connection; nullopt when it fails.
std::optional<int> ask(Node& client, const caf::actor& server) {
  if (!server) return std::nullopt;
  std::optional<int> out;
  caf::scoped_actor self{*client.sys};
  self->request(server, std::chrono::seconds(10), 41).receive([&](int y) { out = y; }, [&](caf::error&) {});
  return out;
}

// Connects to the server at `port` and asks 41 + 1; nullopt when refused.
std::optional<int> ask(Node& client, uint16_t port, bool tls) { return ask(client, connect(client, port, tls)); }

TEST(ClusterTls, OnlyAPeerWithTheClusterKeyGetsThrough) {
  const ClusterIdentity cluster = runtime::make_cluster_identity(), rogue = runtime::make_cluster_identity();
  Node server(&cluster);
  auto answer = server.sys->spawn([](caf::event_based_actor*) -> caf::behavior { return {[](int x) { return x + 1; }}; });
  auto port = caf::openssl::publish(answer, 0, "127.0.0.1");
  ASSERT_TRUE(port) << server.sys->render(port.error());
  // A member that stays connected through the knocks below: a refused
  // handshake must not take a healthy connection down (cluster_tls.cpp's
  // error-queue wrappers; without them this connection broke).
  Node member(&cluster);
  const caf::actor server_handle = connect(member, *port, true);
  EXPECT_EQ(ask(member, server_handle), std::optional<int>(42));
  const uint64_t refused_before = runtime::refused_connections();
  {
    Node other_key(&rogue);  // TLS, but a key the cluster does not trust
    EXPECT_EQ(ask(other_key, *port, true), std::nullopt);
  }
  {
    Node plain(nullptr);  // CAF's plain protocol on the TLS port
    EXPECT_EQ(ask(plain, *port, false), std::nullopt);
  }
  // Logged and counted on the server's side (and the rogue's).
  EXPECT_GE(runtime::refused_connections(), refused_before + 2);
  EXPECT_EQ(ask(member, server_handle), std::optional<int>(42)) << "the member's connection broke";
  {
    Node late(&cluster);  // a new member still gets through
    EXPECT_EQ(ask(late, *port, true), std::optional<int>(42));
  }
  caf::anon_send_exit(answer, caf::exit_reason::user_shutdown);
}

}  // namespace
}  // namespace troupe::test
