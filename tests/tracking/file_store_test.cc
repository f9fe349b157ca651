// The file store: MLflow's mlruns layout, a refused param that leaves its neighbours, and
// appends from many processes that never interleave.
#include "tracking/file/file_store.h"

#include <gtest/gtest.h>

#include <cmath>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "tracking/run_model.h"
#include "tracking/store_support.h"

namespace sgpu::tracking {
namespace {

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
  ASSERT_TRUE(in_processes(kWriters, [&](int w) {
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
  }));
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

}  // namespace
}  // namespace sgpu::tracking
