// Calls on 8 simulated ranks, tracked into a real MLflow tracking server and into
// MLflow's file store, read back through MLflow's own Python client: the run and its
// nesting, every rank's metrics with their steps, params and tags, FAILED and KILLED
// runs, bad input, a server that goes away mid-run and comes back, and one that is away
// when a call ends (its run is sent by the next call).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <memory>
#include <set>
#include <string>
#include <thread>

#include "sgpu/process_group.h"
#include "sgpu/sgpu.h"
#include "testing/mlflow_server.h"
#include "testing/sim_options.h"
#include "tracking/rest/rest_store.h"

namespace {

using nlohmann::json;
using sgpu::testing::MlflowReader;
using sgpu::testing::MlflowServer;

constexpr int kRanks = 8;
constexpr int kSteps = 5;

MlflowServer& server() {
  static MlflowServer instance(SGPU_TEST_PYTHON);
  return instance;
}

MlflowReader& reader() {
  static MlflowReader instance(SGPU_TEST_PYTHON, SGPU_TEST_SOURCE_DIR "/tracking/mlflow_reader.py");
  return instance;
}

double rank_value(int rank, int step) { return rank * 100.0 + step + 0.25; }

int train(int steps) {
  const int rank = sgpu::global_rank();
  sgpu::log_param("rank_" + std::to_string(rank) + "/seed", std::to_string(rank * 7));
  sgpu::set_tag("rank_" + std::to_string(rank), "ran");
  for (int step = 0; step < steps; ++step) {
    sgpu::log_metric("loss", rank_value(rank, step), step);
    sgpu::log_metrics({{"rank_" + std::to_string(rank) + "/acc", rank_value(rank, step) / 1000}},
                      step);
  }
  return rank;
}

int fail_on_rank_3(int) {
  sgpu::log_metric("before_failure", sgpu::global_rank(), 1);
  // Every rank has logged before rank 3 fails (on a loaded machine a rank can be torn
  // down before it gets that far).
  sgpu::process_group().barrier()->wait();
  if (sgpu::global_rank() == 3) throw std::runtime_error("rank 3 gives up");
  return 0;
}

int hang_after_logging(int) {
  sgpu::log_metric("before_timeout", sgpu::global_rank(), 2);
  std::this_thread::sleep_for(std::chrono::hours(1));
  return 0;
}

constexpr int kMany = 2'500;

int bad_input(int) {
  const int rank = sgpu::global_rank();
  int refused = 0;
  sgpu::log_metric("nan", std::nan(""), rank);
  sgpu::log_metric("inf", std::numeric_limits<double>::infinity(), rank);
  sgpu::log_metric("neg_inf", -std::numeric_limits<double>::infinity(), rank);
  try {
    sgpu::log_metric(std::string(300, 'k'), 1, 0);
  } catch (const sgpu::TrackingError&) {
    ++refused;
  }
  try {
    sgpu::log_metric("bad|key", 1, 0);
  } catch (const sgpu::TrackingError&) {
    ++refused;
  }
  if (rank == 0) sgpu::log_param("long_value", std::string(7000, 'v'));
  // More than two of MLflow's batches (at most 1000 metrics a log-batch request).
  for (int i = 0; i < kMany; ++i) sgpu::log_metric("many/r" + std::to_string(rank), i, i);
  sgpu::log_metric("after_bad_ones", rank, 0);
  return refused;
}

int log_through_outage(int count) {
  for (int i = 0; i < count; ++i) {
    sgpu::log_metric("steady", sgpu::global_rank() * 10'000 + i, i);
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  }
  return 0;
}

int log_before_and_after(int pause_ms) {
  // Every rank's points differ in value: MLflow's SQL stores keep one of two points equal
  // in key, value, step and timestamp, so equal points from two ranks logged in the same
  // millisecond would arrive as one.
  for (int step = 0; step < 3; ++step) {
    sgpu::log_metric("early", rank_value(sgpu::global_rank(), step), step);
  }
  sgpu::flush_tracking();
  std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms));
  for (int step = 0; step < 3; ++step) sgpu::log_metric("late", sgpu::global_rank(), step);
  return sgpu::global_rank();
}

