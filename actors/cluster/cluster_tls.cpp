// The cluster identity and its files (see cluster_tls.hpp).
#include "actors/cluster/cluster_tls.hpp"

#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <openssl/err.h>
#include <openssl/ec.h>
#include <openssl/ssl.h>
#include <sys/socket.h>
#include <openssl/evp.h>
#include <openssl/pem.h>
#include <openssl/rand.h>
#include <openssl/x509.h>
#include <openssl/x509v3.h>
#include <sys/stat.h>
#include <unistd.h>

#include <caf/actor_system_config.hpp>
#include <caf/openssl/manager.hpp>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <atomic>
#include <chrono>
#include <mutex>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <system_error>

namespace troupe::runtime {

namespace fs = std::filesystem;

namespace {

constexpr uintmax_t kMaxPemBytes = 64 * 1024;

template <class T, void (*Free)(T*)>
struct Freer {
  void operator()(T* p) const { Free(p); }
};
using PkeyPtr = std::unique_ptr<EVP_PKEY, Freer<EVP_PKEY, EVP_PKEY_free>>;
using X509Ptr = std::unique_ptr<X509, Freer<X509, X509_free>>;
using BioPtr = std::unique_ptr<BIO, Freer<BIO, BIO_free_all>>;

[[noreturn]] void fail(const std::string& what) { throw std::runtime_error("cluster identity: " + what); }

std::string bio_text(BIO* b) {
  char* data = nullptr;
  const long n = BIO_get_mem_data(b, &data);
  return std::string(data, static_cast<size_t>(n));
}

void add_ext(X509* cert, int nid, const char* value) {
  X509V3_CTX ctx;
  X509V3_set_ctx_nodb(&ctx);
  X509V3_set_ctx(&ctx, cert, cert, nullptr, nullptr, 0);
  X509_EXTENSION* ext = X509V3_EXT_conf_nid(nullptr, &ctx, nid, value);
  if (!ext) fail("cannot make a certificate extension");
  X509_add_ext(cert, ext, -1);
  X509_EXTENSION_free(ext);
}

std::string read_small_file(const fs::path& p, const std::string& what) {
  std::error_code ec;
  const fs::file_status st = fs::status(p, ec);
  if (ec || !fs::exists(st)) throw std::invalid_argument(p.string() + ": no such file (the " + what + "; make both files with `troupe keygen DIR`)");
  if (!fs::is_regular_file(st)) throw std::invalid_argument(p.string() + ": not a regular file (the " + what + ")");
  const uintmax_t size = fs::file_size(p, ec);
  if (ec || size > kMaxPemBytes)
    throw std::invalid_argument(p.string() + ": " + std::to_string(size) + " bytes, more than a PEM " + what + " can be (64 KiB)");
  std::ifstream in(p, std::ios::binary);
  std::ostringstream s;
  s << in.rdbuf();
  if (!in && !in.eof()) throw std::invalid_argument(p.string() + ": cannot read it");
  return s.str();
}

// Writes `text` to a new file readable as `perms` says (set before the bytes go in).
void write_new_file(const fs::path& p, const std::string& text, fs::perms perms) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  std::error_code ec;
  fs::permissions(p, perms, ec);
  out << text;
  out.close();
  if (!out) throw std::runtime_error("cannot write " + p.string());
}

}  // namespace

ClusterIdentity make_cluster_identity() {
  PkeyPtr key(EVP_EC_gen("P-256"));
  if (!key) fail("cannot make an EC P-256 key");
  X509Ptr cert(X509_new());
  if (!cert) fail("out of memory");
  X509_set_version(cert.get(), 2);  // v3
  unsigned char serial[16];
  if (RAND_bytes(serial, sizeof(serial)) != 1) fail("no randomness for the serial number");
  serial[0] &= 0x7f;  // positive
  BIGNUM* bn = BN_bin2bn(serial, sizeof(serial), nullptr);
  BN_to_ASN1_INTEGER(bn, X509_get_serialNumber(cert.get()));
  BN_free(bn);
  X509_gmtime_adj(X509_getm_notBefore(cert.get()), -60);  // clocks of other hosts may lag a little
  X509_gmtime_adj(X509_getm_notAfter(cert.get()), 10L * 365 * 24 * 3600);
  X509_NAME* name = X509_get_subject_name(cert.get());
  X509_NAME_add_entry_by_txt(name, "CN", MBSTRING_ASC, reinterpret_cast<const unsigned char*>("troupe-cluster"), -1, -1, 0);
  X509_set_issuer_name(cert.get(), name);
  X509_set_pubkey(cert.get(), key.get());
  // Its own trust anchor: every process presents it and trusts only it.
  add_ext(cert.get(), NID_basic_constraints, "critical,CA:TRUE");
  add_ext(cert.get(), NID_key_usage, "critical,digitalSignature,keyCertSign");
  add_ext(cert.get(), NID_subject_key_identifier, "hash");
  if (X509_sign(cert.get(), key.get(), EVP_sha256()) == 0) fail("cannot sign the certificate");
  BioPtr cb(BIO_new(BIO_s_mem())), kb(BIO_new(BIO_s_mem()));
  if (!cb || !kb || PEM_write_bio_X509(cb.get(), cert.get()) != 1 ||
      PEM_write_bio_PrivateKey(kb.get(), key.get(), nullptr, nullptr, 0, nullptr, nullptr) != 1)
    fail("cannot write PEM");
  return {bio_text(cb.get()), bio_text(kb.get())};
}

