// Tests of rl/reward_command: a user's reward program as a persistent child
// speaking newline-delimited JSON. The reward programs are small Python and
// sh scripts written into a fresh temp dir by each test.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "rl/reward_command.hpp"

using namespace troupe::rl;

namespace {

class TempDir {
 public:
  TempDir() {
    char tmpl[] = "/tmp/troupe-reward-XXXXXX";
    if (::mkdtemp(tmpl) == nullptr) throw std::runtime_error("mkdtemp failed");
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }
  std::string write(const std::string& name, const std::string& text, mode_t mode = 0755) const {
    const std::string p = path_ + "/" + name;
    std::ofstream(p) << text;
    ::chmod(p.c_str(), mode);
    return p;
  }

 private:
  std::string path_;
};

// 1 for an exact match (trimmed); says "correct" when meta asks it to.
const char* const kExact = R"(import sys, json
for line in sys.stdin:
    r = json.loads(line)
    out = {"id": r["id"], "reward": 1.0 if r["completion"].strip() == r["answer"].strip() else 0.0}
    m = r["meta"]
    if isinstance(m, dict) and "correct" in m:
        out["correct"] = (out["reward"] == 1.0) if m["correct"] == "bool" else m["correct"]
    print(json.dumps(out), flush=True)
print("bye", file=sys.stderr)
)";

// len(completion) % 2, or meta["w"] when meta is an object with one.
const char* const kParity = R"(import sys, json
for line in sys.stdin:
    r = json.loads(line)
    m = r["meta"]
    w = m["w"] if isinstance(m, dict) else len(r["completion"]) % 2
    print(json.dumps({"id": r["id"], "reward": w}), flush=True)
)";

// Buffers argv[1] requests, then answers them last first with len(completion).
const char* const kReverse = R"(import sys, json
n = int(sys.argv[1]); held = []
for line in sys.stdin:
    held.append(json.loads(line))
    if len(held) == n:
        for r in reversed(held):
            print(json.dumps({"id": r["id"], "reward": float(len(r["completion"]))}))
        sys.stdout.flush(); held = []
)";

// Prints meta["lines"] (ID replaced by the request's id) for each request.
const char* const kScripted = R"(import sys, json
for line in sys.stdin:
    r = json.loads(line)
    for out in r["meta"]["lines"]:
        print(out.replace("ID", r["id"]))
    sys.stdout.flush()
)";

// First run (no marker file argv[1] yet): answers 99 until the request
// "boom", then leaves a marker and crashes (argv[2] = "crash") or hangs.
// Later runs: len(completion).
const char* const kFailOnce = R"(import sys, json, os, time
marker, how = sys.argv[1], sys.argv[2]
first = not os.path.exists(marker)
for line in sys.stdin:
    r = json.loads(line)
    if first and r["completion"] == "boom":
        open(marker, "w").close()
        print("going down", file=sys.stderr, flush=True)
        if how == "crash":
            sys.exit(3)
        time.sleep(60)
    print(json.dumps({"id": r["id"], "reward": 99.0 if first else float(len(r["completion"]))}), flush=True)
)";

RewardRequest req(const std::string& id, const std::string& completion, const std::string& answer = "",
                  const std::string& meta = "null") {
  return RewardRequest{id, "prompt " + id, completion, answer, meta};
}

RewardCommandOptions python(const TempDir& dir, const std::string& script, const std::string& text,
                            std::vector<std::string> args = {}) {
  dir.write(script, text, 0644);
  RewardCommandOptions o;
  o.argv = {"python3", script};
  o.argv.insert(o.argv.end(), args.begin(), args.end());
  o.working_dir = dir.path();
  o.timeout_seconds = 10;
  return o;
}

bool gone(pid_t pid) { return ::kill(pid, 0) == -1 && errno == ESRCH; }

std::string error_of(RewardCommand& rc, const std::vector<RewardRequest>& batch) {
  try {
    rc.score(batch);
  } catch (const RewardCommandError& e) {
    return e.what();
  }
  return "(no error)";
}

