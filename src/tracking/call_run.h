// The run of one distributed call: created before the ranks start, ended after they are
// gone.
//
// begin() picks the store (the request's tracking_uri, else MLFLOW_TRACKING_URI, else
// MLflow's default: tracking/store.h), the experiment (the request's experiment, else
// MLFLOW_EXPERIMENT_NAME, else MLFLOW_EXPERIMENT_ID, else the parent run's, else Default; a named
// one is created when missing) and the parent (the innermost sgpu::tracking::Run, else
// MLFLOW_RUN_ID in the caller's environment), records the call's params and tags and prints the
// run's link. A store that cannot be reached does not fail the call: begin() says so once and the
// call runs untracked. end() first sends what ranks spooled (rank-*/tracking-spool.jsonl),
// then sets the run's status; when the store is unreachable by then, the run is left
// pending in its run folder (tracking/pending.h, NOTE [Pending runs]).
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sgpu/options.h"
#include "tracking/pending.h"
#include "tracking/run_model.h"
#include "tracking/store.h"

namespace sgpu::tracking {

// What the launcher tells tracking about a call: the options that concern its run and
// the facts the launcher found out.
struct CallRunRequest {
  bool tracking = true;      // Options::tracking
  std::string tracking_uri;  // Options::tracking_uri; empty: tracking_uri_from_environment()
  std::string experiment;    // Options::experiment; empty: from the environment
  std::string run_name;      // Options::name; empty: the function's name
  int gpus = 1;              // per node
  int nnodes = 1;            // the launch's nodes; over several, the run gets a "nnodes" param
  std::optional<std::chrono::milliseconds> timeout;  // none: no timeout
  std::string function_name;
  std::string backend;
  std::string gpu_type;
  std::string sim_node;  // empty off sim
  bool program = false;  // `sgpu run`: the function is a command
  // The run this call's run is nested under, as its caller knows it (Python's
  // mlflow.active_run()); empty: the caller's Run scope, else MLFLOW_RUN_ID, else none.
  std::string parent_run_id;
  // The run's mlflow.source.name, as its front end knows it (a Python caller's script or
  // notebook); empty: this process's executable.
  std::string source_name;
  FrontEnd front_end = FrontEnd::kCpp;  // Options::front_end: how errors name the settings
};

// The call's run and store, for the rank logger (tracking/rank_logger.h): MLflow's client
// in a rank removes MLFLOW_RUN_ID from the environment when it resumes that run.
inline constexpr const char* kRankRunIdVar = "SGPU_TRACKING_RUN_ID";
inline constexpr const char* kRankTrackingUriVar = "SGPU_TRACKING_URI";

class CallRun {
 public:
  // nullptr when tracking is off (request.tracking false, or SGPU_TRACKING=off) or the
  // store cannot be reached. Throws TrackingError for a URI or experiment id that can
  // never work.
  static std::unique_ptr<CallRun> begin(const CallRunRequest& request);

  // A launch over several nodes is one run, node 0's: shared() is what node 0 tells the
  // others, join() what they make of it. The joined run's ranks log into node 0's run (the
  // store opened here, with this node's own credentials); its end() sends their spools
  // and leaves the run for node 0 to end. join() returns nullptr when `tracking` is false
  // or SGPU_TRACKING=off, and when this node cannot reach that run (said on stderr: a
  // store on node 0's own disk, say).
  struct Shared {
    std::string uri, experiment_id, run_id;
  };
  Shared shared() const;
  static std::unique_ptr<CallRun> join(bool tracking, const Shared& run, FrontEnd front_end);
  bool joined() const { return joined_; }

  // MLFLOW_RUN_ID, MLFLOW_TRACKING_URI, MLFLOW_EXPERIMENT_ID for the ranks, and sgpu's own
  // copies of the first two for the rank logger (kRankRunIdVar, kRankTrackingUriVar).
  std::vector<std::pair<std::string, std::string>> rank_environment() const;
  // Sends the ranks' spools from `run_dir` (empty: none), then ends the run with
  // `status`; then sends the runs of earlier calls to this store that are pending in the
  // same runs folder (tracking/pending.h). Returns false when the store could not be
  // reached: what is left stays in `run_dir` with a pending record, to be sent later.
  // `folder_kept_for_tracking_only`: the caller would remove `run_dir` but for this.
  bool end(RunStatus status, const std::filesystem::path& run_dir,
           bool folder_kept_for_tracking_only = false);
  // Records the run as in flight in `run_dir` until end() (NOTE [Pending runs]), so that a
  // later sync ends it KILLED if this process dies first. A record that cannot be written
  // is said on stderr, and the call goes on. Nothing for a joined run (its creator's).
  void hold_in_flight(const std::filesystem::path& run_dir);

  const RunInfo& info() const { return info_; }
  // Where the run is shown: a web link for a server, the run's folder for the file store.
  std::string link() const;

 private:
  CallRun(std::unique_ptr<Store> store, RunInfo info);
  std::unique_ptr<Store> store_;
  RunInfo info_;
  std::unique_ptr<InFlightRecord> in_flight_;
  bool joined_ = false;
};

struct OpenedRun {
  std::unique_ptr<Store> store;
  RunInfo info;
};

// Creates a run as begin() does (store, experiment, parent, standard tags, the link on
// stderr) with `tags` and `params` added. std::nullopt when the store cannot be reached
// (said once on stderr); TrackingError for what can never work, which says where else the
// run can go as `front_end` names the settings. The parent is `parent_run_id`, else the
// innermost Run scope, else MLFLOW_RUN_ID.
std::optional<OpenedRun> open_run(const std::string& uri_option,
                                  const std::string& experiment_option, const std::string& run_name,
                                  std::vector<Tag> tags, const Batch& params,
                                  const std::string& parent_run_id, FrontEnd front_end);

// The variables a rank gets when its call is not tracked: SGPU_TRACKING=off.
std::vector<std::pair<std::string, std::string>> untracked_rank_environment();

}  // namespace sgpu::tracking
