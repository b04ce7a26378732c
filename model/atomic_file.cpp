// write_file_atomically (atomic_file.hpp).
#include "model/atomic_file.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <stdexcept>

namespace troupe::model {

void write_file_atomically(const std::string& path, const std::function<void(std::ostream&)>& write,
                           bool make_parents) {
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
