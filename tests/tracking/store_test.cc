// The tracking core without a server: MLflow's key rules and limits, request building
// and splitting, the file store's layout and its appends from many processes, the spool,
// and the buffered logger.
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <rapidcheck/gtest.h>
#include <sqlite3.h>
#include <sys/file.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <functional>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <thread>

#include "sgpu/config.h"
#include "testing/temp_dir.h"
#include "tracking/call_run.h"
#include "tracking/file/file_store.h"
#include "tracking/log_batch.h"
#include "tracking/pending.h"
#if SGPU_WITH_TRACKING_SERVER
#include "tracking/rest/rest_store.h"
#endif
#include "tracking/run_logger.h"
#include "tracking/spool.h"
#include "tracking/sqlite/sqlite_store.h"
#include "tracking/validation.h"

namespace sgpu::tracking {
namespace {

namespace fs = std::filesystem;

fs::path temp_root() { return sgpu::testing::make_temp_dir("sgpu-store-test") / "mlruns"; }

std::string read(const fs::path& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> lines_of(const fs::path& path) {
  std::vector<std::string> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

TEST(Validation, AcceptsWhatMlflowAccepts) {
  for (const char* key : {"loss", "train/loss", "a.b-c_d", "epoch 1: acc", "x/y/z"}) {
    EXPECT_NO_THROW(check_key("metric", key)) << key;
  }
}

TEST(Validation, RefusesWhatMlflowRefusesWithTheKeyAndTheRule) {
  for (const char* key :
       {"", "a//b", "/a", "a/", "../a", "a/../b", ".", "a/./b", "loss!", "a\"b", "tab\there"}) {
    EXPECT_THROW(check_key("metric", key), TrackingError) << key;
  }
  try {
    check_key("param", std::string(251, 'k'));
    FAIL() << "a 251-character key passed";
  } catch (const TrackingError& e) {
    EXPECT_NE(std::string(e.what()).find("at most 250"), std::string::npos) << e.what();
  }
  EXPECT_NO_THROW(check_key("param", std::string(250, 'k')));
}

TEST(Validation, TruncatesLongValuesByCharacters) {
  bool truncated = false;
  EXPECT_EQ(truncate_value(std::string(7000, 'v'), kMaxParamValueLength, &truncated).size(), 6000u);
  EXPECT_TRUE(truncated);
  EXPECT_EQ(truncate_value("short", kMaxParamValueLength, &truncated), "short");
  EXPECT_FALSE(truncated);
  // Two-byte characters are kept whole: 3 characters of "ééé..." is 6 bytes.
  EXPECT_EQ(truncate_value("éééé", 3), "ééé");
}

RC_GTEST_PROP(SplitBatch, PiecesAreWithinMlflowsLimitsAndKeepEverythingInOrder,
              (std::uint16_t metrics, std::uint8_t params, std::uint8_t tags)) {
  Batch batch;
  for (int i = 0; i < metrics % 3500; ++i) batch.metrics.push_back({"m", double(i), i, i});
  for (int i = 0; i < params; ++i) batch.params.push_back({"p" + std::to_string(i), "v"});
  for (int i = 0; i < tags; ++i) batch.tags.push_back({"t" + std::to_string(i), "v"});
  Batch joined;
  for (const Batch& piece : split_batch(batch)) {
    RC_ASSERT(!piece.empty());
    RC_ASSERT(piece.metrics.size() <= kMaxMetricsPerBatch);
    RC_ASSERT(piece.params.size() <= kMaxParamsTagsPerBatch);
    RC_ASSERT(piece.tags.size() <= kMaxParamsTagsPerBatch);
    RC_ASSERT(piece.size() <= kMaxEntitiesPerBatch);
    joined.metrics.insert(joined.metrics.end(), piece.metrics.begin(), piece.metrics.end());
    joined.params.insert(joined.params.end(), piece.params.begin(), piece.params.end());
    joined.tags.insert(joined.tags.end(), piece.tags.begin(), piece.tags.end());
  }
  RC_ASSERT(joined.metrics.size() == batch.metrics.size());
  for (std::size_t i = 0; i < joined.metrics.size(); ++i)
    RC_ASSERT(joined.metrics[i].step == std::int64_t(i));
  RC_ASSERT(joined.params.size() == batch.params.size());
  RC_ASSERT(joined.tags.size() == batch.tags.size());
}

TEST(LogBatchBody, SpellsNonFiniteValuesAsProtobufJsonAndKeepsInt64Exact) {
  Batch batch;
  const double inf = std::numeric_limits<double>::infinity();
  batch.metrics = {{"a", std::nan(""), 9007199254740993, -3},
                   {"b", inf, 1, 0},
                   {"c", -inf, 1, 0},
                   {"d", 0.1, 1, 0}};
  batch.params = {{"p", "v"}};
  const auto body = nlohmann::json::parse(log_batch_body("r1", batch));
  EXPECT_EQ(body["run_id"], "r1");
  EXPECT_EQ(body["metrics"][0]["value"], "NaN");
  EXPECT_EQ(body["metrics"][0]["timestamp"].get<std::int64_t>(), 9007199254740993);
  EXPECT_EQ(body["metrics"][0]["step"].get<std::int64_t>(), -3);
  EXPECT_EQ(body["metrics"][1]["value"], "Infinity");
  EXPECT_EQ(body["metrics"][2]["value"], "-Infinity");
  EXPECT_EQ(body["metrics"][3]["value"].get<double>(), 0.1);
  EXPECT_EQ(body["params"][0]["key"], "p");
  EXPECT_FALSE(body.contains("tags"));
}

TEST(FileStore, WritesMlflowsLayout) {
  const fs::path root = temp_root();
  FileStore store(root);
  EXPECT_TRUE(fs::is_directory(root / ".trash"));
  EXPECT_NE(read(root / "0" / "meta.yaml").find("name: Default"), std::string::npos);
  const std::string experiment = store.experiment_by_name("my experiment");
  EXPECT_EQ(experiment.size(), 18u);
  EXPECT_EQ(store.experiment_by_name("my experiment"), experiment);  // found, not created again
  EXPECT_NE(read(root / experiment / "meta.yaml").find("name: 'my experiment'"), std::string::npos);

  const RunInfo run = store.create_run(experiment, "train(int)", 1700000000000, {{"k", "v"}});
  const fs::path dir = root / experiment / run.run_id;
  EXPECT_EQ(run.run_id.size(), 32u);
  for (const char* sub : {"metrics", "params", "tags", "artifacts"}) {
    EXPECT_TRUE(fs::is_directory(dir / sub)) << sub;
  }
  EXPECT_EQ(read(dir / "tags" / "k"), "v");
  EXPECT_EQ(read(dir / "tags" / "mlflow.runName"), "train(int)");
  const std::string meta = read(dir / "meta.yaml");
  EXPECT_NE(meta.find("status: 1\n"), std::string::npos) << meta;
  EXPECT_NE(meta.find("start_time: 1700000000000\n"), std::string::npos) << meta;

  Batch batch;
  batch.metrics = {
      {"train/loss", 1.5, 10, 0}, {"train/loss", 2.0, 11, 1}, {"nan", std::nan(""), 12, 2}};
  batch.params = {{"lr", "0.1"}};
  store.log_batch(run.run_id, batch);
  EXPECT_EQ(lines_of(dir / "metrics" / "train" / "loss"),
            (std::vector<std::string>{"10 1.5 0", "11 2.0 1"}));
  EXPECT_EQ(lines_of(dir / "metrics" / "nan"), std::vector<std::string>{"12 nan 2"});
  EXPECT_EQ(read(dir / "params" / "lr"), "0.1");

  store.end_run(run.run_id, RunStatus::kKilled, 1700000001000);
  EXPECT_EQ(store.get_run(run.run_id).status, RunStatus::kKilled);
  EXPECT_EQ(store.get_run(run.run_id).end_time_ms, 1700000001000);
  EXPECT_EQ(store.run_link(run), dir.string());
}

// A run with lr=0.1, then a batch that changes lr beside a new param and a metric: the
// store refuses it (not transient, naming `named`). Returns the run, for the caller to
// check that the neighbours arrived anyway.
RunInfo log_a_changed_param(Store& store, const std::string& named) {
  const RunInfo run = store.create_run("0", "r", 1, {});
  store.log_batch(run.run_id, Batch{{}, {{"lr", "0.1"}}, {}});
  Batch batch;
  batch.params = {{"lr", "0.2"}, {"momentum", "0.9"}};
  batch.metrics = {{"loss", 1, 1, 1}};
  try {
    store.log_batch(run.run_id, batch);
    ADD_FAILURE() << "a changed param was accepted";
  } catch (const StoreError& e) {
    EXPECT_FALSE(e.transient());
    EXPECT_NE(std::string(e.what()).find(named), std::string::npos) << e.what();
  }
  return run;
}

TEST(FileStore, ARefusedParamDoesNotDropItsNeighbours) {
  FileStore store(temp_root());
  const RunInfo run = log_a_changed_param(store, "lr");
  const fs::path dir = store.root() / "0" / run.run_id;
  EXPECT_EQ(read(dir / "params" / "lr"), "0.1");
  EXPECT_EQ(read(dir / "params" / "momentum"), "0.9");
  EXPECT_EQ(lines_of(dir / "metrics" / "loss").size(), 1u);
}

TEST(FileStore, AppendsFromEightProcessesNeverInterleaveWithinALine) {
  const fs::path root = temp_root();
  std::string run_id;
  {
    FileStore store(root);
    run_id = store.create_run("0", "r", 1, {}).run_id;
  }
  constexpr int kWriters = 8, kBatches = 50, kPerBatch = 40;
  std::vector<pid_t> pids;
  for (int w = 0; w < kWriters; ++w) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      FileStore store(root);
      for (int b = 0; b < kBatches; ++b) {
        Batch batch;
        for (int i = 0; i < kPerBatch; ++i) {
          const int step = b * kPerBatch + i;
          batch.metrics.push_back(
              {"shared/key", w * 1e6 + step + 0.123456789, 1700000000000 + w, step});
        }
        store.log_batch(run_id, batch);
      }
      ::_exit(0);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  std::set<std::pair<int, int>> seen;
  for (const std::string& line : lines_of(root / "0" / run_id / "metrics" / "shared" / "key")) {
    std::istringstream fields(line);
    long long stamp = 0, step = -1;
    double value = 0;
    std::string rest;
    ASSERT_TRUE(fields >> stamp >> value >> step) << line;
    ASSERT_FALSE(fields >> rest) << line;
    const int writer = static_cast<int>(stamp - 1700000000000);
    ASSERT_EQ(value, writer * 1e6 + step + 0.123456789) << line;
    seen.insert({writer, static_cast<int>(step)});
  }
  EXPECT_EQ(seen.size(), static_cast<std::size_t>(kWriters * kBatches * kPerBatch));
}

std::string db_uri() {
  return "sqlite:///" + (sgpu::testing::make_temp_dir("sgpu-store-test") / "mlflow.db").string();
}

// One value from the database, through SQLite's own API (not the store's).
std::string query(const fs::path& db, const std::string& sql) {
  sqlite3* handle = nullptr;
  EXPECT_EQ(sqlite3_open_v2(db.c_str(), &handle, SQLITE_OPEN_READONLY, nullptr), SQLITE_OK);
  sqlite3_stmt* stmt = nullptr;
  EXPECT_EQ(sqlite3_prepare_v2(handle, sql.c_str(), -1, &stmt, nullptr), SQLITE_OK) << sql;
  std::string value;
  if (sqlite3_step(stmt) == SQLITE_ROW && sqlite3_column_text(stmt, 0) != nullptr) {
    value = reinterpret_cast<const char*>(sqlite3_column_text(stmt, 0));
  }
  sqlite3_finalize(stmt);
  sqlite3_close(handle);
  return value;
}

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

TEST(SqliteStore, EightProcessesWritingAtOnceLoseNothing) {
  const std::string uri = db_uri();
  std::string run_id;
  {
    SqliteStore store(uri);
    run_id = store.create_run("0", "r", 1, {}).run_id;
  }
  constexpr int kWriters = 8, kBatches = 50, kPerBatch = 40;
  std::vector<pid_t> pids;
  for (int w = 0; w < kWriters; ++w) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      try {
        SqliteStore store(uri);  // each opens the database as it is, at once
        for (int b = 0; b < kBatches; ++b) {
          Batch batch;
          for (int i = 0; i < kPerBatch; ++i) {
            batch.metrics.push_back(
                {"shared/key", w * 1e6 + b * kPerBatch + i, 1, b * kPerBatch + i});
          }
          store.log_batch(run_id, batch);
        }
      } catch (const std::exception& e) {
        std::fprintf(stderr, "writer %d: %s\n", w, e.what());
        ::_exit(1);
      }
      ::_exit(0);
    }
    pids.push_back(pid);
  }
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0);
  }
  EXPECT_EQ(query(sqlite_path_of(uri), "SELECT count(*) FROM metrics"),
            std::to_string(kWriters * kBatches * kPerBatch));
  // The last step, and of the writers that logged it at the same time the greatest value.
  EXPECT_EQ(std::stod(query(sqlite_path_of(uri), "SELECT value FROM latest_metrics")),
            7e6 + kBatches * kPerBatch - 1);
}

