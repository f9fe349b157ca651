// A rank's compute estimate (rank/accounting.h, NOTE [The compute model]): what the
// rank counts, the record it leaves, the caller's summary line and the run's metrics, with
// no process involved. The ctest runs it with SGPU_PLATFORM=h100-nvswitch, as a rank of a
// simulated H100 node has it.
#include "rank/accounting.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "model/kernels.h"
#include "model/platform.h"
#include "serialize/memory_record.h"
#include "testing/temp_dir.h"

namespace sgpu::rank {
namespace {

ComputeStats two_ops(double scale) {
  ComputeStats s;
  s.platform = "h100-nvswitch";
  s.ops["aten.mm"] = {3, 6e12 * scale, 3e9 * scale, 0.006 * scale};
  s.ops["aten.add"] = {5, 0, 2 * double(1 << 30) * scale, 0.001 * scale};
  return s;
}

CommStats comm_of(double predicted) {
  CommStats c;
  c.platform = "h100-nvswitch";
  c.groups["world"]["all_reduce"] = {2, 1024, 0.5, predicted};
  return c;
}

// NOTE [The kernel model]: on the H100's table each operator is its kernel's time in the
// rank's GPU timeline: the first waits for the host to issue it, the next ones follow the
// first's long kernel without waiting.
TEST(ComputeAccount, EachOperatorMovesTheRanksGpuTimelineByItsKernel) {
  const model::Roofline h100 = model::load_platform("h100-nvswitch").compute;
  const model::KernelShape square{model::KernelKind::kMatmul, 1, 8192, 8192, 14901};
  count_compute("aten.mm", "bfloat16", 2e12, 1e8, square);
  count_compute("aten.mm", "float32", 2e12, 1e8, square);
  count_compute("aten.add", "bfloat16", 0, 3e9);
  const ComputeStats stats = rank_compute_stats();
  EXPECT_EQ(stats.platform, "h100-nvswitch");
  const ComputeTotals mm = stats.ops.at("aten.mm");
  EXPECT_EQ(mm.count, 2);
  EXPECT_DOUBLE_EQ(mm.flops, 4e12);
  EXPECT_DOUBLE_EQ(mm.bytes, 2e8);
  EXPECT_DOUBLE_EQ(mm.predicted_seconds,
                   h100.kernels.host_us * 1e-6 +
                       model::kernel_seconds(h100, square, 2e12, 1e8, "bfloat16") +
                       model::kernel_seconds(h100, square, 2e12, 1e8, "float32"));
  EXPECT_NEAR(stats.ops.at("aten.add").predicted_seconds,
              3e9 / (3350e9 * h100.kernels.memory_efficiency), 1e-15);
  EXPECT_EQ(stats.total().count, 3);
  // The table was held to bfloat16 runs: the float32 matmul is outside what it answers for.
  EXPECT_DOUBLE_EQ(stats.unvalidated_seconds,
                   model::kernel_seconds(h100, square, 2e12, 1e8, "float32"));
}

TEST(ComputeRecord, ReadsBackWhatWasWrittenAndRefusesWhatIsNot) {
  const auto dir = sgpu::testing::make_temp_dir("compute-record");
  const auto file = dir / "compute.json";
  ComputeStats written = two_ops(1);
  written.exposed_collective_seconds = 0.025;
  written.steps = {{1.5, 1.25, 16384, 4e14}, {3.0, 2.5, 0, 0}};
  serialize::write_compute_record(file, written);
  const auto back = serialize::read_compute_record(file);
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->platform, "h100-nvswitch");
  EXPECT_EQ(back->ops, two_ops(1).ops);
  EXPECT_EQ(back->exposed_collective_seconds, 0.025);
  EXPECT_EQ(back->steps, written.steps);
  std::ofstream(file) << R"({"platform": "x", "ops": {"aten.mm": {"count": "three"}}})";
  EXPECT_FALSE(serialize::read_compute_record(file).has_value());
  EXPECT_FALSE(serialize::read_compute_record(dir / "missing.json").has_value());
  std::filesystem::remove_all(dir);
}

TEST(ComputeSummary, SaysTheMostOfAnyRankAndTheStepWithItsExposedCollectives) {
  // Rank 1 computes the longest (0.014 s), rank 0 communicates the longest (0.25 s) and has
  // the most of it exposed (0.1 s); the step is the slowest rank's compute and exposed
  // collectives: rank 0's 0.007 + 0.1 s.
  ComputeStats rank0 = two_ops(1), rank1 = two_ops(2);
  rank0.exposed_collective_seconds = 0.1;
  rank1.exposed_collective_seconds = 0.01;
  const std::string line = compute_summary({rank0, rank1}, {comm_of(0.25), comm_of(0.125)});
  const model::Roofline roofline = model::load_platform("h100-nvswitch").compute;
  const model::KernelCosts& h100 = roofline.kernels;
  const double peak = roofline.peak_for("bfloat16") * 1e12;
  EXPECT_EQ(line,
            "sgpu: compute (the most of any rank): 8 operators, 12.00 TFLOP, 9.59 GiB of memory "
            "traffic, 0.014 s on h100-nvswitch; with the collectives' 0.250 s (0.100 s of them "
            "exposed), 0.107 s at " +
                std::to_string(static_cast<int>(std::lround(12e12 / 0.107 / peak * 100))) +
                "% of the bfloat16 peak (hardware FLOPs, recomputation included); typical "
                "error " +
                std::to_string(static_cast<int>(std::lround(h100.typical_error * 100))) +
                "% (the mean over " + std::to_string(h100.validated_runs) +
                " measured runs, docs/benchmarks.md)\n");
  EXPECT_EQ(compute_summary({ComputeStats{}, ComputeStats{}}, {}), "");
  ComputeStats untimed = two_ops(1);
  untimed.platform.clear();
  EXPECT_NE(compute_summary({untimed}, {}).find("(no platform to time them on)"),
            std::string::npos);
}

// A step mostly in kernels of a dtype the kernel table was never held to gets no error
// bound; nor does a platform whose table no measured run holds.
TEST(ComputeSummary, GivesNoErrorWhereTheModelWasNotHeldToMeasuredRuns) {
  ComputeStats float32 = two_ops(1);
  float32.unvalidated_seconds = 0.006;  // the matmuls: 6 of the 7 ms
  EXPECT_NE(compute_summary({float32}, {})
                .find("; 86% of the compute is in matmul and attention kernels of a dtype the "
                      "model was not held to (it was to bfloat16): no error to give\n"),
            std::string::npos)
      << compute_summary({float32}, {});
  ComputeStats a10 = two_ops(1);
  a10.platform = "a10-pcie";
  EXPECT_NE(compute_summary({a10}, {}).find(
                "; a10-pcie's compute model is held to no measured run yet: no error to "
                "give\n"),
            std::string::npos)
      << compute_summary({a10}, {});
}

TEST(ComputeMetrics, AreTheRanksTotalsAndItsPredictedStep) {
  ComputeStats rank = two_ops(1);
  rank.exposed_collective_seconds = 0.05;
  const auto metrics = compute_metrics(rank);
  EXPECT_EQ(metrics.at("sgpu.compute.count"), 8);
  EXPECT_DOUBLE_EQ(metrics.at("sgpu.compute.flops"), 6e12);
  EXPECT_DOUBLE_EQ(metrics.at("sgpu.compute.predicted_seconds"), 0.007);
  EXPECT_DOUBLE_EQ(metrics.at("sgpu.compute.exposed_collective_seconds"), 0.05);
  EXPECT_DOUBLE_EQ(metrics.at("sgpu.predicted_seconds"), 0.057);
  // 6 TFLOP in 0.057 s against the H100's dense bfloat16 peak.
  EXPECT_DOUBLE_EQ(
      metrics.at("sgpu.compute.bfloat16_peak_fraction"),
      6e12 / 0.057 / (model::load_platform("h100-nvswitch").compute.peak_for("bfloat16") * 1e12));
  EXPECT_TRUE(compute_metrics(ComputeStats{}).empty());
}

// A step is predicted from the mark before it: the first from the rank's start, the last on
// the call's line, from the rank whose last step is the slowest.
TEST(StepSummary, SaysTheSlowestRanksLastStepItsTokensPerSecondAndMfu) {
  ComputeStats rank0 = two_ops(1), rank1 = two_ops(1);
  // Rank 0: steps of 1.5 s (then 1.25 s with 0.25 s exposed); rank 1's last takes 2.5 s.
  rank0.steps = {{1.5, 1.5, 16384, 4e14}, {3.0, 2.75, 16384, 4e14}};
  rank1.steps = {{1.0, 1.0, 16384, 4e14}, {3.5, 3.0, 16384, 4e14}};
  const std::optional<StepFigures> last = last_step(rank0);
  ASSERT_TRUE(last);
  EXPECT_DOUBLE_EQ(last->seconds, 1.5);
  EXPECT_DOUBLE_EQ(last->compute_seconds, 1.25);
  EXPECT_DOUBLE_EQ(last->exposed_collective_seconds, 0.25);
  ComputeStats first_only = two_ops(1);
  first_only.steps = {{2.0, 1.5, 0, 0}};
  EXPECT_DOUBLE_EQ(last_step(first_only)->seconds, 2.0);  // from the rank's start
  EXPECT_FALSE(last_step(two_ops(1)));

  const std::string line = step_summary({rank0, rank1});
  const double peak = model::load_platform("h100-nvswitch").compute.peak_for("bfloat16") * 1e12;
  const std::string mfu = std::to_string(static_cast<int>(std::lround(4e14 / 2.5 / peak * 100)));
  EXPECT_EQ(line.substr(0, line.find("; typical error")),
            "sgpu: steps (the slowest of any rank): 2 marked; the last 2.5 s on h100-nvswitch "
            "(compute 2 s, exposed collectives 0.5 s), 6,554 tokens/s per GPU, MFU " +
                mfu + "%")
      << line;
  EXPECT_EQ(line.back(), '\n');
  rank1.steps.back().tokens = 0;  // not said: no tokens/s, nor for a rank of no platform
  rank1.steps.back().model_flops = 0;
  EXPECT_EQ(step_summary({rank1}).find("tokens/s"), std::string::npos);
  EXPECT_EQ(step_summary({rank1}).find("MFU"), std::string::npos);
  rank1.platform.clear();
  EXPECT_EQ(step_summary({rank1}), "");
  EXPECT_EQ(step_summary({two_ops(1)}), "");
}

TEST(StepMetrics, AreTheLastStepsFigures) {
  ComputeStats rank = two_ops(1);
  rank.steps = {{1.5, 1.5, 16384, 0}, {3.0, 2.75, 16384, 0}};
  const auto metrics = compute_metrics(rank);
  EXPECT_EQ(metrics.at("sgpu.step.count"), 2);
  EXPECT_DOUBLE_EQ(metrics.at("sgpu.step.predicted_seconds"), 1.5);
  EXPECT_DOUBLE_EQ(metrics.at("sgpu.step.exposed_collective_seconds"), 0.25);
  EXPECT_DOUBLE_EQ(metrics.at("sgpu.step.tokens_per_second"), 16384 / 1.5);
  EXPECT_EQ(metrics.count("sgpu.step.mfu"), 0U);  // no FLOPs said
  EXPECT_EQ(compute_metrics(two_ops(1)).count("sgpu.step.count"), 0U);
}

// NOTE [A folded world]: what a folded world's second of a place did, held against the
// first of that place: the first difference, group by group, then the memory peaks.
TEST(CollectiveDifference, NamesTheFirstGroupOrOpThatDiffers) {
  contract::RingSnapshot first;
  first.groups = {{"world", 4, 1, {0, 1, 2, 3}}, {"ranks 0,1", 2, 1, {0, 1}}};
  first.totals.resize(2);
  const auto all_reduce = static_cast<std::size_t>(contract::CollectiveOp::kAllReduce);
  first.totals[1][all_reduce].count = 1;
  first.totals[1][all_reduce].bytes = 16;
  contract::RingSnapshot second = first;
  second.groups[1] = {"ranks 2,3", 2, 1, {2, 3}};
  EXPECT_EQ(collective_difference(1, 3, first, second), "");
  second.totals[1][all_reduce] = {2, 32};
  EXPECT_EQ(collective_difference(1, 3, first, second),
            "all_reduce: rank 1 called it 1 time (16 bytes) in its group ranks 0,1, rank 3 2 "
            "times (32 bytes) in its group ranks 2,3");
  second.groups[1].size = 3;
  EXPECT_EQ(collective_difference(1, 3, first, second),
            "rank 1's group ranks 0,1 has 2 ranks, rank 3's ranks 2,3 3");
  second.groups.pop_back();
  EXPECT_EQ(collective_difference(1, 3, first, second),
            "rank 1 made 2 process groups and rank 3 1");
  EXPECT_EQ(collective_difference(1, 3, std::nullopt, second), "");
}

TEST(MemoryDifference, NamesEachPeakThatDiffersWithBothFigures) {
  const MemoryStats peaks = {{"allocated_bytes.all.peak", 512}, {"reserved_bytes.all.peak", 2048}};
  EXPECT_EQ(memory_difference(1, 3, peaks, peaks), "");
  MemoryStats more = peaks;
  more["reserved_bytes.all.peak"] = 4096;
  EXPECT_EQ(memory_difference(1, 3, peaks, more),
            "reserved_bytes.all.peak 2048 on rank 1, 4096 on rank 3");
  more["allocated_bytes.all.peak"] = 1024;
  EXPECT_EQ(memory_difference(1, 3, peaks, more),
            "allocated_bytes.all.peak 512 on rank 1, 1024 on rank 3; reserved_bytes.all.peak 2048 "
            "on rank 1, 4096 on rank 3");
}

TEST(MemorySummary, SaysConsecutiveRanksWithTheSamePeaksOnce) {
  const auto peaks = [](std::int64_t reserved, std::int64_t allocated) {
    return MemoryStats{{"reserved_bytes.all.peak", reserved},
                       {"allocated_bytes.all.peak", allocated}};
  };
  const std::int64_t gib = std::int64_t{1} << 30;
  EXPECT_EQ(memory_summary({peaks(3 * gib, gib), peaks(3 * gib, gib), peaks(3 * gib, gib + 1),
                            peaks(3 * gib, gib)},
                           {0, 1, 2, 7}),
            "sgpu: peak memory of each rank's GPU, reserved and allocated: ranks 0-1 3.00 and "
            "1.00 GiB; rank 2 3.00 and 1.00 GiB; rank 7 3.00 and 1.00 GiB\n");
  EXPECT_EQ(memory_summary({MemoryStats{}, peaks(gib / 2, gib / 4)}, {0, 1}),
            "sgpu: peak memory of each rank's GPU, reserved and allocated: rank 1 0.50 and 0.25 "
            "GiB\n");
  EXPECT_EQ(memory_summary({MemoryStats{}}, {0}), "");
}

}  // namespace
}  // namespace sgpu::rank
