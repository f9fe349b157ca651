#include "tracking/pending.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <optional>
#include <system_error>

#include "sgpu/errors.h"
#include "tracking/spool.h"

namespace sgpu::tracking {
namespace {

namespace fs = std::filesystem;

// An exclusive lock on the record, held while the folder is sent; -1 when another process
// holds it or the record is gone. Also on a run folder, which its live caller holds while
// its record is in flight.
class RecordLock {
 public:
  explicit RecordLock(const fs::path& record) : fd_(::open(record.c_str(), O_RDONLY | O_CLOEXEC)) {
    if (fd_ >= 0 && ::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
      ::close(fd_);
      fd_ = -1;
    }
  }
  ~RecordLock() {
    if (fd_ >= 0) ::close(fd_);
  }
  RecordLock(const RecordLock&) = delete;
  RecordLock& operator=(const RecordLock&) = delete;
  bool held() const { return fd_ >= 0; }

 private:
  int fd_;
};

// When anything in the folder last changed, in ms since the epoch: a dead caller's ranks
// write their logs until they die.
std::int64_t last_change_ms(const fs::path& folder) {
  std::error_code ec;
  fs::file_time_type latest = fs::last_write_time(folder, ec);
  for (auto it = fs::recursive_directory_iterator(folder, ec); !ec && it != fs::end(it);
       it.increment(ec)) {
    const fs::file_time_type at = it->last_write_time(ec);
    if (!ec && at > latest) latest = at;
  }
  const auto since_epoch = std::chrono::file_clock::to_sys(latest);
  return std::chrono::duration_cast<std::chrono::milliseconds>(since_epoch.time_since_epoch())
      .count();
}

}  // namespace

InFlightRecord::InFlightRecord(const fs::path& run_dir, const std::string& uri,
                               const std::string& run_id)
    : run_dir_(run_dir), fd_(::open(run_dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)) {
  // The folder is locked before the record appears: a sync never finds the record while
  // this caller lives and the lock is free.
  if (fd_ < 0 || ::flock(fd_, LOCK_EX) != 0) {
    const std::string why = std::strerror(errno);
    if (fd_ >= 0) ::close(fd_);
    throw TrackingError("tracking: cannot lock the run folder " + run_dir.string() + ": " + why);
  }
  try {
    write_pending(run_dir, {uri, run_id, RunStatus::kKilled, 0, /*remove_folder=*/false,
                            /*in_flight=*/true});
  } catch (...) {
    ::close(fd_);
    throw;
  }
}

InFlightRecord::~InFlightRecord() {
  if (fd_ >= 0) ::close(fd_);
}

void InFlightRecord::remove() {
  std::error_code ec;
  fs::remove(contract::RunFolder{run_dir_}.tracking_pending(), ec);
}

SpoolSend send_spools(Store& store, const fs::path& run_dir) {
  SpoolSend result;
  std::error_code ec;
  for (const auto& entry : fs::directory_iterator(run_dir, ec)) {
    const fs::path spool = contract::RankFolder{entry.path()}.tracking_spool();
    if (!fs::exists(spool)) continue;
    for (const SpooledBatch& spooled : read_spool(spool)) {
      try {
        store.log_batch(spooled.run_id, spooled.batch);
        result.entries += spooled.batch.size();
      } catch (const StoreError& e) {
        // A refused batch would be refused again; only a transient failure keeps it.
        result.error = e.what();
        if (e.transient()) {
          result.complete = false;
          return result;
        }
      }
    }
    fs::remove(spool, ec);
  }
  return result;
}

std::vector<SyncedRun> sync_pending_runs(const fs::path& runs_dir, const std::string& only_uri) {
  std::error_code ec;
  std::vector<fs::path> folders;  // listed first: finished folders are removed below
  for (const auto& entry : fs::directory_iterator(runs_dir, ec)) {
    if (fs::exists(entry.path() / kPendingName, ec)) folders.push_back(entry.path());
  }
  std::sort(folders.begin(), folders.end());  // run folders are named by time: oldest first
  std::vector<SyncedRun> out;
  for (const fs::path& folder : folders) {
    const fs::path record = folder / kPendingName;
    RecordLock lock(record);
    if (!lock.held() || !fs::exists(record, ec)) continue;  // another process has it
    const std::optional<PendingRun> pending = read_pending(record);
    if (!pending || (!only_uri.empty() && pending->uri != only_uri)) continue;
    // A record in flight is ours once its caller's lock on the folder is gone with it.
    std::optional<RecordLock> caller;
    if (pending->in_flight) caller.emplace(folder);
    if (caller && !caller->held()) continue;
    SyncedRun synced;
    synced.folder = folder;
    synced.run_id = pending->run_id;
    synced.status = status_name(pending->status);
    synced.caller_died = pending->in_flight;  // locked by us: its caller is gone
    const std::int64_t end_time =
        pending->in_flight ? last_change_ms(folder) : pending->end_time_ms;
    try {
      std::unique_ptr<Store> store = open_store(pending->uri);
      const SpoolSend sent = send_spools(*store, folder);
      synced.entries = sent.entries;
      synced.error = sent.error;
      if (sent.complete) {
        store->end_run(pending->run_id, pending->status, end_time);
        synced.ended = synced.done = true;
      }
    } catch (const StoreError& e) {
      // A refused end (the run was deleted, say) would be refused again.
      synced.error = e.what();
      synced.done = !e.transient();
    } catch (const std::exception& e) {  // a store that cannot open, a damaged spool
      synced.error = e.what();
    }
    if (synced.done) {
      if (pending->remove_folder) {
        fs::remove_all(folder, ec);
      } else {
        fs::remove(record, ec);
      }
    }
    out.push_back(std::move(synced));
  }
  return out;
}

std::string describe(const SyncedRun& synced) {
  const std::string run = "run " + synced.run_id + " (" + synced.folder.string() + ")";
  if (!synced.done) return run + " is still pending: " + synced.error;
  if (!synced.ended) {
    return run + ": the store refused to end it (" + synced.error + "); it is no longer pending";
  }
  if (synced.caller_died) {
    return run + ", left running by a caller that died: " + std::to_string(synced.entries) +
           " entries sent, ended " + synced.status + " at the folder's last change";
  }
  return run + ", pending since its call ended: " + std::to_string(synced.entries) +
         " entries sent, ended " + synced.status +
         (synced.error.empty() ? "" : "; the store refused some entries: " + synced.error);
}

}  // namespace sgpu::tracking
