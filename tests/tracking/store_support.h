// What the tracking stores' tests share: a fresh mlruns folder or database, a file's text,
// a refused param's check, and a value read from a database through SQLite's own API.
#pragma once

#include <gtest/gtest.h>
#include <sqlite3.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdio>
#include <exception>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "testing/temp_dir.h"
#include "tracking/run_model.h"
#include "tracking/store.h"

namespace sgpu::tracking {

namespace fs = std::filesystem;

inline fs::path temp_root() { return sgpu::testing::make_temp_dir("sgpu-store-test") / "mlruns"; }

inline std::string read(const fs::path& path) {
  std::ifstream in(path);
  std::ostringstream text;
  text << in.rdbuf();
  return text.str();
}

inline std::vector<std::string> lines_of(const fs::path& path) {
  std::vector<std::string> lines;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

// A run with lr=0.1, then a batch that changes lr beside a new param and a metric: the
// store refuses it (not transient, naming `named`). Returns the run, for the caller to
// check that the neighbours arrived anyway.
inline RunInfo log_a_changed_param(Store& store, const std::string& named) {
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

inline std::string db_uri() {
  return "sqlite:///" + (sgpu::testing::make_temp_dir("sgpu-store-test") / "mlflow.db").string();
}

// One value from the database, through SQLite's own API (not the store's).
inline std::string query(const fs::path& db, const std::string& sql) {
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

// `write(w)` in `writers` processes at once, w = 0 to writers-1; true when every one of
// them returned (an exception is said on stderr and fails it).
inline bool in_processes(int writers, const std::function<void(int writer)>& write) {
  std::vector<pid_t> pids;
  for (int w = 0; w < writers; ++w) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      try {
        write(w);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "writer %d: %s\n", w, e.what());
        ::_exit(1);
      }
      ::_exit(0);
    }
    pids.push_back(pid);
  }
  bool all = true;
  for (pid_t pid : pids) {
    int status = 0;
    ::waitpid(pid, &status, 0);
    all = all && WIFEXITED(status) && WEXITSTATUS(status) == 0;
  }
  return all;
}

}  // namespace sgpu::tracking
