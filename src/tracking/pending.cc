#include "tracking/pending.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <optional>
#include <system_error>

#include "tracking/spool.h"

namespace sgpu::tracking {
namespace {

namespace fs = std::filesystem;

// An exclusive lock on the record, held while the folder is sent; -1 when another process
// holds it or the record is gone.
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

}  // namespace

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
    SyncedRun synced;
    synced.folder = folder;
    synced.run_id = pending->run_id;
    synced.status = status_name(pending->status);
    try {
      std::unique_ptr<Store> store = open_store(pending->uri);
      const SpoolSend sent = send_spools(*store, folder);
      synced.entries = sent.entries;
      synced.error = sent.error;
      if (sent.complete) {
        store->end_run(pending->run_id, pending->status, pending->end_time_ms);
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
  return run + ", pending since its call ended: " + std::to_string(synced.entries) +
         " entries sent, ended " + synced.status +
         (synced.error.empty() ? "" : "; the store refused some entries: " + synced.error);
}

}  // namespace sgpu::tracking
