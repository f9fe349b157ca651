#include "tracking/sqlite/sqlite_store.h"

#include <sqlite3.h>

#include <cmath>
#include <limits>
#include <optional>
#include <set>
#include <system_error>
#include <tuple>

#include "tracking/ids.h"

namespace sgpu::tracking {
namespace {

namespace fs = std::filesystem;

[[noreturn]] void fail(sqlite3* db, int rc, const fs::path& path, const std::string& doing) {
  const std::string what = "tracking: MLflow database " + path.string() + ": " + doing + ": " +
                           (db != nullptr ? sqlite3_errmsg(db) : sqlite3_errstr(rc));
  if (rc == SQLITE_BUSY || rc == SQLITE_LOCKED) {
    throw StoreError(what + " (another writer held it for " +
                         std::to_string(SqliteStore::kBusyTimeoutMs / 1000) + " s)",
                     true);
  }
  throw StoreError(what, false);
}

// One prepared statement; binds and reads by position, from 1 and from 0 as SQLite does.
class Statement {
 public:
  Statement(sqlite3* db, const fs::path& path, const char* sql) : db_(db), path_(path) {
    if (const int rc = sqlite3_prepare_v2(db, sql, -1, &stmt_, nullptr); rc != SQLITE_OK) {
      fail(db, rc, path, "preparing a statement");
    }
  }
  ~Statement() { sqlite3_finalize(stmt_); }
  Statement(const Statement&) = delete;
  Statement& operator=(const Statement&) = delete;

  Statement& bind(int i, const std::string& value) {
    sqlite3_bind_text(stmt_, i, value.data(), static_cast<int>(value.size()), SQLITE_TRANSIENT);
    return *this;
  }
  Statement& bind(int i, std::int64_t value) {
    sqlite3_bind_int64(stmt_, i, value);
    return *this;
  }
  Statement& bind(int i, double value) {
    sqlite3_bind_double(stmt_, i, value);
    return *this;
  }
  // True while there is a row to read.
  bool step() {
    const int rc = sqlite3_step(stmt_);
    if (rc == SQLITE_ROW) return true;
    if (rc == SQLITE_DONE) return false;
    fail(db_, rc, path_, "writing");
  }
  void run() {
    step();
    reset();
  }
  void reset() {
    sqlite3_reset(stmt_);
    sqlite3_clear_bindings(stmt_);
  }
  std::string text(int column) const {
    const auto* p = reinterpret_cast<const char*>(sqlite3_column_text(stmt_, column));
    return p != nullptr
               ? std::string(p, static_cast<std::size_t>(sqlite3_column_bytes(stmt_, column)))
               : std::string();
  }
  std::int64_t integer(int column) const { return sqlite3_column_int64(stmt_, column); }
  double real(int column) const { return sqlite3_column_double(stmt_, column); }

 private:
  sqlite3* db_;
  const fs::path& path_;
  sqlite3_stmt* stmt_ = nullptr;
};

void execute(sqlite3* db, const fs::path& path, const char* sql, const std::string& doing) {
  char* message = nullptr;
  const int rc = sqlite3_exec(db, sql, nullptr, nullptr, &message);
  sqlite3_free(message);
  if (rc != SQLITE_OK) fail(db, rc, path, doing);
}

// A write transaction, begun at once (BEGIN IMMEDIATE: it waits for the lock up to the
// busy timeout), rolled back unless committed.
class Transaction {
 public:
  Transaction(sqlite3* db, const fs::path& path) : db_(db), path_(path) {
    execute(db_, path_, "BEGIN IMMEDIATE", "taking the write lock");
  }
  ~Transaction() {
    if (!done_) sqlite3_exec(db_, "ROLLBACK", nullptr, nullptr, nullptr);
  }
  void commit() {
    execute(db_, path_, "COMMIT", "committing");
    done_ = true;
  }

