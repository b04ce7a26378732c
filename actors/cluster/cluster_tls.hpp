// Authenticated connections between troupe processes ([topology] auth = "tls").
//
// Every process of a run holds the same cluster identity: one EC P-256 key
// and a self-signed certificate for it, which is also the only trust anchor.
// CAF's OpenSSL module (libcaf-openssl) then runs mutual TLS on every
// connection: a peer that cannot prove it holds the cluster key fails the
// handshake and never reaches an actor. The identity comes either from
// `troupe keygen DIR` ([topology] auth_dir, distributed out of band: the way
// for several hosts) or, by default, is made fresh for each run by process 0
// and handed to the others over MPI (on one host MPI runs over shared memory,
// so the key never crosses a socket).
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include <caf/fwd.hpp>

namespace troupe::runtime {

struct ClusterIdentity {
  std::string cert_pem;  // self-signed, CA:TRUE, CN=troupe-cluster
  std::string key_pem;   // PKCS#8, unencrypted
};

// A fresh key pair and certificate (valid from now for 10 years).
ClusterIdentity make_cluster_identity();

// The files `troupe keygen` writes and auth_dir names.
inline constexpr const char* kClusterCertFile = "cluster.pem";
inline constexpr const char* kClusterKeyFile = "cluster.key";

// Reads DIR/cluster.pem and DIR/cluster.key. Throws std::invalid_argument
// naming the file and what is wrong: not a directory, missing, not a
// regular file, over 64 KiB, not PEM, or a key that does not belong to the
// certificate.
ClusterIdentity read_cluster_identity(const std::string& dir);

// Writes both files into DIR (created; it must not exist or be empty) via a
// temporary directory renamed into place, the key readable by its owner only.
void write_cluster_identity(const std::string& dir, const ClusterIdentity& id);

// The identity as files CAF's OpenSSL module can read (it takes paths), in a
// private directory (mode 0700) removed when the last holder lets go.
class IdentityFiles {
 public:
  explicit IdentityFiles(const ClusterIdentity& id);
  ~IdentityFiles();
  IdentityFiles(const IdentityFiles&) = delete;
  IdentityFiles& operator=(const IdentityFiles&) = delete;
  const std::string& cert_path() const { return cert_; }
  const std::string& key_path() const { return key_; }

 private:
  std::string dir_, cert_, key_;
};

// Connections this process refused in the TLS handshake (each is also
// logged on stderr with the peer's address and OpenSSL's reason).
uint64_t refused_connections();

// Loads CAF's OpenSSL module into `cfg` with `files` as certificate, key and
// the only trusted CA (mutual verification).
void configure_tls(caf::actor_system_config& cfg, const IdentityFiles& files);

}  // namespace troupe::runtime
