// Argument parsing and dispatch for the `troupe` CLI. Commands that take a
// spec load it here (the built-in default when none is given), so every
// command reports spec problems the same way.
#include "launch/cli.hpp"

#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <spdlog/spdlog.h>

#include "actors/cluster/cluster_tls.hpp"
#include "kernels/blas_core.hpp"
#include "launch/spec/spec.hpp"

#ifndef TROUPE_VERSION
#define TROUPE_VERSION "0.0.0"
#endif

namespace troupe::launch {

static const char* kHelp = R"(troupe — actor-model asynchronous training for Mixture-of-Experts models and online RL

usage:
  troupe run [SPEC] [options]       train as the spec says (the built-in default spec when SPEC is omitted)
  troupe validate [SPEC] [options]  check a spec and print the resolved topology (every actor, its device and process)
  troupe eval [SPEC] --checkpoint DIR
                                    validation loss and task accuracy of a checkpoint
  troupe sample [SPEC] --checkpoint DIR --prompt TEXT [--max-new-tokens N] [--temperature T] [--top-p P]
                                    generate from a checkpoint (greedy when T = 0)
  troupe export [SPEC] --checkpoint DIR --format safetensors --output FILE
                                    write the checkpoint's parameters as safetensors
  troupe import [SPEC] --checkpoint DIR --input FILE
                                    make a fresh checkpoint from safetensors weights
  troupe calibrate SPEC [--out FILE] [--repeat N] [--model flops|measured]
                                    time the spec's per-stage ops on this machine (the real runtime: alone, then
                                    with the spec's devices busy) and print (and write) the [sim] table that makes
                                    its sim predict it; an RL spec: the synchronous loop on one device, then
                                    data-parallel, then a fixed_lag trainer, for the RL sim's rl_* costs
  troupe launch [-np N] [SPEC] [options]
                                    a multi-process run on this host: mpirun with the flags troupe needs, Ctrl-C /
                                    SIGTERM / SIGHUP forwarded to process 0 (it stops after its step with a
                                    checkpoint), and process 0's exit status returned (0, 130, 1, 3, 4)
  troupe keygen DIR                 write a cluster key for [topology] auth_dir (DIR/cluster.pem, DIR/cluster.key;
                                    copy DIR to every host of a multi-host run)
  troupe keys                       print every spec key (Markdown table: key, type, default, meaning)
  troupe tokenizer train --input FILE... --vocab-size N --output FILE.model [--model-type bpe|unigram]
                                    train a SentencePiece tokenizer (deterministic; written atomically);
                                    `troupe tokenizer show FILE.model` says what a model file is
  troupe dashboard RUN_DIR... [--port N]
                                    serve a read-only page on 127.0.0.1 that follows the runs live (loss, evals,
                                    RL, expert load, pipeline timeline, actor tree, log); the port is printed
  troupe report RUN_DIR... --output FILE.html
                                    the same page as one self-contained file (libraries and data inlined)
  troupe plot RUN_DIR... --output FILE.png|FILE.svg
                                    the charts as an image (gnuplot)
  troupe --help | --version

options:
  --set SECTION.KEY=VALUE   override a spec key (repeatable), e.g. --set run.steps=20
  --log-level LEVEL         trace, debug, info, warn, error, off (overrides [log] level)
  --port N                  dashboard: the port on 127.0.0.1 (default: a free port, printed)
  --out FILE                calibrate: also write the [sim] table to FILE (temporary file + rename)
  --repeat N                calibrate: timed rounds after 2 warm-up rounds (default 8; medians are taken;
                            an RL spec: timed steps per phase)
  --model M                 calibrate: the cost model to write, "flops" or "measured" (default: measured
                            unless the flops fit is within 5% on every op)

environment:
  OPENBLAS_CORETYPE         OpenBLAS's kernel family; unset, troupe chooses it: the portable one (Haswell: the
                            same bits on every x86-64 CPU with AVX2 and FMA), or the CPU's fastest with
                            --set topology.host_kernels='"native"'. A value you set is kept and named in the log.

exit codes:
  0    success
  1    the run failed (backend error, I/O failure, training diverged)
  2    bad command line
  3    invalid spec (every problem is printed as file:line:col: error: ...)
  4    a checkpoint or input file is missing or corrupt
  130  interrupted (SIGINT/SIGTERM/SIGHUP/SIGQUIT: run stops after the running step and saves a checkpoint to resume from)
)";

static int usage_error(const std::string& message) {
  std::fprintf(stderr, "troupe: %s\nRun 'troupe --help' for usage.\n", message.c_str());
  return kExitUsage;
}