 private:
  sqlite3* db_;
  const fs::path& path_;
  bool done_ = false;
};

std::set<std::string> columns_of(sqlite3* db, const fs::path& path, const std::string& table) {
  Statement info(db, path, ("PRAGMA table_info(\"" + table + "\")").c_str());
  std::set<std::string> columns;
  while (info.step()) columns.insert(info.text(1));
  return columns;
}

// The tables and columns sgpu writes, as MLflow's SQL store has them.
const std::vector<std::pair<std::string, std::vector<std::string>>>& written_columns() {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> tables = {
      {"experiments",
       {"experiment_id", "name", "artifact_location", "lifecycle_stage", "creation_time",
        "last_update_time"}},
      {"runs",
       {"run_uuid", "name", "source_type", "source_name", "entry_point_name", "user_id", "status",
        "start_time", "end_time", "source_version", "lifecycle_stage", "artifact_uri",
        "experiment_id"}},
      {"metrics", {"key", "value", "timestamp", "run_uuid", "step", "is_nan"}},
      {"latest_metrics", {"key", "value", "timestamp", "step", "is_nan", "run_uuid"}},
      {"params", {"key", "value", "run_uuid"}},
      {"tags", {"key", "value", "run_uuid"}},
  };
  return tables;
}

// MLflow's SQL store keeps NaN as 0 with is_nan set and infinities as the largest doubles.
std::pair<double, std::int64_t> sanitized(double value) {
  if (std::isnan(value)) return {0.0, 1};
  if (std::isinf(value)) {
    return {value > 0 ? std::numeric_limits<double>::max() : -std::numeric_limits<double>::max(),
            0};
  }
  return {value, 0};
}

StoreError no_run(const std::string& run_id, const fs::path& path) {
  return StoreError("tracking: no run " + run_id + " in " + path.string(), false);
}

}  // namespace

fs::path sqlite_path_of(const std::string& uri) {
  const std::string prefix = "sqlite:///";
  if (uri.rfind(prefix, 0) != 0 || uri.size() == prefix.size() ||
      uri.find(":memory:") != uri.npos) {
    throw TrackingError("tracking: '" + uri +
                        "' names no database file; use sqlite:///relative/path.db or "
                        "sqlite:////absolute/path.db, as MLflow does");
  }
  const fs::path path = uri.substr(prefix.size());  // "/abs" when the URI had four slashes
  std::error_code ec;
  const fs::path absolute = fs::absolute(path, ec);
  return ec ? path : absolute.lexically_normal();
}

SqliteStore::SqliteStore(const std::string& uri) : path_(sqlite_path_of(uri)) {
  std::error_code ec;
  fs::create_directories(path_.parent_path(), ec);
  const int rc =
      sqlite3_open_v2(path_.c_str(), &db_,
                      SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_FULLMUTEX, nullptr);
  if (rc != SQLITE_OK) {
    const std::string why = db_ != nullptr ? sqlite3_errmsg(db_) : sqlite3_errstr(rc);
    sqlite3_close(db_);
    db_ = nullptr;
    throw StoreUnopened("tracking: cannot open the MLflow database " + path_.string() + ": " + why +
                        "; make its folder writable");
  }
  sqlite3_busy_timeout(db_, kBusyTimeoutMs);
  try {
    create_or_check();
    // Under WAL, a commit need not wait for the disk (only a checkpoint does), and a crash
    // or power loss still leaves the database whole: it may lose the last commits, never
    // its consistency. Eight ranks logging each step commit hundreds of times a call; with
    // each waiting for an fsync, a disk that takes 50 ms for one (a fresh cloud volume)
    // holds their sends past the limit of a rank's end. A journal of another mode keeps
    // SQLite's full synchronisation, which that mode needs.
    Statement mode(db_, path_, "PRAGMA journal_mode");
    if (mode.step() && mode.text(0) == "wal") {
      Statement normal(db_, path_, "PRAGMA synchronous=NORMAL");
      normal.step();
    }
  } catch (...) {
    sqlite3_close(db_);
    db_ = nullptr;
    throw;
  }
}

SqliteStore::~SqliteStore() { sqlite3_close(db_); }

std::string SqliteStore::artifact_root() const { return (path_.parent_path() / "mlruns").string(); }

void SqliteStore::create_or_check() {
  bool created = false;
  {
    Transaction tx(db_, path_);
    std::set<std::string> names;
    {
      Statement tables(db_, path_, "SELECT name FROM sqlite_master WHERE type = 'table'");
      while (tables.step()) names.insert(tables.text(0));
    }
    if (names.empty()) {
      // A new database, as MLflow creates one: its schema, then the Default experiment.
      execute(db_, path_, kMlflowSchema, "creating MLflow's tables");
      const std::int64_t now = now_ms();
      Statement experiment(db_, path_,
                           "INSERT INTO experiments (experiment_id, name, artifact_location, "
                           "lifecycle_stage, creation_time, last_update_time) "
                           "VALUES (0, 'Default', ?, 'active', ?, ?)");
      experiment.bind(1, artifact_root() + "/0").bind(2, now).bind(3, now).run();
      created = true;
    } else if (names.count("alembic_version") == 0) {
      throw TrackingError("tracking: " + path_.string() +
                          " is a SQLite database but not MLflow's (it has no alembic_version "
                          "table); name another file in the sqlite:/// tracking URI");
    }
    tx.commit();
  }
  if (created) {
    // Readers never block the writer, nor the writer the readers; kept in the file.
    Statement wal(db_, path_, "PRAGMA journal_mode=WAL");
    wal.step();
  }
  for (const auto& [table, wanted] : written_columns()) {
    const std::set<std::string> have = columns_of(db_, path_, table);
    for (const std::string& column : wanted) {
      if (have.count(column) == 0) {
        throw TrackingError("tracking: the MLflow database " + path_.string() + " has no column " +
                            table + "." + column +
                            " (an older MLflow made it); upgrade it with `mlflow db upgrade "
                            "sqlite:///" +
                            path_.string() + "`, then run again");
      }
    }
  }
  has_workspaces_ = columns_of(db_, path_, "experiments").count("workspace") != 0;
}

std::string SqliteStore::experiment_by_name(const std::string& name) {
  std::lock_guard lock(mutex_);
  const std::string sql =
      std::string("SELECT experiment_id, lifecycle_stage FROM experiments WHERE name = ?") +
      (has_workspaces_ ? " AND workspace = 'default'" : "");
  const auto find = [&]() -> std::optional<std::pair<std::string, std::string>> {
    Statement select(db_, path_, sql.c_str());
    select.bind(1, name);
    if (!select.step()) return std::nullopt;
    return std::make_pair(std::to_string(select.integer(0)), select.text(1));
  };
  auto found = find();
  if (!found) {
    Transaction tx(db_, path_);
    found = find();  // another writer may have created it meanwhile
    if (!found) {
      const std::int64_t now = now_ms();
      Statement insert(db_, path_,
                       "INSERT INTO experiments (name, lifecycle_stage, creation_time, "
                       "last_update_time) VALUES (?, 'active', ?, ?)");
      insert.bind(1, name).bind(2, now).bind(3, now).run();
      const std::int64_t id = sqlite3_last_insert_rowid(db_);
      Statement location(db_, path_,
                         "UPDATE experiments SET artifact_location = ? WHERE experiment_id = ?");
      location.bind(1, artifact_root() + "/" + std::to_string(id)).bind(2, id).run();
      found = std::make_pair(std::to_string(id), std::string("active"));
    }
    tx.commit();
  }
  if (found->second != "active") {
    throw StoreError("tracking: experiment '" + name + "' is deleted in " + path_.string() +
                         "; restore it (mlflow experiments restore), or choose another "
                         "MLFLOW_EXPERIMENT_NAME",
                     false);
  }
  return found->first;
}

void SqliteStore::check_experiment(const std::string& id) {
  std::lock_guard lock(mutex_);
  Statement select(db_, path_,
                   "SELECT 1 FROM experiments WHERE CAST(experiment_id AS TEXT) = ? AND "
                   "lifecycle_stage = 'active'");
  select.bind(1, id);
  if (!select.step()) {
    throw StoreError("tracking: no experiment with id " + id + " in " + path_.string() +
                         "; check MLFLOW_EXPERIMENT_ID, or name one with MLFLOW_EXPERIMENT_NAME",
                     false);
  }
}

RunInfo SqliteStore::create_run(const std::string& experiment_id, const std::string& run_name,
                                std::int64_t start_time_ms, const std::vector<Tag>& tags) {
  check_experiment(experiment_id);
  std::lock_guard lock(mutex_);
  RunInfo run;
  run.experiment_id = experiment_id;
  run.run_id = random_hex(32);
  run.run_name = run_name;
  run.start_time_ms = start_time_ms;
  Transaction tx(db_, path_);
  {
    Statement location(db_, path_,
                       "SELECT artifact_location FROM experiments WHERE CAST(experiment_id AS "
                       "TEXT) = ?");
    location.bind(1, experiment_id);
    const std::string root =
        location.step() ? location.text(0) : artifact_root() + "/" + experiment_id;
    run.artifact_uri = root + "/" + run.run_id + "/artifacts";
  }
  Statement insert(db_, path_,
                   "INSERT INTO runs (run_uuid, name, source_type, source_name, entry_point_name, "
                   "user_id, status, start_time, end_time, source_version, lifecycle_stage, "
                   "artifact_uri, experiment_id) VALUES (?, ?, 'LOCAL', '', '', ?, 'RUNNING', ?, "
                   "NULL, '', 'active', ?, ?)");
  insert.bind(1, run.run_id)
      .bind(2, run_name)
      .bind(3, current_user())
      .bind(4, start_time_ms)
      .bind(5, run.artifact_uri)
      .bind(6, static_cast<std::int64_t>(std::stoll(experiment_id)))
      .run();
  Statement tag(db_, path_, "INSERT OR REPLACE INTO tags (key, value, run_uuid) VALUES (?, ?, ?)");
  for (const Tag& t : tags) tag.bind(1, t.key).bind(2, t.value).bind(3, run.run_id).run();
  tag.bind(1, std::string("mlflow.runName")).bind(2, run_name).bind(3, run.run_id).run();
  tx.commit();
  return run;
}

void SqliteStore::log_batch(const std::string& run_id, const Batch& batch) {
  if (batch.empty()) return;
  std::lock_guard lock(mutex_);
  Transaction tx(db_, path_);
  {
    Statement run(db_, path_, "SELECT lifecycle_stage FROM runs WHERE run_uuid = ?");
    run.bind(1, run_id);
    if (!run.step()) {
      throw no_run(run_id, path_);
    }
    if (run.text(0) != "active") {
      throw StoreError("tracking: run " + run_id + " is deleted in " + path_.string(), false);
    }
  }
  // A param logged again with another value is refused, after the rest of the batch is in.
  std::string refused;
  Statement existing(db_, path_, "SELECT value FROM params WHERE run_uuid = ? AND key = ?");
  Statement param(db_, path_, "INSERT INTO params (key, value, run_uuid) VALUES (?, ?, ?)");
  for (const Param& p : batch.params) {
    existing.bind(1, run_id).bind(2, p.key);
    if (existing.step()) {
      const std::string before = existing.text(0);
      existing.reset();
      if (before != p.value && refused.empty()) {
        refused = "tracking: param '" + p.key + "' of run " + run_id + " is '" + before +
                  "' already and cannot become '" + p.value +
                  "'; params are written once (log a metric or a tag for what changes)";
      }
      continue;
    }
    existing.reset();
    param.bind(1, p.key).bind(2, p.value).bind(3, run_id).run();
  }
  Statement tag(db_, path_, "INSERT OR REPLACE INTO tags (key, value, run_uuid) VALUES (?, ?, ?)");
  for (const Tag& t : batch.tags) tag.bind(1, t.key).bind(2, t.value).bind(3, run_id).run();
  // A point logged twice (same key, timestamp, step, value) is kept once, as MLflow does;
  // the latest point of a key is the one with the greatest (step, timestamp, value).
  Statement metric(db_, path_,
                   "INSERT OR IGNORE INTO metrics (key, value, timestamp, run_uuid, step, is_nan) "
                   "VALUES (?, ?, ?, ?, ?, ?)");
  Statement latest(db_, path_,
                   "SELECT step, timestamp, value FROM latest_metrics WHERE run_uuid = ? AND "
                   "key = ?");
  Statement set_latest(db_, path_,
                       "INSERT OR REPLACE INTO latest_metrics (key, value, timestamp, step, "
                       "is_nan, run_uuid) VALUES (?, ?, ?, ?, ?, ?)");
  for (const Metric& m : batch.metrics) {
    const auto [value, is_nan] = sanitized(m.value);
    metric.bind(1, m.key)
        .bind(2, value)
        .bind(3, m.timestamp_ms)
        .bind(4, run_id)
        .bind(5, m.step)
        .bind(6, is_nan)
        .run();
    latest.bind(1, run_id).bind(2, m.key);
    const bool newer =
        !latest.step() || std::make_tuple(m.step, m.timestamp_ms, value) >
                              std::make_tuple(latest.integer(0), latest.integer(1), latest.real(2));
    latest.reset();
    if (newer) {
      set_latest.bind(1, m.key)
          .bind(2, value)
          .bind(3, m.timestamp_ms)
          .bind(4, m.step)
          .bind(5, is_nan)
          .bind(6, run_id)
          .run();
    }
  }
  tx.commit();
  if (!refused.empty()) throw StoreError(refused, false);
}

void SqliteStore::end_run(const std::string& run_id, RunStatus status, std::int64_t end_time_ms) {
  std::lock_guard lock(mutex_);
  Transaction tx(db_, path_);
  Statement update(db_, path_, "UPDATE runs SET status = ?, end_time = ? WHERE run_uuid = ?");
  update.bind(1, std::string(status_name(status))).bind(2, end_time_ms).bind(3, run_id).run();
  if (sqlite3_changes(db_) == 0) {
    throw no_run(run_id, path_);
  }
  tx.commit();
}

RunInfo SqliteStore::get_run(const std::string& run_id) {
  std::lock_guard lock(mutex_);
  Statement select(db_, path_,
                   "SELECT experiment_id, name, status, start_time, end_time, artifact_uri FROM "
                   "runs WHERE run_uuid = ?");
  select.bind(1, run_id);
  if (!select.step()) throw no_run(run_id, path_);
  RunInfo run;
  run.run_id = run_id;
  run.experiment_id = std::to_string(select.integer(0));
  run.run_name = select.text(1);
  run.status = status_from_name(select.text(2));
  run.start_time_ms = select.integer(3);
  run.end_time_ms = select.integer(4);
  run.artifact_uri = select.text(5);
  return run;
}

std::string SqliteStore::run_link(const RunInfo& run) const {
  return uri() + " (experiment " + run.experiment_id + ", run " + run.run_id +
         "; mlflow ui --backend-store-uri " + uri() + ")";
}

std::string SqliteStore::uri() const { return "sqlite:///" + path_.string(); }

}  // namespace sgpu::tracking