// The stores a test runs against.
enum class Where { kServer, kFiles, kDatabase };

class Tracking : public ::testing::TestWithParam<Where> {
 protected:
  void SetUp() override {
    if (GetParam() == Where::kServer) {
      uri_ = server().uri();
    } else if (GetParam() == Where::kDatabase) {
      files_ = sgpu::testing::make_temp_dir("sgpu-mlflow-db");
      uri_ = "sqlite:///" + (files_ / "mlflow.db").string();
    } else {
      files_ = sgpu::testing::make_temp_dir("sgpu-mlruns");
      uri_ = "file://" + (files_ / "mlruns").string();
    }
  }
  sgpu::Options options(int ranks = kRanks) const {
    sgpu::Options o = sgpu::testing::sim(ranks);
    o.tracking_uri = uri_;
    o.experiment = "sgpu tracking test";
    return o;
  }
  json run(const std::string& id) { return reader().ask({{"uri", uri_}, {"runs", {id}}})[id]; }
  std::string only_child(const std::string& parent) {
    const json children = reader().ask({{"uri", uri_}, {"children", parent}});
    EXPECT_EQ(children.size(), 1u) << children.dump();
    return children.empty() ? "" : children[0].get<std::string>();
  }

  std::string uri_;
  std::filesystem::path files_;
};

TEST_P(Tracking, ACallIsAChildRunWithEveryRanksMetricsParamsAndTags) {
  sgpu::tracking::Run sweep("sweep", "sgpu tracking test", uri_);
  ASSERT_TRUE(sweep.active());
  const auto ranks = sgpu::distributed(train, options()).distributed(kSteps);
  EXPECT_EQ(ranks.size(), static_cast<std::size_t>(kRanks));
  const std::string id = only_child(sweep.run_id());
  const json r = run(id);

  EXPECT_EQ(r["info"]["status"], "FINISHED");
  EXPECT_EQ(r["info"]["experiment_id"], sweep.experiment_id());
  EXPECT_EQ(r["tags"]["mlflow.parentRunId"], sweep.run_id());
  EXPECT_EQ(r["tags"]["sgpu.sim_node"], "8xH100");
  EXPECT_FALSE(r["tags"]["sgpu.version"].get<std::string>().empty());
  EXPECT_FALSE(r["tags"]["sgpu.host"].get<std::string>().empty());
  EXPECT_EQ(r["params"]["gpus"], "8");
  EXPECT_EQ(r["params"]["world_size"], "8");
  EXPECT_EQ(r["params"]["backend"], "sim");
  EXPECT_EQ(r["params"]["gpu_type"], "H100");
  EXPECT_EQ(r["params"]["timeout"], "10800000ms");
  // A function in an anonymous namespace is found in the binary's own symbol table: the
  // param holds its whole name, the run its plain one.
  EXPECT_EQ(r["params"]["function"], "(anonymous namespace)::train(int)");
  EXPECT_EQ(r["info"]["run_name"], "train");

  json expected_loss = json::array();
  for (int step = 0; step < kSteps; ++step) {
    for (int rank = 0; rank < kRanks; ++rank)
      expected_loss.push_back({step, rank_value(rank, step)});
  }
  json loss = json::array();
  for (const json& point : r["metrics"]["loss"]) loss.push_back({point[0], point[1]});
  std::sort(expected_loss.begin(), expected_loss.end());
  std::sort(loss.begin(), loss.end());
  EXPECT_EQ(loss, expected_loss);
  for (int rank = 0; rank < kRanks; ++rank) {
    const std::string key = "rank_" + std::to_string(rank) + "/acc";
    ASSERT_EQ(r["metrics"][key].size(), static_cast<std::size_t>(kSteps)) << key;
    for (int step = 0; step < kSteps; ++step) {
      EXPECT_EQ(r["metrics"][key][step][0], step);
      EXPECT_EQ(r["metrics"][key][step][1], rank_value(rank, step) / 1000);
    }
    EXPECT_EQ(r["params"]["rank_" + std::to_string(rank) + "/seed"], std::to_string(rank * 7));
    EXPECT_EQ(r["tags"]["rank_" + std::to_string(rank)], "ran");
  }
}

