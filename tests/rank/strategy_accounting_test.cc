// Communication accounting (NOTE [Communication accounting]): a call's totals per rank,
// group and op are the recorded collectives added up, and for the training strategies they
// equal the theory exactly: DDP all-reduces every gradient once a step; FSDP all-gathers
// every unit twice a step (forward, and again for backward) and reduce-scatters it once;
// ZeRO-2 reduce-scatters and all-gathers the padded flat parameters once a step and
// all-reduces the gradient norm. Any model shape, 2, 4 and 8 ranks, both transports. The
// predicted times are the collective model's for each recorded collective on the
// simulated node's platform (8xH100: h100-nvswitch), and one named with '@'.
#include <gtest/gtest.h>
#include <rapidcheck.h>
#include <rapidcheck/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <filesystem>

#include "contract/collective_ring.h"
#include "contract/run_folder.h"
#include "model/platform.h"
#include "sgpu/parallel/ddp.h"
#include "sgpu/parallel/fsdp.h"
#include "sgpu/parallel/zero.h"
#include "sgpu/process_group.h"
#include "sgpu/sgpu.h"
#include "testing/sim_options.h"

namespace {

namespace F = torch::nn::functional;

struct Shape {
  std::int64_t in = 1, hidden = 1, out = 1;
  int steps = 1;
  std::string strategy;  // ddp, fsdp, zero2
  template <class Archive>
  void serialize(Archive& ar) {
    ar(in, hidden, out, steps, strategy);
  }
  std::int64_t first() const { return in * hidden + hidden; }  // Linear(in, hidden)
  std::int64_t second() const { return hidden * out + out; }   // Linear(hidden, out)
};

int train(Shape shape) {
  torch::manual_seed(3);
  torch::nn::Sequential model(torch::nn::Linear(shape.in, shape.hidden), torch::nn::ReLU(),
                              torch::nn::Linear(shape.hidden, shape.out));
  torch::manual_seed(11 + sgpu::global_rank());
  const at::Tensor x = torch::randn({4, shape.in}), y = torch::randn({4, shape.out});
  if (shape.strategy == "ddp") {
    sgpu::parallel::DistributedDataParallel ddp(model);
    torch::optim::SGD sgd(ddp.parameters(), 0.1);
    for (int s = 0; s < shape.steps; ++s) {
      sgd.zero_grad();
      F::mse_loss(ddp.forward(x), y).backward();
      sgd.step();
    }
  } else if (shape.strategy == "fsdp") {
    sgpu::parallel::FullyShardedDataParallel fsdp(model);
    torch::optim::SGD sgd(fsdp.parameters(), 0.1);
    for (int s = 0; s < shape.steps; ++s) {
      sgd.zero_grad();
      F::mse_loss(fsdp.forward(x), y).backward();
      sgd.step();
    }
  } else {
    sgpu::parallel::ZeroOptimizer zero(
        model->parameters(),
        sgpu::parallel::ZeroConfig::parse(
            R"({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2},
                "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})"));
    for (int s = 0; s < shape.steps; ++s) {
      zero.backward(F::mse_loss(model->forward(x), y));
      zero.step();
    }
  }
  return 0;
}

const sgpu::model::Platform& h100() {
  static const sgpu::model::Platform p = sgpu::model::load_platform("h100-nvswitch");
  return p;
}

std::int64_t padded(std::int64_t n, int world) { return (n + world - 1) / world * world; }

sgpu::CollectiveTotals of(const std::map<std::string, sgpu::CollectiveTotals>& ops,
                          const std::string& op) {
  const auto it = ops.find(op);
  return it == ops.end() ? sgpu::CollectiveTotals{} : it->second;
}

RC_GTEST_PROP(Accounting, EqualsTheRecordedCollectivesAndTheStrategysTheory, ()) {
  const int world = *rc::gen::element(2, 4, 8);
  Shape shape;
  shape.in = *rc::gen::inRange<std::int64_t>(1, 40);
  shape.hidden = *rc::gen::inRange<std::int64_t>(1, 40);
  shape.out = *rc::gen::inRange<std::int64_t>(1, 10);
  shape.steps = *rc::gen::inRange(1, 4);
  shape.strategy = *rc::gen::element<std::string>("ddp", "fsdp", "zero2");
  RC_TAG(shape.strategy, world);
  sgpu::Options o = sgpu::testing::sim(world, true);
  o.keep_run_dir = true;
  o.tracking = false;
  auto launch = sgpu::distributed(train, o).launch(shape);
  launch.wait();
  const auto& comm = launch.comm_stats();
  RC_ASSERT(comm.size() == static_cast<std::size_t>(world));

  const std::int64_t params = shape.first() + shape.second();
  const std::int64_t f = sizeof(float);
  const std::int64_t steps = shape.steps;
  for (int rank = 0; rank < world; ++rank) {
    const sgpu::CommStats& stats = comm[static_cast<std::size_t>(rank)];
    // The totals are the ring's entries added up (the ring holds every one here).
    const auto ring = sgpu::contract::read_collective_ring(
        sgpu::contract::RunFolder{launch.run_dir()}.rank(rank).collective_ring());
    RC_ASSERT(ring.has_value());
    RC_ASSERT(ring->written <= ring->capacity);
    RC_ASSERT(stats.platform == "h100-nvswitch");
    RC_ASSERT(ring->platform == "h100-nvswitch");
    std::map<std::string, sgpu::CollectiveTotals> summed;
    for (const auto& e : ring->entries) {
      const std::string op(sgpu::contract::op_name(e.op));
      sgpu::CollectiveTotals& t = summed[op];
      t.count += 1;
      t.bytes += e.message_bytes;
      t.seconds += static_cast<double>(e.ended_ns - e.entered_ns) / 1e9;
      // Each entry's prediction is the model's for its op, size and group.
      const auto c = sgpu::model::collective_of(op);
      RC_ASSERT(c.has_value());
      RC_ASSERT(
          e.predicted_ns ==
          std::llround(sgpu::model::predict(h100(), *c, e.message_bytes, world).seconds * 1e9));
      t.predicted_seconds += static_cast<double>(e.predicted_ns) / 1e9;
    }
    const auto by_op = stats.by_op();
    RC_ASSERT(by_op.size() == summed.size());
    for (const auto& [op, t] : summed) {
      RC_ASSERT(of(by_op, op).count == t.count);
      RC_ASSERT(of(by_op, op).bytes == t.bytes);
      RC_ASSERT(std::abs(of(by_op, op).seconds - t.seconds) <= 1e-6 + 1e-9 * t.count);
      RC_ASSERT(std::abs(of(by_op, op).predicted_seconds - t.predicted_seconds) <= 1e-9 * t.count);
      RC_ASSERT(of(by_op, op).predicted_seconds > 0);  // every op here moves data or waits
    }
    RC_ASSERT(stats.groups.size() == 1u);
    RC_ASSERT(stats.groups.count("world") == 1u);

    // The theory, in nccl-tests' message sizes.
    if (shape.strategy == "ddp") {
      // Rank 0's parameters among what it broadcasts first (with DDP's checks of them).
      RC_ASSERT(of(by_op, "broadcast").bytes >= params * f);
      RC_ASSERT(of(by_op, "all_reduce").bytes == steps * params * f);
      RC_ASSERT(of(by_op, "all_reduce").count >= steps);
    } else if (shape.strategy == "fsdp") {
      const std::int64_t units = padded(shape.first(), world) + padded(shape.second(), world);
      RC_ASSERT(of(by_op, "broadcast").bytes >= params * f);
      RC_ASSERT(of(by_op, "reduce_scatter_tensor").count == 2 * steps);
      RC_ASSERT(of(by_op, "reduce_scatter_tensor").bytes == steps * units * f);
      RC_ASSERT(of(by_op, "all_gather_into_tensor").count == 2 * 2 * steps);
      RC_ASSERT(of(by_op, "all_gather_into_tensor").bytes == 2 * steps * units * f);
    } else {
      const std::int64_t flat = padded(params, world);
      RC_ASSERT(of(by_op, "reduce_scatter_tensor").count == steps);
      RC_ASSERT(of(by_op, "reduce_scatter_tensor").bytes == steps * flat * f);
      RC_ASSERT(of(by_op, "all_gather_into_tensor").count == steps);
      RC_ASSERT(of(by_op, "all_gather_into_tensor").bytes == steps * flat * f);
      RC_ASSERT(of(by_op, "all_reduce").count == steps);  // the gradient norm, a double
      RC_ASSERT(of(by_op, "all_reduce").bytes == steps * 8);
    }
    // Every rank of these strategies makes the same collectives.
    for (const auto& [op, t] : by_op) {
      RC_ASSERT(t.count == of(comm[0].by_op(), op).count);
      RC_ASSERT(t.bytes == of(comm[0].by_op(), op).bytes);
    }
  }
  std::filesystem::remove_all(launch.run_dir());
}

// A failed call's accounting is still there: what the ranks made before it failed.
int reduce_then_throw(int times) {
  auto& pg = sgpu::process_group();
  for (int i = 0; i < times; ++i) {
    std::vector<at::Tensor> t{at::ones({250})};
    pg.allreduce(t)->wait();
  }
  if (sgpu::global_rank() == 1) throw std::runtime_error("after the collectives");
  return 0;
}

TEST(Accounting, AFailedCallStillHasIt) {
  sgpu::Options o = sgpu::testing::sim(2, true);
  o.tracking = false;
  auto launch = sgpu::distributed(reduce_then_throw, o).launch(3);
  EXPECT_THROW(launch.wait(), sgpu::DistributedError);
  for (const sgpu::CommStats& rank : launch.comm_stats()) {
    const sgpu::CollectiveTotals t = rank.groups.at("world").at("all_reduce");
    EXPECT_EQ(t.count, 3);
    EXPECT_EQ(t.bytes, 3 * 250 * 4);
    EXPECT_GE(t.seconds, 0.0);
  }
}

// A node spec's '@PLATFORM' is the platform predicted on; a node of one GPU type predicts on
// that type's node, a mixed one on none.
int reduce(int times) {
  auto& pg = sgpu::process_group();
  for (int i = 0; i < times; ++i) {
    std::vector<at::Tensor> t{at::ones({250})};
    pg.allreduce(t)->wait();
  }
  return 0;
}

TEST(Accounting, PredictsOnTheNodeTheSpecNames) {
  const auto stats_of = [](const char* spec, int gpus, const char* gpu_type) {
    sgpu::Options o = sgpu::testing::sim(gpus, true);
    o.gpu_type = gpu_type;
    o.sim.node = spec;
    o.tracking = false;
    auto launch = sgpu::distributed(reduce, o).launch(1);
    launch.wait();
    return launch.comm_stats().at(0);
  };
  const sgpu::CommStats named = stats_of("2xA100@a10-pcie", 2, "");
  EXPECT_EQ(named.platform, "a10-pcie");
  EXPECT_DOUBLE_EQ(named.by_op().at("all_reduce").predicted_seconds,
                   std::llround(sgpu::model::predict(sgpu::model::load_platform("a10-pcie"),
                                                     sgpu::model::Collective::kAllReduce, 1000, 2)
                                    .seconds *
                                1e9) /
                       1e9);
  EXPECT_EQ(stats_of("2xA100", 2, "").platform, "a100-nvswitch");
  const sgpu::CommStats mixed = stats_of("1xH100+1xA10", 1, "A10");
  EXPECT_EQ(mixed.platform, "");
  EXPECT_EQ(mixed.by_op().at("all_reduce").predicted_seconds, 0);
  sgpu::Options o = sgpu::testing::sim(2);
  o.sim.node = "2xH100@h300-nvswitch";
  o.tracking = false;
  try {
    sgpu::distributed(reduce, o).distributed(0);
    ADD_FAILURE() << "an unknown platform started a call";
  } catch (const sgpu::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("no platform \"h300-nvswitch\""), std::string::npos)
        << e.what();
  }
}

}  // namespace

