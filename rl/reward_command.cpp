// A user's reward program as a persistent child process (see reward_command.hpp).
#include "rl/reward_command.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <unordered_map>
#include <utility>

extern char** environ;

namespace troupe::rl {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

constexpr size_t kQuoteChars = 200;          // of a bad line in an error message
constexpr size_t kMaxStderrLine = 1 << 16;   // a longer stderr line is handed on in pieces
constexpr size_t kStderrTail = 5;            // stderr lines quoted when score() gives up
constexpr double kExitGrace = 1.0;           // seconds a child may take to exit before SIGKILL
constexpr const char* kNonFinite = "\x01troupe-non-finite:";  // stands in for NaN / Infinity when parsing

std::string quote(const std::string& line) {
  if (line.size() <= kQuoteChars) return line;
  return line.substr(0, kQuoteChars) + "... (" + std::to_string(line.size()) + " bytes)";
}

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g s", s);
  return buf;
}

// "" when `path` can be executed, else why not.
std::string check_program_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    return errno == ENOENT || errno == ENOTDIR ? "reward command: program " + path + " not found"
                                               : "reward command: program " + path + ": " + std::strerror(errno);
  if (S_ISDIR(st.st_mode)) return "reward command: program " + path + " is a directory";
  // AT_EACCESS: the effective ids decide, as they will at exec; the mode bits
  // as well, since root passes X_OK on any file with one x bit.
  if ((st.st_mode & 0111) == 0 || ::faccessat(AT_FDCWD, path.c_str(), X_OK, AT_EACCESS) != 0)
    return "reward command: program " + path +
           " is not executable (chmod +x it, or name its interpreter first, e.g. [\"python3\", \"reward.py\"])";
  return "";
}

// argv[0] as an absolute path (the child may chdir before exec), or an error.
struct Resolved {
  std::string path;
  std::string error;
};

Resolved resolve_program(const std::vector<std::string>& argv, const std::string& working_dir) {
  if (argv.empty())
    return {"", "reward command is empty: give the program and its arguments, e.g. [\"python3\", \"reward.py\"]"};
  const std::string& name = argv[0];
  if (name.empty()) return {"", "reward command: the program (argv[0]) is an empty string"};
  std::error_code ec;
  if (!working_dir.empty()) {
    if (!fs::exists(working_dir, ec))
      return {"", "reward command: working directory " + working_dir + " does not exist"};
    if (!fs::is_directory(working_dir, ec))
      return {"", "reward command: working directory " + working_dir + " is not a directory"};
  }
  const fs::path base = fs::absolute(working_dir.empty() ? fs::path(".") : fs::path(working_dir), ec);
  if (name.find('/') != std::string::npos) {
    const std::string path = (base / name).lexically_normal().string();  // an absolute name stays as it is
    std::string err = check_program_file(path);
    return {err.empty() ? path : "", err};
  }
  // A PATH search as execvp does it: relative entries are relative to the
  // child's cwd, and entries holding a non-executable file are skipped.
  const char* env = std::getenv("PATH");
  const std::string search = env != nullptr ? env : "/usr/local/bin:/usr/bin:/bin";
  std::string skipped;
  size_t from = 0;
  for (;;) {
    const size_t colon = search.find(':', from);
    const std::string dir = search.substr(from, colon == std::string::npos ? std::string::npos : colon - from);
    const std::string path = (base / (dir.empty() ? "." : dir) / name).lexically_normal().string();
    struct stat st {};
    if (::stat(path.c_str(), &st) == 0 && !S_ISDIR(st.st_mode)) {
      std::string err = check_program_file(path);
      if (err.empty()) return {path, ""};
      if (skipped.empty()) skipped = path;
    }
    if (colon == std::string::npos) break;
    from = colon + 1;
  }
  std::string err = "reward command: program '" + name + "' not found in PATH (" + search + ")";
  if (!skipped.empty()) err += "; " + skipped + " is not executable";
  if (fs::exists(base / name, ec))
    err += "; for the " + name + " in " + base.string() + ", write ./" + name + " or name its interpreter first";
  return {"", err};
}

