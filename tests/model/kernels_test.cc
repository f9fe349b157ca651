// The kernel model (NOTE [The kernel model]): the shipped H100 table against the matmul
// throughputs measured on an H100, the laws of tiles, floors and the host's timeline, and
// platform files that say what is wrong with a table.
#include "model/kernels.h"

#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>

#include <cmath>
#include <string>
#include <tuple>
#include <vector>

#include "model/platform.h"
#include "sgpu/errors.h"

namespace sgpu::model {
namespace {

double tflops_of_square_bf16(const Roofline& r, double n) {
  const KernelShape shape{KernelKind::kMatmul, 1, n, n, n};
  return 2 * n * n * n / kernel_seconds(r, shape, 2 * n * n * n, 3 * n * n * 2, "bfloat16") / 1e12;
}

// zzc0721/torch-performance-test-data#79: torch 2.7 on an H100 80GB HBM3, square bf16
// matmuls. 8192 is the row the table's fraction was set from; the others were not.
TEST(KernelModel, SquareBf16MatmulsReachWhatAnH100Measured) {
  const Roofline h100 = load_platform("h100-nvswitch").compute;
  EXPECT_NEAR(tflops_of_square_bf16(h100, 8192), 797.5, 797.5 * 0.01);
  EXPECT_NEAR(tflops_of_square_bf16(h100, 4096), 788.7, 788.7 * 0.05);
  EXPECT_NEAR(tflops_of_square_bf16(h100, 2048), 676.6, 676.6 * 0.20);
  // At 1024 one wave fills a quarter of the SMs, and back-to-back calls are bound by the
  // host that issues them: the measured loop's throughput, within 15%.
  StreamTimeline loop;
  const double n = 1024, flops = 2 * n * n * n;
  const KernelShape shape{KernelKind::kMatmul, 1, n, n, n};
  for (int i = 0; i < 100; ++i) {
    loop.kernel(0, h100.kernels.host_us * 1e-6,
                kernel_seconds(h100, shape, flops, 3 * n * n * 2, "bfloat16"));
  }
  EXPECT_NEAR(100 * flops / loop.end() / 1e12, 176.6, 176.6 * 0.15);
}

TEST(KernelModel, AWaveThatIsNotFullLeavesItsSmsIdle) {
  const Roofline h100 = load_platform("h100-nvswitch").compute;
  // 128 x 256 tiles: 12 x 11 = 132 of them fill the 132 SMs once; a row more needs a
  // second wave.
  const KernelShape full{KernelKind::kMatmul, 1, 128 * 12, 256 * 11, 8192};
  const KernelShape one_more{KernelKind::kMatmul, 1, 128 * 12 + 1, 256 * 11, 8192};
  const double flops = 2.0 * 128 * 12 * 256 * 11 * 8192;
  const double t_full = kernel_seconds(h100, full, flops, 0, "bfloat16");
  const double t_more = kernel_seconds(h100, one_more, flops, 0, "bfloat16");
  // 13 x 11 = 143 tiles in two waves of 132: the SMs are busy 143 / 264 of the time.
  EXPECT_NEAR(t_more / t_full, 264.0 / 143, 1e-9);
  EXPECT_GT(t_more, 1.8 * t_full);
  // The batch counts its tiles too.
  const KernelShape batched{KernelKind::kMatmul, 2, 128 * 12, 256 * 11, 8192};
  EXPECT_NEAR(kernel_seconds(h100, batched, 2 * flops, 0, "bfloat16"), 2 * t_full, 1e-12);
}

TEST(KernelModel, EveryKernelTakesAtLeastItsFloorAndMovesBytesAtItsFraction) {
  const Roofline h100 = load_platform("h100-nvswitch").compute;
  EXPECT_DOUBLE_EQ(kernel_seconds(h100, {}, 0, 8, "float32"), h100.kernels.kernel_floor_us * 1e-6);
  const double bytes = 4e9;
  EXPECT_DOUBLE_EQ(kernel_seconds(h100, {}, 0, bytes, "bfloat16"),
                   bytes / (3350e9 * h100.kernels.memory_efficiency));
}

TEST(KernelModel, AttentionRunsAtItsOwnFractionOfThePeak) {
  const Roofline h100 = load_platform("h100-nvswitch").compute;
  const double flops = 1e12;
  EXPECT_DOUBLE_EQ(kernel_seconds(h100, {KernelKind::kAttention}, flops, 0, "bfloat16"),
                   flops / (989.4e12 * h100.kernels.attention_efficiency));
}

TEST(KernelModel, WithoutATableTheRooflineStands) {
  const Roofline a10 = load_platform("a10-pcie").compute;
  ASSERT_TRUE(a10.kernels.empty());
  const KernelShape shape{KernelKind::kMatmul, 1, 64, 64, 64};
  EXPECT_DOUBLE_EQ(kernel_seconds(a10, shape, 1e9, 1e6, "bfloat16"),
                   roofline_seconds(a10, 1e9, 1e6, "bfloat16"));
  EXPECT_EQ(kernel_seconds(Roofline{}, shape, 1e9, 1e6, "bfloat16"), 0);
}

TEST(StreamTimeline, SmallOperatorsWaitForTheHostAndLargeOnesDoNot) {
  StreamTimeline small;
  for (int i = 0; i < 100; ++i) small.kernel(0, 10e-6, 1e-6);
  EXPECT_NEAR(small.end(), 100 * 10e-6 + 1e-6, 1e-12);  // the host's pace, then one kernel
  StreamTimeline large;
  for (int i = 0; i < 100; ++i) large.kernel(0, 10e-6, 50e-6);
  EXPECT_NEAR(large.end(), 10e-6 + 100 * 50e-6, 1e-12);  // the first issue, then kernels
}

// NOTE [The step's timeline], on schedules whose critical path is known exactly (ms).
TEST(StreamTimeline, ACollectiveRunsBehindTheComputeIssuedAfterIt) {
  StreamTimeline t;
  t.kernel(0, 0, 10);
  const Moment done = t.collective(1, 0, 5);  // from 10, when stream 0 gets there, to 15
  EXPECT_EQ(done.real, 15);
  t.kernel(0, 0, 10);  // 10 to 20, beside the collective
  t.wait(0, done);     // already past it
  t.kernel(0, 0, 1);
  EXPECT_EQ(t.end(), 21);
  EXPECT_EQ(t.compute_end(), 21);
  EXPECT_EQ(t.exposed(), 0);  // summed, compute and collective would have taken 26
}

TEST(StreamTimeline, AWaitRightAfterACollectiveExposesAllOfIt) {
  StreamTimeline t;
  t.kernel(0, 0, 10);
  t.wait(0, t.collective(1, 0, 5));
  t.kernel(0, 0, 10);
  EXPECT_EQ(t.end(), 25);
  EXPECT_EQ(t.compute_end(), 20);
  EXPECT_EQ(t.exposed(), 5);
}

// FSDP2's forward: each layer's all-gather on its own stream (1), waited there and handed
// to the compute stream (0) by an event; the next layer's is prefetched before this
// layer's compute is issued, so only the first one is exposed.
TEST(StreamTimeline, AnAllGatherPrefetchedBeforeALayerRunsBesideIt) {
  StreamTimeline t;
  t.wait(1, t.collective(7, 1, 4));  // layer 0's all-gather: 0 to 4
  const Moment gathered0 = t.now(1);
  t.wait(0, gathered0);
  t.wait(1, t.collective(7, 1, 4));  // layer 1's, prefetched: 4 to 8
  const Moment gathered1 = t.now(1);
  t.kernel(0, 0, 10);  // layer 0: 4 to 14
  t.wait(0, gathered1);
  t.kernel(0, 0, 10);  // layer 1: 14 to 24
  EXPECT_EQ(t.end(), 24);
  EXPECT_EQ(t.compute_end(), 20);
  EXPECT_EQ(t.exposed(), 4);
  // A channel takes one collective at a time: a third, issued at 0 on another stream,
  // starts when the second ends.
  EXPECT_EQ(t.collective(7, 2, 1).real, 9);
}

RC_GTEST_PROP(StreamTimeline, OverlapNeverCostsMoreThanTheSumAndNeverLessThanTheCompute, ()) {
  // Random schedules of kernels, collectives, waits for them and events across 3 streams.
  const auto steps = *rc::gen::container<std::vector<std::tuple<int, int, int>>>(
      rc::gen::tuple(rc::gen::inRange(0, 4), rc::gen::inRange(0, 3), rc::gen::inRange(0, 100)));
  StreamTimeline t;
  double moved = 0, collectives = 0;
  std::vector<Moment> ends;
  for (const auto& [what, stream, ms] : steps) {
    if (what == 0) moved += t.kernel(stream, ms % 3, ms);
    if (what == 1) ends.push_back(t.collective(stream % 2, stream, ms)), collectives += ms;
    if (what == 2 && !ends.empty()) t.wait(stream, ends[ms % ends.size()]);
    if (what == 3) t.wait((stream + 1) % 3, t.now(stream));
  }
  RC_ASSERT(std::abs(moved - t.compute_end()) < 1e-9);  // each operator's share adds up
  RC_ASSERT(t.exposed() >= -1e-9);
  RC_ASSERT(t.exposed() <= collectives + 1e-9);
}

std::string error_of_kernels(const std::string& kernels) {
  const std::string text =
      R"({"name": "x", "ops": {"default": [{"name": "a", "base_latency_us": 8, "bus_bandwidth_gbps": 1}]}, )"
      R"("compute": {"peak_tflops": {"float32": 1}, "memory_bandwidth_gbps": 1, "kernels": )" +
      kernels + "}}";
  try {
    parse_platform(text, "bad.json");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(PlatformFile, SaysWhatIsWrongWithItsKernelTable) {
  EXPECT_NE(error_of_kernels("{}").find("compute.kernels has no \"sms\""), std::string::npos);
  EXPECT_NE(error_of_kernels(R"({"sms": 0})").find("\"sms\" is not above 0"), std::string::npos);
  EXPECT_NE(error_of_kernels(R"({"sms": 4, "matmul_tiles": [[128, 256]]})")
                .find("[128,256] is not [rows, cols, fraction"),
            std::string::npos)
      << error_of_kernels(R"({"sms": 4, "matmul_tiles": [[128, 256]]})");
  EXPECT_NE(error_of_kernels(R"({"sms": 4, "memory_efficiency": 1.5})")
                .find("\"memory_efficiency\" is 1.5, not a fraction"),
            std::string::npos);
  EXPECT_EQ(error_of_kernels(R"({"sms": 4, "matmul_tiles": [[64, 64, 0.5]], "host_us": 3})"),
            "(accepted)");
  EXPECT_NE(error_of_kernels(R"({"sms": 4, "validation": {"runs": 2}})")
                .find("\"validation\" is not {dtypes: [...], runs, typical_error}"),
            std::string::npos);
  EXPECT_NE(
      error_of_kernels(
          R"({"sms": 4, "validation": {"dtypes": ["bfloat16"], "runs": 0, "typical_error": 0.1}})")
          .find("\"runs\" is not 1 or more"),
      std::string::npos);
  EXPECT_NE(error_of_kernels(
                R"({"sms": 4, "validation": {"dtypes": [16], "runs": 1, "typical_error": 0.1}})")
                .find("the dtype 16 is not a name"),
            std::string::npos);
}

// What the table was held to answers for bfloat16 matmuls and attention, and for every
// kernel bound by its memory traffic; a float32 matmul is outside it.
TEST(KernelModel, AnswersForTheDtypesItWasHeldTo) {
  const KernelCosts h100 = load_platform("h100-nvswitch").compute.kernels;
  ASSERT_EQ(h100.validated_dtypes, std::vector<std::string>{"bfloat16"});
  EXPECT_GE(h100.validated_runs, 1);
  const KernelShape mm{KernelKind::kMatmul, 1, 4096, 4096, 4096};
  const KernelShape attention{KernelKind::kAttention};
  EXPECT_TRUE(validated_kernel(h100, mm, "bfloat16"));
  EXPECT_TRUE(validated_kernel(h100, attention, "bfloat16"));
  EXPECT_FALSE(validated_kernel(h100, mm, "float32"));
  EXPECT_TRUE(validated_kernel(h100, KernelShape{}, "float32"));
  EXPECT_FALSE(validated_kernel(load_platform("a10-pcie").compute.kernels, mm, "bfloat16"));
}

TEST(PlatformFile, AKernelTableReadsBackTheSame) {
  const Roofline h100 = load_platform("h100-nvswitch").compute;
  const Roofline again =
      parse_platform(platform_json(load_platform("h100-nvswitch")), "again.json").compute;
  const KernelShape shape{KernelKind::kMatmul, 3, 1000, 3000, 4096};
  EXPECT_DOUBLE_EQ(kernel_seconds(again, shape, 7e10, 1e8, "bfloat16"),
                   kernel_seconds(h100, shape, 7e10, 1e8, "bfloat16"));
  EXPECT_EQ(again.kernels.host_us, h100.kernels.host_us);
  EXPECT_EQ(again.kernels.sources, h100.kernels.sources);
  EXPECT_EQ(again.kernels.validated_dtypes, h100.kernels.validated_dtypes);
  EXPECT_EQ(again.kernels.validated_runs, h100.kernels.validated_runs);
  EXPECT_EQ(again.kernels.typical_error, h100.kernels.typical_error);
}

}  // namespace
}  // namespace sgpu::model
