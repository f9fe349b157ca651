// MLflow's SQL store in a SQLite database (sqlite:///path), written through SQLite's C
// library in the schema MLflow itself uses, so that MLflow's own client, `mlflow ui` and
// `mlflow server` read and write the same database.
//
// A database that does not exist yet is created from the schema of the pinned MLflow's
// newest revision (mlflow_schema.sql, kept equal to it by ci/mlflow-schema), with the
// Default experiment, as MLflow creates one. An existing database is written into as it
// is when the tables sgpu writes have the columns it writes; one that lacks them (made by
// an older MLflow) is a TrackingError that says to run `mlflow db upgrade`.
//
// Several processes write at once (the caller, every rank's logger, MLflow's own client
// in the ranks): the database is in WAL mode, every write is one transaction that waits
// for the lock (a busy timeout), and a lock not had within it is a transient StoreError.
#pragma once

#include <filesystem>
#include <mutex>
#include <string>

#include "tracking/store.h"

struct sqlite3;

namespace sgpu::tracking {

class SqliteStore final : public Store {
 public:
  // `uri` is sqlite:///relative/path or sqlite:////absolute/path.
  explicit SqliteStore(const std::string& uri);
  ~SqliteStore() override;
  SqliteStore(const SqliteStore&) = delete;
  SqliteStore& operator=(const SqliteStore&) = delete;

  std::string experiment_by_name(const std::string& name) override;
  void check_experiment(const std::string& id) override;
  RunInfo create_run(const std::string& experiment_id, const std::string& run_name,
                     std::int64_t start_time_ms, const std::vector<Tag>& tags) override;
  void log_batch(const std::string& run_id, const Batch& batch) override;
  void end_run(const std::string& run_id, RunStatus status, std::int64_t end_time_ms) override;
  RunInfo get_run(const std::string& run_id) override;
  // The database and the run, for `mlflow ui --backend-store-uri ...`.
  std::string run_link(const RunInfo& run) const override;
  std::string uri() const override;

  const std::filesystem::path& path() const { return path_; }

  // How long a write waits for another process's lock before it is a transient error.
  static constexpr int kBusyTimeoutMs = 30'000;

 private:
  void create_or_check();
  std::string artifact_root() const;

  std::filesystem::path path_;
  std::mutex mutex_;  // one statement at a time on the connection
  sqlite3* db_ = nullptr;
  bool has_workspaces_ = false;  // experiments.workspace exists (MLflow 3.x)
};

// The path a sqlite: URI names (relative to the working folder unless absolute); throws
// TrackingError for a URI that names no file (sqlite://, an in-memory database).
std::filesystem::path sqlite_path_of(const std::string& uri);

// The schema kept in mlflow_schema.sql (generated into the build).
extern const char* const kMlflowSchema;

}  // namespace sgpu::tracking
