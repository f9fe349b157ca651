// A team's own distributed function and its GoogleTest test, on 4 simulated ranks.
#include <gtest/gtest.h>
#include <sgpu/sgpu.h>

#include <vector>

int base_plus_rank_squared(int base) { return base + sgpu::global_rank() * sgpu::global_rank(); }

TEST(Consumer, RunsOnFourSimulatedRanks) {
  sgpu::Options options;
  options.backend = "sim";
  options.gpus = 4;
  EXPECT_EQ(sgpu::distributed(base_plus_rank_squared, options).distributed(10),
            (std::vector<int>{10, 11, 14, 19}));
}
