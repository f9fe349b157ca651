#include "tracking/rank_logger.h"

#include <atomic>
#include <cstdlib>
#include <iostream>
#include <mutex>

#include "contract/option_table.h"
#include "contract/rank_env.h"
#include "contract/run_folder.h"
#include "tracking/call_run.h"
#include "tracking/run_logger.h"

namespace sgpu::tracking {
namespace {

std::atomic<RunLogger*> g_logger{nullptr};
constexpr auto kProgramExitFlushLimit = std::chrono::seconds(10);
std::once_flag g_once;

void create() {
  // sgpu's own copies first: MLflow's client removes MLFLOW_RUN_ID from the environment
  // when it resumes the run it names, so a rank whose code used mlflow.log_metric first
  // would find no run (tracking/call_run.h, CallRun::rank_environment).
  std::string run_id = contract::env_string(kRankRunIdVar);
  if (run_id.empty()) run_id = contract::env_string("MLFLOW_RUN_ID");
  // A rank's SGPU_TRACKING is its launcher's word, on or off (CallRun::rank_environment).
  if (!contract::environment_flag("tracking", true, contract::kRankSide) || run_id.empty()) {
    return;
  }
  std::string uri = contract::env_string(kRankTrackingUriVar);
  if (uri.empty()) uri = tracking_uri_from_environment();
  std::unique_ptr<Store> store;
  try {
    // Patient with a busy server: the time a rank's end waits is bounded by
    // close_rank_logger's limit, not here (what is not sent by then is spooled).
    store = open_store(uri, RetryPolicy{3, std::chrono::milliseconds(200), std::chrono::seconds(15),
                                        std::chrono::seconds(2)});
  } catch (const std::exception& e) {
    std::cerr << "sgpu: " << e.what() << "; this rank logs nothing\n";
    return;
  }
  LoggerSettings settings;
  settings.run_id = run_id;
  settings.report_transient = false;
  if (const contract::RankEnvironment env = contract::read_rank_environment();
      !env.rank_dir.empty()) {
    settings.spool_file = contract::RankFolder{env.rank_dir}.tracking_spool();
  }
  // Never destroyed: a rank ends with _exit after close_rank_logger.
  g_logger.store(new RunLogger(std::move(store), std::move(settings)));
  // A program's rank (sgpu run) ends as the program does, with exit(): what it logged is
  // sent then, within the limit a function's rank has (what is left is spooled).
  std::atexit([] { close_rank_logger(kProgramExitFlushLimit); });
}

}  // namespace

RunLogger* rank_logger() {
  std::call_once(g_once, create);
  return g_logger.load();
}

void close_rank_logger(std::chrono::milliseconds limit) {
  if (RunLogger* logger = g_logger.load()) logger->close(limit);
}

bool rank_logger_started() { return g_logger.load() != nullptr; }

}  // namespace sgpu::tracking