TEST_P(Tracking, TheLaunchSaysWhereItsRunIsShown) {
  sgpu::tracking::Run parent("parent", "sgpu tracking test", uri_);
  auto launch = sgpu::distributed(train, options(2)).launch(1);
  launch.wait();
  const std::string id = only_child(parent.run_id());
  const std::string link = launch.tracking_link();
  if (GetParam() == Where::kServer) {
    EXPECT_NE(link.find("/#/experiments/" + parent.experiment_id() + "/runs/" + id),
              std::string::npos)
        << link;
  } else if (GetParam() == Where::kDatabase) {
    EXPECT_EQ(link.rfind(uri_, 0), 0u) << link;
    EXPECT_NE(link.find("run " + id), std::string::npos) << link;
  } else {
    EXPECT_EQ(std::filesystem::path(link).filename(), id) << link;
    EXPECT_TRUE(std::filesystem::is_directory(link)) << link;
  }
}

TEST_P(Tracking, MlflowRunIdInTheCallersEnvironmentMakesTheCallItsChild) {
  auto store = sgpu::tracking::open_store(uri_);
  const auto parent = store->create_run("0", "outer", sgpu::tracking::now_ms(), {});
  ::setenv("MLFLOW_RUN_ID", parent.run_id.c_str(), 1);
  sgpu::Options o = options(2);
  o.experiment.clear();
  sgpu::distributed(train, o).distributed(1);
  ::unsetenv("MLFLOW_RUN_ID");
  const json r = run(only_child(parent.run_id));
  EXPECT_EQ(r["tags"]["mlflow.parentRunId"], parent.run_id);
  EXPECT_EQ(r["info"]["experiment_id"], "0");
  EXPECT_EQ(r["info"]["status"], "FINISHED");
}

TEST_P(Tracking, AFailedCallsRunIsFailedWithWhatRanksLoggedBeforehand) {
  sgpu::tracking::Run scope("failure", "sgpu tracking test", uri_);
  EXPECT_THROW(sgpu::distributed(fail_on_rank_3, options(4)).distributed(0),
               sgpu::DistributedError);
  const json r = run(only_child(scope.run_id()));
  EXPECT_EQ(r["info"]["status"], "FAILED");
  // Rank 3 flushed as it threw; the others as they were torn down or returned.
  EXPECT_EQ(r["metrics"]["before_failure"].size(), 4u) << r["metrics"].dump();
}

TEST_P(Tracking, ATimedOutCallsRunIsKilledWithWhatRanksLoggedBeforeTeardown) {
  sgpu::tracking::Run scope("timeout", "sgpu tracking test", uri_);
  sgpu::Options o = options(4);
  o.timeout = std::chrono::seconds(3);
  EXPECT_THROW(sgpu::distributed(hang_after_logging, o).distributed(0), sgpu::TimeoutError);
  const json r = run(only_child(scope.run_id()));
  EXPECT_EQ(r["info"]["status"], "KILLED");
  EXPECT_EQ(r["metrics"]["before_timeout"].size(), 4u) << r["metrics"].dump();
}

