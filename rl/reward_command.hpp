// A user's reward program as the RL reward (rl.reward = "command"): any
// executable (e.g. ["python3", "reward.py"]) runs as one persistent child
// process and scores batches of completions over newline-delimited JSON.
//
// Protocol. For each request the child reads one line on stdin
//   {"id": "...", "prompt": "...", "completion": "...", "answer": "...", "meta": <JSON or null>}
// and writes one line on stdout
//   {"id": "...", "reward": <number>, "correct": <bool, optional>}
// Replies may come in any order; a batch is done when every id has a reply.
// "correct": null is taken as absent. Blank stdout lines are ignored; stdout
// is otherwise for replies only (logs go to stderr, whose lines are handed to
// on_stderr). Strings that are not valid UTF-8 (a completion cut inside a
// character) are sent with U+FFFD in place of the bad bytes. The child starts
// in working_dir with only fds 0-2 open, no signal blocked and SIGPIPE at its
// default.
//
// Failures. If the child exits (or closes stdout) before replying to every
// request, or the batch deadline passes (the child is then SIGKILLed), the
// child is restarted and the whole batch resent; replies received before the
// failure are discarded, so each request is scored exactly once, by one run
// of the program. After max_restarts such restarts for one batch, score()
// throws RewardCommandError. The deadline of a new child's first batch
// includes its start-up (interpreter, imports, a model to load): give that
// startup_seconds.
//
// Bad replies: a line that is not JSON, not an object, lacks "id" or
// "reward", has an "id" that is not a string, not of this batch, or already
// answered, a "reward" that is not a finite number (Python's NaN / Infinity
// tokens included) or a "correct" that is not a bool.
//  - errors = fail: score() throws, naming the request (when the line names
//    one) and quoting the line.
//  - errors = zero: the request the line names scores 0 with errored = true
//    (an id answered twice: that request, whatever its first reply said).
//    A bad line that names no request of the batch cannot be attributed; it
//    still counts as a reply line, and once the child has written as many
//    reply lines as the batch has requests, the requests still unanswered
//    score 0 with errored = true. Its stdout then no longer lines up with its
//    requests, so the child is restarted before the next batch (a late reply
//    must never be taken for a later batch's request of the same id).
//  - Too few replies is never a bad reply: the child waiting is a hang
//    (deadline, restart), the child exiting a crash (restart).
// An exception from score() over a reply or the child leaves the child
// killed; the next score() starts a fresh one.
//
// Not thread-safe: one RewardCommand per reward actor, one call at a time.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <functional>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

namespace troupe::rl {

struct RewardRequest {
  std::string id;  // unique within a batch
  std::string prompt;
  std::string completion;
  std::string answer;
  std::string meta_json = "null";  // a JSON text sent as "meta" verbatim; "" means null
};

struct RewardReply {
  double reward = 0.0;
  std::optional<bool> correct;  // when the reply said
  bool errored = false;         // scored 0 for a bad reply (errors = zero)
};

enum class RewardErrors { fail, zero };

struct RewardCommandOptions {
  std::vector<std::string> argv;  // program and arguments; argv[0] without a '/' is looked up in PATH
  std::string working_dir;        // the child's cwd, and what a relative argv[0] is relative to; "" = ours
  double timeout_seconds = 30;    // deadline for one attempt at one batch
  double startup_seconds = 0;     // added to it for a new child's first batch (imports, loading a model)
  int max_restarts = 3;           // restarts for one batch before score() gives up
  RewardErrors errors = RewardErrors::fail;
  // Each line the child writes to stderr, without its newline, called on the
  // thread in score() or the destructor. May be empty.
  std::function<void(const std::string& line)> on_stderr;
};

struct RewardCommandStats {
  int64_t restarts = 0;     // children started after the first, for any reason (kill_child included)
  int64_t batches = 0;      // score() calls that returned replies
  int64_t requests = 0;     // requests in those batches (each counted once, however many attempts)
  int64_t bad_replies = 0;  // bad reply lines taken as 0 under errors = zero
};

// The message is meant for the user as it stands.
class RewardCommandError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// "" when argv can be started from working_dir, else what is wrong (empty
// argv, working_dir missing, argv[0] not found, a directory, or not
// executable), naming the path. Spawns nothing: for `troupe validate`.
std::string check_reward_command(const std::vector<std::string>& argv, const std::string& working_dir);

class RewardCommand {
 public:
  // Checks the program as check_reward_command() does, then starts the
  // child. Throws RewardCommandError (std::invalid_argument for options out
  // of range).
  explicit RewardCommand(RewardCommandOptions options);
  // Closes the child's stdin, waits up to a second for it to exit (still
  // handing its stderr on), then SIGKILLs it; always reaps it.
  ~RewardCommand();
  RewardCommand(const RewardCommand&) = delete;
  RewardCommand& operator=(const RewardCommand&) = delete;

  // One reply per request, in the order of `batch`. Throws RewardCommandError
  // (duplicate ids in `batch`, a meta_json that is not JSON, a bad reply
  // under errors = fail, a child that cannot be started, or one that failed
  // max_restarts + 1 attempts).
  std::vector<RewardReply> score(const std::vector<RewardRequest>& batch);

  // Fault injection: SIGKILLs (and reaps) the child now; the next score()
  // starts a new one and counts a restart.
  void kill_child();
  // The running child's pid, -1 when there is none.
  pid_t pid() const;
  const RewardCommandStats& stats() const { return stats_; }

 private:
  struct Attempt;
  void start();
  bool try_reap();
  void stop(double grace_seconds);
  std::string run_attempt(Attempt& a, const std::string& payload);
  void drain_stdout(char* buf, size_t size, bool& eof);
  void take_reply_lines(Attempt& a);
  void take_reply_line(Attempt& a, std::string line);
  void pump_stderr();
  void take_stderr_line(std::string line);
  std::string describe_exit() const;

  RewardCommandOptions opt_;
  std::string program_;  // argv[0] resolved to an absolute path
  RewardCommandStats stats_;
  bool started_once_ = false;
  pid_t pid_ = -1;
  bool reaped_ = false;        // pid_ is gone: never signal it again (the number may be reused)
  bool fresh_ = false;         // has not finished a batch yet: gets startup_seconds more
  bool killed_by_us_ = false;  // the last exit was our SIGKILL after it closed stdout
  int exit_status_ = 0;        // waitpid's status once reaped_, -1 when unknown
  int in_ = -1, out_ = -1, err_ = -1;  // our ends of the child's stdin, stdout, stderr
  std::string out_buf_;                // stdout not yet taken as replies
  std::string err_buf_;                // a stderr line not yet ended
  std::vector<std::string> last_stderr_;  // the last few lines, for error messages
};

}  // namespace troupe::rl