TEST(Spool, RoundTripsBatchesWithNonFiniteValues) {
  const fs::path file = temp_root().parent_path() / "spool.jsonl";
  Batch batch;
  batch.metrics = {{"a", std::nan(""), 5, 6},
                   {"b", -std::numeric_limits<double>::infinity(), 7, 8}};
  batch.tags = {{"t", "v"}};
  spool_batch(file, "run1", batch);
  spool_batch(file, "run2", Batch{{{"c", 1.25, 1, 2}}, {}, {}});
  const auto spooled = read_spool(file);
  ASSERT_EQ(spooled.size(), 2u);
  EXPECT_EQ(spooled[0].run_id, "run1");
  EXPECT_TRUE(std::isnan(spooled[0].batch.metrics[0].value));
  EXPECT_EQ(spooled[0].batch.metrics[0].timestamp_ms, 5);
  EXPECT_EQ(spooled[0].batch.metrics[1].value, -std::numeric_limits<double>::infinity());
  EXPECT_EQ(spooled[0].batch.tags[0].value, "v");
  EXPECT_EQ(spooled[1].batch.metrics[0].value, 1.25);
}

TEST(Spool, SkipsDamagedLinesAndKeepsTheRest) {
  const fs::path file = temp_root().parent_path() / "damaged.jsonl";
  spool_batch(file, "run1", Batch{{{"a", 1, 1, 1}}, {}, {}});
  {
    std::ofstream out(file, std::ios::app);
    out << R"({"run_id": "run1", "metrics": [{"key": 7}]})"
        << "\n"
        << R"({"run_id": 5})"
        << "\n"
        // A timestamp no integer holds (once undefined behaviour; tests/fuzz/corpus/
        // spool_huge_timestamp): a damaged line too.
        << R"({"run_id": "run1", "metrics": [{"key": "k", "value": 1, "timestamp": 1.7e125, )"
        << R"("step": 1}]})"
        << "\n"
        << "not json\n";
  }
  spool_batch(file, "run2", Batch{{}, {{"p", "v"}}, {}});
  {
    std::ofstream out(file, std::ios::app);
    out << R"({"run_id": "run3", "metr)";  // torn
  }
  const auto spooled = read_spool(file);
  ASSERT_EQ(spooled.size(), 2u);
  EXPECT_EQ(spooled[0].run_id, "run1");
  EXPECT_EQ(spooled[1].run_id, "run2");
  EXPECT_EQ(spooled[1].batch.params[0].value, "v");
}

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

