// The buffered run logger: every metric of a large flush arrives, and a bad key throws at
// the call.
#include "tracking/run_logger.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

#include "sgpu/errors.h"
#include "tracking/file/file_store.h"
#include "tracking/store_support.h"
#include "tracking/validation.h"

namespace sgpu::tracking {
namespace {

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

}  // namespace
}  // namespace sgpu::tracking