// A close-on-exec pipe whose ends are not 0, 1 or 2, so that the child's
// dup2 onto its stdio can never overwrite an end it still has to dup.
void make_pipe(int fds[2]) {
  if (::pipe2(fds, O_CLOEXEC) != 0)
    throw RewardCommandError(std::string("reward command: cannot create a pipe: ") + std::strerror(errno));
  for (int k = 0; k < 2; ++k) {
    if (fds[k] > 2) continue;
    const int moved = ::fcntl(fds[k], F_DUPFD_CLOEXEC, 3);
    ::close(fds[k]);
    fds[k] = moved;
  }
}

void close_fd(int& fd) {
  if (fd >= 0) ::close(fd);
  fd = -1;
}

// Blocks SIGPIPE in this thread around a write to the child's stdin: a dead
// reader must give EPIPE, not kill the trainer. A SIGPIPE the write raised is
// taken off the pending set before the old mask comes back.
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_);
  }
  ~SigpipeGuard() {
    if (!was_pending_) {
      const timespec zero{};
      while (sigtimedwait(&pipe_, nullptr, &zero) == SIGPIPE) {
      }
    }
    pthread_sigmask(SIG_SETMASK, &old_, nullptr);
  }

 private:
  sigset_t pipe_, old_;
  bool was_pending_ = false;
};

// Python's json.dumps writes NaN, Infinity and -Infinity, which JSON lacks,
// and a number like 1e999 overflows a double: outside strings these become
// marker strings, so that a reward program printing NaN hears about its NaN
// rather than about a parse error.
std::string mark_non_finite(const std::string& line, bool& found) {
  static const char* const tokens[] = {"-Infinity", "Infinity", "NaN"};
  auto word_char = [](char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_'; };
  auto marker = [&](const std::string& what) {
    found = true;
    return json(std::string(kNonFinite) + what).dump();
  };
  std::string out;
  bool in_string = false, escaped = false;
  for (size_t i = 0; i < line.size(); ++i) {
    const char c = line[i];
    if (in_string) {
      out += c;
      if (escaped) escaped = false;
      else if (c == '\\') escaped = true;
      else if (c == '"') in_string = false;
      continue;
    }
    if (c == '"') in_string = true;
    if (in_string || (i > 0 && word_char(line[i - 1]))) {
      out += c;
      continue;
    }
    size_t n = 0;
    for (const char* t : tokens) {
      const size_t len = std::strlen(t);
      if (line.compare(i, len, t) == 0 && (i + len == line.size() || !word_char(line[i + len]))) {
        n = len;
        break;
      }
    }
    if (n > 0) {
      out += marker(line.substr(i, n));
    } else if (c == '-' || std::isdigit(static_cast<unsigned char>(c))) {
      n = line.find_first_not_of("+-0123456789.eE", i) - i;  // npos - i: to the end
      const std::string number = line.substr(i, n);
      const double v = std::strtod(number.c_str(), nullptr);
      out += std::isinf(v) ? marker(number) : number;
    } else {
      out += c;
      continue;
    }
    i += std::min(n, line.size() - i) - 1;
  }
  return out;
}

// One request as a protocol line. Bad UTF-8 becomes U+FFFD rather than an
// exception: a completion cut at max_new_tokens may end inside a character.
std::string request_line(const RewardRequest& r) {
  auto str = [](const std::string& s) { return json(s).dump(-1, ' ', false, json::error_handler_t::replace); };
  std::string meta = r.meta_json.empty() ? "null" : r.meta_json;
  if (!json::accept(meta))
    throw RewardCommandError("reward command: the meta of request '" + r.id + "' is not JSON: " + quote(meta));
  if (meta.find_first_of("\r\n") != std::string::npos) meta = json::parse(meta).dump();  // one line per request
  return "{\"id\":" + str(r.id) + ",\"prompt\":" + str(r.prompt) + ",\"completion\":" + str(r.completion) +
         ",\"answer\":" + str(r.answer) + ",\"meta\":" + meta + "}\n";
}

int remaining_ms(Clock::time_point deadline) {
  const auto left = std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()).count();
  return static_cast<int>(std::clamp<int64_t>(left, 0, 1 << 30));
}

}  // namespace

std::string check_reward_command(const std::vector<std::string>& argv, const std::string& working_dir) {
  return resolve_program(argv, working_dir).error;
}

