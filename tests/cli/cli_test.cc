// The sgpu command as a user runs it: a real PyTorch DDP script under `sgpu run`, a crash
// on one rank, timeout, mismatch and bad flags, with their exit codes and messages; and
// `sgpu tracking sync` sending runs that were left pending.
#include <gtest/gtest.h>
#include <poll.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "contract/option_table.h"
#include "testing/process_table.h"
#include "testing/temp_dir.h"
#include "tracking/file/file_store.h"
#include "tracking/pending.h"
#include "tracking/spool.h"

extern char** environ;

namespace {

struct Result {
  int status = -1;  // exit code, or 128+signal
  std::string output;
};

Result sgpu(std::vector<std::string> args, const std::string& extra_env = "") {
  const std::string program =
      (std::filesystem::read_symlink("/proc/self/exe").parent_path() / "sgpu").string();
  args.insert(args.begin(), program);
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::vector<std::string> env_text;
  const std::string replaced = extra_env.substr(0, extra_env.find('=') + 1);
  for (char** e = environ; *e != nullptr; ++e) {
    const std::string var(*e);
    if (var.rfind("SGPU_BACKEND=", 0) == 0) continue;
    if (!extra_env.empty() && var.rfind(replaced, 0) == 0) continue;  // extra_env wins
    env_text.push_back(var);
  }
  if (!extra_env.empty()) env_text.push_back(extra_env);
  std::vector<char*> env;
  for (auto& e : env_text) env.push_back(e.data());
  env.push_back(nullptr);
  int fds[2];
  EXPECT_EQ(::pipe(fds), 0);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
  posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
  posix_spawn_file_actions_addclose(&actions, fds[0]);
  pid_t pid = 0;
  EXPECT_EQ(::posix_spawn(&pid, program.c_str(), &actions, nullptr, argv.data(), env.data()), 0);
  posix_spawn_file_actions_destroy(&actions);
  ::close(fds[1]);
  Result result;
  char buffer[4096];
  for (ssize_t n; (n = ::read(fds[0], buffer, sizeof buffer)) > 0;) result.output.append(buffer, n);
  ::close(fds[0]);
  int status = 0;
  ::waitpid(pid, &status, 0);
  result.status = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return result;
}

void expect_has(const std::string& text, const std::string& part) {
  EXPECT_NE(text.find(part), std::string::npos) << "missing \"" << part << "\" in:\n" << text;
}

const std::string kScript = SGPU_TEST_SOURCE_DIR "/cli/ddp_train.py";

TEST(SgpuRun, PytorchDdpScriptRunsUnchanged) {
  const Result r = sgpu({"run", "--gpus", "4", "--backend", "sim", "--timeout", "300", "--",
                         SGPU_TEST_PYTHON, kScript});
  EXPECT_EQ(r.status, 0) << r.output;
  for (int rank = 0; rank < 4; ++rank) {
    expect_has(r.output, "[rank " + std::to_string(rank) + "] rank " + std::to_string(rank) +
                             ": parameters agree after 5 steps");
  }
}

TEST(SgpuRun, ACrashOnRankTwoExitsWithItsStatusAndLeavesNothing) {
  const std::string marker = "SGPU_TEST_MARKER=cli-crash-" + std::to_string(::getpid());
  const auto run = [&] {
    return sgpu({"run", "--gpus", "4", "--backend", "sim", "--timeout", "300", "--",
                 SGPU_TEST_PYTHON, kScript},
                marker);
  };
  ::setenv("CRASH_RANK", "2", 1);
  const Result r = run();
  ::unsetenv("CRASH_RANK");
  EXPECT_EQ(r.status, 13) << r.output;
  expect_has(r.output, "root cause: rank 2");
  expect_has(r.output, "exited with code 13");
  expect_has(r.output, "rank 2 crashing");
  EXPECT_TRUE(sgpu::testing::processes_with(marker).empty());
}

TEST(SgpuRun, EachLaunchIsAnMlflowRunTheRanksFind) {
  const std::string dir = sgpu::testing::make_temp_dir("sgpu-cli-mlruns").string();
  const Result r =
      sgpu({"run", "--gpus", "2", "--backend", "sim", "--experiment", "cli", "--run-name",
            "nightly smoke", "--", "/bin/sh", "-c", "echo run=$MLFLOW_RUN_ID"},
           "MLFLOW_TRACKING_URI=file:" + dir);
  EXPECT_EQ(r.status, 0) << r.output;
  const auto at = r.output.find("[rank 1] run=");
  ASSERT_NE(at, std::string::npos) << r.output;
  const std::string run_id = r.output.substr(at + 13, 32);
  expect_has(r.output, "sgpu: tracking run " + run_id + ": " + dir + "/");
  expect_has(r.output, "[rank 0] run=" + run_id);
  bool found = false;
  for (const auto& experiment : std::filesystem::directory_iterator(dir)) {
    const auto meta = experiment.path() / run_id / "meta.yaml";
    if (!std::filesystem::exists(meta)) continue;
    found = true;
    std::ifstream in(meta);
    const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    expect_has(text, "status: 3\n");  // FINISHED
    expect_has(text, "run_name: 'nightly smoke'");
  }
  EXPECT_TRUE(found) << "no run " << run_id << " under " << dir;
  std::filesystem::remove_all(dir);
}

// MLflow 3's client refuses a file store unless MLFLOW_ALLOW_FILE_STORE=true: the launch
// gives its ranks that, so mlflow.log_metric inside them lands in the launch's run.
TEST(SgpuRun, MlflowsOwnClientInEveryRankLogsIntoTheLaunchsFileStoreRun) {
  const std::string dir = sgpu::testing::make_temp_dir("sgpu-cli-mlflow").string();
  ::unsetenv("MLFLOW_ALLOW_FILE_STORE");
  const Result r = sgpu({"run", "--gpus", "2", "--backend", "sim", "--timeout", "300", "--",
                         SGPU_TEST_PYTHON, SGPU_TEST_SOURCE_DIR "/cli/mlflow_log.py"},
                        "MLFLOW_TRACKING_URI=file:" + dir);
  ASSERT_EQ(r.status, 0) << r.output;
  const auto at = r.output.find("sgpu: tracking run ");
  ASSERT_NE(at, std::string::npos) << r.output;
  const std::string run_id = r.output.substr(at + 19, 32);
  expect_has(r.output, "[rank 0] rank 0: logged into " + run_id);
  expect_has(r.output, "[rank 1] rank 1: logged into " + run_id);
  int runs_found = 0;
  for (const auto& experiment : std::filesystem::directory_iterator(dir)) {
    const auto metrics = experiment.path() / run_id / "metrics";
    if (!std::filesystem::exists(metrics)) continue;
    ++runs_found;
    for (int rank = 0; rank < 2; ++rank) {
      std::ifstream in(metrics / ("loss_rank" + std::to_string(rank)));
      std::vector<std::pair<double, int>> points;  // value, step
      long long timestamp = 0;
      double value = 0;
      int step = 0;
      while (in >> timestamp >> value >> step) points.emplace_back(value, step);
      const std::vector<std::pair<double, int>> expected = {
          {rank + 0.0, 0}, {rank + 0.1, 1}, {rank + 0.2, 2}};
      EXPECT_EQ(points, expected) << "rank " << rank;
    }
  }
  EXPECT_EQ(runs_found, 1) << "run " << run_id << " under " << dir << "\n" << r.output;
  for (const auto& experiment : std::filesystem::directory_iterator(dir)) {
    std::ifstream meta(experiment.path() / run_id / "meta.yaml");
    if (!meta) continue;
    const std::string text((std::istreambuf_iterator<char>(meta)), {});
    expect_has(text, "run_name: mlflow_log.py\n");  // the script's name, not the command
  }
  std::filesystem::remove_all(dir);
}

TEST(SgpuRun, TimeoutExits124) {
  const Result r =
      sgpu({"run", "--gpus", "2", "--backend", "sim", "--timeout", "1", "--", "sleep", "60"});
  EXPECT_EQ(r.status, 124) << r.output;
  expect_has(r.output, "ranks still running: 0, 1");
}

TEST(SgpuRun, MismatchExits3BeforeStartingAnything) {
  const Result r =
      sgpu({"run", "--gpus", "2", "--backend", "sim", "--gpu-type", "A10", "--", "true"});
  EXPECT_EQ(r.status, 3) << r.output;
  expect_has(r.output, "gpu_type \"A10\" requested but this node has 8 x H100");
}

TEST(SgpuRun, BadFlagsExit2WithUsage) {
  Result r = sgpu({"run", "--gpus", "two", "--", "true"});
  EXPECT_EQ(r.status, 2) << r.output;
  expect_has(r.output, "--gpus");
  r = sgpu({"run", "--gpus", "2", "--backend", "sim", "--timeout", "soon", "--", "true"});
  EXPECT_EQ(r.status, 2) << r.output;
  expect_has(r.output, "--timeout takes seconds or none");
  // No number of seconds, or none that is positive (once undefined behaviour in the
  // conversion; found by tests/fuzz/decoders_fuzz.cc).
  r = sgpu({"run", "--gpus", "2", "--backend", "sim", "--timeout", "nan", "--", "true"});
  EXPECT_EQ(r.status, 2) << r.output;
  expect_has(r.output, "--timeout takes seconds or none, got \"nan\"");
  for (const char* seconds : {"-1e300", "-inf", "0"}) {
    r = sgpu({"run", "--gpus", "2", "--backend", "sim", "--timeout", seconds, "--", "true"});
    EXPECT_EQ(r.status, 2) << seconds << ": " << r.output;
    expect_has(r.output, "--timeout must be positive, got ");
    expect_has(r.output, "use --timeout none for no deadline");
  }
  // Past what a clock holds, no deadline: the launch runs.
  for (const char* seconds : {"inf", "1e300", "1e10"}) {
    r = sgpu({"run", "--gpus", "2", "--backend", "sim", "--timeout", seconds, "--", "true"});
    EXPECT_EQ(r.status, 0) << seconds << ": " << r.output;
  }
  r = sgpu({"launch"});
  EXPECT_EQ(r.status, 2) << r.output;
  r = sgpu({"run", "--gpus", "2", "--backend", "sim", "--sim-compute", "fake", "--", "true"});
  EXPECT_EQ(r.status, 2) << r.output;
  expect_has(r.output, "--sim-compute fake is not what simulated ranks compute");
}

// --sim-compute shapes is for a Python program, which says so once it runs in shapes; any
// other program fails, though it exited 0, rather than pass having computed values.
TEST(SgpuRun, ShapeOnlyComputeFailsAProgramThatNeverRanInIt) {
  const Result r =
      sgpu({"run", "--gpus", "2", "--backend", "sim", "--sim-compute", "shapes", "--", "true"});
  EXPECT_EQ(r.status, 1) << r.output;
  expect_has(r.output, "ConfigError: true ended without running in shape-only compute");
}

void expect_lacks(const std::string& text, const std::string& part) {
  EXPECT_EQ(text.find(part), std::string::npos) << "unexpected \"" << part << "\" in:\n" << text;
}

// Advice names the command's flags (NOTE [Front ends]), never the C++ API's spellings.
TEST(SgpuRun, MessagesNameFlagsNotCppSymbols) {
  Result r = sgpu({"run", "--gpus", "2", "--backend", "sim", "--timeout", "-5", "--", "true"});
  EXPECT_EQ(r.status, 2) << r.output;
  expect_has(r.output, "--timeout must be positive, got -5000 ms");
  expect_lacks(r.output, "sgpu::");
  r = sgpu({"run", "--gpus", "2", "--backend", "sim", "--gpu-type", "A10", "--", "true"});
  EXPECT_EQ(r.status, 3) << r.output;
  expect_has(r.output, "pass --gpu-type H100 or leave it unset");
  expect_lacks(r.output, "gpu_type=");
  r = sgpu({"run", "--gpus", "9", "--backend", "sim", "--gpu-type", "H100", "--", "true"});
  EXPECT_EQ(r.status, 3) << r.output;
  expect_has(r.output, "pass --gpus 8 or fewer");
  r = sgpu({"run", "--gpus", "0", "--backend", "sim", "--", "true"});
  EXPECT_EQ(r.status, 2) << r.output;
  expect_has(r.output, "--gpus must be at least 1, got 0");
  r = sgpu({"run", "--gpus", "1", "--backend", "cuda", "--", "true"});
  if (r.status != 0) {  // a node without a GPU: the advice is the simulated backend's flag
    EXPECT_EQ(r.status, 3) << r.output;
    expect_has(r.output, "pass --backend sim to simulate one");
    expect_lacks(r.output, "backend=");
  }
}

TEST(SgpuRun, AProgramThatCannotRunIsAnErrorBeforeAnyRankStarts) {
  const std::string dir = sgpu::testing::make_temp_dir("sgpu-cli-noprog").string();
  Result r = sgpu({"run", "--gpus", "2", "--backend", "sim", "--log-dir", dir, "--",
                   "sgpu-no-such-program", "--flag"});
  EXPECT_EQ(r.status, 2) << r.output;
  expect_has(r.output, "cannot run \"sgpu-no-such-program\": no executable of that name on PATH");
  expect_lacks(r.output, "[rank");
  expect_lacks(r.output, "tracking run");
  EXPECT_TRUE(std::filesystem::is_empty(dir)) << "no run folder for a launch that never started";
  r = sgpu({"run", "--gpus", "2", "--backend", "sim", "--", dir + "/missing"});
  EXPECT_EQ(r.status, 2) << r.output;
  expect_has(r.output, "cannot run \"" + dir + "/missing\": no such file");
  r = sgpu({"run", "--gpus", "2", "--backend", "sim", "--", dir});
  EXPECT_EQ(r.status, 2) << r.output;
  expect_has(r.output, "it is not an executable file");
  std::filesystem::remove_all(dir);
}

TEST(SgpuRun, ATrackingUriThatCannotWorkExits2BeforeStartingAnything) {
  const Result r =
      sgpu({"run", "--gpus", "2", "--backend", "sim", "--", "true"}, "MLFLOW_TRACKING_URI=ftp://x");
  EXPECT_EQ(r.status, 2) << r.output;
  expect_has(r.output, "sgpu run: tracking: unsupported tracking URI scheme in 'ftp://...'");
}

TEST(SgpuRun, SignalDeathExits128PlusSignal) {
  const Result r =
      sgpu({"run", "--gpus", "1", "--backend", "sim", "--", "sh", "-c", "kill -SEGV $$"});
  EXPECT_EQ(r.status, 139) << r.output;
  expect_has(r.output, "SIGSEGV");
}

TEST(SgpuBench, CollectivesRunsTheBenchmarkWithSgpuRunsOptions) {
  const Result r = sgpu({"bench",    "collectives", "--gpus",      "2",        "--backend",
                         "sim",      "--timeout",   "300",         "--ops",    "allreduce",
                         "--dtypes", "float32",     "--min-bytes", "1K",       "--max-bytes",
                         "2K",       "--iters",     "2",           "--warmup", "1"});
  EXPECT_EQ(r.status, 0) << r.output;
  expect_has(r.output, "allreduce/float32/1024/sgpu");
  expect_has(r.output, "allreduce/float32/2048/floor");
  expect_has(r.output, "backend sim, 2 ranks");
  expect_has(r.output, "vs_floor");
}

TEST(SgpuBench, BadFlagsExit2WithUsage) {
  Result r = sgpu({"bench", "collectives", "--gpus", "two"});
  EXPECT_EQ(r.status, 2) << r.output;
  expect_has(r.output, "--gpus");
  expect_has(r.output, "Usage");
  r = sgpu({"bench", "collectives", "--backend", "sim", "--ops", "allsum"});
  EXPECT_EQ(r.status, 2) << r.output;
  expect_has(r.output, "unknown allsum");
  r = sgpu({"bench", "throughput"});
  EXPECT_EQ(r.status, 2) << r.output;
}

TEST(SgpuInfo, ListsTheBackends) {
  const Result r = sgpu({"info"});
  EXPECT_EQ(r.status, 0) << r.output;
  expect_has(r.output, "backend sim: 8 x H100");
  expect_has(r.output, "libtorch");
}

TEST(SgpuTrackingSync, SendsPendingRunsAndExits1WhileAStoreIsStillUnreachable) {
  namespace tracking = sgpu::tracking;
  const auto dir = sgpu::testing::make_temp_dir("sgpu-cli-sync");
  const std::string runs = (dir / "runs").string();
  Result r = sgpu({"tracking", "sync", "--log-dir", runs});
  EXPECT_EQ(r.status, 0) << r.output;
  expect_has(r.output, "nothing is pending");

  tracking::FileStore store(dir / "mlruns");
  const tracking::RunInfo run = store.create_run("0", "train", 1700000000000, {});
  const std::filesystem::path folder = dir / "runs" / "20261129-101500-1-0";
  std::filesystem::create_directories(folder / "rank-0");
  tracking::spool_batch(folder / "rank-0" / tracking::kSpoolName, run.run_id,
                        tracking::Batch{{{"loss", 0.5, 1700000000100, 7}}, {}, {}});
  tracking::write_pending(folder, {store.uri(), run.run_id, tracking::RunStatus::kFinished,
                                   1700000000200, /*remove_folder=*/true});
  const std::filesystem::path down = dir / "runs" / "20261129-101600-1-0";
  std::filesystem::create_directories(down);
  tracking::write_pending(
      down, {"http://127.0.0.1:1", "abc", tracking::RunStatus::kFailed, 1700000000300, true});

  r = sgpu({"tracking", "sync", "--log-dir", runs});
  EXPECT_EQ(r.status, 1) << r.output;
  expect_has(r.output, "run " + run.run_id);
  expect_has(r.output, "1 entries sent, ended FINISHED");
  expect_has(r.output, "run abc");
  expect_has(r.output, "is still pending");
  expect_has(r.output, "1 run(s) sent, 1 still pending in " + runs);
  EXPECT_EQ(store.get_run(run.run_id).status, tracking::RunStatus::kFinished);
  EXPECT_EQ(store.get_run(run.run_id).end_time_ms, 1700000000200);
  EXPECT_FALSE(std::filesystem::exists(folder));
  EXPECT_TRUE(std::filesystem::exists(down / tracking::kPendingName));
  // SGPU_RUNS_DIR is where it looks by default.
  std::filesystem::remove_all(down);
  r = sgpu({"tracking", "sync"}, "SGPU_RUNS_DIR=" + runs);
  EXPECT_EQ(r.status, 0) << r.output;
  expect_has(r.output, "0 run(s) sent, 0 still pending in " + runs);
}

TEST(SgpuHelp, EveryCommandHasHelpWithExamples) {
  for (const std::vector<std::string>& args :
       {std::vector<std::string>{"--help"}, std::vector<std::string>{"run", "--help"}}) {
    const Result r = sgpu(args);
    EXPECT_EQ(r.status, 0) << r.output;
    expect_has(r.output, "sgpu run --gpus");
  }
  const Result r = sgpu({"bench", "collectives", "--help"});
  EXPECT_EQ(r.status, 0) << r.output;
  expect_has(r.output, "sgpu bench collectives --gpus 8");
  expect_has(r.output, "--max-bytes");
  const Result sync = sgpu({"tracking", "sync", "--help"});
  EXPECT_EQ(sync.status, 0) << sync.output;
  expect_has(sync.output, "sgpu tracking sync --log-dir");
}

// Advice for the command names the option table's flags (NOTE [The option table]): each is
// one that sgpu run takes.
TEST(SgpuHelp, RunTakesEveryFlagOfTheOptionTable) {
  const Result r = sgpu({"run", "--help"});
  for (const auto& row : sgpu::contract::option_table()) {
    if (!row.flag.empty()) expect_has(r.output, std::string(row.flag) + " ");
  }
}

}  // namespace