TEST(RunLogger, TenThousandMetricsInOneFlushAllArriveAndABadKeyThrowsAtTheCall) {
  const fs::path root = temp_root();
  auto store = std::make_unique<FileStore>(root);
  const std::string run_id = store->create_run("0", "r", 1, {}).run_id;
  LoggerSettings settings;
  settings.run_id = run_id;
  settings.flush_interval = std::chrono::hours(1);  // only flush() sends
  RunLogger logger(std::move(store), settings);
  for (int step = 0; step < 10'000; ++step) logger.log_metric("loss", step * 0.5, step);
  EXPECT_THROW(logger.log_metric("bad key!", 1, 0), TrackingError);
  logger.log_param("long", std::string(7000, 'x'));
  EXPECT_TRUE(logger.flush());
  const fs::path dir = root / "0" / run_id;
  const auto lines = lines_of(dir / "metrics" / "loss");
  ASSERT_EQ(lines.size(), 10'000u);
  EXPECT_EQ(lines.back().substr(lines.back().find(' ')), " 4999.5 9999");
  EXPECT_EQ(read(dir / "params" / "long").size(), kMaxParamValueLength);
}

#if SGPU_WITH_TRACKING_SERVER
// A tiny HTTP responder: answers each request with the next canned response (status and
// body), records what it got, and closes the connection.
class Responder {
 public:
  explicit Responder(std::vector<std::pair<int, std::string>> answers)
      : answers_(std::move(answers)), fd_(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0)) {
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ::bind(fd_, reinterpret_cast<sockaddr*>(&addr), sizeof addr);
    ::listen(fd_, 16);
    socklen_t len = sizeof addr;
    ::getsockname(fd_, reinterpret_cast<sockaddr*>(&addr), &len);
    port_ = ntohs(addr.sin_port);
    thread_ = std::thread([this] {
      for (const auto& [status, body] : answers_) {
        const int client = ::accept(fd_, nullptr, nullptr);
        if (client < 0) return;
        std::string request;
        char buffer[65536];
        // Headers, then as much body as Content-Length says.
        while (request.find("\r\n\r\n") == std::string::npos) {
          const ssize_t n = ::read(client, buffer, sizeof buffer);
          if (n <= 0) break;
          request.append(buffer, static_cast<std::size_t>(n));
        }
        const auto length_at = request.find("Content-Length: ");
        if (length_at != std::string::npos) {
          const std::size_t length = std::stoul(request.substr(length_at + 16));
          while (request.size() - request.find("\r\n\r\n") - 4 < length) {
            const ssize_t n = ::read(client, buffer, sizeof buffer);
            if (n <= 0) break;
            request.append(buffer, static_cast<std::size_t>(n));
          }
        }
        requests_.push_back(request);
        const std::string reply = "HTTP/1.1 " + std::to_string(status) +
                                  " X\r\nContent-Type: application/json\r\nContent-Length: " +
                                  std::to_string(body.size()) + "\r\nConnection: close\r\n\r\n" +
                                  body;
        [[maybe_unused]] ssize_t w = ::write(client, reply.data(), reply.size());
        ::close(client);
      }
    });
  }
  ~Responder() {
    ::shutdown(fd_, SHUT_RDWR);
    ::close(fd_);
    thread_.join();
  }
  std::string uri() const { return "http://127.0.0.1:" + std::to_string(port_); }
  // Valid once the responder answered them all.
  const std::vector<std::string>& requests() const { return requests_; }

 private:
  std::vector<std::pair<int, std::string>> answers_;
  int fd_;
  int port_ = 0;
  std::vector<std::string> requests_;
  std::thread thread_;
};

constexpr RetryPolicy kFastRetries{4, std::chrono::milliseconds(10), std::chrono::seconds(5),
                                   std::chrono::seconds(1)};

TEST(RestStore, RetriesTransientFailuresAndSendsTheBearerToken) {
  ::setenv("MLFLOW_TRACKING_TOKEN", "s3cret-token", 1);
  const std::string run = R"({"run": {"info": {"run_id": "abc", "experiment_id": "7",
      "status": "RUNNING", "start_time": "1700000000000", "end_time": 1700000000001}}})";
  {
    Responder server({{503, "{}"}, {429, "{}"}, {200, run}});
    RestStore store(server.uri(), kFastRetries);
    const RunInfo info = store.get_run("abc");
    EXPECT_EQ(info.run_id, "abc");
    EXPECT_EQ(info.experiment_id, "7");
    EXPECT_EQ(info.start_time_ms, 1700000000000);  // an int64 given as a string
    EXPECT_EQ(info.end_time_ms, 1700000000001);    // and as a number
    EXPECT_EQ(store.requests_sent(), 3u);
    EXPECT_EQ(store.run_link({"7", "abc"}), server.uri() + "/#/experiments/7/runs/abc");
    ASSERT_EQ(server.requests().size(), 3u);
    EXPECT_NE(server.requests()[2].find("Authorization: Bearer s3cret-token"), std::string::npos);
  }
  ::unsetenv("MLFLOW_TRACKING_TOKEN");
}

