// Where runs go: one small interface over MLflow's stores.
//
// A Store creates experiments and runs, appends batches to a run and ends it. Three
// implementations repeat the same names: file/file_store.h writes MLflow's own file-store
// layout (`./mlruns`), sqlite/sqlite_store.h MLflow's SQL store in a SQLite database,
// rest/rest_store.h speaks MLflow's REST API to a tracking server.
// Every method may be called from several threads and several processes at once; a
// Store never keeps a run's state in memory, so a rank and its caller can each open one
// on the same run. Failures are TrackingError with a message fit for a user (never a
// token or password in it); `transient()` tells the caller whether trying again later
// may succeed (the server was unreachable or overloaded) or not (the request was
// refused).
#pragma once

#include <chrono>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "sgpu/errors.h"
#include "sgpu/options.h"
#include "tracking/run_model.h"

namespace sgpu::tracking {

class StoreError : public TrackingError {
 public:
  StoreError(const std::string& what, bool transient)
      : TrackingError(what), transient_(transient) {}
  bool transient() const { return transient_; }

 private:
  bool transient_;
};

// A store that cannot be made where its URI puts it (a database whose folder is read-only):
// never transient. The call's run can go elsewhere, or nowhere, which open_run adds in its
// caller's words.
class StoreUnopened : public StoreError {
 public:
  explicit StoreUnopened(const std::string& what) : StoreError(what, false) {}
};

class Store {
 public:
  virtual ~Store() = default;
  // The id of the experiment named `name`, created when missing.
  virtual std::string experiment_by_name(const std::string& name) = 0;
  // Throws StoreError when there is no experiment `id`.
  virtual void check_experiment(const std::string& id) = 0;
  // A new RUNNING run; `tags` are set on it (mlflow.runName is added from `run_name`).
  virtual RunInfo create_run(const std::string& experiment_id, const std::string& run_name,
                             std::int64_t start_time_ms, const std::vector<Tag>& tags) = 0;
  // Appends `batch` to the run; params already logged with the same value are accepted.
  // The batch is already validated (tracking/validation.h) and may be of any size.
  virtual void log_batch(const std::string& run_id, const Batch& batch) = 0;
  virtual void end_run(const std::string& run_id, RunStatus status, std::int64_t end_time_ms) = 0;
  virtual RunInfo get_run(const std::string& run_id) = 0;
  // Where a person looks at the run: a web link for a server, the folder for files.
  virtual std::string run_link(const RunInfo& run) const = 0;
  // The tracking URI that finds this store again (what ranks get as MLFLOW_TRACKING_URI).
  virtual std::string uri() const = 0;
  // What MLflow's own client needs, besides MLFLOW_TRACKING_URI, to open this store in a
  // rank ("NAME", "value" pairs). The default needs nothing.
  virtual std::vector<std::pair<std::string, std::string>> client_environment() const { return {}; }
};

// How a tracking server's store retries: a transient failure (no connection, a timeout,
// 429, 5xx) is tried again with exponential backoff within these bounds.
struct RetryPolicy {
  int attempts = 4;                                   // tries per request
  std::chrono::milliseconds first_backoff{200};       // doubles after each try
  std::chrono::milliseconds request_timeout{10'000};  // one request, connect included
  std::chrono::milliseconds connect_timeout{2'000};
};

// The store for `uri`: `http(s)://...` is a server (retrying as `server_retry` says),
// `sqlite:///path` an MLflow database (sqlite/sqlite_store.h), `file:...`, a path, or
// empty (then `./mlruns`) is the file store. Anything else is a
// TrackingError naming what is supported.
std::unique_ptr<Store> open_store(const std::string& uri, const RetryPolicy& server_retry = {});

// MLflow's own default store: a database in the working folder.
inline constexpr const char* kDefaultDatabaseUri = "sqlite:///mlflow.db";

// True when `folder` holds MLflow file-store data (an experiment folder, named by a number,
// with its meta.yaml), as MLflow 3 decides whether ./mlruns is still the default.
bool has_mlruns_data(const std::filesystem::path& folder);

// MLflow's default, as MLflow 3 chooses it: "" (the file store, ./mlruns) when ./mlruns
// already holds data, else kDefaultDatabaseUri.
std::string default_tracking_uri();

// MLFLOW_TRACKING_URI, else default_tracking_uri().
std::string tracking_uri_from_environment();

// False when tracking is turned off: SGPU_TRACKING=off (or 0, false, no). ConfigError for a
// word that is neither, naming the setting as `front_end` writes it.
bool tracking_enabled_by_environment(FrontEnd front_end);

}  // namespace sgpu::tracking
