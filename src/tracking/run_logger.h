// Buffers what code logs to one run and sends it in batches from a background thread.
//
// The logging calls validate (tracking/validation.h: a bad key throws there, at the
// caller's line; long values are truncated as MLflow does), stamp the time, append to a
// buffer and return; they never wait for the store. A background thread sends the
// buffer every `flush_interval`, or sooner once `flush_at` entries wait. A batch the
// store cannot take for a transient reason is kept and sent first next time; one it
// refuses (a changed param, say) is reported once on stderr and dropped, its neighbours
// having been taken (the stores send refused batches entry by entry). close() sends what
// is left within a time limit and appends whatever still could not be sent to the spool
// file (tracking/spool.h), for the launcher to send when the call ends.
#pragma once

#include <chrono>
#include <condition_variable>
#include <deque>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>

#include "tracking/store.h"

namespace sgpu::tracking {

struct LoggerSettings {
  std::string run_id;
  std::filesystem::path spool_file;  // empty: unsent batches are reported as lost
  std::chrono::milliseconds flush_interval{1000};
  std::size_t flush_at = 10'000;  // entries
  // Say once on stderr that the store is failing (ranks leave that to the launcher,
  // which says it once for the whole call).
  bool report_transient = true;
};

class RunLogger {
 public:
  RunLogger(std::unique_ptr<Store> store, LoggerSettings settings);
  ~RunLogger();  // close(5 s)
  RunLogger(const RunLogger&) = delete;
  RunLogger& operator=(const RunLogger&) = delete;

  void log_metric(std::string_view key, double value, std::int64_t step);
  void log_metrics(const std::map<std::string, double>& metrics, std::int64_t step);
  void log_param(std::string_view key, std::string_view value);
  void set_tag(std::string_view key, std::string_view value);

  // Blocks until everything logged so far was sent, or could not be (then it waits in
  // memory for the next try). Returns true when nothing is left unsent.
  bool flush();
  // Sends what is left within `limit`, spools the rest, stops the thread. Idempotent.
  // Returns the number of entries spooled.
  std::size_t close(std::chrono::milliseconds limit);

  const std::string& run_id() const { return settings_.run_id; }
  Store& store() { return *store_; }

 private:
  void run();
  void add(Batch&& batch);

  std::unique_ptr<Store> store_;
  const LoggerSettings settings_;

  std::mutex mutex_;
  std::condition_variable wake_;     // the thread: work or closing
  std::condition_variable settled_;  // flush(): the thread finished a round
  Batch buffer_;
  std::deque<Batch> pending_;        // taken by the thread, not yet accepted by the store
  std::uint64_t logged_rounds_ = 0;  // add() calls seen
  std::uint64_t sent_rounds_ = 0;    // add() calls the thread has tried to send
  std::uint64_t flush_wanted_ = 0;   // flush() waits until sent_rounds_ reaches it
  bool in_flight_ = false;
  bool closing_ = false;
  bool closed_ = false;
  bool reported_transient_ = false;
  std::thread thread_;
};

}  // namespace sgpu::tracking