std::string ctor_error(const RewardCommandOptions& o) {
  try {
    RewardCommand rc(o);
  } catch (const RewardCommandError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(RlRewardCommand, MissingOrNotExecutableProgramIsNamed) {
  TempDir dir;
  RewardCommandOptions o;
  o.working_dir = dir.path();
  o.argv = {"./missing.py"};
  const std::string missing = ctor_error(o);
  EXPECT_NE(missing.find(dir.path() + "/missing.py not found"), std::string::npos) << missing;
  EXPECT_EQ(check_reward_command(o.argv, o.working_dir), missing);

  o.argv = {"troupe-no-such-reward-program"};
  EXPECT_NE(ctor_error(o).find("'troupe-no-such-reward-program' not found in PATH"), std::string::npos);

  dir.write("reward.py", kExact, 0644);
  o.argv = {"./reward.py"};
  const std::string not_exec = ctor_error(o);
  EXPECT_NE(not_exec.find(dir.path() + "/reward.py is not executable"), std::string::npos) << not_exec;
  EXPECT_EQ(check_reward_command(o.argv, o.working_dir), not_exec);
  o.argv = {"reward.py"};  // a bare name is a PATH lookup; the file beside it earns a hint
  EXPECT_NE(ctor_error(o).find("write ./reward.py"), std::string::npos) << ctor_error(o);

  o.argv = {dir.path()};
  EXPECT_NE(ctor_error(o).find("is a directory"), std::string::npos);
  o.argv = {};
  EXPECT_NE(ctor_error(o).find("empty"), std::string::npos);
  o.argv = {"python3", "reward.py"};
  o.working_dir = dir.path() + "/nowhere";
  EXPECT_NE(ctor_error(o).find(dir.path() + "/nowhere does not exist"), std::string::npos);
  EXPECT_EQ(check_reward_command({"python3", "reward.py"}, dir.path()), "");

  // Executable, but its interpreter is missing: found by the spawn itself.
  dir.write("bad.py", "#!/nonexistent/python9\n");
  o.argv = {"./bad.py"};
  o.working_dir = dir.path();
  EXPECT_NE(ctor_error(o).find("#! line"), std::string::npos) << ctor_error(o);
}

TEST(RlRewardCommand, ScoresInRequestOrderWithOptionalCorrect) {
  TempDir dir;
  RewardCommand rc(python(dir, "reward.py", kExact));
  const auto r = rc.score({req("a", " 42 ", "42"), req("b", "41", "42", R"({"correct": "bool"})"),
                           req("c", "7", "7", R"({"correct": "bool"})"), req("d", "7", "7", R"({"correct": null})")});
  ASSERT_EQ(r.size(), 4u);
  EXPECT_EQ(r[0].reward, 1.0);
  EXPECT_FALSE(r[0].correct.has_value());
  EXPECT_EQ(r[1].reward, 0.0);
  EXPECT_EQ(r[1].correct, std::optional<bool>(false));
  EXPECT_EQ(r[2].correct, std::optional<bool>(true));
  EXPECT_FALSE(r[3].correct.has_value());  // null: the program does not say
  for (const RewardReply& x : r) EXPECT_FALSE(x.errored);
  EXPECT_TRUE(rc.score({}).empty());
  EXPECT_EQ(rc.stats().batches, 2);
  EXPECT_EQ(rc.stats().requests, 4);
  EXPECT_EQ(rc.stats().restarts, 0);
  EXPECT_NE(error_of(rc, {req("x", "1"), req("x", "2")}).find("'x' appears twice"), std::string::npos);
}

TEST(RlRewardCommand, MetaIsPassedVerbatimAndBadUtf8IsReplaced) {
  TempDir dir;
  RewardCommand rc(python(dir, "reward.py", kParity));
  const auto r = rc.score({req("a", "xx", "", R"({"w": 2.5, "deep": [1, {"k": null}]})"), req("b", "xxx", "", ""),
                           req("c", "x", "", "{\n  \"w\": -3\n}"), req("d", "\xff\xfe" "abc")});
  EXPECT_EQ(r[0].reward, 2.5);
  EXPECT_EQ(r[1].reward, 1.0);  // "" is null: parity of 3
  EXPECT_EQ(r[2].reward, -3.0);
  EXPECT_EQ(r[3].reward, 1.0);  // two U+FFFD and abc: 5 characters
  EXPECT_NE(error_of(rc, {req("e", "x", "", "{")}).find("meta of request 'e' is not JSON"), std::string::npos);
}

TEST(RlRewardCommand, ChildStartsInWorkingDirWithNoOtherFds) {
  TempDir dir;
  const int leaky = ::open("/dev/null", O_RDONLY);  // no O_CLOEXEC: must not reach the child either
  ASSERT_GE(leaky, 0);
  RewardCommand other(python(dir, "reward.py", kExact));  // its pipes are open in this process
  dir.write("probe.py", R"(#!/usr/bin/env python3
import sys, json, os
def is_open(fd):
    try:
        os.fstat(fd); return True
    except OSError:
        return False
for line in sys.stdin:
    r = json.loads(line)
    extra = [fd for fd in range(3, 4096) if is_open(fd)]
    here = os.path.realpath(os.getcwd()) == os.path.realpath(r["answer"])
    print(json.dumps({"id": r["id"], "reward": len(extra), "correct": here}), flush=True)
)");
  RewardCommandOptions o;
  o.argv = {"./probe.py"};  // relative to the working dir, not to ours
  o.working_dir = dir.path();
  RewardCommand rc(o);
  const auto r = rc.score({req("a", "", dir.path())});
  EXPECT_EQ(r[0].reward, 0.0) << "fds beyond stdio are open in the child";
  EXPECT_EQ(r[0].correct, std::optional<bool>(true)) << "child's cwd is not the working dir";
  ::close(leaky);
}

TEST(RlRewardCommand, RepliesInAnyOrderAreMatchedById) {
  TempDir dir;
  RewardCommand rc(python(dir, "reward.py", kReverse, {"8"}));
  std::vector<RewardRequest> batch;
  for (size_t i = 0; i < 8; ++i) batch.push_back(req("q" + std::to_string(i), std::string(i + 1, 'z')));
  const auto r = rc.score(batch);
  for (size_t i = 0; i < 8; ++i) EXPECT_EQ(r[i].reward, static_cast<double>(i + 1)) << i;
}

TEST(RlRewardCommand, DeterministicAcrossCallsAndRestarts) {
  TempDir dir;
  RewardCommand rc(python(dir, "reward.py", kParity));
  std::vector<RewardRequest> batch;
  for (size_t i = 0; i < 50; ++i) batch.push_back(req(std::to_string(i), std::string(i * 7 % 13, 'a')));
  const auto first = rc.score(batch);
  const auto second = rc.score(batch);
  const pid_t before = rc.pid();
  rc.kill_child();
  EXPECT_EQ(rc.pid(), -1);
  EXPECT_TRUE(gone(before));
  const auto third = rc.score(batch);
  EXPECT_NE(rc.pid(), -1);
  EXPECT_EQ(rc.stats().restarts, 1);
  for (size_t i = 0; i < batch.size(); ++i) {
    EXPECT_EQ(first[i].reward, static_cast<double>(batch[i].completion.size() % 2)) << i;
    EXPECT_EQ(second[i].reward, first[i].reward) << i;
    EXPECT_EQ(third[i].reward, first[i].reward) << i;
  }
}

TEST(RlRewardCommand, CrashMidBatchRestartsAndResendsTheWholeBatch) {
  TempDir dir;
  std::vector<std::string> log;
  auto o = python(dir, "reward.py", kFailOnce, {dir.path() + "/marker", "crash"});
  o.on_stderr = [&](const std::string& line) { log.push_back(line); };
  RewardCommand rc(o);
  const pid_t first = rc.pid();
  // The first run answers "a" with 99, then dies at "boom": that 99 must not survive.
  const auto r = rc.score({req("a", "xy"), req("b", "boom"), req("c", "xyz")});
  EXPECT_EQ(r[0].reward, 2.0);
  EXPECT_EQ(r[1].reward, 4.0);
  EXPECT_EQ(r[2].reward, 3.0);
  EXPECT_EQ(rc.stats().restarts, 1);
  EXPECT_NE(rc.pid(), first);
  EXPECT_TRUE(gone(first));
  EXPECT_EQ(log, std::vector<std::string>{"going down"});  // the dying run's stderr was handed on
}

TEST(RlRewardCommand, HangPastTheDeadlineIsKilledAndRetried) {
  TempDir dir;
  // sh, not Python: its start-up is no part of the 0.5 s even on a loaded machine.
  dir.write("reward.sh", R"(# First run (no marker yet): answers 99 until the completion "boom", then hangs.
first=1; [ -e "$1" ] && first=0
while IFS= read -r line; do
  id=${line#'{"id":"'}; id=${id%%'"'*}
  case $line in *'"completion":"boom"'*) [ $first = 1 ] && { : > "$1"; exec sleep 60; } ;; esac
  [ $first = 1 ] && r=99 || r=1
  echo "{\"id\": \"$id\", \"reward\": $r}"
done
)", 0644);
  RewardCommandOptions o;
  o.argv = {"sh", "reward.sh", dir.path() + "/marker"};
  o.working_dir = dir.path();
  o.timeout_seconds = 0.5;
  RewardCommand rc(o);
  const pid_t first = rc.pid();
  const auto r = rc.score({req("a", "xy"), req("b", "boom"), req("c", "z")});
  for (const RewardReply& x : r) EXPECT_EQ(x.reward, 1.0);  // not the first run's 99
  EXPECT_EQ(rc.stats().restarts, 1);
  EXPECT_TRUE(gone(first));
}

TEST(RlRewardCommand, StartupAllowanceCoversASlowStartOnce) {
  RewardCommandOptions o;
  o.argv = {"sh", "-c", R"(sleep 0.6
while IFS= read -r line; do id=${line#'{"id":"'}; echo "{\"id\": \"${id%%'"'*}\", \"reward\": 1}"; done)"};
  o.timeout_seconds = 0.3;
  o.max_restarts = 0;
  {
    RewardCommand rc(o);  // 0.6 s to start, 0.3 s allowed
    EXPECT_NE(error_of(rc, {req("a", "")}).find("did not reply to 1 of 1 requests within 0.3 s"), std::string::npos);
  }
  o.startup_seconds = 3;
  RewardCommand rc(o);
  EXPECT_EQ(rc.score({req("a", "")})[0].reward, 1.0);
  EXPECT_EQ(rc.score({req("b", "")})[0].reward, 1.0);
  EXPECT_EQ(rc.stats().restarts, 0);
}

TEST(RlRewardCommand, GivesUpAfterMaxRestartsNamingExitStatusOrSignal) {
  TempDir dir;
  RewardCommandOptions o;
  o.working_dir = dir.path();
  o.timeout_seconds = 5;
  o.max_restarts = 2;
  const std::vector<RewardRequest> two{req("a", "1"), req("b", "2")};
  o.argv = {"sh", "-c", "echo 'cannot load model' >&2; exit 3"};
  {
    RewardCommand rc(o);
    const std::string e = error_of(rc, two);
    EXPECT_NE(e.find("exited with status 3 before replying to 2 of 2 requests (gave up after 2 restarts)"),
              std::string::npos) << e;
    EXPECT_NE(e.find("cannot load model"), std::string::npos) << e;
    // Two restarts for the batch; one more when the first child had already
    // exited before the batch reached it (found dead, started again): timing.
    EXPECT_GE(rc.stats().restarts, 2);
    EXPECT_LE(rc.stats().restarts, 3);
    EXPECT_EQ(rc.pid(), -1);
  }
  o.argv = {"false"};
  o.max_restarts = 0;
  {
    RewardCommand rc(o);
    EXPECT_NE(error_of(rc, two).find("exited with status 1 before replying to 2 of 2 requests (gave up after 0 "),
              std::string::npos);
  }
  o.argv = {"sh", "-c", "kill -9 $$"};
  {
    RewardCommand rc(o);
    EXPECT_NE(error_of(rc, two).find("killed by signal 9"), std::string::npos) << error_of(rc, two);
  }
  // Answers one of two, then waits: a hang, not a bad reply.
  o.argv = {"sh", "-c", "read x; echo '{\"id\": \"a\", \"reward\": 1}'; exec sleep 30"};
  o.timeout_seconds = 0.3;
  o.max_restarts = 1;
  {
    RewardCommand rc(o);
    const std::string e = error_of(rc, two);
    EXPECT_NE(e.find("did not reply to 1 of 2 requests within 0.3 s (gave up after 1 restart)"), std::string::npos)
        << e;
    EXPECT_EQ(rc.stats().restarts, 1);
  }
}

TEST(RlRewardCommand, DeadReaderGivesAnErrorNotSigpipe) {
  ::signal(SIGPIPE, SIG_DFL);  // a SIGPIPE would end this test binary
  TempDir dir;
  RewardCommandOptions o;
  o.argv = {"sh", "-c", "exec 0<&-; exit 0"};  // never reads its stdin
  o.working_dir = dir.path();
  o.max_restarts = 1;
  RewardCommand rc(o);
  std::vector<RewardRequest> batch;
  for (int i = 0; i < 100; ++i) batch.push_back(req(std::to_string(i), std::string(10000, 'x')));  // 1 MB
  EXPECT_NE(error_of(rc, batch).find("exited with status 0 before replying to 100 of 100"), std::string::npos);
}

struct BadCase {
  std::vector<std::string> lines;  // what the program prints for request r0
  std::string message;             // in the error
  bool names_r0;                   // the error names request r0
};

TEST(RlRewardCommand, BadRepliesFailNamingTheRequestAndQuotingTheLine) {
  const std::vector<BadCase> cases{
      {{"hello"}, "reply is not JSON", false},
      {{"[1, 2]"}, "is not a JSON object", false},
      {{R"({"reward": 1})"}, "has no \"id\"", false},
      {{R"({"id": 5, "reward": 1})"}, "\"id\" that is not a string", false},
      {{R"({"id": "nobody", "reward": 1})"}, "names id 'nobody', which is no request of this batch", false},
      {{R"({"id": "ID", "reward": 1})", R"({"id": "ID", "reward": 0})"}, "second reply", true},
      {{R"({"id": "ID"})"}, "has no \"reward\"", true},
      {{R"({"id": "ID", "reward": "1"})"}, "\"reward\" that is not a number", true},
      {{R"({"id": "ID", "reward": true})"}, "\"reward\" that is not a number", true},
      {{R"({"id": "ID", "reward": NaN})"}, "non-finite \"reward\" (NaN)", true},
      {{R"({"id": "ID", "reward": Infinity})"}, "non-finite \"reward\" (Infinity)", true},
      {{R"({"id": "ID", "reward": -Infinity, "note": "NaN"})"}, "non-finite \"reward\" (-Infinity)", true},
      {{R"({"id": "ID", "reward": 1e999})"}, "non-finite \"reward\" (1e999)", true},
      {{R"({"id": "ID", "reward": 1, "correct": "yes"})"}, "\"correct\" that is not true or false", true},
      {{R"({"id": "ID", "reward": 1, "correct": 1})"}, "\"correct\" that is not true or false", true},
  };
  // sh answers r1 well and prints the case's lines for r0 (our request lines
  // are compact JSON, so they start {"id":"r0").
  auto scripted = [](const std::vector<std::string>& lines) {
    std::string sh = "while IFS= read -r line; do case $line in '{\"id\":\"r0\"'*) printf '%s\\n'";
    for (const std::string& l : lines) sh += " '" + l + "'";
    return sh + ";; *) echo '{\"id\": \"r1\", \"reward\": 0.5}';; esac; done";
  };
  TempDir dir;
  RewardCommandOptions o;
  o.working_dir = dir.path();
  const std::vector<RewardRequest> batch{req("r0", ""), req("r1", "")};
  for (const BadCase& c : cases) {
    std::vector<std::string> lines = c.lines;
    for (std::string& l : lines)
      for (size_t at; (at = l.find("ID")) != std::string::npos;) l.replace(at, 2, "r0");
    o.argv = {"sh", "-c", scripted(lines)};
    RewardCommand rc(o);
    const std::string e = error_of(rc, batch);
    EXPECT_NE(e.find(c.message), std::string::npos) << e;
    EXPECT_NE(e.find("; the line: " + lines.back()), std::string::npos) << e;
    EXPECT_EQ(e.find("request 'r0'") != std::string::npos, c.names_r0) << e;
    EXPECT_EQ(rc.pid(), -1) << "the child should be stopped after a bad reply";
    EXPECT_EQ(rc.score({req("r1", "")})[0].reward, 0.5) << "the next score() should start it again";
  }
  // Python's own NaN, as its json.dumps writes it.
  o.argv = {"python3", "-c", R"(import sys, json
for line in sys.stdin: print(json.dumps({"id": json.loads(line)["id"], "reward": float("nan")}), flush=True))"};
  {
    RewardCommand rc(o);
    const std::string e = error_of(rc, batch);
    EXPECT_NE(e.find("request 'r0' has a non-finite \"reward\" (NaN); the line: {\"id\": \"r0\", \"reward\": NaN}"),
              std::string::npos) << e;
  }
  // Strings holding NaN are no non-finite numbers.
  o.argv = {"sh", "-c", scripted({R"({"id": "r0", "reward": 0.25, "n": "NaN -Infinity 1e999"})"})};
  {
    RewardCommand rc(o);
    EXPECT_EQ(rc.score(batch)[0].reward, 0.25);
  }
  // A long bad line is quoted in part.
  o.argv = {"sh", "-c", scripted({std::string(5000, 'q')})};
  RewardCommand rc(o);
  const std::string e = error_of(rc, batch);
  EXPECT_NE(e.find("; the line: " + std::string(200, 'q') + "... (5000 bytes)"), std::string::npos) << e;
  EXPECT_LT(e.size(), 400u);
}

TEST(RlRewardCommand, BadRepliesScoreZeroUnderErrorsZero) {
  TempDir dir;
  auto o = python(dir, "reward.py", kScripted);
  o.errors = RewardErrors::zero;
  RewardCommand rc(o);
  auto lines = [](std::vector<std::string> l) { return nlohmann::json{{"lines", l}}.dump(); };
  // Bad lines naming their request: scored 0 each, the child stays.
  const pid_t pid = rc.pid();
  auto r = rc.score({req("a", "", "", lines({R"({"id": "ID", "reward": 0.5})"})),
                     req("b", "", "", lines({R"({"id": "ID", "reward": NaN})"})),
                     req("c", "", "", lines({R"({"id": "ID", "reward": 1, "correct": "y"})"}))});
  EXPECT_EQ(r[0].reward, 0.5);
  EXPECT_FALSE(r[0].errored);
  EXPECT_TRUE(r[1].errored && r[1].reward == 0.0);
  EXPECT_TRUE(r[2].errored && r[2].reward == 0.0);
  EXPECT_EQ(rc.stats().bad_replies, 2);
  EXPECT_EQ(rc.pid(), pid);
  // A line that names no request: once as many lines as requests are in, the
  // unanswered request scores 0, and the child is restarted for the next batch.
  r = rc.score({req("a", "", "", lines({R"({"id": "ID", "reward": 0.5})"})), req("b", "", "", lines({"oops"})),
                req("c", "", "", lines({R"({"id": "ID", "reward": 0.75})"}))});
  EXPECT_EQ(r[0].reward, 0.5);
  EXPECT_TRUE(r[1].errored && r[1].reward == 0.0);
  EXPECT_EQ(r[2].reward, 0.75);
  EXPECT_EQ(rc.stats().bad_replies, 3);
  EXPECT_EQ(rc.pid(), -1);
  // An id answered twice: that request is 0, the other (never answered) too.
  r = rc.score({req("a", "", "", lines({R"({"id": "ID", "reward": 0.5})", R"({"id": "ID", "reward": 0.5})"})),
                req("b", "", "", lines({}))});
  EXPECT_TRUE(r[0].errored && r[0].reward == 0.0);
  EXPECT_TRUE(r[1].errored && r[1].reward == 0.0);
  EXPECT_EQ(rc.stats().bad_replies, 4);
  EXPECT_EQ(rc.stats().restarts, 1);
  // Too few replies and then waiting is still a hang, not a bad reply.
  o.timeout_seconds = 0.3;
  o.max_restarts = 0;
  RewardCommand waits(o);
  const std::string e = error_of(waits, {req("a", "", "", lines({})), req("b", "", "", lines({}))});
  EXPECT_NE(e.find("did not reply to 2 of 2 requests within 0.3 s"), std::string::npos) << e;
}

TEST(RlRewardCommand, StderrIsDrainedLineByLine) {
  TempDir dir;
  // 300 KB of stderr per request before its reply: a child left blocked on a
  // full stderr pipe would hang the batch.
  auto o = python(dir, "reward.py", R"(import sys, json
for line in sys.stdin:
    r = json.loads(line)
    for k in range(3000):
        print("req %s line %d %s" % (r["id"], k, "." * 80), file=sys.stderr)
    print(json.dumps({"id": r["id"], "reward": 1}), flush=True)
print("exiting", file=sys.stderr)
)");
  std::vector<std::string> log;
  o.on_stderr = [&](const std::string& line) { log.push_back(line); };
  {
    RewardCommand rc(o);
    const auto r = rc.score({req("a", ""), req("b", "")});
    EXPECT_EQ(r[1].reward, 1.0);
    ASSERT_EQ(log.size(), 6000u);
    EXPECT_EQ(log[0], "req a line 0 " + std::string(80, '.'));
    EXPECT_EQ(log[5999], "req b line 2999 " + std::string(80, '.'));
  }
  EXPECT_EQ(log.back(), "exiting");  // what it says while exiting, on destruction
}

TEST(RlRewardCommand, LargeBatchDoesNotDeadlock) {
  TempDir dir;
  RewardCommand rc(python(dir, "reward.py", R"(import sys, json
for line in sys.stdin:
    r = json.loads(line)
    print(json.dumps({"id": r["id"], "reward": len(r["completion"])}), flush=True)
)"));
  std::vector<RewardRequest> batch;
  for (int i = 0; i < 2000; ++i)
    batch.push_back(req("req-" + std::to_string(i), std::string(1000 + static_cast<size_t>(i % 7), 'a' + i % 26)));
  for (int round = 0; round < 2; ++round) {
    const auto r = rc.score(batch);
    ASSERT_EQ(r.size(), batch.size());
    for (size_t i = 0; i < batch.size(); ++i) ASSERT_EQ(r[i].reward, 1000.0 + static_cast<double>(i % 7)) << i;
  }
  EXPECT_EQ(rc.stats().requests, 4000);
}

TEST(RlRewardCommand, DestructorReapsTheChild) {
  TempDir dir;
  pid_t polite, stubborn;
  {
    RewardCommand rc(python(dir, "reward.py", kExact));  // exits at EOF
    rc.score({req("a", "1", "1")});
    polite = rc.pid();
  }
  EXPECT_TRUE(gone(polite));
  RewardCommandOptions o;
  o.argv = {"sleep", "30"};  // ignores EOF on stdin: SIGKILLed after the grace
  {
    RewardCommand rc(o);
    stubborn = rc.pid();
    EXPECT_GT(stubborn, 0);
  }
  EXPECT_TRUE(gone(stubborn));
  o.timeout_seconds = 0;
  EXPECT_THROW(RewardCommand{o}, std::invalid_argument);
}
