// The run of one distributed call (tracking/call_run.h), in a file store: what the run holds
// of the call, the experiment and parent it lands in, what the ranks are told, what end()
// sends and sets, and a run shared by several nodes.
#include "tracking/call_run.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <utility>
#include <vector>

#include "contract/run_folder.h"
#include "sgpu/errors.h"
#include "tracking/file/file_store.h"
#include "tracking/spool.h"
#include "tracking/store_support.h"

namespace sgpu::tracking {
namespace {

// The caller's environment names no store, experiment, parent or switch of its own.
class CallRunTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* name : {"MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME",
                             "MLFLOW_EXPERIMENT_ID", "MLFLOW_RUN_ID", "SGPU_TRACKING"}) {
      ::unsetenv(name);
    }
  }
  void TearDown() override { ::unsetenv("SGPU_TRACKING"); }

  CallRunRequest request(const std::string& function = "train") const {
    CallRunRequest r;
    r.tracking_uri = "file://" + root_.string();
    r.function_name = function;
    r.backend = "sim";
    r.gpu_type = "H100";
    r.gpus = 4;
    return r;
  }
  std::string param(const RunInfo& run, const std::string& key) const {
    return read(root_ / run.experiment_id / run.run_id / "params" / key);
  }
  bool has_param(const RunInfo& run, const std::string& key) const {
    return fs::exists(root_ / run.experiment_id / run.run_id / "params" / key);
  }
  std::string tag(const RunInfo& run, const std::string& key) const {
    return read(root_ / run.experiment_id / run.run_id / "tags" / key);
  }

  const fs::path root_ = temp_root();
};

TEST_F(CallRunTest, TheRunHoldsTheCallsFactsAsParamsAndIsNamedForItsFunction) {
  CallRunRequest r = request();
  r.nnodes = 2;
  r.timeout = std::chrono::milliseconds(5000);
  r.sim_node = "8xH100";
  const std::unique_ptr<CallRun> call = CallRun::begin(r);
  ASSERT_NE(call, nullptr);
  const RunInfo& run = call->info();
  EXPECT_EQ(run.experiment_id, "0");  // Default
  EXPECT_EQ(run.run_name, "train");
  EXPECT_EQ(run.status, RunStatus::kRunning);
  EXPECT_EQ(param(run, "gpus"), "4");
  EXPECT_EQ(param(run, "world_size"), "8");
  EXPECT_EQ(param(run, "nnodes"), "2");
  EXPECT_EQ(param(run, "timeout"), "5000ms");
  EXPECT_EQ(param(run, "function"), "train");
  EXPECT_EQ(param(run, "backend"), "sim");
  EXPECT_EQ(param(run, "gpu_type"), "H100");
  EXPECT_EQ(tag(run, "sgpu.sim_node"), "8xH100");
  EXPECT_EQ(call->link(), FileStore(root_).run_link(run));
}

TEST_F(CallRunTest, ACommandOnOneNodeIsNamedAsGivenWithNoNodeCount) {
  CallRunRequest r = request("python train.py");
  r.program = true;
  r.run_name = "nightly";
  r.source_name = "/work/train.py";
  const std::unique_ptr<CallRun> call = CallRun::begin(r);
  ASSERT_NE(call, nullptr);
  const RunInfo& run = call->info();
  EXPECT_EQ(run.run_name, "nightly");
  EXPECT_EQ(param(run, "command"), "python train.py");
  EXPECT_FALSE(has_param(run, "function"));
  EXPECT_FALSE(has_param(run, "nnodes"));
  EXPECT_EQ(param(run, "timeout"), "none");
  EXPECT_EQ(tag(run, "mlflow.source.name"), "/work/train.py");  // the front end's, not the binary
}

TEST_F(CallRunTest, NoRunWhenTrackingIsOffByOptionOrEnvironment) {
  CallRunRequest off = request();
  off.tracking = false;
  EXPECT_EQ(CallRun::begin(off), nullptr);
  ::setenv("SGPU_TRACKING", "off", 1);
  EXPECT_EQ(CallRun::begin(request()), nullptr);
  EXPECT_EQ(CallRun::join(true, {"file://" + root_.string(), "0", "any"}, sgpu::FrontEnd::kCpp),
            nullptr);
  EXPECT_FALSE(fs::exists(root_ / "0"));  // nothing was written
}

TEST_F(CallRunTest, ANamedExperimentIsCreatedAndTheRunNestsUnderItsParent) {
  const std::unique_ptr<CallRun> parent = CallRun::begin(request("outer"));
  ASSERT_NE(parent, nullptr);
  CallRunRequest r = request();
  r.experiment = "sweeps";
  r.parent_run_id = parent->info().run_id;
  const std::unique_ptr<CallRun> call = CallRun::begin(r);
  ASSERT_NE(call, nullptr);
  EXPECT_EQ(call->info().experiment_id, FileStore(root_).experiment_by_name("sweeps"));
  EXPECT_NE(call->info().experiment_id, "0");
  EXPECT_EQ(tag(call->info(), "mlflow.parentRunId"), parent->info().run_id);
}

TEST_F(CallRunTest, TheParentsExperimentIsTheRunsWhenNoneIsNamed) {
  CallRunRequest outer = request("outer");
  outer.experiment = "team";
  const std::unique_ptr<CallRun> parent = CallRun::begin(outer);
  ASSERT_NE(parent, nullptr);
  ::setenv("MLFLOW_RUN_ID", parent->info().run_id.c_str(), 1);
  const std::unique_ptr<CallRun> call = CallRun::begin(request());
  ::unsetenv("MLFLOW_RUN_ID");
  ASSERT_NE(call, nullptr);
  EXPECT_EQ(call->info().experiment_id, parent->info().experiment_id);
  EXPECT_EQ(tag(call->info(), "mlflow.parentRunId"), parent->info().run_id);
}