TEST(RestStore, CredentialsNeverAppearInErrors) {
  ::setenv("MLFLOW_TRACKING_USERNAME", "alice", 1);
  ::setenv("MLFLOW_TRACKING_PASSWORD", "pa55word", 1);
  Responder server({{401, R"({"error_code": "UNAUTHENTICATED", "message": "bad credentials"})"}});
  RestStore store(server.uri(), kFastRetries);
  try {
    store.get_run("abc");
    FAIL() << "a 401 was accepted";
  } catch (const StoreError& e) {
    const std::string what = e.what();
    EXPECT_FALSE(e.transient());
    EXPECT_NE(what.find("MLFLOW_TRACKING_USERNAME"), std::string::npos) << what;
    EXPECT_EQ(what.find("pa55word"), std::string::npos) << what;
  }
  EXPECT_NE(server.requests().at(0).find("Authorization: Basic "), std::string::npos);
  ::unsetenv("MLFLOW_TRACKING_USERNAME");
  ::unsetenv("MLFLOW_TRACKING_PASSWORD");
  // Credentials in the URI are hidden too.
  RestStore unreachable("http://bob:hunter2@127.0.0.1:1", RetryPolicy{1});
  try {
    unreachable.get_run("abc");
    FAIL() << "a server on port 1 answered";
  } catch (const StoreError& e) {
    EXPECT_TRUE(e.transient());
    EXPECT_EQ(std::string(e.what()).find("hunter2"), std::string::npos) << e.what();
  }
}

