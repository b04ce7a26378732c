// write_file_atomically (atomic_file.hpp).
#include "model/atomic_file.hpp"

#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace troupe::model {

namespace {
std::atomic<int> g_writes{0};
std::atomic<int> g_deferred{0};
}  // namespace

UninterruptedWrite::UninterruptedWrite() { g_writes.fetch_add(1); }

UninterruptedWrite::~UninterruptedWrite() {
  if (g_writes.fetch_sub(1) != 1) return;
  const int sig = g_deferred.exchange(0);
  if (sig == 0) return;
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  ::raise(sig);
}

bool defer_termination(int sig) {
  if (g_writes.load() == 0) return false;
  g_deferred.store(sig);
  // The write may have ended between the two loads: then nobody raises it.
  return g_writes.load() != 0;
}

void write_file_atomically(const std::string& path, const std::function<void(std::ostream&)>& write,
                           bool make_parents) {
  const UninterruptedWrite whole;
  namespace fs = std::filesystem;
  const fs::path target(path);
  std::error_code ec;
  if (make_parents && target.has_parent_path()) fs::create_directories(target.parent_path(), ec);
  const std::string tmp = path + ".tmp." + std::to_string(::getpid());
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    if (!out) throw std::runtime_error("cannot write " + path + " (cannot create " + tmp + ": " + std::strerror(errno) + ")");
    try {
      write(out);
    } catch (...) {
      out.close();
      fs::remove(tmp, ec);
      throw;
    }
    out.flush();
    if (!out) {
      out.close();
      fs::remove(tmp, ec);
      throw std::runtime_error("cannot write " + path + " (writing " + tmp + " failed)");
    }
  }
  fs::rename(tmp, target, ec);
  if (ec) {
    std::error_code ignore;
    fs::remove(tmp, ignore);
    throw std::runtime_error("cannot write " + path + ": " + ec.message());
  }
}

void write_file_atomically(const std::string& path, std::string_view bytes, bool make_parents) {
  write_file_atomically(path, [bytes](std::ostream& out) { out.write(bytes.data(), static_cast<std::streamsize>(bytes.size())); },
                        make_parents);
}

}  // namespace troupe::model
