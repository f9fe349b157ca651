// The SQLite store: MLflow's own schema and defaults, a refused param, a database it
// cannot write, the default store as MLflow picks it, and many processes writing at once.
#include "tracking/sqlite/sqlite_store.h"

#include <dlfcn.h>
#include <gtest/gtest.h>
#include <sqlite3.h>

#include <atomic>
#include <cmath>
#include <fstream>
#include <limits>
#include <string>
#include <vector>

#include "sgpu/errors.h"
#include "testing/temp_dir.h"
#include "tracking/run_model.h"
#include "tracking/store.h"
#include "tracking/store_support.h"

// Every wait of this process for its disk, counted: fsync and fdatasync, which SQLite calls,
// here in place of the C library's, which they then call.
std::atomic<int> g_disk_waits{0};

extern "C" int fsync(int fd) {
  static const auto real = reinterpret_cast<int (*)(int)>(::dlsym(RTLD_NEXT, "fsync"));
  g_disk_waits.fetch_add(1);
  return real(fd);
}

extern "C" int fdatasync(int fd) {
  static const auto real = reinterpret_cast<int (*)(int)>(::dlsym(RTLD_NEXT, "fdatasync"));
  g_disk_waits.fetch_add(1);
  return real(fd);
}

namespace sgpu::tracking {
namespace {

TEST(SqliteStore, ANewDatabaseHasMlflowsSchemaTheDefaultExperimentAndWal) {
  SqliteStore store(db_uri());
  EXPECT_EQ(query(store.path(), "SELECT version_num FROM alembic_version"), "dc11669786a5");
  EXPECT_EQ(query(store.path(), "SELECT name FROM experiments WHERE experiment_id = 0"), "Default");
  EXPECT_EQ(query(store.path(), "PRAGMA journal_mode"), "wal");
  // Every table, index and trigger of the kept schema, and nothing else.
  sqlite3* fresh = nullptr;
  ASSERT_EQ(sqlite3_open(":memory:", &fresh), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(fresh, kMlflowSchema, nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_stmt* names = nullptr;
  sqlite3_prepare_v2(
      fresh, "SELECT group_concat(name) FROM (SELECT name FROM sqlite_master ORDER BY name)", -1,
      &names, nullptr);
  ASSERT_EQ(sqlite3_step(names), SQLITE_ROW);
  const std::string expected = reinterpret_cast<const char*>(sqlite3_column_text(names, 0));
  sqlite3_finalize(names);
  sqlite3_close(fresh);
  EXPECT_GT(expected.size(), 1000u);
  EXPECT_EQ(query(store.path(),
                  "SELECT group_concat(name) FROM (SELECT name FROM sqlite_master ORDER BY name)"),
            expected);
  const std::string id = store.experiment_by_name("sgpu store test");
  EXPECT_EQ(id, "1");  // MLflow's SQL store numbers experiments from 1
  EXPECT_EQ(store.experiment_by_name("sgpu store test"), id);
  const RunInfo run = store.create_run(id, "r", 5, {{"a", "b"}});
  Batch batch;
  batch.metrics = {{"loss", std::nan(""), 10, 0},
                   {"loss", std::numeric_limits<double>::infinity(), 11, 1},
                   {"loss", 0.5, 12, 2},
                   {"loss", 0.5, 12, 2}};  // the same point again: kept once
  batch.params = {{"lr", "0.1"}};
  store.log_batch(run.run_id, batch);
  store.end_run(run.run_id, RunStatus::kFinished, 20);
  const std::string where = " WHERE run_uuid = '" + run.run_id + "'";
  EXPECT_EQ(query(store.path(), "SELECT count(*) FROM metrics" + where), "3");
  EXPECT_EQ(query(store.path(), "SELECT is_nan FROM metrics" + where + " AND step = 0"), "1");
  EXPECT_EQ(query(store.path(), "SELECT value FROM metrics" + where + " AND step = 1"),
            "1.79769313486232e+308");
  EXPECT_EQ(query(store.path(), "SELECT step FROM latest_metrics" + where), "2");
  EXPECT_EQ(query(store.path(), "SELECT value FROM tags" + where + " AND key = 'mlflow.runName'"),
            "r");
  EXPECT_EQ(query(store.path(), "SELECT status FROM runs" + where), "FINISHED");
  EXPECT_EQ(store.get_run(run.run_id).end_time_ms, 20);
}

TEST(SqliteStore, ARefusedParamDoesNotDropItsNeighbours) {
  SqliteStore store(db_uri());
  const RunInfo run = log_a_changed_param(store, "'lr'");
  const std::string where = " WHERE run_uuid = '" + run.run_id + "'";
  EXPECT_EQ(query(store.path(), "SELECT value FROM params" + where + " AND key = 'lr'"), "0.1");
  EXPECT_EQ(query(store.path(), "SELECT value FROM params" + where + " AND key = 'momentum'"),
            "0.9");
  EXPECT_EQ(query(store.path(), "SELECT count(*) FROM metrics" + where), "1");
}

TEST(SqliteStore, ADatabaseItCannotWriteSaysWhatToRun) {
  const fs::path folder = sgpu::testing::make_temp_dir("sgpu-store-test");
  { SqliteStore store("sqlite:///" + (folder / "old.db").string()); }
  // An older MLflow's runs table, without a column sgpu writes.
  sqlite3* db = nullptr;
  ASSERT_EQ(sqlite3_open((folder / "old.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(
      sqlite3_exec(db, "ALTER TABLE runs DROP COLUMN source_version", nullptr, nullptr, nullptr),
      SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE other (x INTEGER)", nullptr, nullptr, nullptr),
            SQLITE_OK);
  sqlite3_close(db);
  try {
    SqliteStore store("sqlite:///" + (folder / "old.db").string());
    FAIL() << "a database without runs.source_version was accepted";
  } catch (const TrackingError& e) {
    EXPECT_NE(std::string(e.what()).find("runs.source_version"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("mlflow db upgrade sqlite:///"), std::string::npos)
        << e.what();
  }
  ASSERT_EQ(sqlite3_open((folder / "foreign.db").c_str(), &db), SQLITE_OK);
  ASSERT_EQ(sqlite3_exec(db, "CREATE TABLE t (x INTEGER)", nullptr, nullptr, nullptr), SQLITE_OK);
  sqlite3_close(db);
  EXPECT_THROW(SqliteStore("sqlite:///" + (folder / "foreign.db").string()), TrackingError);
  EXPECT_THROW(SqliteStore("sqlite://"), TrackingError);
  EXPECT_THROW(SqliteStore("sqlite:///:memory:"), TrackingError);
}

TEST(DefaultStore, IsMlflowsDatabaseUnlessMlrunsHoldsRunsAsMlflowDecides) {
  const fs::path folder = sgpu::testing::make_temp_dir("sgpu-default-store");
  const fs::path before = fs::current_path();
  fs::current_path(folder);
  EXPECT_EQ(default_tracking_uri(), "sqlite:///mlflow.db");
  fs::create_directories(folder / "mlruns" / ".trash");  // no experiment: not data yet
  fs::create_directories(folder / "mlruns" / "0");
  EXPECT_EQ(default_tracking_uri(), "sqlite:///mlflow.db");
  std::ofstream(folder / "mlruns" / "0" / "meta.yaml") << "name: Default\n";
  EXPECT_EQ(default_tracking_uri(), "");  // the file store in ./mlruns
  fs::current_path(before);
}

// Ranks that log every step commit hundreds of times a call. Under WAL, none waits for the
// disk (a checkpoint does), so a slow disk does not hold their sends past a rank's end.
TEST(SqliteStore, ACommitUnderWalDoesNotWaitForTheDisk) {
  SqliteStore store(db_uri());
  const RunInfo run = store.create_run("0", "r", 1, {});
  constexpr int kCommits = 100;
  const int before = g_disk_waits.load();
  for (int step = 0; step < kCommits; ++step) {
    Batch batch;
    batch.metrics = {{"loss", 1.0 / (step + 1), step, step}};
    store.log_batch(run.run_id, batch);
  }
  EXPECT_LT(g_disk_waits.load() - before, kCommits / 10);
  EXPECT_EQ(query(store.path(), "SELECT count(*) FROM metrics"), std::to_string(kCommits));
}

TEST(SqliteStore, EightProcessesWritingAtOnceLoseNothing) {
  const std::string uri = db_uri();
  std::string run_id;
  {
    SqliteStore store(uri);
    run_id = store.create_run("0", "r", 1, {}).run_id;
  }
  constexpr int kWriters = 8, kBatches = 50, kPerBatch = 40;
  ASSERT_TRUE(in_processes(kWriters, [&](int w) {
    SqliteStore store(uri);  // each opens the database as it is, at once
    for (int b = 0; b < kBatches; ++b) {
      Batch batch;
      for (int i = 0; i < kPerBatch; ++i) {
        batch.metrics.push_back({"shared/key", w * 1e6 + b * kPerBatch + i, 1, b * kPerBatch + i});
      }
      store.log_batch(run_id, batch);
    }
  }));
  EXPECT_EQ(query(sqlite_path_of(uri), "SELECT count(*) FROM metrics"),
            std::to_string(kWriters * kBatches * kPerBatch));
  // The last step, and of the writers that logged it at the same time the greatest value.
  EXPECT_EQ(std::stod(query(sqlite_path_of(uri), "SELECT value FROM latest_metrics")),
            7e6 + kBatches * kPerBatch - 1);
}

}  // namespace
}  // namespace sgpu::tracking
