// Runs whose end did not reach their store, and sending them later.
//
// NOTE [Pending runs]
// A call's run ends after its ranks are gone (tracking/call_run.h): the caller sends what
// the ranks spooled (rank-*/tracking-spool.jsonl in the call's run folder), then sets the
// run's status. When the store cannot be reached then, the call still returns as it
// would have, and the caller writes tracking-pending.json beside the spools: the store's
// URI, the run id, the status and end time the call reached, and whether the folder was
// kept for this alone. sync_pending_runs() sends such folders later: `sgpu tracking
// sync` runs it over a runs folder, and every call that ends its own run runs it over
// its runs folder for the same store. It sends the spools, ends the run with the
// recorded status and time, then removes the spools and the record (the whole folder
// when it was kept only for them). The record is locked while a folder is sent
// (flock), so two processes never send one folder at once; a metric sent twice (a sync
// cut short, say) is one point in MLflow, which deduplicates them.
//
// A caller killed outright (SIGKILL, the OOM killer) ends nothing. So that its run does
// not stay RUNNING for ever, the caller writes the record as soon as the run folder exists,
// marked in flight with status KILLED and no end time, having locked the run folder
// (flock), which it holds until the call ends, when the record is removed, or replaced by
// the real pending one. The kernel drops the lock with the caller however it dies, so a
// sync that can take the folder's lock under an in-flight record knows its caller is gone: it ends
// the run KILLED, at the time the folder last changed (the ranks' last words), and sends what they
// spooled.
#pragma once

#include <cstdint>
#include <filesystem>
#include <optional>
#include <string>
#include <vector>

#include "contract/run_folder.h"
#include "tracking/run_model.h"
#include "tracking/store.h"

namespace sgpu::tracking {

// Their places in the run folder (NOTE [The run folder] in contract/run_folder.h).
inline constexpr const char* kPendingName = contract::RunFolder::kTrackingPendingName;
inline constexpr const char* kSpoolName = contract::RankFolder::kTrackingSpoolName;

struct PendingRun {
  std::string uri;  // the store's (Store::uri())
  std::string run_id;
  RunStatus status = RunStatus::kFinished;
  std::int64_t end_time_ms = 0;
  bool remove_folder = false;  // the folder was kept only for what is unsent
  bool in_flight = false;      // written while the call runs: its caller died if unlocked
};

// Writes run_dir/tracking-pending.json (whole, through a rename). Throws TrackingError.
void write_pending(const std::filesystem::path& run_dir, const PendingRun& pending);
// What a tracking-pending.json holds; nullopt when it is missing or not such a record (not
// JSON, no uri or run_id, a field of the wrong type), which a sync leaves alone.
std::optional<PendingRun> read_pending(const std::filesystem::path& record);

// The record of a call in flight, its run folder locked while this object lives (see the
// NOTE above).
class InFlightRecord {
 public:
  // Locks run_dir, then writes its tracking-pending.json for the run (status KILLED, in
  // flight). Throws TrackingError when either cannot be done.
  InFlightRecord(const std::filesystem::path& run_dir, const std::string& uri,
                 const std::string& run_id);
  ~InFlightRecord();  // the folder's lock goes; the record stays (replaced or removed first)
  InFlightRecord(const InFlightRecord&) = delete;
  InFlightRecord& operator=(const InFlightRecord&) = delete;
  const std::filesystem::path& run_dir() const { return run_dir_; }
  // Removes the record (the run is ended), still locked, so no sync can take it.
  void remove();

 private:
  std::filesystem::path run_dir_;
  int fd_ = -1;  // the run folder, locked
};

// What sending a folder's spools did.
struct SpoolSend {
  std::size_t entries = 0;  // entries the store took
  bool complete = true;     // false: the store became unreachable; the spools stay
  std::string error;        // the last failure, refused batches included
};

// Sends every rank-*/tracking-spool.jsonl under `run_dir` to `store` and removes each file
// once sent. A refused batch is dropped (it would be refused again); the first transient
// failure stops everything.
SpoolSend send_spools(Store& store, const std::filesystem::path& run_dir);

struct SyncedRun {
  std::filesystem::path folder;
  std::string run_id;
  std::string status;        // the status it was ended with, or is to be
  std::size_t entries = 0;   // sent now
  bool ended = false;        // the run has its status now
  bool caller_died = false;  // an in-flight record whose caller is gone
  bool done = false;         // nothing is pending any more: ended, or refused for good
  std::string error;         // the last failure or refusal
};

// Sends the pending folders directly under `runs_dir` (only those for the store at
// `only_uri`, when it is not empty) and ends their runs. A folder another process is
// sending is skipped.
std::vector<SyncedRun> sync_pending_runs(const std::filesystem::path& runs_dir,
                                         const std::string& only_uri = "");

// One line on what became of a pending run, for the console.
std::string describe(const SyncedRun& synced);

}  // namespace sgpu::tracking
