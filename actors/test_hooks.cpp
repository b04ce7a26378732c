// The process-wide slot of the installed test hooks (test_hooks.hpp).
#include "actors/test_hooks.hpp"

#include <mutex>
#include <utility>

namespace troupe::runtime {
namespace {
std::mutex mu;
std::shared_ptr<const TestHooks> installed;
}  // namespace

std::shared_ptr<const TestHooks> current_test_hooks() {
  std::lock_guard<std::mutex> lock(mu);
  return installed;
}

ScopedTestHooks::ScopedTestHooks(TestHooks hooks) {
  std::lock_guard<std::mutex> lock(mu);
  previous_ = std::exchange(installed, std::make_shared<const TestHooks>(std::move(hooks)));
}

ScopedTestHooks::~ScopedTestHooks() {
  std::lock_guard<std::mutex> lock(mu);
  installed = std::move(previous_);
}

}  // namespace troupe::runtime
