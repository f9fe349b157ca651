// A batch split within MLflow's limits with nothing lost or reordered, and its request
// body as MLflow's REST API reads it.
#include "tracking/log_batch.h"

#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>

#include "tracking/run_model.h"
#include "tracking/validation.h"

namespace sgpu::tracking {
namespace {

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

}  // namespace
}  // namespace sgpu::tracking
