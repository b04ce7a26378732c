// The `troupe` executable with the test hooks (actors/test_hooks.hpp) a
// shell test asks for, for the cases no spec may inject: TROUPE_TEST_FAULT
// = "kill:P:S" makes process P SIGKILL itself as step S starts, "hang:P:S"
// SIGSTOP itself (a hung process 0, or a loss under process_loss = "fail").
// Everything else is the real CLI. Only tests read this variable.
#include <cstdio>
#include <cstdlib>
#include <string>

#include "actors/test_hooks.hpp"
#include "kernels/blas_core.hpp"
#include "launch/cli.hpp"

namespace {
troupe::runtime::ProcessFault fault_from_env() {
  troupe::runtime::ProcessFault f;
  const char* env = std::getenv("TROUPE_TEST_FAULT");
  if (!env || !*env) return f;
  const std::string s(env);
  const auto a = s.find(':');
  const auto b = a == std::string::npos ? a : s.find(':', a + 1);
  try {
    if (b == std::string::npos) throw std::invalid_argument(s);
    f.kind = s.substr(0, a);
    f.process = std::stoi(s.substr(a + 1, b - a - 1));
    f.step = std::stoll(s.substr(b + 1));
  } catch (const std::exception&) {
    f.kind.clear();
  }
  if (f.kind != "kill" && f.kind != "hang") {
    std::fprintf(stderr, "troupe_with_hooks: TROUPE_TEST_FAULT=%s: expected kill:PROCESS:STEP or hang:PROCESS:STEP\n", env);
    std::exit(2);
  }
  return f;
}
}  // namespace

int main(int argc, char** argv) {
  troupe::kernels::configure_openblas(argv);
  troupe::runtime::TestHooks hooks;
  hooks.process_fault = fault_from_env();
  troupe::runtime::ScopedTestHooks installed(hooks);
  return troupe::launch::run_cli(argc, argv);
}