ClusterIdentity read_cluster_identity(const std::string& dir) {
  std::error_code ec;
  if (!fs::is_directory(dir, ec))
    throw std::invalid_argument("auth_dir " + dir + ": not a directory (make one with `troupe keygen " + dir + "`)");
  ClusterIdentity id;
  const fs::path cert_path = fs::path(dir) / kClusterCertFile, key_path = fs::path(dir) / kClusterKeyFile;
  id.cert_pem = read_small_file(cert_path, "certificate");
  id.key_pem = read_small_file(key_path, "private key");
  BioPtr cb(BIO_new_mem_buf(id.cert_pem.data(), static_cast<int>(id.cert_pem.size())));
  X509Ptr cert(PEM_read_bio_X509(cb.get(), nullptr, nullptr, nullptr));
  if (!cert) throw std::invalid_argument(cert_path.string() + ": not a PEM certificate");
  BioPtr kb(BIO_new_mem_buf(id.key_pem.data(), static_cast<int>(id.key_pem.size())));
  char empty[] = "";  // an encrypted key fails here instead of prompting for a passphrase
  PkeyPtr key(PEM_read_bio_PrivateKey(kb.get(), nullptr, nullptr, empty));
  if (!key) throw std::invalid_argument(key_path.string() + ": not an unencrypted PEM private key");
  if (X509_check_private_key(cert.get(), key.get()) != 1)
    throw std::invalid_argument(key_path.string() + ": the key does not belong to " + cert_path.string());
  return id;
}

void write_cluster_identity(const std::string& dir, const ClusterIdentity& id) {
  std::error_code ec;
  const fs::path target(dir);
  if (fs::exists(target, ec) && !(fs::is_directory(target, ec) && fs::is_empty(target, ec)))
    throw std::invalid_argument(dir + ": exists and is not an empty directory (keygen never overwrites a key)");
  const fs::path parent = target.has_parent_path() ? target.parent_path() : fs::path(".");
  std::string tmpl = (parent / ".troupe-keygen-XXXXXX").string();
  if (!::mkdtemp(tmpl.data())) throw std::runtime_error("cannot make a temporary directory in " + parent.string());
  const fs::path tmp(tmpl);
  try {
    write_new_file(tmp / kClusterKeyFile, id.key_pem, fs::perms::owner_read | fs::perms::owner_write);
    write_new_file(tmp / kClusterCertFile, id.cert_pem,
                   fs::perms::owner_read | fs::perms::owner_write | fs::perms::group_read | fs::perms::others_read);
    if (fs::exists(target, ec)) fs::remove(target);  // the empty directory
    fs::rename(tmp, target);
  } catch (...) {
    fs::remove_all(tmp, ec);
    throw;
  }
}

IdentityFiles::IdentityFiles(const ClusterIdentity& id) {
  const char* base = std::getenv("TMPDIR");
  std::string tmpl = std::string(base && *base ? base : "/tmp") + "/troupe-tls-XXXXXX";
  if (!::mkdtemp(tmpl.data())) throw std::runtime_error("cannot make a private directory for the cluster identity");
  dir_ = tmpl;  // mkdtemp makes it 0700
  cert_ = dir_ + "/" + kClusterCertFile;
  key_ = dir_ + "/" + kClusterKeyFile;
  const auto owner = fs::perms::owner_read | fs::perms::owner_write;  // and the directory is 0700
  try {
    write_new_file(key_, id.key_pem, owner);
    write_new_file(cert_, id.cert_pem, owner);
  } catch (...) {
    std::error_code ec;
    fs::remove_all(dir_, ec);
    throw;
  }
}

IdentityFiles::~IdentityFiles() {
  std::error_code ec;
  fs::remove_all(dir_, ec);
}

namespace {
std::atomic<uint64_t> g_refused{0};
}  // namespace

uint64_t refused_connections() { return g_refused.load(); }

void configure_tls(caf::actor_system_config& cfg, const IdentityFiles& files) {
  cfg.load<caf::openssl::manager>();
  cfg.openssl_certificate = files.cert_path();
  cfg.openssl_key = files.key_path();
  cfg.openssl_cafile = files.cert_path();
}

