// SIGINT / SIGTERM handling (see signals.hpp). The handler only stores into
// lock-free atomics (async-signal-safe); SA_RESETHAND restores the default
// action, so a second signal terminates.
#include "launch/signals.hpp"

#include <csignal>

namespace troupe::launch {

namespace {

std::atomic<bool> g_stop{false};
std::atomic<int> g_signal{0};
struct sigaction g_old_int, g_old_term;

void on_signal(int sig) {
  g_signal.store(sig);
  g_stop.store(true);
}

}  // namespace

StopOnSignal::StopOnSignal() {
  g_stop.store(false);
  g_signal.store(0);
  struct sigaction sa {};
  sa.sa_handler = on_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESETHAND | SA_RESTART;
  sigaction(SIGINT, &sa, &g_old_int);
  sigaction(SIGTERM, &sa, &g_old_term);
}

StopOnSignal::~StopOnSignal() {
  sigaction(SIGINT, &g_old_int, nullptr);
  sigaction(SIGTERM, &g_old_term, nullptr);
}

const std::atomic<bool>* StopOnSignal::flag() const { return &g_stop; }
int StopOnSignal::signal() const { return g_signal.load(); }

}  // namespace troupe::launch
