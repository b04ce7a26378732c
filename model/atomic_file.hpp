// Writing a file so that a reader sees the old file or the whole new one,
// never a part: the bytes go to a temporary file beside it, which replaces
// `path` by rename once they are all written and flushed. Used by every
// output troupe writes as one file (traces, reports, calibrations,
// safetensors exports); checkpoints are whole directories and do the same
// one level up (model/checkpoint.cpp).
#pragma once

#include <functional>
#include <ostream>
#include <string>
#include <string_view>

namespace troupe::model {

// Writes `path` from what `write` puts into the stream. Creates missing
// parent directories when `make_parents`. Throws std::runtime_error naming
// `path` and the cause; leaves no temporary file behind.
void write_file_atomically(const std::string& path, const std::function<void(std::ostream&)>& write,
                           bool make_parents = false);
void write_file_atomically(const std::string& path, std::string_view bytes, bool make_parents = false);

// A write that a signal must not cut in two (a checkpoint directory, a file
// above): while one is alive, a terminating signal that the command's
// handler defers (defer_termination) ends the process right after the last
// such write instead of in its middle, so no temporary is left behind.
class UninterruptedWrite {
 public:
  UninterruptedWrite();
  ~UninterruptedWrite();  // the last one out raises a deferred signal with its default action
  UninterruptedWrite(const UninterruptedWrite&) = delete;
  UninterruptedWrite& operator=(const UninterruptedWrite&) = delete;
};

// Async-signal-safe, for a signal handler: when an UninterruptedWrite is
// alive, records `sig` to be raised when it ends and returns true; false
// otherwise (the handler then terminates at once).
bool defer_termination(int sig);

}  // namespace troupe::model