// NOTE [The compute model]: a C++ function's rank computing values on sim times each
// operator it calls as one kernel on the node's roofline: linear over bfloat16 256x512 by
// 512x1024 is 2*256*512*1024 FLOPs (its addmm's), over the A10's 125 TFLOPS (a platform
// with no kernel table: the roofline alone, NOTE [The kernel model]), and what it
// runs inside (the weight's transpose, the addmm) is not timed again. Backward (through the
// autograd engine's frames) computes the weight's gradient: an mm of as many FLOPs.
double linear_layer(int) {
  const at::Tensor x = at::ones({256, 512}, at::kBFloat16);
  const at::Tensor w = at::ones({1024, 512}, at::kBFloat16).requires_grad_();
  const at::Tensor b = at::zeros({1024}, at::kBFloat16);
  const at::Tensor total = at::linear(x, w, b).sum();
  total.backward();
  return total.item<double>();
}

TEST(ComputeEstimate, AComputingRanksKernelsAreTimedOnTheNodesRoofline) {
  sgpu::Options o = sgpu::testing::sim(2, true);
  o.sim.node = "2xA10";
  o.tracking = false;
  auto launch = sgpu::distributed(linear_layer, o).launch(0);
  EXPECT_EQ(launch.wait(), (std::vector<double>{256.0 * 1024 * 512, 256.0 * 1024 * 512}));
  const sgpu::model::Roofline a10 = sgpu::model::load_platform("a10-pcie").compute;
  for (const sgpu::ComputeStats& rank : launch.compute_stats()) {
    EXPECT_EQ(rank.platform, "a10-pcie");
    std::string timed;
    for (const auto& [op, t] : rank.ops) timed += " " + op;
    ASSERT_TRUE(rank.ops.contains("aten.linear") && rank.ops.contains("aten.sum")) << timed;
    const sgpu::ComputeTotals linear = rank.ops.at("aten.linear");
    EXPECT_EQ(linear.count, 1);
    EXPECT_DOUBLE_EQ(linear.flops, 2.0 * 256 * 512 * 1024);
    EXPECT_DOUBLE_EQ(linear.bytes, (256.0 * 512 + 1024 * 512 + 1024 + 256 * 1024) * 2);
    EXPECT_DOUBLE_EQ(linear.predicted_seconds,
                     sgpu::model::roofline_seconds(a10, linear.flops, linear.bytes, "bfloat16"));
    ASSERT_TRUE(rank.ops.contains("aten.mm")) << timed;
    EXPECT_DOUBLE_EQ(rank.ops.at("aten.mm").flops, 2.0 * 256 * 512 * 1024);
    EXPECT_DOUBLE_EQ(rank.total().flops, 2 * 2.0 * 256 * 512 * 1024);
    for (const char* inside : {"aten.addmm", "aten.t", "aten.empty"})
      EXPECT_FALSE(rank.ops.contains(inside)) << inside << " in" << timed;
    // The ones, the zeros and the sum are kernels that move memory.
    EXPECT_GT(rank.ops.at("aten.sum").bytes, 256.0 * 1024 * 2);
    EXPECT_DOUBLE_EQ(
        rank.ops.at("aten.sum").predicted_seconds,
        sgpu::model::roofline_seconds(a10, 0, rank.ops.at("aten.sum").bytes, "bfloat16"));
  }
}
