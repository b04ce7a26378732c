// `troupe launch [-np N] [SPEC] [--set ...]`: a multi-process run on this
// host, in the manner of torchrun. It starts `mpirun` with the flags a
// troupe run needs (--allow-run-as-root as root, --oversubscribe, --mca btl
// self,vader, --enable-recovery when [topology] process_loss = "recover"),
// forwards SIGINT/SIGTERM/SIGHUP/SIGQUIT to process 0 (which stops the run
// after its step with a checkpoint; a signal to mpirun would abort every
// process without one), and exits with process 0's own status: 0 finished,
// 130 interrupted, 1/3/4 failed as `troupe run` says. mpirun's status cannot
// tell these apart (MPI_ABORT is 1 on a clean interruption; with recovery a
// killed process 0 gives 0). Process 0 reports its pid and status through
// files in a private directory named by TROUPE_LAUNCH_DIR (launch_report_*).
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#include "launch/cli.hpp"
#include "launch/signals.hpp"

namespace troupe::launch {

namespace {

constexpr const char* kLaunchDirEnv = "TROUPE_LAUNCH_DIR";

std::atomic<int> g_forward{0};  // the last signal to forward (the handler only stores it)
extern "C" void on_launch_signal(int sig) { g_forward.store(sig); }

bool is_rank0() {
  for (const char* v : {"OMPI_COMM_WORLD_RANK", "PMIX_RANK", "PMI_RANK"})
    if (const char* r = std::getenv(v)) return std::string(r) == "0";
  return false;
}

long read_number(const std::string& path) {
  std::ifstream in(path);
  long v = -1;
  return in >> v ? v : -1;
}

}  // namespace

void launch_report_start() {
  const char* dir = std::getenv(kLaunchDirEnv);
  if (!dir || !is_rank0()) return;
  std::ofstream(std::string(dir) + "/pid.tmp") << ::getpid() << "\n";
  std::rename((std::string(dir) + "/pid.tmp").c_str(), (std::string(dir) + "/pid").c_str());
}

void launch_report_exit(int status) {
  const char* dir = std::getenv(kLaunchDirEnv);
  if (!dir || !is_rank0()) return;
  std::ofstream(std::string(dir) + "/status.tmp") << status << "\n";
  std::rename((std::string(dir) + "/status.tmp").c_str(), (std::string(dir) + "/status").c_str());
}

int command_launch(const CliOptions& opt, const Spec& spec, const char* self) {
  const int64_t np = opt.np > 0 ? opt.np : spec.topology.processes;
  if (np != spec.topology.processes) {
    std::fprintf(stderr, "troupe: launch -np %lld: the spec has [topology] processes = %lld (set it, or leave -np out)\n",
                 static_cast<long long>(np), static_cast<long long>(spec.topology.processes));
    return kExitUsage;
  }
  char tmpl[] = "/tmp/troupe-launch-XXXXXX";
  if (!::mkdtemp(tmpl)) {
    std::perror("troupe: launch: mkdtemp");
    return kExitRuntime;
  }
  const std::string dir = tmpl;
  struct Cleanup {
    std::string d;
    ~Cleanup() { std::error_code ec; std::filesystem::remove_all(d, ec); }
  } cleanup{dir};

  std::vector<std::string> args = {"mpirun", "-np", std::to_string(np)};
  if (::geteuid() == 0) args.push_back("--allow-run-as-root");
  for (const char* a : {"--oversubscribe", "--mca", "btl", "self,vader"}) args.push_back(a);
  if (spec.topology.process_loss == runtime::ProcessLoss::recover) args.push_back("--enable-recovery");
  args.push_back(self);
  args.push_back("run");
  for (const auto& p : opt.positional) args.push_back(std::filesystem::absolute(p).string());
  for (const auto& o : opt.overrides) {
    args.push_back("--set");
    args.push_back(o.path + "=" + o.value);
  }
  if (!opt.log_level.empty()) {
    args.push_back("--log-level");
    args.push_back(opt.log_level);
  }
  std::string shown;
  for (const auto& a : args) shown += (shown.empty() ? "" : " ") + a;
  std::fprintf(stderr, "troupe launch: %s\n", shown.c_str());
  std::fflush(stderr);

  struct sigaction sa {};
  sa.sa_handler = on_launch_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaction(sig, &sa, nullptr);

  const pid_t child = ::fork();
  if (child < 0) {
    std::perror("troupe: launch: fork");
    return kExitRuntime;
  }
  if (child == 0) {
    // mpirun in its own process group: a Ctrl-C on the terminal reaches the
    // launcher only, which forwards it to process 0.
    ::setpgid(0, 0);
    struct sigaction dfl {};
    dfl.sa_handler = SIG_DFL;
    for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaction(sig, &dfl, nullptr);
    ::setenv(kLaunchDirEnv, dir.c_str(), 1);
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execvp("mpirun", argv.data());
    std::fprintf(stderr, "troupe: launch: cannot run mpirun: %s (install openmpi-bin; ./setup.sh does)\n",
                 std::strerror(errno));
    ::_exit(127);
  }
  int wstatus = 0;
  for (;;) {
    const pid_t r = ::waitpid(child, &wstatus, WNOHANG);
    if (r == child) break;
    if (r < 0 && errno != EINTR) break;
    if (const int sig = g_forward.exchange(0); sig != 0) {
      const long pid0 = read_number(dir + "/pid");
      if (pid0 > 0) {
        std::fprintf(stderr, "troupe launch: %s -> process 0 (pid %ld)\n", signal_name(sig), pid0);
        ::kill(static_cast<pid_t>(pid0), sig);
      } else {
        std::fprintf(stderr, "troupe launch: %s before process 0 started: stopping mpirun\n", signal_name(sig));
        ::kill(-child, SIGTERM);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  const int mpirun_status = WIFEXITED(wstatus) ? WEXITSTATUS(wstatus) : 128 + WTERMSIG(wstatus);
  if (mpirun_status == 127) return kExitRuntime;
  const long status = read_number(dir + "/status");
  if (status < 0) {
    std::fprintf(stderr, "troupe launch: process 0 ended without reporting its status (killed?); mpirun exited %d\n",
                 mpirun_status);
    return kExitRuntime;
  }
  std::fprintf(stderr, "troupe launch: process 0 exited %ld (mpirun: %d)\n", status, mpirun_status);
  return static_cast<int>(status);
}

}  // namespace troupe::launch
