// The `troupe` command line: argument parsing, dispatch and exit codes.
#pragma once

#include <string>
#include <vector>

#include "launch/spec/spec.hpp"

namespace troupe::launch {

// Exit codes (documented in `troupe --help`).
enum ExitCode : int {
  kExitOk = 0,
  kExitRuntime = 1,     // the run failed (backend error, I/O failure, divergence)
  kExitUsage = 2,       // bad command line
  kExitBadSpec = 3,     // the spec is invalid (every problem is printed)
  kExitBadInput = 4,    // a checkpoint or input file is missing or corrupt
  kExitInterrupted = 130,
};

struct CliOptions {
  std::string command;              // run, validate, keys, eval, sample, export, import
  std::vector<std::string> positional;
  std::vector<Override> overrides;  // --set section.key=value
  std::string log_level;            // --log-level (overrides [log] level)
  std::string checkpoint;           // --checkpoint DIR
  std::string prompt;               // sample: --prompt TEXT
  int64_t max_new_tokens = 32;      // sample: --max-new-tokens N
  double temperature = 0.0;         // sample: --temperature T (0 = greedy)
  double top_p = 1.0;               // sample: --top-p P
  std::string format;               // export: --format safetensors
  std::string file;                 // export: --output FILE, import: --input FILE
  int port = 0;                     // dashboard: --port N (0: any free port)
  bool out_given = false;           // calibrate: --out FILE (in `file`)
  int64_t repeat = 0;               // calibrate: --repeat N timed steps (0: the default)
  std::string cost_model;           // calibrate: --model flops|measured ("": measured unless flops fits)
  int64_t np = 0;                   // launch: -np N processes (0: the spec's topology.processes)
};

int run_cli(int argc, char** argv);

// The checkpoints a spec reads ([rl] init, [checkpoint] resume): each loads,
// and a resumed run has steps left. Prints the problem and returns
// kExitBadInput (missing or damaged) or kExitBadSpec (nothing to train);
// kExitOk otherwise. `validate` and `run` both call it.
int check_input_checkpoints(const Spec& spec);

// Command implementations (launch/commands_*.cpp). Each returns an ExitCode.
int command_validate(const CliOptions& options, const Spec& spec);
int command_run(const CliOptions& options, const Spec& spec);
// `troupe launch`: mpirun with the right flags, signals forwarded to process
// 0, process 0's status returned (commands/launch.cpp). `self` is this
// executable's path.
int command_launch(const CliOptions& options, const Spec& spec, const char* self);
// Under `troupe launch`, process 0 reports its pid when it starts and its
// exit status when it ends (no-ops otherwise).
void launch_report_start();
void launch_report_exit(int status);
int command_eval(const CliOptions& options, const Spec& spec);
int command_sample(const CliOptions& options, const Spec& spec);
int command_export(const CliOptions& options, const Spec& spec);
int command_import(const CliOptions& options, const Spec& spec);
int command_calibrate(const CliOptions& options, const Spec& spec);  // launch/commands/calibrate.cpp
// Seeing runs (no spec): the positional arguments are run directories.
int command_dashboard(const CliOptions& options);  // launch/commands/dashboard.cpp
int command_report(const CliOptions& options);     // launch/commands/report.cpp
int command_plot(const CliOptions& options);       // launch/commands/report.cpp
// `troupe tokenizer train|show ...`: its own arguments (launch/commands/tokenizer.cpp).
int command_tokenizer(const std::vector<std::string>& args);

}  // namespace troupe::launch
