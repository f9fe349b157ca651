#include "tracking/run_logger.h"

#include <algorithm>
#include <iostream>
#include <utility>

#include "tracking/spool.h"
#include "tracking/validation.h"

namespace sgpu::tracking {

RunLogger::RunLogger(std::unique_ptr<Store> store, LoggerSettings settings)
    : store_(std::move(store)), settings_(std::move(settings)) {
  thread_ = std::thread([this] { run(); });
}

RunLogger::~RunLogger() {
  close(std::chrono::seconds(5));
  if (thread_.joinable()) thread_.join();
}

void RunLogger::add(Batch&& batch) {
  bool full = false;
  {
    std::lock_guard lock(mutex_);
    if (closed_) return;
    for (Metric& m : batch.metrics) buffer_.metrics.push_back(std::move(m));
    for (Param& p : batch.params) buffer_.params.push_back(std::move(p));
    for (Tag& t : batch.tags) buffer_.tags.push_back(std::move(t));
    ++logged_rounds_;
    full = buffer_.size() >= settings_.flush_at;
  }
  if (full) wake_.notify_one();
}

void RunLogger::log_metric(std::string_view key, double value, std::int64_t step) {
  check_key("metric", key);
  Batch batch;
  batch.metrics.push_back({std::string(key), value, now_ms(), step});
  add(std::move(batch));
}

void RunLogger::log_metrics(const std::map<std::string, double>& metrics, std::int64_t step) {
  const std::int64_t stamp = now_ms();
  Batch batch;
  for (const auto& [key, value] : metrics) {
    check_key("metric", key);
    batch.metrics.push_back({key, value, stamp, step});
  }
  add(std::move(batch));
}

void RunLogger::log_param(std::string_view key, std::string_view value) {
  check_key("param", key);
  Batch batch;
  batch.params.push_back({std::string(key), truncate_value(value, kMaxParamValueLength)});
  add(std::move(batch));
}

void RunLogger::set_tag(std::string_view key, std::string_view value) {
  check_key("tag", key);
  Batch batch;
  batch.tags.push_back({std::string(key), truncate_value(value, kMaxTagValueLength)});
  add(std::move(batch));
}

void RunLogger::run() {
  std::unique_lock lock(mutex_);
  while (true) {
    wake_.wait_for(lock, settings_.flush_interval, [this] {
      return closing_ || buffer_.size() >= settings_.flush_at || sent_rounds_ < flush_wanted_;
    });
    if (!buffer_.empty()) {
      pending_.push_back(std::move(buffer_));
      buffer_ = Batch{};
    }
    const std::uint64_t round = logged_rounds_;
    in_flight_ = true;
    while (!pending_.empty()) {
      Batch batch = pending_.front();
      lock.unlock();
      bool keep = false;
      try {
        store_->log_batch(settings_.run_id, batch);
      } catch (const StoreError& e) {
        keep = e.transient();
        if (!e.transient()) {
          std::cerr << "sgpu: " << e.what() << "\n";
        } else if (settings_.report_transient && !std::exchange(reported_transient_, true)) {
          std::cerr << "sgpu: " << e.what() << "; metrics are kept and sent again later\n";
        }
      } catch (const std::exception& e) {
        std::cerr << "sgpu: tracking: " << e.what() << "\n";
      }
      lock.lock();
      if (closed_) return;  // close() gave up waiting and took the batches
      if (keep) break;
      pending_.pop_front();
    }
    in_flight_ = false;
    sent_rounds_ = round;
    settled_.notify_all();
    if (closing_) return;
    // After a transient failure, wait a full interval before the next try.
    if (!pending_.empty()) {
      wake_.wait_for(lock, settings_.flush_interval, [this] { return closing_; });
    }
  }
}

bool RunLogger::flush() {
  std::unique_lock lock(mutex_);
  if (closed_) return pending_.empty() && buffer_.empty();
  const std::uint64_t target = logged_rounds_;
  flush_wanted_ = std::max(flush_wanted_, target);
  wake_.notify_one();
  settled_.wait(lock, [&] { return sent_rounds_ >= target || closed_; });
  return pending_.empty() && buffer_.empty();
}

std::size_t RunLogger::close(std::chrono::milliseconds limit) {
  std::unique_lock lock(mutex_);
  if (closed_) return 0;
  closing_ = true;
  wake_.notify_one();
  const bool done = settled_.wait_for(
      lock, limit, [this] { return !in_flight_ && sent_rounds_ >= logged_rounds_; });
  closed_ = true;
  // Whatever the store has not accepted, in flight included (the store dedups a metric
  // sent twice: same key, value, timestamp and step).
  std::deque<Batch> left = std::move(pending_);
  pending_.clear();
  if (!buffer_.empty()) left.push_back(std::move(buffer_));
  buffer_ = Batch{};
  lock.unlock();
  // A thread stuck in a request past the limit is joined by the destructor; a rank ends
  // with _exit and never waits for it.
  if (done && thread_.joinable()) thread_.join();
  std::size_t spooled = 0;
  for (const Batch& batch : left) {
    if (settings_.spool_file.empty()) {
      std::cerr << "sgpu: tracking: " << batch.size() << " entries for run " << settings_.run_id
                << " could not be sent and are lost\n";
      continue;
    }
    try {
      spool_batch(settings_.spool_file, settings_.run_id, batch);
      spooled += batch.size();
    } catch (const std::exception& e) {
      std::cerr << "sgpu: " << e.what() << "\n";
    }
  }
  return spooled;
}

}  // namespace sgpu::tracking
