#include "tracking/active_run.h"

#include <algorithm>
#include <mutex>
#include <vector>

namespace sgpu::tracking {
namespace {

std::mutex& runs_mutex() {
  static std::mutex mutex;
  return mutex;
}
std::vector<ActiveRun>& runs() {
  static std::vector<ActiveRun> stack;
  return stack;
}

}  // namespace

void push_active_run(ActiveRun run) {
  std::lock_guard lock(runs_mutex());
  runs().push_back(std::move(run));
}

void pop_active_run(const std::string& run_id) {
  std::lock_guard lock(runs_mutex());
  auto& stack = runs();
  stack.erase(std::remove_if(stack.begin(), stack.end(),
                             [&](const ActiveRun& r) { return r.run_id == run_id; }),
              stack.end());
}

std::optional<ActiveRun> innermost_active_run() {
  std::lock_guard lock(runs_mutex());
  if (runs().empty()) return std::nullopt;
  return runs().back();
}

}  // namespace sgpu::tracking
