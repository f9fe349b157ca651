// The collective model (NOTE [The collective model]): the shipped platforms against the
// published figures they must reproduce, the laws every prediction keeps, a fit that
// reproduces the timings it was fitted to, and platform files that say what is wrong.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>
#include <stdlib.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include "contract/collective_ring.h"
#include "model/platform.h"
#include "sgpu/errors.h"
#include "testing/temp_dir.h"

namespace sgpu::model {
namespace {

constexpr std::int64_t kMiB = std::int64_t{1} << 20;
constexpr Collective kAll[] = {Collective::kAllReduce,     Collective::kAllGather,
                               Collective::kReduceScatter, Collective::kBroadcast,
                               Collective::kReduce,        Collective::kAllToAll,
                               Collective::kSendRecv};

TEST(Platforms, TheFourNodesShip) {
  const auto names = platform_names();
  for (const char* name : {"h100-nvswitch", "h200-nvswitch", "a100-nvswitch", "a10-pcie"}) {
    EXPECT_NE(std::find(names.begin(), names.end(), name), names.end()) << name;
    const Platform p = load_platform(name);
    EXPECT_EQ(p.name, name);
    EXPECT_FALSE(p.sources.empty()) << name << " says where its constants come from";
    for (Collective c : kAll)
      EXPECT_FALSE(p.algorithms(c).empty()) << name << " " << collective_name(c);
  }
}

TEST(Platforms, EachGpuTypeHasItsNode) {
  EXPECT_EQ(default_platform_for("H100"), "h100-nvswitch");
  EXPECT_EQ(default_platform_for("h200"), "h200-nvswitch");
  EXPECT_EQ(default_platform_for("A100"), "a100-nvswitch");
  EXPECT_EQ(default_platform_for("A10G"), "a10-pcie");
  // H800's NVLink is narrower than H100's: no node is assumed for it.
  EXPECT_EQ(default_platform_for("H800"), std::nullopt);
}

// The validation docs/communication.md's table shows: published 8xH100 (and 8xH200) figures within
// 10% from 64 MiB up, the small-message floor within 2x.
TEST(Validation, PublishedHopperFiguresAreMet) {
  for (const char* name : {"h100-nvswitch", "h200-nvswitch"}) {
    const auto rows = validate(load_platform(name));
    ASSERT_FALSE(rows.empty()) << name;
    for (const Check& row : rows) {
      if (row.published.nodes > 1) continue;  // network_test holds the rows across nodes
      const std::string what = std::string(name) + " " +
                               std::string(collective_name(row.published.op)) + " of " +
                               std::to_string(row.published.bytes) + " B (" + row.published.source +
                               "): predicted " + std::to_string(row.predicted.seconds * 1e6) +
                               " us, published " + std::to_string(row.published_us) + " us";
      if (row.published.bytes >= 64 * kMiB) {
        EXPECT_LE(std::abs(row.error), 0.10) << what;
      } else {
        EXPECT_LE(1 + row.error, 2.0) << what;
        EXPECT_GE(1 + row.error, 0.5) << what;
      }
    }
  }
}

TEST(Validation, ReduceScatterFollowsNccl1047AtEverySize) {
  // The reduce-scatter rows are independent of the constants (which come from NCCL and
  // SimAI's curve): each one must be there and close.
  int rows = 0;
  for (const Check& row : validate(load_platform("h100-nvswitch"))) {
    if (row.published.op != Collective::kReduceScatter) continue;
    ++rows;
    EXPECT_FALSE(row.published.calibrated);
    EXPECT_LE(std::abs(row.error), 0.03) << row.published.bytes;
  }
  EXPECT_EQ(rows, 7);
}

TEST(Predict, OneRankAndEmptyTransfersCostNothing) {
  const Platform p = load_platform("h100-nvswitch");
  EXPECT_EQ(predict(p, Collective::kAllReduce, 1 << 20, 1).seconds, 0);
  EXPECT_EQ(predict(p, Collective::kSendRecv, 0, 2).seconds, 0);
  // A barrier's empty all-reduce still pays the latency.
  EXPECT_GT(predict(p, Collective::kAllReduce, 0, 8).seconds, 5e-6);
}

TEST(Predict, NvlsCarriesLargeAllReducesOnHopper) {
  const Platform p = load_platform("h100-nvswitch");
  EXPECT_EQ(predict(p, Collective::kAllReduce, 1 << 30, 8).algorithm, "nvls/Simple");
  EXPECT_EQ(predict(p, Collective::kAllReduce, 4, 8).algorithm, "ring/LL");
  EXPECT_EQ(predict(p, Collective::kAllGather, 1 << 30, 8).algorithm, "ring/Simple");
  EXPECT_EQ(predict(load_platform("a100-nvswitch"), Collective::kAllReduce, 1 << 30, 8).algorithm,
            "ring/Simple");
}

const Platform& any_platform(int index) {
  static const std::vector<Platform> all = [] {
    std::vector<Platform> v;
    for (const char* name : {"h100-nvswitch", "h200-nvswitch", "a100-nvswitch", "a10-pcie"})
      v.push_back(load_platform(name));
    return v;
  }();
  return all[static_cast<std::size_t>(index) % all.size()];
}

RC_GTEST_PROP(Predict, LargerMessagesNeverTakeLess, ()) {
  const Platform& p = any_platform(*rc::gen::inRange(0, 4));
  const Collective c = kAll[*rc::gen::inRange<std::size_t>(0, std::size(kAll))];
  const int ranks = *rc::gen::inRange(2, 9);
  const std::int64_t a = *rc::gen::inRange<std::int64_t>(1, std::int64_t{16} << 30);
  const std::int64_t b = *rc::gen::inRange<std::int64_t>(1, std::int64_t{16} << 30);
  const auto [small, large] = std::minmax(a, b);
  RC_ASSERT(predict(p, c, small, ranks).seconds <= predict(p, c, large, ranks).seconds);
}

RC_GTEST_PROP(Predict, NoMessageBeatsTheFastestLinkOrLatency, ()) {
  const Platform& p = any_platform(*rc::gen::inRange(0, 4));
  const Collective c = kAll[*rc::gen::inRange<std::size_t>(0, std::size(kAll))];
  const int ranks = *rc::gen::inRange(2, 9);
  const std::int64_t bytes = *rc::gen::inRange<std::int64_t>(1, std::int64_t{16} << 30);
  double fastest = 0, lowest_latency = 1e9;
  for (const Algorithm& a : p.algorithms(c)) {
    double top = 1.0;
    for (const auto& [size, fraction] : a.efficiency) top = std::max(top, fraction);
    fastest = std::max(fastest, a.bus_bandwidth_gbps * top);
    lowest_latency = std::min(lowest_latency, a.base_latency_us + a.hop_latency_us);
  }
  const Prediction got = predict(p, c, bytes, ranks);
  RC_ASSERT(got.busbw_gbps <= fastest * (1 + 1e-9));
  RC_ASSERT(got.seconds >= lowest_latency * 1e-6 * (1 - 1e-9));
}

// The law `sgpu model fit` rests on: a platform fitted to a node's timings predicts those
// timings again, at every size measured.
RC_GTEST_PROP(Fit, ReproducesTheTimingsItWasFittedTo, ()) {
  const Platform& truth = any_platform(*rc::gen::inRange(0, 4));
  const int ranks = *rc::gen::inRange(2, 9);
  const int sizes = *rc::gen::inRange(1, 12);
  const int first = *rc::gen::inRange(2, 20);  // log2 of the smallest size
  std::vector<Measurement> rows;
  for (Collective c :
       {Collective::kAllReduce, Collective::kAllGather, Collective::kReduceScatter}) {
    for (int i = 0; i < sizes; ++i) {
      const std::int64_t bytes = std::int64_t{1} << (first + 2 * i);
      rows.push_back({c, bytes, ranks, predict(truth, c, bytes, ranks).seconds});
    }
  }
  const Platform fitted = fit_platform(load_platform("h100-nvswitch"), rows, "fitted-node");
  const Platform reread = parse_platform(platform_json(fitted), "fitted-node.json");
  for (const Measurement& m : rows) {
    for (const Platform* p : {&fitted, &reread}) {
      const double got = predict(*p, m.op, m.bytes, m.ranks).seconds;
      RC_ASSERT(std::abs(got / m.seconds - 1) < 1e-9);
    }
  }
}

TEST(Fit, RefusesTimingsItCannotUse) {
  const Platform base = load_platform("h100-nvswitch");
  EXPECT_THROW(fit_platform(base, {{Collective::kAllReduce, 1024, 8, 0.0}}, "x"), ConfigError);
  EXPECT_THROW(
      fit_platform(
          base, {{Collective::kAllReduce, 1024, 8, 1e-5}, {Collective::kAllReduce, 2048, 4, 2e-5}},
          "x"),
      ConfigError);
}

TEST(Collectives, EveryRecordedOpHasOne) {
  for (std::size_t op = 0; op < contract::kCollectiveOps; ++op) {
    const auto name = contract::op_name(static_cast<contract::CollectiveOp>(op));
    EXPECT_TRUE(collective_of(name).has_value()) << name;
  }
  EXPECT_EQ(collective_of("all_gather_into_tensor"), Collective::kAllGather);
  EXPECT_EQ(collective_of("reduce_scatter_tensor_coalesced"), Collective::kReduceScatter);
  EXPECT_EQ(collective_of("barrier"), Collective::kAllReduce);
  EXPECT_EQ(collective_of("recv_any_source"), Collective::kSendRecv);
}

std::string error_of(const std::string& text) {
  try {
    parse_platform(text, "bad.json");
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "(accepted)";
}

TEST(PlatformFile, SaysWhatIsWrong) {
  EXPECT_NE(error_of("{").find("bad.json: not JSON"), std::string::npos) << error_of("{");
  EXPECT_NE(error_of(R"({"ops": {}})").find("no \"name\""), std::string::npos);
  const std::string no_bw =
      R"({"name": "x", "ops": {"default": [{"name": "ring/Simple", "base_latency_us": 8}]}})";
  EXPECT_NE(error_of(no_bw).find("ops.default[0] (ring/Simple) has no \"bus_bandwidth_gbps\""),
            std::string::npos)
      << error_of(no_bw);
  const std::string bad_op =
      R"({"name": "x", "ops": {"allreduce": [{"name": "a", "base_latency_us": 8, "bus_bandwidth_gbps": 1}]}})";
  EXPECT_NE(error_of(bad_op).find("\"allreduce\""), std::string::npos) << error_of(bad_op);
  const std::string descending =
      R"({"name": "x", "curves": {"c": [[2048, 0.5], [1024, 0.6]]}, "ops": {"default": [{"name": "a", "base_latency_us": 8, "bus_bandwidth_gbps": 1, "efficiency": "c"}]}})";
  EXPECT_NE(error_of(descending).find("ascend"), std::string::npos) << error_of(descending);
  const std::string no_curve =
      R"({"name": "x", "ops": {"default": [{"name": "a", "base_latency_us": 8, "bus_bandwidth_gbps": 1, "efficiency": "c"}]}})";
  EXPECT_NE(error_of(no_curve).find("no curve \"c\""), std::string::npos) << error_of(no_curve);
  const std::string partial =
      R"({"name": "x", "ops": {"all_reduce": [{"name": "a", "base_latency_us": 8, "bus_bandwidth_gbps": 1}]}})";
  EXPECT_NE(error_of(partial).find("neither every collective nor a \"default\""),
            std::string::npos);
}

TEST(PlatformFile, TheJsonWrittenReadsBackTheSame) {
  for (const char* name : {"h100-nvswitch", "a10-pcie"}) {
    const Platform p = load_platform(name);
    const Platform q = parse_platform(platform_json(p), "again.json");
    EXPECT_EQ(q.published.size(), p.published.size());
    for (Collective c : kAll) {
      for (std::int64_t bytes : {std::int64_t{8}, 3 * kMiB, std::int64_t{5} << 30})
        EXPECT_DOUBLE_EQ(predict(q, c, bytes, 8).seconds, predict(p, c, bytes, 8).seconds);
    }
    EXPECT_EQ(q.compute.peak_tflops, p.compute.peak_tflops);
    EXPECT_EQ(q.compute.memory_bandwidth_gbps, p.compute.memory_bandwidth_gbps);
    EXPECT_EQ(q.compute.efficiency, p.compute.efficiency);
  }
}

// NOTE [The compute model]: the roofline of each shipped node, from its datasheet.
TEST(Roofline, EveryNodeHasItsGpusDatasheet) {
  for (const std::string& name : platform_names()) {
    const Roofline& r = load_platform(name).compute;
    EXPECT_FALSE(r.empty()) << name;
    EXPECT_GT(r.peak_for("bfloat16"), r.peak_for("float32")) << name;
  }
  const Roofline h100 = load_platform("h100-nvswitch").compute;
  EXPECT_DOUBLE_EQ(h100.peak_for("bfloat16"), 989.4);
  EXPECT_DOUBLE_EQ(h100.memory_bandwidth_gbps, 3350);
  EXPECT_DOUBLE_EQ(load_platform("h200-nvswitch").compute.memory_bandwidth_gbps, 4800);
  // torchtitan's H100s: HBM2e at 2.4 TB/s, a peak between the SXM's and the NVL's (835).
  const Roofline grand_teton = load_platform("h100-96gb-500w").compute;
  EXPECT_DOUBLE_EQ(grand_teton.memory_bandwidth_gbps, 2400);
  EXPECT_GT(grand_teton.peak_for("bfloat16"), 835);
  EXPECT_LT(grand_teton.peak_for("bfloat16"), 989.4);
  EXPECT_EQ(grand_teton.kernels.sms, 132);
}

TEST(Roofline, AnOperatorTakesTheLongerOfItsMathAndItsMemoryTraffic) {
  const Roofline h100 = load_platform("h100-nvswitch").compute;
  // A 4096^3 bfloat16 matmul: 137 GFLOP over 100 MB: bound by the tensor cores.
  const double flops = 2.0 * 4096 * 4096 * 4096, bytes = 3.0 * 4096 * 4096 * 2;
  EXPECT_DOUBLE_EQ(roofline_seconds(h100, flops, bytes, "bfloat16"), flops / 989.4e12);
  // An elementwise add of 1 GB: bound by the memory.
  EXPECT_DOUBLE_EQ(roofline_seconds(h100, 0, 1e9, "bfloat16"), 1e9 / 3350e9);
  // float32 on CUDA cores is 15 times slower than bfloat16; a dtype not listed is float32.
  EXPECT_DOUBLE_EQ(roofline_seconds(h100, flops, bytes, "float32"), flops / 66.9e12);
  EXPECT_DOUBLE_EQ(roofline_seconds(h100, flops, bytes, "complex64"), flops / 66.9e12);
  EXPECT_DOUBLE_EQ(roofline_seconds(h100, flops, bytes, "tf32"), flops / 494.7e12);
  // torch's float8 dtypes ("float8_e4m3fn", "float8_e5m2") on the file's "float8" peak.
  EXPECT_DOUBLE_EQ(roofline_seconds(h100, flops, bytes, "float8_e4m3fn"), flops / 1978.9e12);
  EXPECT_DOUBLE_EQ(roofline_seconds(h100, flops, bytes, "float8_e5m2"), flops / 1978.9e12);
  // A calibrated efficiency stretches both sides alike.
  Roofline calibrated = h100;
  calibrated.efficiency = 0.5;
  EXPECT_DOUBLE_EQ(roofline_seconds(calibrated, flops, bytes, "bfloat16"), 2 * flops / 989.4e12);
  EXPECT_EQ(roofline_seconds(Roofline{}, flops, bytes, "bfloat16"), 0);
}

RC_GTEST_PROP(Roofline, MoreWorkNeverTakesLess, ()) {
  const Roofline& r = any_platform(*rc::gen::inRange(0, 4)).compute;
  const double flops = *rc::gen::inRange(0, 1 << 30) * 1e3, bytes = *rc::gen::inRange(0, 1 << 30);
  const double more_flops = flops + *rc::gen::inRange(0, 1 << 30) * 1e3;
  const double more_bytes = bytes + *rc::gen::inRange(0, 1 << 30);
  const double t = roofline_seconds(r, flops, bytes, "bfloat16");
  RC_ASSERT(roofline_seconds(r, more_flops, more_bytes, "bfloat16") >= t);
  // Never faster than either roof alone.
  RC_ASSERT(t >= flops / (r.peak_for("bfloat16") * 1e12) * 0.999999);
  RC_ASSERT(t >= bytes / (r.memory_bandwidth_gbps * 1e9) * 0.999999);
}

TEST(PlatformFile, SaysWhatIsWrongWithItsRoofline) {
  const std::string ops =
      R"("ops": {"default": [{"name": "a", "base_latency_us": 8, "bus_bandwidth_gbps": 1}]})";
  auto with = [&](const std::string& compute) {
    return error_of(R"({"name": "x", )" + ops + R"(, "compute": )" + compute + "}");
  };
  EXPECT_NE(with(R"({"memory_bandwidth_gbps": 1})").find("no \"peak_tflops\""), std::string::npos);
  EXPECT_NE(with(R"({"peak_tflops": {"bfloat16": 1}, "memory_bandwidth_gbps": 1})")
                .find("no \"float32\""),
            std::string::npos);
  EXPECT_NE(with(R"({"peak_tflops": {"float32": 1}})").find("no \"memory_bandwidth_gbps\""),
            std::string::npos);
  EXPECT_NE(with(R"({"peak_tflops": {"float32": 1}, "memory_bandwidth_gbps": 1, "efficiency": 2})")
                .find("\"efficiency\" is 2"),
            std::string::npos);
  EXPECT_EQ(with(R"({"peak_tflops": {"float32": 1}, "memory_bandwidth_gbps": 1})"), "(accepted)");
}

TEST(PlatformPath, FoldersInTheVariableComeFirstAndUnknownNamesListTheKnown) {
  const auto dir = testing::make_temp_dir("sgpu-platforms");
  std::ofstream(dir / "h100-nvswitch.json")
      << R"({"name": "mine", "ops": {"default": [{"name": "a", "base_latency_us": 1, "bus_bandwidth_gbps": 1}]}})";
  ::setenv("SGPU_PLATFORM_PATH", dir.c_str(), 1);
  EXPECT_EQ(load_platform("h100-nvswitch").name, "mine");
  try {
    load_platform("h300-nvswitch");
    ADD_FAILURE() << "an unknown platform loaded";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "no platform \"h300-nvswitch\": the platforms are a10-pcie, a100-nvswitch"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(load_platform((dir / "h100-nvswitch.json").string()).name, "mine");
  ::unsetenv("SGPU_PLATFORM_PATH");
  EXPECT_EQ(load_platform("h100-nvswitch").name, "h100-nvswitch");
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace sgpu::model