TEST_P(Tracking, BadInputIsRefusedAtTheCallOrStoredAsMlflowStoresItAndNeighboursArrive) {
  sgpu::tracking::Run scope("bad input", "sgpu tracking test", uri_);
  const auto refused = sgpu::distributed(bad_input, options(2)).distributed(0);
  EXPECT_EQ(refused, (std::vector<int>{2, 2}));
  const json r = run(only_child(scope.run_id()));
  EXPECT_EQ(r["info"]["status"], "FINISHED");
  for (const json& point : r["metrics"]["nan"]) EXPECT_EQ(point[1], "nan");
  ASSERT_EQ(r["metrics"]["nan"].size(), 2u);
  // The file store keeps infinities; a database (sgpu's, or the server's) stores them as
  // the largest double, as MLflow does.
  ASSERT_EQ(r["metrics"]["inf"].size(), 2u);
  ASSERT_EQ(r["metrics"]["neg_inf"].size(), 2u);
  for (const json& point : r["metrics"]["inf"]) {
    if (GetParam() == Where::kFiles) {
      EXPECT_EQ(point[1], "inf");
    } else {
      EXPECT_EQ(point[1].get<double>(), std::numeric_limits<double>::max());
    }
  }
  for (const json& point : r["metrics"]["neg_inf"]) {
    if (GetParam() == Where::kFiles) {
      EXPECT_EQ(point[1], "-inf");
    } else {
      EXPECT_EQ(point[1].get<double>(), -std::numeric_limits<double>::max());
    }
  }
  EXPECT_EQ(r["params"]["long_value"].get<std::string>(), std::string(6000, 'v'));
  for (int rank = 0; rank < 2; ++rank) {
    const json& many = r["metrics"]["many/r" + std::to_string(rank)];
    ASSERT_EQ(many.size(), static_cast<std::size_t>(kMany));
    for (int i = 0; i < kMany; i += 997) {
      EXPECT_EQ(many[i][0], i);
      EXPECT_EQ(many[i][1].get<double>(), i);
    }
  }
  EXPECT_EQ(r["metrics"]["after_bad_ones"].size(), 2u);
}

TEST(TrackingFiles, MlflowMigrateFilestoreMovesTheRunsIntoADatabase) {
  const auto dir = sgpu::testing::make_temp_dir("sgpu-migrate");
  const std::string files = "file://" + (dir / "mlruns").string();
  sgpu::tracking::Run scope("migrated", "sgpu tracking test", files);
  sgpu::Options o = sgpu::testing::sim(2);
  o.tracking_uri = files;
  sgpu::distributed(train, o).distributed(kSteps);
  const json children = reader().ask({{"uri", files}, {"children", scope.run_id()}});
  ASSERT_EQ(children.size(), 1u);
  const std::string id = children[0];
  const json before = reader().ask({{"uri", files}, {"runs", {id}}})[id];
  const std::string database = "sqlite:///" + (dir / "migrated.db").string();
  reader().ask({{"migrate", (dir / "mlruns").string()}, {"target", database}});
  const json after = reader().ask({{"uri", database}, {"runs", {id}}})[id];
  EXPECT_EQ(after["info"]["status"], "FINISHED");
  EXPECT_EQ(after["params"], before["params"]);
  EXPECT_EQ(after["tags"]["mlflow.parentRunId"], scope.run_id());
  EXPECT_EQ(after["metrics"], before["metrics"]);
  EXPECT_EQ(after["metrics"]["loss"].size(), static_cast<std::size_t>(2 * kSteps));
}

INSTANTIATE_TEST_SUITE_P(Stores, Tracking,
                         ::testing::Values(Where::kFiles, Where::kDatabase, Where::kServer),
                         [](const auto& info) {
                           return info.param == Where::kServer     ? "server"
                                  : info.param == Where::kDatabase ? "database"
                                                                   : "files";
                         });

