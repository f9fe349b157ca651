// The run model sgpu records: MLflow's entities, as plain values.
//
// An experiment holds runs; a run has an id, a status, start and end times, and what was
// logged to it: params (write-once strings), tags (overwritable strings) and metrics (a
// series of values per key, each with a timestamp in milliseconds and a step). Every
// store (tracking/store.h) speaks in these types.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace sgpu::tracking {

// MLflow's RunStatus names, as its stores write them.
enum class RunStatus { kRunning, kFinished, kFailed, kKilled };
const char* status_name(RunStatus status);  // "RUNNING", "FINISHED", ...
// The status a name stands for; kRunning for a name that is none of them.
RunStatus status_from_name(std::string_view name);

struct Metric {
  std::string key;
  double value = 0;
  std::int64_t timestamp_ms = 0;
  std::int64_t step = 0;
};

struct Param {
  std::string key;
  std::string value;
};

struct Tag {
  std::string key;
  std::string value;
};

// What one log-batch carries.
struct Batch {
  std::vector<Metric> metrics;
  std::vector<Param> params;
  std::vector<Tag> tags;
  bool empty() const { return metrics.empty() && params.empty() && tags.empty(); }
  std::size_t size() const { return metrics.size() + params.size() + tags.size(); }
};

struct RunInfo {
  std::string experiment_id;
  std::string run_id;
  std::string run_name;
  RunStatus status = RunStatus::kRunning;
  std::int64_t start_time_ms = 0;
  std::int64_t end_time_ms = 0;  // 0 while running
  std::string artifact_uri;
};

// Milliseconds since the epoch, as MLflow timestamps are.
std::int64_t now_ms();

// The user MLflow records, as Python's getpass.getuser() finds it: LOGNAME, USER, LNAME or
// USERNAME, else the password database, else "unknown".
std::string current_user();

}  // namespace sgpu::tracking