// CAF 0.17's OpenSSL session never clears OpenSSL's per-thread error queue
// before an SSL call, as OpenSSL requires (SSL_get_error reads that queue).
// So one peer that fails its handshake (a rogue, a wrong key) leaves an error
// behind on the middleman's thread, and the next SSL_read of a healthy
// connection on that thread is taken for a failure: CAF drops the connection
// and the run loses a process. Measured: a good connection broke at the
// first request after one refused knock; with these wrappers 50 of 50
// requests went through. The wrappers interpose the four calls CAF makes
// (this executable's definitions come first in symbol lookup), clear the
// queue, call OpenSSL's, and log and count a refused handshake.
namespace {

template <class Fn>
Fn real_ssl(const char* name) {
  void* f = dlsym(RTLD_NEXT, name);
  if (!f) std::abort();  // libssl is linked: cannot happen
  return reinterpret_cast<Fn>(f);
}

std::string peer_of(SSL* s) {
  sockaddr_storage a{};
  socklen_t n = sizeof(a);
  const int fd = SSL_get_fd(s);
  if (fd < 0 || ::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &n) != 0) return "an unknown peer";
  char host[INET6_ADDRSTRLEN] = {};
  uint16_t port = 0;
  if (a.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&a);
    ::inet_ntop(AF_INET, &in->sin_addr, host, sizeof(host));
    port = ntohs(in->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* in = reinterpret_cast<const sockaddr_in6*>(&a);
    ::inet_ntop(AF_INET6, &in->sin6_addr, host, sizeof(host));
    port = ntohs(in->sin6_port);
  }
  return std::string(host) + ":" + std::to_string(port);
}

// A handshake step that failed for good (not "want read/write"): log it.
int after_handshake(SSL* s, int rc, const char* side) {
  if (rc > 0) return rc;
  const int why = SSL_get_error(s, rc);
  if (why == SSL_ERROR_WANT_READ || why == SSL_ERROR_WANT_WRITE) return rc;
  thread_local const SSL* last_refused = nullptr;  // CAF may call again on a failed session: log it once
  if (s == last_refused) return rc;
  last_refused = s;
  char text[256] = "the peer closed the connection";
  if (const unsigned long e = ERR_peek_error(); e != 0) ERR_error_string_n(e, text, sizeof(text));
  const uint64_t n = g_refused.fetch_add(1) + 1;
  // A probe or a scan knocks hundreds of times: the first few refusals are
  // logged one by one, then one line per interval with their count.
  constexpr uint64_t kLoggedOneByOne = 5;
  constexpr auto kInterval = std::chrono::seconds(10);
  static std::mutex mu;
  static std::chrono::steady_clock::time_point last_summary;
  static uint64_t summarised = kLoggedOneByOne;
  const std::string peer = peer_of(s);
  if (n <= kLoggedOneByOne) {
    std::fprintf(stderr, "troupe[pid %d]: refused a connection %s %s: TLS handshake failed (%s)%s\n",
                 static_cast<int>(::getpid()), side, peer.c_str(), text,
                 n == kLoggedOneByOne ? "; further refusals are counted, one line per 10 s" : "");
    return rc;
  }
  const std::lock_guard<std::mutex> lock(mu);
  const auto now = std::chrono::steady_clock::now();
  if (now - last_summary >= kInterval) {
    std::fprintf(stderr, "troupe[pid %d]: refused %llu more connection(s) (TLS handshake failed; the last %s %s), "
                         "%llu in all\n",
                 static_cast<int>(::getpid()), static_cast<unsigned long long>(n - summarised), side, peer.c_str(),
                 static_cast<unsigned long long>(n));
    summarised = n;
    last_summary = now;
  }
  return rc;
}

}  // namespace

}  // namespace troupe::runtime

extern "C" {
int SSL_read(SSL* s, void* buf, int num) {
  static const auto real = troupe::runtime::real_ssl<int (*)(SSL*, void*, int)>("SSL_read");
  ERR_clear_error();
  return real(s, buf, num);
}
int SSL_write(SSL* s, const void* buf, int num) {
  static const auto real = troupe::runtime::real_ssl<int (*)(SSL*, const void*, int)>("SSL_write");
  ERR_clear_error();
  return real(s, buf, num);
}
int SSL_accept(SSL* s) {
  static const auto real = troupe::runtime::real_ssl<int (*)(SSL*)>("SSL_accept");
  ERR_clear_error();
  return troupe::runtime::after_handshake(s, real(s), "from");
}
int SSL_connect(SSL* s) {
  static const auto real = troupe::runtime::real_ssl<int (*)(SSL*)>("SSL_connect");
  ERR_clear_error();
  return troupe::runtime::after_handshake(s, real(s), "to");
}
}
