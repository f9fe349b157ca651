// The embedded store: MLflow's own file-store layout, as MLflow 3 writes it.
//
//   <root>/.trash/, <root>/0/ (the Default experiment)
//   <root>/<experiment id>/meta.yaml                     name, artifact_location, ...
//   <root>/<experiment id>/<run id>/meta.yaml            status (1 running, 3 finished,
//                                                        4 failed, 5 killed), times, ...
//   <root>/<experiment id>/<run id>/metrics/<key>        "timestamp value step" lines
//   <root>/<experiment id>/<run id>/params/<key>         the value, no newline
//   <root>/<experiment id>/<run id>/tags/<key>           the value, no newline
//   <root>/<experiment id>/<run id>/artifacts/
//
// A key with `/` is a path: `train/loss` is metrics/train/loss. `MLFLOW_ALLOW_FILE_STORE=true
// mlflow ui --backend-store-uri <root>` shows the runs, and `mlflow migrate-filestore`
// moves them into a database. Metric lines of one key are appended with one write() on an
// O_APPEND descriptor, so writers in many processes never interleave within a line; files
// that are replaced (params, tags, meta.yaml) are written aside and renamed into place.
// Experiments are created under an flock on the root folder.
#pragma once

#include <filesystem>
#include <map>
#include <mutex>

#include "tracking/store.h"

namespace sgpu::tracking {

class FileStore final : public Store {
 public:
  // `root` is created (with the Default experiment) when missing.
  explicit FileStore(std::filesystem::path root);

  std::string experiment_by_name(const std::string& name) override;
  void check_experiment(const std::string& id) override;
  RunInfo create_run(const std::string& experiment_id, const std::string& run_name,
                     std::int64_t start_time_ms, const std::vector<Tag>& tags) override;
  void log_batch(const std::string& run_id, const Batch& batch) override;
  void end_run(const std::string& run_id, RunStatus status, std::int64_t end_time_ms) override;
  RunInfo get_run(const std::string& run_id) override;
  std::string run_link(const RunInfo& run) const override;
  std::string uri() const override;
  // MLflow 3 keeps the file store in maintenance mode: its client opens one only with
  // MLFLOW_ALLOW_FILE_STORE=true.
  std::vector<std::pair<std::string, std::string>> client_environment() const override {
    return {{"MLFLOW_ALLOW_FILE_STORE", "true"}};
  }

  const std::filesystem::path& root() const { return root_; }

 private:
  std::filesystem::path run_dir(const std::string& run_id);

  std::filesystem::path root_;
  std::mutex mutex_;
  std::map<std::string, std::filesystem::path> run_dirs_;
};

// The folder a `file:` URI or a plain path names, made absolute.
std::filesystem::path file_store_root(const std::string& uri);

}  // namespace sgpu::tracking
