// Pending runs (NOTE [Pending runs]): a run folder's spools sent by a sync, its run ended
// as recorded or KILLED once its caller is gone, and what is not ours left alone.
#include "tracking/pending.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <fstream>
#include <string>
#include <vector>

#include "testing/temp_dir.h"
#include "tracking/call_run.h"
#include "tracking/file/file_store.h"
#include "tracking/run_model.h"
#include "tracking/spool.h"
#include "tracking/sqlite/sqlite_store.h"
#include "tracking/store_support.h"

namespace sgpu::tracking {
namespace {

// A run folder as a call leaves it when its store was unreachable at its end: two ranks'
// spools and the pending record.
fs::path pending_folder(const fs::path& runs, const std::string& name, const PendingRun& pending,
                        int metrics_per_rank) {
  const fs::path folder = runs / name;
  for (int rank = 0; rank < 2; ++rank) {
    fs::create_directories(folder / ("rank-" + std::to_string(rank)));
    Batch batch;
    for (int i = 0; i < metrics_per_rank; ++i) {
      batch.metrics.push_back({"rank_" + std::to_string(rank) + "/loss", i * 0.5, 1000 + i, i});
    }
    spool_batch(folder / ("rank-" + std::to_string(rank)) / kSpoolName, pending.run_id, batch);
  }
  write_pending(folder, pending);
  return folder;
}

TEST(PendingRuns, SyncSendsTheSpoolsEndsTheRunAsRecordedAndRemovesWhatItSent) {
  const fs::path root = temp_root();
  const fs::path runs = root.parent_path() / "runs";
  FileStore store(root);
  const RunInfo a = store.create_run("0", "a", 1700000000000, {});
  const RunInfo b = store.create_run("0", "b", 1700000000000, {});
  const RunInfo elsewhere = store.create_run("0", "c", 1700000000000, {});
  const fs::path kept_only = pending_folder(
      runs, "a", {store.uri(), a.run_id, RunStatus::kFinished, 1700000005000, true}, 3);
  const fs::path failed = pending_folder(
      runs, "b", {store.uri(), b.run_id, RunStatus::kFailed, 1700000006000, false}, 2);
  const fs::path other = pending_folder(
      runs, "c", {"file:///nowhere", elsewhere.run_id, RunStatus::kFinished, 1, true}, 1);
  fs::create_directories(runs / "unrelated");

  const auto synced = sync_pending_runs(runs, store.uri());
  ASSERT_EQ(synced.size(), 2u);
  for (const SyncedRun& s : synced) {
    EXPECT_TRUE(s.done && s.ended) << describe(s);
    EXPECT_EQ(s.error, "") << describe(s);
  }
  const RunInfo got_a = store.get_run(a.run_id), got_b = store.get_run(b.run_id);
  EXPECT_EQ(got_a.status, RunStatus::kFinished);
  EXPECT_EQ(got_a.end_time_ms, 1700000005000);  // when the call ended, not when sent
  EXPECT_EQ(got_b.status, RunStatus::kFailed);
  EXPECT_EQ(got_b.end_time_ms, 1700000006000);
  const fs::path a_dir = root / "0" / a.run_id;
  EXPECT_EQ(lines_of(a_dir / "metrics" / "rank_0" / "loss"),
            (std::vector<std::string>{"1000 0.0 0", "1001 0.5 1", "1002 1.0 2"}));
  EXPECT_EQ(lines_of(a_dir / "metrics" / "rank_1" / "loss").size(), 3u);
  EXPECT_NE(describe(synced[0]).find("6 entries sent, ended FINISHED"), std::string::npos)
      << describe(synced[0]);
  // Kept only for tracking: gone. A failed call's folder stays, without record or spools.
  EXPECT_FALSE(fs::exists(kept_only));
  EXPECT_TRUE(fs::exists(failed / "rank-0"));
  EXPECT_FALSE(fs::exists(failed / kPendingName));
  EXPECT_FALSE(fs::exists(failed / "rank-0" / kSpoolName));
  // Another store's run is left for a sync of that store.
  EXPECT_TRUE(fs::exists(other / kPendingName));
  EXPECT_EQ(store.get_run(elsewhere.run_id).status, RunStatus::kRunning);
  // Nothing is sent twice: the next sync of this store finds nothing.
  EXPECT_TRUE(sync_pending_runs(runs, store.uri()).empty());
  EXPECT_EQ(lines_of(a_dir / "metrics" / "rank_0" / "loss").size(), 3u);
}

TEST(PendingRuns, SyncSendsIntoAnMlflowDatabaseToo) {
  const fs::path folder = sgpu::testing::make_temp_dir("sgpu-store-test");
  const fs::path runs = folder / "runs";
  SqliteStore store("sqlite:///" + (folder / "mlflow.db").string());
  const RunInfo a = store.create_run("0", "a", 1700000000000, {});
  const fs::path kept_only = pending_folder(
      runs, "a", {store.uri(), a.run_id, RunStatus::kFinished, 1700000005000, true}, 3);
  const auto synced = sync_pending_runs(runs, store.uri());
  ASSERT_EQ(synced.size(), 1u);
  EXPECT_TRUE(synced[0].done && synced[0].ended) << describe(synced[0]);
  const RunInfo got = store.get_run(a.run_id);
  EXPECT_EQ(got.status, RunStatus::kFinished);
  EXPECT_EQ(got.end_time_ms, 1700000005000);
  EXPECT_EQ(query(store.path(), "SELECT count(*) FROM metrics WHERE run_uuid = '" + a.run_id + "'"),
            "6");
  EXPECT_FALSE(fs::exists(kept_only));
  EXPECT_TRUE(sync_pending_runs(runs, store.uri()).empty());  // nothing is sent twice
}

TEST(PendingRuns, AStoreStillUnreachableLeavesEverythingAndAFolderBeingSentIsSkipped) {
  const fs::path runs = temp_root().parent_path() / "runs";
  const fs::path down = pending_folder(
      runs, "down", {"http://127.0.0.1:1", "r1", RunStatus::kKilled, 1700000000000, true}, 2);
  const auto synced = sync_pending_runs(runs);
  ASSERT_EQ(synced.size(), 1u);
  EXPECT_FALSE(synced[0].done);
  EXPECT_NE(describe(synced[0]).find("is still pending"), std::string::npos) << describe(synced[0]);
  EXPECT_TRUE(fs::exists(down / kPendingName));
  EXPECT_EQ(read_spool(down / "rank-0" / kSpoolName).size(), 1u);
  // Another process holds the record's lock: this one leaves the folder alone.
  const int fd = ::open((down / kPendingName).c_str(), O_RDONLY | O_CLOEXEC);
  ASSERT_EQ(::flock(fd, LOCK_EX), 0);
  const pid_t child = ::fork();
  if (child == 0) ::_exit(sync_pending_runs(runs).empty() ? 0 : 1);
  int status = 0;
  ::waitpid(child, &status, 0);
  ::close(fd);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0) << "a locked folder was sent";
}

// NOTE [Pending runs]: a call's run is recorded in flight, locked while its caller lives.
// Once the lock is gone with the caller, a sync ends the run KILLED at the time the folder
// last changed and sends what the ranks spooled.
TEST(PendingRuns, ARunInFlightIsLeftAloneWhileItsCallerLivesAndEndedKilledOnceItDies) {
  const fs::path root = temp_root();
  const fs::path runs = root.parent_path() / "runs";
  FileStore store(root);
  const RunInfo run = store.create_run("0", "killed", 1700000000000, {});
  const fs::path folder = runs / "in-flight";
  fs::create_directories(folder / "rank-0");
  auto caller = std::make_unique<InFlightRecord>(folder, store.uri(), run.run_id);
  const std::optional<PendingRun> record = read_pending(folder / kPendingName);
  ASSERT_TRUE(record.has_value());
  EXPECT_TRUE(record->in_flight);
  EXPECT_EQ(record->status, RunStatus::kKilled);
  Batch batch;
  batch.metrics.push_back({"loss", 0.25, 1700000001000, 1});
  spool_batch(folder / "rank-0" / kSpoolName, run.run_id, batch);
  std::ofstream(folder / "rank-0" / "stderr.log") << "the rank's last words\n";
  // Everything in the folder changed by 1700000002 s, the log last, at 1700000003 s.
  const auto at = [](std::int64_t seconds) {
    return std::chrono::file_clock::from_sys(
        std::chrono::sys_seconds(std::chrono::seconds(seconds)));
  };
  for (const fs::path& path :
       {folder / kPendingName, folder / "rank-0" / kSpoolName, folder / "rank-0", folder}) {
    fs::last_write_time(path, at(1700000002));
  }
  fs::last_write_time(folder / "rank-0" / "stderr.log", at(1700000003));

  EXPECT_TRUE(sync_pending_runs(runs, store.uri()).empty()) << "a live caller's run was taken";
  EXPECT_EQ(store.get_run(run.run_id).status, RunStatus::kRunning);
  caller.reset();  // the caller dies: the kernel drops its lock
  const auto synced = sync_pending_runs(runs, store.uri());
  ASSERT_EQ(synced.size(), 1u);
  EXPECT_TRUE(synced[0].done && synced[0].ended && synced[0].caller_died) << describe(synced[0]);
  EXPECT_NE(
      describe(synced[0]).find("left running by a caller that died: 1 entries sent, ended KILLED"),
      std::string::npos)
      << describe(synced[0]);
  const RunInfo ended = store.get_run(run.run_id);
  EXPECT_EQ(ended.status, RunStatus::kKilled);
  EXPECT_EQ(ended.end_time_ms, 1700000003000);
  EXPECT_EQ(lines_of(root / "0" / run.run_id / "metrics" / "loss"),
            (std::vector<std::string>{"1700000001000 0.25 1"}));
  EXPECT_TRUE(fs::exists(folder / "rank-0" / "stderr.log"));  // the evidence stays
  EXPECT_FALSE(fs::exists(folder / kPendingName));
  EXPECT_TRUE(sync_pending_runs(runs, store.uri()).empty());
}

// A call that ends its run leaves no in-flight record behind, so no later sync turns its
// FINISHED or FAILED into KILLED; a run it could not end becomes an ordinary pending one.
TEST(PendingRuns, ACallThatEndsItsRunLeavesNoInFlightRecord) {
  const fs::path root = temp_root();
  const fs::path runs = root.parent_path() / "runs";
  CallRunRequest request;
  request.tracking_uri = "file://" + root.string();
  request.run_name = "failed";
  std::unique_ptr<CallRun> call = CallRun::begin(request);
  ASSERT_NE(call, nullptr);
  const fs::path folder = runs / "failed";
  fs::create_directories(folder);
  call->hold_in_flight(folder);
  ASSERT_TRUE(fs::exists(folder / kPendingName));
  EXPECT_TRUE(call->end(RunStatus::kFailed, folder));
  EXPECT_FALSE(fs::exists(folder / kPendingName));
  const std::string run_id = call->info().run_id;
  call.reset();
  EXPECT_TRUE(sync_pending_runs(runs).empty());
  FileStore store(root);
  EXPECT_EQ(store.get_run(run_id).status, RunStatus::kFailed);
}

// A record that is not one of ours (a field of the wrong type, not JSON) is left alone,
// never thrown at the sync (a call's end, `sgpu tracking sync`); found by the decoders'
// fuzz target.
TEST(PendingRuns, ARecordWithAFieldOfTheWrongTypeIsLeftAlone) {
  const fs::path runs = temp_root().parent_path() / "runs";
  for (const char* text :
       {R"({"uri": 5, "run_id": "r"})", R"({"uri": "file:/x", "run_id": []})",
        R"({"uri": "file:/x", "run_id": "r", "status": 3})",
        R"({"uri": "file:/x", "run_id": "r", "end_time_ms": "soon"})",
        // An end time no integer holds (tests/fuzz/corpus/pending_huge_end_time)
        R"({"uri": "file:/x", "run_id": "r", "end_time_ms": 171000001710000000000})", "{"}) {
    const fs::path folder = runs / ("bad-" + std::to_string(std::hash<std::string>{}(text)));
    fs::create_directories(folder);
    std::ofstream(folder / kPendingName) << text;
    EXPECT_EQ(read_pending(folder / kPendingName), std::nullopt) << text;
  }
  std::vector<SyncedRun> synced;
  EXPECT_NO_THROW(synced = sync_pending_runs(runs));
  EXPECT_TRUE(synced.empty());
  EXPECT_TRUE(read_pending(runs / "nowhere" / kPendingName) == std::nullopt);
}

}  // namespace
}  // namespace sgpu::tracking
