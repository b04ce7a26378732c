// SIGINT / SIGTERM / SIGHUP (a closed terminal or ssh session) / SIGQUIT for
// long-running commands: the first signal asks the run to stop (the training
// loop finishes the running step, saves a checkpoint and returns; `troupe
// run` then exits 130), a second one ends the process at once (the default
// action), so a stuck run can still be killed; only a checkpoint being
// written is finished first, so none is left half-saved.
#pragma once

#include <atomic>

namespace troupe::launch {

class StopOnSignal {
 public:
  StopOnSignal();   // installs the handlers
  ~StopOnSignal();  // restores the previous ones
  StopOnSignal(const StopOnSignal&) = delete;
  StopOnSignal& operator=(const StopOnSignal&) = delete;

  // Set once a signal arrived; what TrainOptions::stop points to.
  const std::atomic<bool>* flag() const;
  bool requested() const { return flag()->load(); }
  int signal() const;  // the signal that arrived (0: none)
};

// "SIGINT", "SIGTERM", "SIGHUP", "SIGQUIT" (others: "a signal").
const char* signal_name(int sig);

}  // namespace troupe::launch