TEST(RestStore, ARefusedBatchIsSentAgainEntryByEntrySoNeighboursArrive) {
  const std::string refused = R"({"error_code": "INVALID_PARAMETER_VALUE", "message": "no"})";
  // The batch of three is refused; then "a" is taken, "b" refused, "c" taken.
  Responder server({{400, refused}, {200, "{}"}, {400, refused}, {200, "{}"}});
  RestStore store(server.uri(), kFastRetries);
  Batch batch;
  batch.params = {{"a", "1"}, {"b", "2"}, {"c", "3"}};
  try {
    store.log_batch("run", batch);
    FAIL() << "the refusal was not reported";
  } catch (const StoreError& e) {
    EXPECT_FALSE(e.transient());
    EXPECT_NE(std::string(e.what()).find("param 'b'"), std::string::npos) << e.what();
  }
  ASSERT_EQ(server.requests().size(), 4u);
  EXPECT_NE(server.requests()[3].find(R"("key":"c")"), std::string::npos);
}
#else
TEST(RestStore, AnHttpUriSaysThisBuildHasNoServerStore) {
  try {
    open_store("http://127.0.0.1:1");
    FAIL() << "an http URI was accepted";
  } catch (const TrackingError& e) {
    EXPECT_NE(std::string(e.what()).find("built without libcurl"), std::string::npos) << e.what();
  }
}
#endif  // SGPU_WITH_TRACKING_SERVER

}  // namespace
}  // namespace sgpu::tracking