// The replies of one attempt at one batch: thrown away if the attempt fails.
struct RewardCommand::Attempt {
  const std::vector<RewardRequest>& batch;
  const std::unordered_map<std::string, size_t>& index;
  std::vector<RewardReply> replies;
  std::vector<char> answered;
  size_t n_answered = 0;
  size_t n_stray = 0;  // lines that answered no fresh request (errors = zero)
  int64_t bad = 0;
  bool done() const { return n_answered + n_stray >= batch.size(); }
  bool desynced() const { return n_stray > 0; }
};

RewardCommand::RewardCommand(RewardCommandOptions options) : opt_(std::move(options)) {
  if (!(opt_.timeout_seconds > 0))
    throw std::invalid_argument("reward command: timeout must be > 0 seconds, got " +
                                std::to_string(opt_.timeout_seconds));
  if (!(opt_.startup_seconds >= 0))
    throw std::invalid_argument("reward command: startup allowance must be >= 0 seconds, got " +
                                std::to_string(opt_.startup_seconds));
  if (opt_.max_restarts < 0)
    throw std::invalid_argument("reward command: max_restarts must be >= 0, got " + std::to_string(opt_.max_restarts));
  start();
}

RewardCommand::~RewardCommand() {
  try {
    stop(kExitGrace);
  } catch (...) {  // stop() is careful not to throw; nothing may leave a destructor
  }
}

pid_t RewardCommand::pid() const { return reaped_ ? -1 : pid_; }

void RewardCommand::kill_child() { stop(0); }

