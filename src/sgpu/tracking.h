// Experiment tracking: every distributed call is an MLflow run, and code logs to it.
//
// Inside a rank, log_metric / log_metrics / log_param / set_tag go to the call's run
// (found through MLFLOW_RUN_ID and MLFLOW_TRACKING_URI, which the launcher sets, as
// MLflow's own clients find a run). They validate and buffer and return at once; a
// background thread sends batches, and the rank's buffer is flushed when the function
// returns, throws, or the rank is torn down. A key MLflow would refuse throws
// sgpu::TrackingError at the call; values past MLflow's limits are truncated as MLflow
// truncates them.
//
// In the caller, a sgpu::tracking::Run scope opens a run of its own: calls started while
// it lives become its child runs (a sweep), and the logging functions go to it. Outside a
// rank and without a Run, and whenever tracking is off, they do nothing.
//
//   sgpu::tracking::Run sweep("lr sweep");
//   for (double lr : {0.1, 0.01}) train.distributed(lr);   // two child runs
//   sgpu::log_metric("best_loss", best);                     // on the sweep's run
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>

namespace sgpu {

void log_metric(std::string_view key, double value, std::int64_t step = 0);
// Several metrics with one timestamp and step.
void log_metrics(const std::map<std::string, double>& metrics, std::int64_t step = 0);
void log_param(std::string_view key, std::string_view value);
void set_tag(std::string_view key, std::string_view value);
// Blocks until what this process logged so far was sent; false when some of it could
// not be (it is kept and tried again).
bool flush_tracking();

namespace tracking {

class RunLogger;

// A run the caller holds open for its scope. The store and experiment are chosen as for
// a call (Options::tracking_uri / MLFLOW_TRACKING_URI, `experiment` /
// MLFLOW_EXPERIMENT_NAME / MLFLOW_EXPERIMENT_ID); an enclosing Run, or MLFLOW_RUN_ID in
// the environment, makes it a child run. It ends FINISHED, or FAILED when its scope is
// left by an exception or fail() was called. With tracking off it does nothing.
class Run {
 public:
  explicit Run(std::string name = "", std::string experiment = "", std::string tracking_uri = "");
  ~Run();
  Run(const Run&) = delete;
  Run& operator=(const Run&) = delete;

  void fail() { failed_ = true; }
  bool active() const { return !run_id_.empty(); }
  const std::string& run_id() const { return run_id_; }
  const std::string& experiment_id() const { return experiment_id_; }
  const std::string& link() const { return link_; }  // web link, or the run's folder

 private:
  std::shared_ptr<RunLogger> logger_;
  std::string run_id_;
  std::string experiment_id_;
  std::string link_;
  int uncaught_at_start_ = 0;
  bool failed_ = false;
};

}  // namespace tracking
}  // namespace sgpu
