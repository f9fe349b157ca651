#include "sgpu/tracking.h"

#include <exception>
#include <iostream>

#include "contract/rank_env.h"
#include "sgpu/runtime.h"
#include "tracking/active_run.h"
#include "tracking/call_run.h"
#include "tracking/rank_logger.h"
#include "tracking/run_logger.h"

namespace sgpu {
namespace {

// The logger this process's logging calls go to: the rank's, or the caller's innermost
// Run's; nullptr when there is none (then logging does nothing).
std::shared_ptr<tracking::RunLogger> current_logger() {
  // A rank, or a program's rank (sgpu run), which has no role left (its supervisor
  // drops it) but has the call's run in its environment.
  static const bool in_a_rank = is_rank() || !contract::env_string(tracking::kRankRunIdVar).empty();
  if (in_a_rank) {
    // The rank's logger is made once and lives until the process ends; the shared_ptr,
    // made once too, does not own it.
    static const std::shared_ptr<tracking::RunLogger> rank = [] {
      tracking::RunLogger* logger = tracking::rank_logger();
      return logger != nullptr ? std::shared_ptr<tracking::RunLogger>(logger, [](auto*) {})
                               : nullptr;
    }();
    return rank;
  }
  const auto scope = tracking::innermost_active_run();
  return scope ? scope->logger : nullptr;
}

}  // namespace

void log_metric(std::string_view key, double value, std::int64_t step) {
  if (auto logger = current_logger()) logger->log_metric(key, value, step);
}

void log_metrics(const std::map<std::string, double>& metrics, std::int64_t step) {
  if (auto logger = current_logger()) logger->log_metrics(metrics, step);
}

void log_param(std::string_view key, std::string_view value) {
  if (auto logger = current_logger()) logger->log_param(key, value);
}

void set_tag(std::string_view key, std::string_view value) {
  if (auto logger = current_logger()) logger->set_tag(key, value);
}

bool flush_tracking() {
  auto logger = current_logger();
  return logger == nullptr || logger->flush();
}

namespace tracking {

Run::Run(std::string name, std::string experiment, std::string tracking_uri)
    : uncaught_at_start_(std::uncaught_exceptions()) {
  if (!tracking_enabled_by_environment(FrontEnd::kCpp)) return;  // a C++ program's scope
  std::optional<OpenedRun> opened =
      open_run(tracking_uri, experiment, name.empty() ? std::string("sgpu run") : name, {}, {}, {},
               FrontEnd::kCpp);  // a C++ program's scope
  if (!opened) return;
  run_id_ = opened->info.run_id;
  experiment_id_ = opened->info.experiment_id;
  link_ = opened->store->run_link(opened->info);
  const std::string uri = opened->store->uri();
  LoggerSettings settings;
  settings.run_id = run_id_;
  logger_ = std::make_shared<RunLogger>(std::move(opened->store), settings);
  push_active_run({uri, experiment_id_, run_id_, logger_});
}

Run::~Run() {
  if (!active()) return;
  pop_active_run(run_id_);
  logger_->close(std::chrono::seconds(30));
  const bool failed = failed_ || std::uncaught_exceptions() > uncaught_at_start_;
  try {
    logger_->store().end_run(run_id_, failed ? RunStatus::kFailed : RunStatus::kFinished, now_ms());
  } catch (const std::exception& e) {
    std::cerr << "sgpu: " << e.what() << "; run " << run_id_ << " stays RUNNING\n";
  }
}

}  // namespace tracking
}  // namespace sgpu