void RewardCommand::start() {
  // Checked again at every start: a restart after the script was deleted
  // should say so, not fail inside posix_spawn.
  const Resolved r = resolve_program(opt_.argv, opt_.working_dir);
  if (!r.error.empty()) throw RewardCommandError(r.error);
  program_ = r.path;
  int in[2], out[2], err[2];
  make_pipe(in);
  make_pipe(out);
  make_pipe(err);
  posix_spawn_file_actions_t fa;
  posix_spawn_file_actions_init(&fa);
  posix_spawn_file_actions_adddup2(&fa, in[0], 0);
  posix_spawn_file_actions_adddup2(&fa, out[1], 1);
  posix_spawn_file_actions_adddup2(&fa, err[1], 2);
  if (!opt_.working_dir.empty()) posix_spawn_file_actions_addchdir_np(&fa, opt_.working_dir.c_str());
#if defined(__GLIBC__) && (__GLIBC__ > 2 || __GLIBC_MINOR__ >= 34)
  posix_spawn_file_actions_addclosefrom_np(&fa, 3);  // fds the host opened without O_CLOEXEC too
#endif
  // The child starts with no signal blocked and SIGPIPE at its default, as
  // from a shell, whatever this thread has set.
  posix_spawnattr_t attr;
  posix_spawnattr_init(&attr);
  sigset_t none, pipe_only;
  sigemptyset(&none);
  sigemptyset(&pipe_only);
  sigaddset(&pipe_only, SIGPIPE);
  posix_spawnattr_setsigmask(&attr, &none);
  posix_spawnattr_setsigdefault(&attr, &pipe_only);
  posix_spawnattr_setflags(&attr, POSIX_SPAWN_SETSIGMASK | POSIX_SPAWN_SETSIGDEF);
  std::vector<char*> args;
  for (const std::string& a : opt_.argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  // posix_spawn, not fork: no copy of a large trainer's address space, and
  // safe beside other threads.
  pid_t pid = -1;
  const int rc = ::posix_spawn(&pid, program_.c_str(), &fa, &attr, args.data(), environ);
  posix_spawn_file_actions_destroy(&fa);
  posix_spawnattr_destroy(&attr);
  ::close(in[0]);
  ::close(out[1]);
  ::close(err[1]);
  if (rc != 0) {
    ::close(in[1]);
    ::close(out[0]);
    ::close(err[0]);
    std::string why = "reward command: cannot start " + program_ + ": " + std::strerror(rc);
    if (rc == ENOENT) why += " (if it is a script, check the interpreter on its #! line)";
    if (rc == ENOEXEC) why += " (a script needs a #! line, or name its interpreter first)";
    throw RewardCommandError(why);
  }
  for (int fd : {in[1], out[0], err[0]}) ::fcntl(fd, F_SETFL, ::fcntl(fd, F_GETFL) | O_NONBLOCK);
  pid_ = pid;
  reaped_ = false;
  killed_by_us_ = false;
  fresh_ = true;
  in_ = in[1];
  out_ = out[0];
  err_ = err[0];
  out_buf_.clear();
  err_buf_.clear();
  last_stderr_.clear();
  if (started_once_) ++stats_.restarts;
  started_once_ = true;
}

bool RewardCommand::try_reap() {
  if (reaped_ || pid_ <= 0) return true;
  int status = 0;
  const pid_t r = ::waitpid(pid_, &status, WNOHANG);
  if (r == 0) return false;
  // -1 (ECHILD): reaped behind our back (the host ignores SIGCHLD); it is gone.
  exit_status_ = r == pid_ ? status : -1;
  reaped_ = true;
  return true;
}

void RewardCommand::stop(double grace_seconds) {
  close_fd(in_);  // EOF: a well-behaved program exits
  bool deliver = true;  // a throwing on_stderr must not keep the child from being reaped
  auto pump = [&] {
    if (!deliver) return;
    try {
      pump_stderr();
    } catch (...) {
      deliver = false;
    }
  };
  if (pid_ > 0) {
    const auto deadline = Clock::now() + std::chrono::duration_cast<Clock::duration>(
                                             std::chrono::duration<double>(grace_seconds));
    while (!try_reap()) {
      if (Clock::now() >= deadline) {
        ::kill(pid_, SIGKILL);
        killed_by_us_ = true;
        int status = 0;
        pid_t r;
        while ((r = ::waitpid(pid_, &status, 0)) < 0 && errno == EINTR) {
        }
        exit_status_ = r == pid_ ? status : -1;
        reaped_ = true;
        break;
      }
      // Its stderr keeps flowing while it winds down (a traceback, a summary).
      pollfd p{err_, POLLIN, 0};
      const int ms = std::min(remaining_ms(deadline), 10);
      if (err_ >= 0 && ::poll(&p, 1, ms) > 0) pump();
      else if (err_ < 0) ::usleep(static_cast<useconds_t>(ms) * 1000);
    }
  }
  pump();  // what it wrote before it went
  if (deliver && !err_buf_.empty()) {
    try {
      take_stderr_line(std::move(err_buf_));
    } catch (...) {
    }
  }
  err_buf_.clear();
  close_fd(out_);
  close_fd(err_);
  reaped_ = true;
}

// Reads the child's stderr until it would block, handing on whole lines.
void RewardCommand::pump_stderr() {
  char buf[1 << 16];
  while (err_ >= 0) {
    const ssize_t n = ::read(err_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      if (n == 0 || errno != EAGAIN) close_fd(err_);  // EOF: nothing more will come
      break;
    }
    err_buf_.append(buf, static_cast<size_t>(n));
    // Lines leave the buffer before they are handed on: a throwing on_stderr
    // must not see them twice.
    std::vector<std::string> lines;
    size_t from = 0, nl;
    while ((nl = err_buf_.find('\n', from)) != std::string::npos) {
      lines.push_back(err_buf_.substr(from, nl - from));
      from = nl + 1;
    }
    err_buf_.erase(0, from);
    if (err_buf_.size() >= kMaxStderrLine) lines.push_back(std::exchange(err_buf_, std::string()));
    for (std::string& line : lines) take_stderr_line(std::move(line));
  }
}

void RewardCommand::take_stderr_line(std::string line) {
  if (!line.empty() && line.back() == '\r') line.pop_back();
  last_stderr_.push_back(quote(line));
  if (last_stderr_.size() > kStderrTail) last_stderr_.erase(last_stderr_.begin());
  if (opt_.on_stderr) opt_.on_stderr(line);
}

std::string RewardCommand::describe_exit() const {
  if (killed_by_us_) return "closed its stdout without exiting";
  if (exit_status_ == -1) return "exited";
  if (WIFEXITED(exit_status_)) return "exited with status " + std::to_string(WEXITSTATUS(exit_status_));
  if (WIFSIGNALED(exit_status_)) {
    const int sig = WTERMSIG(exit_status_);
    return "was killed by signal " + std::to_string(sig) + " (" + strsignal(sig) + ")";
  }
  return "stopped";
}

void RewardCommand::take_reply_line(Attempt& a, std::string line) {
  while (!line.empty() && std::isspace(static_cast<unsigned char>(line.back()))) line.pop_back();
  if (line.find_first_not_of(" \t") == std::string::npos) return;  // blank lines are no replies
  auto bad = [&](const std::string& id, const std::string& why, size_t fresh = SIZE_MAX, size_t again = SIZE_MAX) {
    if (opt_.errors == RewardErrors::fail)
      throw RewardCommandError("reward command: reply" + (id.empty() ? std::string() : " for request '" + id + "'") +
                               " " + why + "; the line: " + quote(line));
    ++a.bad;
    const size_t i = fresh != SIZE_MAX ? fresh : again;
    if (i != SIZE_MAX) a.replies[i] = RewardReply{0.0, std::nullopt, true};
    if (fresh != SIZE_MAX) {
      a.answered[fresh] = 1;
      ++a.n_answered;
    } else {
      ++a.n_stray;
    }
  };
  json j = json::parse(line, nullptr, false);
  if (j.is_discarded()) {
    bool found = false;
    const std::string marked = mark_non_finite(line, found);
    if (found) j = json::parse(marked, nullptr, false);
  }
  if (j.is_discarded()) return bad("", "is not JSON (stdout is for replies only: write logs to stderr)");
  if (!j.is_object()) return bad("", "is not a JSON object");
  const auto id_it = j.find("id");
  if (id_it == j.end()) return bad("", "has no \"id\"");
  if (!id_it->is_string()) return bad("", "has an \"id\" that is not a string");
  const std::string id = id_it->get<std::string>();
  const auto at = a.index.find(id);
  if (at == a.index.end()) return bad("", "names id '" + id + "', which is no request of this batch");
  const size_t i = at->second;
  if (a.answered[i]) return bad(id, "is a second reply for that request", SIZE_MAX, i);
  const auto reward = j.find("reward");
  if (reward == j.end()) return bad(id, "has no \"reward\"", i);
  if (reward->is_string()) {
    const std::string s = reward->get<std::string>();
    if (s.rfind(kNonFinite, 0) == 0)
      return bad(id, "has a non-finite \"reward\" (" + s.substr(std::strlen(kNonFinite)) + ")", i);
  }
  if (!reward->is_number()) return bad(id, "has a \"reward\" that is not a number", i);
  const double value = reward->get<double>();
  if (!std::isfinite(value)) return bad(id, "has a non-finite \"reward\" (out of range)", i);
  std::optional<bool> correct;
  const auto c = j.find("correct");
  if (c != j.end() && !c->is_null()) {
    if (!c->is_boolean()) return bad(id, "has a \"correct\" that is not true or false", i);
    correct = c->get<bool>();
  }
  a.replies[i] = RewardReply{value, correct, false};
  a.answered[i] = 1;
  ++a.n_answered;
}

// Takes whole lines from out_buf_ until the batch is done; the rest (a
// partial line, or lines past the batch) stays for later.
void RewardCommand::take_reply_lines(Attempt& a) {
  size_t from = 0, nl;
  while (!a.done() && (nl = out_buf_.find('\n', from)) != std::string::npos) {
    std::string line = out_buf_.substr(from, nl - from);
    from = nl + 1;
    take_reply_line(a, std::move(line));
  }
  out_buf_.erase(0, from);
}

// One try at the batch on the running child: "" when done, else what went
// wrong (the child is then stopped).
std::string RewardCommand::run_attempt(Attempt& a, const std::string& payload) {
  const double allowed = opt_.timeout_seconds + (fresh_ ? opt_.startup_seconds : 0.0);
  const auto deadline =
      Clock::now() + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(allowed));
  auto missing = [&] {
    return std::to_string(a.batch.size() - a.n_answered) + " of " + std::to_string(a.batch.size()) + " requests";
  };
  size_t written = 0;
  bool writing = true, eof = false, exited = false;
  char buf[1 << 16];
  take_reply_lines(a);
  while (!a.done()) {
    if (eof || exited) {
      // Every line it wrote is in: a last line without its newline counts.
      if (eof && !out_buf_.empty()) take_reply_line(a, std::exchange(out_buf_, std::string()));
      if (a.done()) break;
      stop(kExitGrace);
      return describe_exit() + " before replying to " + missing();
    }
    const int ms = remaining_ms(deadline);
    if (ms <= 0) {
      stop(0);
      return "did not reply to " + missing() + " within " + seconds(allowed);
    }
    pollfd fds[3];
    nfds_t n = 0;
    const bool want_write = writing && written < payload.size();
    if (want_write) fds[n++] = pollfd{in_, POLLOUT, 0};
    fds[n++] = pollfd{out_, POLLIN, 0};
    if (err_ >= 0) fds[n++] = pollfd{err_, POLLIN, 0};
    // Woken at least every 200 ms to see whether the child has exited while
    // something else (a grandchild) holds its stdout open.
    const int r = ::poll(fds, n, std::min(ms, 200));
    if (r < 0) {
      if (errno == EINTR) continue;
      throw RewardCommandError(std::string("reward command: poll failed: ") + std::strerror(errno));
    }
    if (r == 0) {
      if (try_reap()) {  // gone: what it wrote is in the pipe already
        drain_stdout(buf, sizeof buf, eof);
        take_reply_lines(a);
        exited = true;
      }
      continue;
    }
    if (want_write && fds[0].revents != 0) {
      SigpipeGuard guard;
      while (written < payload.size()) {
        const ssize_t w = ::write(in_, payload.data() + written, std::min<size_t>(payload.size() - written, 1 << 16));
        if (w > 0) {
          written += static_cast<size_t>(w);
        } else if (w < 0 && errno == EINTR) {
          continue;
        } else {
          // EAGAIN: the pipe is full, poll again. EPIPE or worse: the child
          // stopped reading; its stdout will tell the rest.
          if (!(w < 0 && errno == EAGAIN)) writing = false;
          break;
        }
      }
    }
    drain_stdout(buf, sizeof buf, eof);
    take_reply_lines(a);
    pump_stderr();
  }
  pump_stderr();  // what it logged before its last reply
  if (eof || exited) stop(kExitGrace);  // done, but leaving: the next batch starts a new one
  return "";
}