TEST(TrackingServer, StoppedMidRunAndBackEveryMetricArrivesOnce) {
  sgpu::testing::TcpRelay relay(server().port());
  const std::string uri = relay.uri();
  sgpu::tracking::Run scope("outage", "sgpu tracking test", server().uri());
  sgpu::Options o = sgpu::testing::sim(4);
  o.tracking_uri = uri;
  o.experiment = "sgpu tracking test";
  constexpr int kCount = 120;  // 3 s of logging per rank
  auto launch = sgpu::distributed(log_through_outage, o).launch(kCount);
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  relay.stop();
  std::this_thread::sleep_for(std::chrono::milliseconds(1500));
  relay.start();
  launch.wait();
  const json children = reader().ask({{"uri", server().uri()}, {"children", scope.run_id()}});
  ASSERT_EQ(children.size(), 1u);
  const std::string id = children[0];
  const json r = reader().ask({{"uri", server().uri()}, {"runs", {id}}})[id];
  EXPECT_EQ(r["info"]["status"], "FINISHED");
  ASSERT_EQ(r["metrics"]["steady"].size(), static_cast<std::size_t>(4 * kCount));
  std::set<double> values;
  for (const json& point : r["metrics"]["steady"]) values.insert(point[1].get<double>());
  EXPECT_EQ(values.size(), static_cast<std::size_t>(4 * kCount));
}

TEST(TrackingServer, ACallEndingWhileTheServerIsDownIsSentByTheNextCallToIt) {
  sgpu::testing::TcpRelay relay(server().port());
  const auto runs = sgpu::testing::make_temp_dir("sgpu-pending-runs");
  sgpu::Options o = sgpu::testing::sim(2);
  o.tracking_uri = relay.uri();
  o.experiment = "sgpu tracking test";
  o.runs_dir = runs;
  auto launch = sgpu::distributed(log_before_and_after, o).launch(1500);
  std::this_thread::sleep_for(std::chrono::milliseconds(700));
  relay.stop();  // the ranks log "late" and end, and the call ends, while it is down
  EXPECT_EQ(launch.wait(), (std::vector<int>{0, 1})) << "training fails for tracking";
  const std::string link = launch.tracking_link();
  const std::string id = link.substr(link.rfind('/') + 1);
  const auto at_server = [&] {
    return reader().ask({{"uri", server().uri()}, {"runs", {id}}})[id];
  };
  EXPECT_EQ(at_server()["info"]["status"], "RUNNING");
  std::vector<std::filesystem::path> kept;
  for (const auto& entry : std::filesystem::directory_iterator(runs)) kept.push_back(entry.path());
  ASSERT_EQ(kept.size(), 1u) << "the run folder is kept while its run is pending";
  EXPECT_TRUE(std::filesystem::exists(kept[0] / "tracking-pending.json"));

  const auto sent_after = std::chrono::duration_cast<std::chrono::milliseconds>(
                              std::chrono::system_clock::now().time_since_epoch())
                              .count();
  relay.start();
  sgpu::distributed(log_before_and_after, o).distributed(0);
  const json r = at_server();
  EXPECT_EQ(r["info"]["status"], "FINISHED");
  EXPECT_LT(r["info"]["end_time"].get<std::int64_t>(), sent_after) << "ended when its call did";
  EXPECT_EQ(r["metrics"]["early"].size(), 6u);
  EXPECT_EQ(r["metrics"]["late"].size(), 6u);
  EXPECT_FALSE(std::filesystem::exists(kept[0])) << "sent, the folder kept for it goes";
}

TEST(TrackingOff, WritesNothing) {
  const auto files = sgpu::testing::make_temp_dir("sgpu-off");
  sgpu::Options o = sgpu::testing::sim(2);
  o.tracking_uri = "file://" + (files / "mlruns").string();
  o.tracking = false;
  auto launch = sgpu::distributed(train, o).launch(2);
  launch.wait();
  EXPECT_EQ(launch.tracking_link(), "");
  EXPECT_FALSE(std::filesystem::exists(files / "mlruns"));
  o.tracking = true;
  ::setenv("SGPU_TRACKING", "off", 1);
  sgpu::distributed(train, o).distributed(2);
  ::unsetenv("SGPU_TRACKING");
  EXPECT_FALSE(std::filesystem::exists(files / "mlruns"));
}

}  // namespace