TEST_F(CallRunTest, TheRanksAreToldTheRunAndItsStore) {
  const std::unique_ptr<CallRun> call = CallRun::begin(request());
  ASSERT_NE(call, nullptr);
  const auto environment = call->rank_environment();
  const auto value = [&](const std::string& name) {
    const auto found = std::find_if(environment.begin(), environment.end(),
                                    [&](const auto& entry) { return entry.first == name; });
    return found != environment.end() ? found->second : "(unset)";
  };
  const std::string uri = FileStore(root_).uri();
  EXPECT_EQ(value("MLFLOW_RUN_ID"), call->info().run_id);
  EXPECT_EQ(value(kRankRunIdVar), call->info().run_id);
  EXPECT_EQ(value("MLFLOW_TRACKING_URI"), uri);
  EXPECT_EQ(value(kRankTrackingUriVar), uri);
  EXPECT_EQ(value("MLFLOW_EXPERIMENT_ID"), "0");
  EXPECT_EQ(value("SGPU_TRACKING"), "on");
  EXPECT_EQ(untracked_rank_environment(),
            (std::vector<std::pair<std::string, std::string>>{{"SGPU_TRACKING", "off"}}));
}

TEST_F(CallRunTest, EndSendsWhatTheRanksSpooledThenEndsTheRun) {
  const std::unique_ptr<CallRun> call = CallRun::begin(request());
  ASSERT_NE(call, nullptr);
  const fs::path run_dir = root_.parent_path() / "runs" / "call";
  const contract::RankFolder rank{run_dir / "rank-1"};
  fs::create_directories(rank.dir);
  spool_batch(rank.tracking_spool(), call->info().run_id,
              Batch{{{"loss", 0.5, 1700000000000, 3}}, {}, {}});
  EXPECT_TRUE(call->end(RunStatus::kFailed, run_dir));
  const RunInfo ended = FileStore(root_).get_run(call->info().run_id);
  EXPECT_EQ(ended.status, RunStatus::kFailed);
  EXPECT_GT(ended.end_time_ms, 0);
  EXPECT_EQ(lines_of(root_ / "0" / ended.run_id / "metrics" / "loss"),
            (std::vector<std::string>{"1700000000000 0.5 3"}));
  EXPECT_FALSE(fs::exists(rank.tracking_spool()));  // sent, so gone
}

TEST_F(CallRunTest, AnotherNodeJoinsNode0sRunAndLeavesItsEndToNode0) {
  const std::unique_ptr<CallRun> node0 = CallRun::begin(request());
  ASSERT_NE(node0, nullptr);
  const CallRun::Shared shared = node0->shared();
  EXPECT_EQ(shared.run_id, node0->info().run_id);
  EXPECT_EQ(shared.experiment_id, "0");
  const std::unique_ptr<CallRun> node1 = CallRun::join(true, shared, sgpu::FrontEnd::kCpp);
  ASSERT_NE(node1, nullptr);
  EXPECT_TRUE(node1->joined());
  EXPECT_FALSE(node0->joined());
  EXPECT_EQ(node1->info().run_id, node0->info().run_id);
  EXPECT_TRUE(node1->end(RunStatus::kFinished, {}));
  EXPECT_EQ(FileStore(root_).get_run(shared.run_id).status, RunStatus::kRunning);
  EXPECT_TRUE(node0->end(RunStatus::kFinished, {}));
  EXPECT_EQ(FileStore(root_).get_run(shared.run_id).status, RunStatus::kFinished);
  EXPECT_EQ(CallRun::join(false, shared, sgpu::FrontEnd::kCpp), nullptr);
}

TEST_F(CallRunTest, ANodeThatCannotReachNode0sRunRunsUntracked) {
  const std::unique_ptr<CallRun> node0 = CallRun::begin(request());
  ASSERT_NE(node0, nullptr);
  CallRun::Shared elsewhere = node0->shared();
  elsewhere.run_id = "0123456789abcdef0123456789abcdef";  // not in this store
  EXPECT_EQ(CallRun::join(true, elsewhere, sgpu::FrontEnd::kCpp), nullptr);
}

TEST_F(CallRunTest, AStoreThatCanNeverWorkIsTheCallersError) {
  CallRunRequest r = request();
  r.tracking_uri = "ftp://example/mlruns";
  EXPECT_THROW(CallRun::begin(r), TrackingError);
}

// A database that cannot be made where its URI puts it (its folder would be inside a file)
// says where else the run can go, in the words of the call's own caller.
TEST_F(CallRunTest, ADatabaseThatCannotBeMadeSaysWhereElseInTheCallersWords) {
  fs::create_directories(root_);
  std::ofstream(root_ / "file") << "not a folder";
  const std::pair<sgpu::FrontEnd, std::string> said[] = {
      {sgpu::FrontEnd::kCommand,
       "make its folder writable, or record the launch elsewhere "
       "(MLFLOW_TRACKING_URI=sqlite:////path/mlflow.db), or not at all (--no-tracking)"},
      {sgpu::FrontEnd::kCpp, "or not at all (Options::tracking = false, or SGPU_TRACKING=off)"},
      {sgpu::FrontEnd::kPython, "(tracking_uri=\"sqlite:////path/mlflow.db\" or"},
  };
  for (const auto& [front_end, text] : said) {
    CallRunRequest r = request();
    r.tracking_uri = "sqlite:///" + (root_ / "file" / "mlflow.db").string();
    r.front_end = front_end;
    try {
      CallRun::begin(r);
      ADD_FAILURE() << "a database under a file was opened";
    } catch (const TrackingError& e) {
      EXPECT_NE(std::string(e.what()).find(text), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace sgpu::tracking
