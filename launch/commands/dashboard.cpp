// `troupe dashboard RUN_DIR... [--port N]`: a read-only web page on
// 127.0.0.1 that follows runs live (launch/observe/web/dashboard.js polls the /api
// routes below). cpp-httplib (Debian's libcpp-httplib-dev) is the server;
// this is the only file that includes it. SIGINT/SIGTERM/SIGHUP/SIGQUIT stop it
// cleanly. It answers only requests whose Host is a loopback name of its port
// and serves from disk only files inside the run directories.
#include <httplib.h>
#include <signal.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <string>
#include <thread>

#include "launch/cli.hpp"
#include "launch/observe/progress.hpp"
#include "launch/observe/run_dir.hpp"
#include "launch/observe/web_page.hpp"
#include "launch/signals.hpp"

namespace troupe::launch {

namespace {

constexpr const char* kHost = "127.0.0.1";  // loopback only, always

int g_stop_pipe[2] = {-1, -1};
extern "C" void on_stop_signal(int sig) {
  const unsigned char s = static_cast<unsigned char>(sig);
  (void)!write(g_stop_pipe[1], &s, 1);  // async-signal-safe
}

constexpr size_t kWorkers = 64;
constexpr int kBacklog = 512;

// The Host header of a request to this server: a loopback name and our port.
bool host_allowed(const std::string& host, int port) {
  const std::string p = ":" + std::to_string(port);
  for (const char* name : {"127.0.0.1", "localhost", "[::1]"})
    if (host == name + p) return true;
  return false;
}

// The run a request names (?run=K), or -1.
int run_index(const httplib::Request& req, size_t runs) {
  if (!req.has_param("run")) return -1;
  try {
    size_t used = 0;
    const std::string v = req.get_param_value("run");
    const long i = std::stol(v, &used);
    return used == v.size() && i >= 0 && static_cast<size_t>(i) < runs ? static_cast<int>(i) : -1;
  } catch (const std::exception&) {
    return -1;
  }
}

uint64_t offset_param(const httplib::Request& req) {
  try {
    return req.has_param("from") ? std::stoull(req.get_param_value("from")) : 0;
  } catch (const std::exception&) {
    return 0;
  }
}

// Identifies a version of the trace file: changes when it is rewritten.
std::string file_key(const std::string& path) {
  std::error_code ec;
  const auto size = std::filesystem::file_size(path, ec);
  if (ec) return "";
  const auto mtime = std::filesystem::last_write_time(path, ec).time_since_epoch().count();
  return std::to_string(size) + "-" + std::to_string(mtime);
}

void routes(httplib::Server& svr, const std::vector<RunDir>& runs, const std::string& page) {
  svr.Get("/", [&page](const httplib::Request&, httplib::Response& res) {
    res.set_content(page, "text/html; charset=utf-8");
  });
  svr.Get("/api/runs", [&runs](const httplib::Request&, httplib::Response& res) {
    std::string out = "[";
    for (size_t i = 0; i < runs.size(); ++i)
      out += std::string(i ? "," : "") + JsonObject().add("id", static_cast<int64_t>(i)).add("name", runs[i].name)
                                             .add("dir", runs[i].path).str();
    res.set_content(out + "]", "application/json");
  });
  svr.Get("/api/metrics", [&runs](const httplib::Request& req, httplib::Response& res) {
    const int i = run_index(req, runs.size());
    if (i < 0) return void(res.status = 404);
    const MetricsChunk c = read_metrics(runs[static_cast<size_t>(i)], offset_param(req));
    if (c.gone) {
      res.status = 410;
      res.set_content(runs[static_cast<size_t>(i)].path + " no longer exists", "text/plain");
      return;
    }
    res.set_header("X-Next-Offset", std::to_string(c.next));
    if (c.reset) res.set_header("X-Reset", "1");
    res.set_content(c.text, "application/x-ndjson");
  });
  svr.Get("/api/log", [&runs](const httplib::Request& req, httplib::Response& res) {
    const int i = run_index(req, runs.size());
    if (i < 0) return void(res.status = 404);
    const auto tail = read_log_tail(runs[static_cast<size_t>(i)], 64u << 10);
    if (!tail) return void(res.status = 404);
    res.set_content(*tail, "text/plain; charset=utf-8");
  });
  // The latest groups of rollouts.jsonl (log.rollouts), complete lines.
  svr.Get("/api/rollouts", [&runs](const httplib::Request& req, httplib::Response& res) {
    const int i = run_index(req, runs.size());
    if (i < 0) return void(res.status = 404);
    const auto tail = read_rollouts_tail(runs[static_cast<size_t>(i)], 256u << 10);
    if (!tail) return void(res.status = 404);
    res.set_content(*tail, "application/x-ndjson");
  });
  svr.Get("/api/trace", [&runs](const httplib::Request& req, httplib::Response& res) {
    const int i = run_index(req, runs.size());
    if (i < 0) return void(res.status = 404);
    const std::string path = trace_path(runs[static_cast<size_t>(i)]);
    // (Only ever a regular file inside the run directory: trace_path checks.)
    const std::string key = path.empty() ? "" : file_key(path);
    if (key.empty()) return void(res.status = 404);
    if (req.has_param("key") && req.get_param_value("key") == key) return void(res.status = 204);
    const auto text = read_whole_file(path, 64u << 20);
    if (!text) return void(res.status = 404);
    res.set_header("X-Trace-Key", key);
    res.set_content(*text, "application/json");
  });
  // The chart libraries, from Debian's packages (read-only static files).
  svr.set_mount_point("/js/dygraphs", std::string(kJsRoot) + "/dygraphs");
  svr.set_mount_point("/js/d3", std::string(kJsRoot) + "/d3");
  svr.set_post_routing_handler([](const httplib::Request&, httplib::Response& res) {
    res.set_header("Cache-Control", "no-store");
  });
}

}  // namespace

int command_dashboard(const CliOptions& opt) {
  if (opt.positional.empty()) {
    std::fprintf(stderr, "troupe: dashboard needs at least one RUN_DIR\nRun 'troupe --help' for usage.\n");
    return kExitUsage;
  }
  std::vector<RunDir> runs;
  try {
    runs = open_run_dirs(opt.positional);
  } catch (const RunDirError& e) {
    std::fprintf(stderr, "troupe: dashboard: %s\n", e.what());
    return kExitBadInput;
  }
  for (const char* lib : {"dygraphs/dygraph.min.js", "d3/d3.min.js"})
    if (!std::filesystem::exists(std::string(kJsRoot) + "/" + lib)) {
      std::fprintf(stderr, "troupe: dashboard: %s/%s not found: install libjs-dygraphs and libjs-d3 (./setup.sh does)\n",
                   kJsRoot, lib);
      return kExitRuntime;
    }
  const std::string page = live_page();

  // SIGINT/SIGTERM: the handler (run on whichever thread gets the signal;
  // OpenBLAS's threads exist already) writes the signal to a pipe, and a
  // waiter thread stops the server.
  if (pipe(g_stop_pipe) != 0) {
    std::perror("troupe: dashboard: pipe");
    return kExitRuntime;
  }
  struct sigaction sa {};
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  for (int sig : {SIGINT, SIGTERM, SIGHUP, SIGQUIT}) sigaction(sig, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);

  httplib::Server svr;
  // A half-open connection gives up its worker after 2 s without a request
  // byte, and 64 workers serve at once: 50 stalled clients leave room for
  // the page. (httplib 0.11's keep-alive timeout, when set, also drops fresh
  // connections early; its default, 5 s, is kept.)
  svr.set_read_timeout(2, 0);
  svr.set_write_timeout(5, 0);
  svr.new_task_queue = [] { return new httplib::ThreadPool(kWorkers); };
  // No SO_REUSEPORT (httplib's default): a port another server holds is an error, not shared.
  socket_t listening = INVALID_SOCKET;
  svr.set_socket_options([&listening](socket_t sock) {
    int yes = 1;
    setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof yes);
    listening = sock;
  });
  routes(svr, runs, page);
  int port = opt.port;
  // DNS rebinding: a page from another origin that resolves its own name to
  // 127.0.0.1 sends its own Host; only the loopback names of this port pass.
  svr.set_pre_routing_handler([&port](const httplib::Request& req, httplib::Response& res) {
    if (host_allowed(req.get_header_value("Host"), port)) return httplib::Server::HandlerResponse::Unhandled;
    res.status = 403;
    res.set_content("troupe dashboard: Host must be 127.0.0.1:" + std::to_string(port) + ", localhost:" +
                        std::to_string(port) + " or [::1]:" + std::to_string(port) + "\n",
                    "text/plain");
    return httplib::Server::HandlerResponse::Handled;
  });
  if (port > 0) {
    if (!svr.bind_to_port(kHost, port)) {
      std::fprintf(stderr, "troupe: dashboard: cannot listen on %s:%d (port in use?); pick another with --port\n", kHost,
                   port);
      return kExitRuntime;
    }
  } else {
    port = svr.bind_to_any_port(kHost);
    if (port <= 0) {
      std::fprintf(stderr, "troupe: dashboard: cannot listen on %s\n", kHost);
      return kExitRuntime;
    }
  }
  // httplib listens with a backlog of 5: a burst of connections (50 stalled
  // clients) overflows it and the kernel drops some. A second listen() on
  // the bound socket raises the backlog.
  if (listening != INVALID_SOCKET) ::listen(listening, kBacklog);
  std::printf("troupe dashboard: following %zu run(s) at http://%s:%d/ (read-only; Ctrl-C stops)\n", runs.size(), kHost,
              port);
  for (const auto& r : runs) std::printf("  %s  %s\n", r.name.c_str(), r.path.c_str());
  std::fflush(stdout);

  std::atomic<int> caught{0};
  std::thread waiter([&] {
    unsigned char sig = 0;
    while (read(g_stop_pipe[0], &sig, 1) < 0 && errno == EINTR) {
    }
    caught = sig;
    if (sig == 0) return;  // released below: the server ended on its own
    // A signal just before listening starts: wait until it runs, then stop it.
    for (int k = 0; k < 300 && !svr.is_running(); ++k) std::this_thread::sleep_for(std::chrono::milliseconds(10));
    svr.stop();
  });
  const bool ok = svr.listen_after_bind();
  if (!caught) {
    const unsigned char zero = 0;
    (void)!write(g_stop_pipe[1], &zero, 1);
  }
  waiter.join();
  if (caught) {
    std::printf("troupe dashboard: stopped (%s)\n", signal_name(caught));
    return kExitOk;
  }
  std::fprintf(stderr, "troupe: dashboard: the server stopped unexpectedly\n");
  return ok ? kExitOk : kExitRuntime;
}

}  // namespace troupe::launch
