// What a multi-process run does when it loses a process ([topology]
// process_loss): recover (the lost process's actors restart on process 0 and
// the step is replayed; runtime_cluster.cpp, coordinator.cpp) or fail (the
// run stops, naming the lost process and its actors). CAF-free, for the spec.
#pragma once

#include <string>

namespace troupe::runtime {

enum class ProcessLoss {
  recover,  // 2 processes, process 1 lost: its actors move to process 0, the run goes on (default)
  fail,     // the run stops with exit code 1
};

inline std::string process_loss_name(ProcessLoss p) { return p == ProcessLoss::recover ? "recover" : "fail"; }

}  // namespace troupe::runtime
