// A tracking server through MLflow's REST API (/api/2.0/mlflow/...), over libcurl.
//
// Calls: experiments/get-by-name and create, runs/create, update, get and log-batch.
// log_batch splits a batch of any size within the server's limits (1000 metrics, 100
// params, 100 tags per request); a request the server refuses as invalid is sent again
// entry by entry, so one bad entry never drops its neighbours. Int64 fields are read as
// JSON numbers or strings; NaN and infinities go as protobuf JSON spells them ("NaN",
// "Infinity", "-Infinity"). A request that fails for a transient reason (no connection,
// a timeout, 429, 5xx) is tried again with exponential backoff within the RetryPolicy,
// then fails with StoreError::transient() true.
//
// Authentication and TLS as MLflow's clients read them from the environment:
// MLFLOW_TRACKING_TOKEN (a bearer token) or MLFLOW_TRACKING_USERNAME and
// MLFLOW_TRACKING_PASSWORD (basic), MLFLOW_TRACKING_INSECURE_TLS=true,
// MLFLOW_TRACKING_SERVER_CERT_PATH (a CA bundle). Credentials never appear in an error.
#pragma once

#include <chrono>
#include <memory>
#include <mutex>

#include "tracking/store.h"

namespace sgpu::tracking {

class RestStore final : public Store {
 public:
  explicit RestStore(std::string uri, RetryPolicy policy = {});
  ~RestStore() override;

  std::string experiment_by_name(const std::string& name) override;
  void check_experiment(const std::string& id) override;
  RunInfo create_run(const std::string& experiment_id, const std::string& run_name,
                     std::int64_t start_time_ms, const std::vector<Tag>& tags) override;
  void log_batch(const std::string& run_id, const Batch& batch) override;
  void end_run(const std::string& run_id, RunStatus status, std::int64_t end_time_ms) override;
  RunInfo get_run(const std::string& run_id) override;
  std::string run_link(const RunInfo& run) const override;
  std::string uri() const override { return uri_; }

  void set_retry_policy(RetryPolicy policy);
  // Requests sent so far (each try counts), for tests and benchmarks.
  std::size_t requests_sent() const;

 private:
  struct Http;
  struct Response {
    long status = 0;
    std::string body;
  };
  Response call(const char* method, const std::string& path, const std::string& body);
  Response call_once(const char* method, const std::string& path, const std::string& body,
                     std::string* transport_error);
  void send_batch(const std::string& run_id, const Batch& batch, std::string* refused);

  const std::string uri_;
  RetryPolicy policy_;
  std::unique_ptr<Http> http_;
  mutable std::mutex mutex_;
  std::size_t requests_ = 0;
};

}  // namespace sgpu::tracking
