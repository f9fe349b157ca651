// The spool: batches a rank could not send, kept line by line and read back, damaged lines
// skipped.
#include "tracking/spool.h"

#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "tracking/run_model.h"
#include "tracking/store_support.h"

namespace sgpu::tracking {
namespace {

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

}  // namespace
}  // namespace sgpu::tracking
