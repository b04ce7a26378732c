// SIGINT / SIGTERM / SIGHUP / SIGQUIT handling (see signals.hpp). The handler
// only touches lock-free atomics and sigaction/raise (async-signal-safe).
#include "launch/signals.hpp"

#include <csignal>

#include "model/atomic_file.hpp"

namespace troupe::launch {

namespace {

constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP, SIGQUIT};
constexpr int kCount = sizeof kSignals / sizeof kSignals[0];

std::atomic<bool> g_stop{false};
std::atomic<int> g_signal{0};
struct sigaction g_old[kCount];

void on_signal(int sig) {
  if (!g_stop.exchange(true)) {
    g_signal.store(sig);
    return;  // the first: stop after the running step, saving there
  }
  // A second one ends the process now, unless a checkpoint is being written:
  // then right after it (model/atomic_file.hpp), so nothing is left half-saved.
  if (model::defer_termination(sig)) return;
  struct sigaction dfl {};
  dfl.sa_handler = SIG_DFL;
  sigemptyset(&dfl.sa_mask);
  sigaction(sig, &dfl, nullptr);
  ::raise(sig);
}

}  // namespace

StopOnSignal::StopOnSignal() {
  g_stop.store(false);
  g_signal.store(0);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (int i = 0; i < kCount; ++i) sigaction(kSignals[i], &sa, &g_old[i]);
}

StopOnSignal::~StopOnSignal() {
  for (int i = 0; i < kCount; ++i) sigaction(kSignals[i], &g_old[i], nullptr);
}

const std::atomic<bool>* StopOnSignal::flag() const { return &g_stop; }
int StopOnSignal::signal() const { return g_signal.load(); }

const char* signal_name(int sig) {
  switch (sig) {
    case SIGINT: return "SIGINT";
    case SIGTERM: return "SIGTERM";
    case SIGHUP: return "SIGHUP";
    case SIGQUIT: return "SIGQUIT";
    default: return "a signal";
  }
}

}  // namespace troupe::launch
