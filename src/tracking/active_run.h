// The runs the caller has open (sgpu::tracking::Run scopes), innermost last. A call
// started while one is open becomes its child (tag mlflow.parentRunId). Process-wide,
// so calls from any thread nest under the caller's sweep.
#pragma once

#include <memory>
#include <optional>
#include <string>

namespace sgpu::tracking {

class RunLogger;

struct ActiveRun {
  std::string uri;
  std::string experiment_id;
  std::string run_id;
  std::shared_ptr<RunLogger> logger;  // what the caller logs to this run goes here
};

void push_active_run(ActiveRun run);
void pop_active_run(const std::string& run_id);
std::optional<ActiveRun> innermost_active_run();

}  // namespace sgpu::tracking