int run_cli(int argc, char** argv) {
  CliOptions opt;
  std::vector<std::string> args(argv + 1, argv + argc);
  if (args.empty()) {
    std::fputs(kHelp, stdout);
    return kExitUsage;
  }
  if (args[0] == "tokenizer") return command_tokenizer(std::vector<std::string>(args.begin() + 1, args.end()));
  for (size_t i = 0; i < args.size(); ++i) {
    const std::string& a = args[i];
    auto value = [&](const char* flag) -> const std::string* {
      if (i + 1 >= args.size()) return nullptr;
      (void)flag;
      return &args[++i];
    };
    auto need = [&](const char* flag, std::string& dst) {
      const std::string* v = value(flag);
      if (!v) return false;
      dst = *v;
      return true;
    };
    if (a == "-h" || a == "--help" || a == "help") {
      std::fputs(kHelp, stdout);
      return kExitOk;
    }
    if (a == "--version" || a == "-V") {
      std::printf("troupe %s\nOpenBLAS kernels: %s\n", TROUPE_VERSION,
                  kernels::describe_host_kernels(kernels::HostKernels::portable).c_str());
      return kExitOk;
    }
    std::string tmp;
    if (a == "--set") {
      if (!need("--set", tmp)) return usage_error("--set needs SECTION.KEY=VALUE");
      const auto eq = tmp.find('=');
      if (eq == std::string::npos) return usage_error("--set " + tmp + ": expected SECTION.KEY=VALUE");
      opt.overrides.push_back({tmp.substr(0, eq), tmp.substr(eq + 1)});
    } else if (a == "--log-level") {
      if (!need(a.c_str(), opt.log_level)) return usage_error("--log-level needs a level");
      if (spdlog::level::from_str(opt.log_level) == spdlog::level::off && opt.log_level != "off")
        return usage_error("--log-level " + opt.log_level + ": expected trace, debug, info, warn, error or off");
    } else if (a == "--checkpoint") {
      if (!need(a.c_str(), opt.checkpoint)) return usage_error("--checkpoint needs a directory");
    } else if (a == "--prompt") {
      if (!need(a.c_str(), opt.prompt)) return usage_error("--prompt needs text");
    } else if (a == "--format") {
      if (!need(a.c_str(), opt.format)) return usage_error("--format needs a format");
    } else if (a == "--out") {
      if (!need(a.c_str(), opt.file)) return usage_error("--out needs a path");
      opt.out_given = true;
    } else if (a == "--model") {
      if (!need(a.c_str(), opt.cost_model)) return usage_error("--model needs flops or measured");
      if (opt.cost_model != "flops" && opt.cost_model != "measured")
        return usage_error("--model " + opt.cost_model + ": expected flops or measured");
    } else if (a == "--repeat") {
      if (!need(a.c_str(), tmp)) return usage_error("--repeat needs a number");
      size_t used = 0;
      long long n = -1;
      try {
        n = std::stoll(tmp, &used);
      } catch (const std::exception&) {
      }
      if (used != tmp.size() || n < 1 || n > 1000) return usage_error("--repeat " + tmp + ": expected 1..1000");
      opt.repeat = n;
    } else if (a == "-np" || a == "--np") {
      if (!need(a.c_str(), tmp)) return usage_error(a + " needs a number of processes");
      size_t used = 0;
      long long n = -1;
      try {
        n = std::stoll(tmp, &used);
      } catch (const std::exception&) {
      }
      if (used != tmp.size() || n < 1 || n > 4096) return usage_error(a + " " + tmp + ": expected 1..4096");
      opt.np = n;
    } else if (a == "--output" || a == "--input") {
      if (!need(a.c_str(), opt.file)) return usage_error(a + " needs a path");
    } else if (a == "--port") {
      if (!need(a.c_str(), tmp)) return usage_error("--port needs a number");
      size_t used = 0;
      long port = -1;
      try {
        port = std::stol(tmp, &used);
      } catch (const std::exception&) {
      }
      if (used != tmp.size() || port < 1 || port > 65535) return usage_error("--port " + tmp + ": expected 1..65535");
      opt.port = static_cast<int>(port);
    } else if (a == "--max-new-tokens" || a == "--temperature" || a == "--top-p") {
      if (!need(a.c_str(), tmp)) return usage_error(a + " needs a number");
      try {
        size_t used = 0;
        if (a == "--max-new-tokens") opt.max_new_tokens = std::stoll(tmp, &used);
        else if (a == "--temperature") opt.temperature = std::stod(tmp, &used);
        else opt.top_p = std::stod(tmp, &used);
        if (used != tmp.size()) throw std::invalid_argument(tmp);
      } catch (const std::exception&) {
        return usage_error(a + " " + tmp + ": not a number");
      }
      // stod reads "nan" and "inf": a sampling setting must be a finite number in range.
      if (a == "--temperature" && !(std::isfinite(opt.temperature) && opt.temperature >= 0))
        return usage_error("--temperature " + tmp + ": must be a finite number >= 0 (0 = greedy)");
      if (a == "--top-p" && !(std::isfinite(opt.top_p) && opt.top_p > 0 && opt.top_p <= 1))
        return usage_error("--top-p " + tmp + ": must be in (0, 1]");
      if (a == "--max-new-tokens" && opt.max_new_tokens < 1)
        return usage_error("--max-new-tokens " + tmp + ": must be >= 1");
    } else if (a.size() > 1 && a[0] == '-') {
      return usage_error("unknown option " + a);
    } else if (opt.command.empty()) {
      opt.command = a;
    } else {
      opt.positional.push_back(a);
    }
  }

  static const char* kCommands[] = {"run", "validate", "eval", "sample", "export", "import", "keys",
                                    "keygen", "dashboard", "report", "plot", "calibrate", "launch"};
  bool known = false;
  for (const char* c : kCommands) known = known || opt.command == c;
  if (!known) return usage_error("unknown command '" + opt.command + "'");
  if (opt.command == "keys") {
    std::fputs(spec_keys_markdown().c_str(), stdout);
    return kExitOk;
  }
  if (opt.command == "keygen") {
    if (opt.positional.size() != 1) return usage_error("keygen needs one DIR (where cluster.pem and cluster.key go)");
    try {
      runtime::write_cluster_identity(opt.positional[0], runtime::make_cluster_identity());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "troupe keygen: %s\n", e.what());
      return kExitBadInput;
    }
    std::printf("wrote %s/%s and %s/%s (owner-only); set [topology] auth_dir = \"%s\" and copy the directory to every host\n",
                opt.positional[0].c_str(), runtime::kClusterCertFile, opt.positional[0].c_str(), runtime::kClusterKeyFile,
                opt.positional[0].c_str());
    return kExitOk;
  }
  if (opt.port != 0 && opt.command != "dashboard") return usage_error("--port is an option of dashboard only");
  if ((opt.out_given || opt.repeat != 0 || !opt.cost_model.empty()) && opt.command != "calibrate")
    return usage_error("--out, --repeat and --model are options of calibrate only");
  // Seeing runs: RUN_DIR arguments, no spec.
  if (opt.command == "dashboard") return command_dashboard(opt);
  if (opt.command == "report") return command_report(opt);
  if (opt.command == "plot") return command_plot(opt);
  if (opt.positional.size() > 1) return usage_error("expected at most one SPEC, got " + std::to_string(opt.positional.size()));
  if (opt.command == "validate" && opt.positional.empty() && opt.overrides.empty())
    return usage_error("validate needs a SPEC file");
  if (opt.command == "calibrate" && opt.positional.empty()) return usage_error("calibrate needs a SPEC file");

  Spec spec;
  try {
    spec = opt.positional.empty() ? load_default_spec(opt.overrides)
                                  : load_spec_file(opt.positional[0], opt.overrides);
  } catch (const SpecError& e) {
    for (const auto& d : e.diagnostics()) std::fprintf(stderr, "%s\n", d.str().c_str());
    std::fprintf(stderr, "troupe: %zu problem(s) in the spec; nothing was run\n", e.diagnostics().size());
    return kExitBadSpec;
  }
  // OpenBLAS's kernel family is fixed as the library loads: a spec that asks
  // for another than the one loaded runs this command again (nothing has been
  // done yet; mpirun's processes each do the same, before MPI starts).
  kernels::select_host_kernels(spec.topology.host_kernels, argv);
  for (const auto& w : spec.warnings) std::fprintf(stderr, "%s\n", w.str().c_str());
  if (!opt.log_level.empty()) spec.log.level = opt.log_level;
  spdlog::set_level(spdlog::level::from_str(spec.log.level));

  if (opt.command == "validate") return command_validate(opt, spec);
  if (opt.command == "run") {
    launch_report_start();
    const int rc = command_run(opt, spec);
    launch_report_exit(rc);
    return rc;
  }
  if (opt.command == "launch") {
    char self[4096] = {};
    const ssize_t n = ::readlink("/proc/self/exe", self, sizeof self - 1);
    return command_launch(opt, spec, n > 0 ? self : argv[0]);
  }
  if (opt.command == "eval") return command_eval(opt, spec);
  if (opt.command == "sample") return command_sample(opt, spec);
  if (opt.command == "export") return command_export(opt, spec);
  if (opt.command == "calibrate") return command_calibrate(opt, spec);
  return command_import(opt, spec);
}

}  // namespace troupe::launch