// Appends what the child's stdout holds now to out_buf_; eof once it is closed.
void RewardCommand::drain_stdout(char* buf, size_t size, bool& eof) {
  while (!eof) {
    const ssize_t n = ::read(out_, buf, size);
    if (n > 0) {
      out_buf_.append(buf, static_cast<size_t>(n));
    } else if (n < 0 && errno == EINTR) {
      continue;
    } else {
      if (n == 0 || errno != EAGAIN) eof = true;
      break;
    }
  }
}

std::vector<RewardReply> RewardCommand::score(const std::vector<RewardRequest>& batch) {
  std::unordered_map<std::string, size_t> index;
  std::string payload;
  for (size_t i = 0; i < batch.size(); ++i) {
    if (!index.emplace(batch[i].id, i).second)
      throw RewardCommandError("reward command: request id '" + batch[i].id + "' appears twice in one batch");
    payload += request_line(batch[i]);
  }
  if (batch.empty()) {
    ++stats_.batches;
    return {};
  }
  try {
    if (try_reap()) {  // killed, given up on, or gone since the last batch
      stop(0);
      start();
    }
    for (int failures = 0;; ++failures) {
      Attempt a{batch, index, std::vector<RewardReply>(batch.size()), std::vector<char>(batch.size(), 0)};
      const std::string failure = run_attempt(a, payload);
      if (failure.empty()) {
        for (size_t i = 0; i < batch.size(); ++i)  // errors = zero: what no line answered
          if (!a.answered[i]) a.replies[i] = RewardReply{0.0, std::nullopt, true};
        fresh_ = false;
        ++stats_.batches;
        stats_.requests += static_cast<int64_t>(batch.size());
        stats_.bad_replies += a.bad;
        if (a.desynced()) stop(0);  // late replies must not reach the next batch
        return std::move(a.replies);
      }
      if (failures == opt_.max_restarts) {
        stop(0);  // reaped (or killed), then its stderr read to the end: the message quotes all of it
        std::string msg = "reward command " + failure + " (gave up after " + std::to_string(failures) +
                          (failures == 1 ? " restart)" : " restarts)");
        if (!last_stderr_.empty()) {
          msg += "; its last stderr lines:";
          for (const std::string& l : last_stderr_) msg += "\n  " + l;
        }
        throw RewardCommandError(msg);
      }
      start();
    }
  } catch (...) {
    stop(0);  // its state is unknown: the next score() starts afresh
    throw;
  }
}

}  // namespace troupe::rl
