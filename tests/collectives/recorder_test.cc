// The collective recorder's entries are the collectives the ranks made: a known sequence
// of every kind, entry for entry, and one training step of DDP, FSDP and ZeRO-2, whose
// element counts are fixed by the model (every gradient all-reduced once; every unit's
// padded flat buffer reduce-scattered once; the padded flat parameters reduce-scattered
// and gathered once).
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/sgd.h>

#include <numeric>

#include "contract/collective_ring.h"
#include "contract/run_folder.h"
#include "sgpu/parallel/ddp.h"
#include "sgpu/parallel/fsdp.h"
#include "sgpu/parallel/zero.h"
#include "sgpu/process_group.h"
#include "sgpu/sgpu.h"
#include "testing/sim_options.h"

namespace {

using sgpu::contract::CollectiveEntry;
using sgpu::contract::CollectiveOp;
using sgpu::contract::EntryState;

namespace F = torch::nn::functional;

// Linear(7, 5), Tanh, Linear(5, 3): units of 40 and 18 parameters, 58 in all.
constexpr std::int64_t kUnits[] = {40, 18};
constexpr std::int64_t kParams = 58;

torch::nn::Sequential model() {
  torch::manual_seed(3);
  torch::nn::Sequential m(torch::nn::Linear(7, 5), torch::nn::Tanh(), torch::nn::Linear(5, 3));
  m->to(torch::kDouble);
  return m;
}

std::pair<at::Tensor, at::Tensor> batch() {
  torch::manual_seed(11 + sgpu::global_rank());
  return {torch::randn({4, 7}, torch::kDouble), torch::randn({4, 3}, torch::kDouble)};
}

int known_sequence(int) {
  auto& pg = sgpu::process_group();
  const int world = sgpu::world_size();
  std::vector<at::Tensor> a{at::ones({10})};
  pg.allreduce(a)->wait();
  std::vector<at::Tensor> b{at::zeros({4}, at::kLong)};
  c10d::BroadcastOptions root;
  root.rootRank = world - 1;
  pg.broadcast(b, root)->wait();
  at::Tensor in = at::ones({3});
  at::Tensor out = at::empty({3 * world});
  pg._allgather_base(out, in)->wait();
  at::Tensor big = at::ones({2 * world});
  at::Tensor small = at::empty({2});
  c10d::ReduceScatterOptions max;
  max.reduceOp = c10d::ReduceOp::MAX;
  pg._reduce_scatter_base(small, big, max)->wait();
  pg.barrier()->wait();
  std::vector<at::Tensor> message{at::ones({5})};
  if (sgpu::global_rank() == 0) pg.send(message, 1, 0)->wait();
  if (sgpu::global_rank() == 1) pg.recv(message, 0, 0)->wait();
  return sgpu::global_rank();
}

int ddp_step(int) {
  sgpu::parallel::DistributedDataParallel ddp(model());
  torch::optim::SGD sgd(ddp.parameters(), 0.1);
  auto [x, y] = batch();
  F::mse_loss(ddp.forward(x), y).backward();
  sgd.step();
  return 0;
}

int fsdp_step(int) {
  sgpu::parallel::FullyShardedDataParallel fsdp(model());
  torch::optim::SGD sgd(fsdp.parameters(), 0.1);
  auto [x, y] = batch();
  F::mse_loss(fsdp.forward(x), y).backward();
  sgd.step();
  return 0;
}

int zero_step(int) {
  auto m = model();
  sgpu::parallel::ZeroOptimizer zero(
      m->parameters(),
      sgpu::parallel::ZeroConfig::parse(
          R"({"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2},
              "optimizer": {"type": "SGD", "params": {"lr": 0.1}}})"));
  auto [x, y] = batch();
  zero.backward(F::mse_loss(m->forward(x), y));
  zero.step();
  return 0;
}

// Every rank's recorded entries, after a call that kept its run folder.
template <class F>
std::vector<std::vector<CollectiveEntry>> recorded(F* fn, int world, const std::string& transport) {
  sgpu::Options o = sgpu::testing::sim(world, true);
  o.sim.transport = transport;
  o.keep_run_dir = true;
  o.tracking = false;
  auto launch = sgpu::distributed(fn, o).launch(0);
  launch.wait();
  std::vector<std::vector<CollectiveEntry>> entries;
  for (int rank = 0; rank < world; ++rank) {
    const auto ring = sgpu::contract::read_collective_ring(
        sgpu::contract::RunFolder{launch.run_dir()}.rank(rank).collective_ring());
    EXPECT_TRUE(ring.has_value()) << "rank " << rank << " has no ring";
    entries.push_back(ring ? ring->entries : std::vector<CollectiveEntry>{});
    if (ring) {
      EXPECT_EQ(ring->groups.size(), 1u);
      if (!ring->groups.empty()) {
        EXPECT_EQ(ring->groups[0].name, "world");
      }
    }
  }
  std::filesystem::remove_all(launch.run_dir());
  return entries;
}

std::int64_t padded(std::int64_t n, int world) { return (n + world - 1) / world * world; }

// The entries of `op` in one rank's ring.
std::vector<CollectiveEntry> of(const std::vector<CollectiveEntry>& entries, CollectiveOp op) {
  std::vector<CollectiveEntry> found;
  for (const auto& e : entries) {
    if (e.op == op) found.push_back(e);
  }
  return found;
}

std::int64_t sum_in(const std::vector<CollectiveEntry>& entries) {
  return std::accumulate(entries.begin(), entries.end(), std::int64_t{0},
                         [](std::int64_t s, const CollectiveEntry& e) { return s + e.numel_in; });
}

class Recorder : public ::testing::TestWithParam<std::string> {};

TEST_P(Recorder, RecordsEveryCollectiveAndTransferAsMade) {
  for (int world : {2, 3}) {
    const auto ranks = recorded(known_sequence, world, GetParam());
    for (int rank = 0; rank < world; ++rank) {
      const auto& e = ranks[static_cast<std::size_t>(rank)];
      const std::size_t transfers = rank < 2 ? 1 : 0;
      ASSERT_EQ(e.size(), 5 + transfers) << "rank " << rank;
      const auto expect = [&](std::size_t i, CollectiveOp op, const char* dtype, std::int64_t in,
                              std::int64_t out, const char* reduce, int peer) {
        SCOPED_TRACE("rank " + std::to_string(rank) + " entry " + std::to_string(i));
        EXPECT_EQ(e[i].op, op);
        EXPECT_EQ(e[i].seq, i < 5 ? i + 1 : 1);
        EXPECT_EQ(e[i].serial, i + 1);
        EXPECT_EQ(e[i].dtype, dtype);
        EXPECT_EQ(e[i].numel_in, in);
        EXPECT_EQ(e[i].numel_out, out);
        EXPECT_EQ(e[i].reduce_op, reduce);
        EXPECT_EQ(e[i].peer, peer);
        EXPECT_EQ(e[i].state, EntryState::kCompleted);
        EXPECT_GE(e[i].ended_ns, e[i].entered_ns);
        if (i > 0) {
          EXPECT_GE(e[i].entered_ns, e[i - 1].entered_ns);
        }
      };
      expect(0, CollectiveOp::kAllReduce, "float32", 10, 10, "sum", -1);
      expect(1, CollectiveOp::kBroadcast, "int64", 4, 4, "", world - 1);
      expect(2, CollectiveOp::kAllGatherIntoTensor, "float32", 3, 3 * world, "", -1);
      expect(3, CollectiveOp::kReduceScatterTensor, "float32", 2 * world, 2, "max", -1);
      expect(4, CollectiveOp::kBarrier, "", 0, 0, "", -1);
      if (rank == 0) expect(5, CollectiveOp::kSend, "float32", 5, 0, "", 1);
      if (rank == 1) expect(5, CollectiveOp::kRecv, "float32", 0, 5, "", 0);
      EXPECT_EQ(e[2].bytes, 12);
    }
  }
}

TEST_P(Recorder, ADdpStepAllReducesEveryGradientOnce) {
  const int world = 3;
  for (const auto& e : recorded(ddp_step, world, GetParam())) {
    // Rank 0's parameters to all (broadcast in buckets), then the gradients' buckets.
    std::vector<CollectiveEntry> doubles;
    for (const auto& b : of(e, CollectiveOp::kBroadcast)) {
      if (b.dtype == "float64") doubles.push_back(b);
    }
    EXPECT_EQ(sum_in(doubles), kParams);
    const auto reduced = of(e, CollectiveOp::kAllReduce);
    ASSERT_FALSE(reduced.empty());
    for (const auto& r : reduced) EXPECT_EQ(r.dtype, "float64");
    EXPECT_EQ(sum_in(reduced), kParams);
    for (const auto& entry : e) {
      EXPECT_EQ(entry.state, EntryState::kCompleted)
          << "#" << entry.seq << " " << sgpu::contract::op_name(entry.op) << " of "
          << entry.numel_in << " " << entry.dtype;
    }
  }
}

TEST_P(Recorder, AnFsdpStepReduceScattersEachUnitOnce) {
  const int world = 3;
  const std::int64_t units = padded(kUnits[0], world) + padded(kUnits[1], world);
  for (const auto& e : recorded(fsdp_step, world, GetParam())) {
    const auto scattered = of(e, CollectiveOp::kReduceScatterTensor);
    ASSERT_EQ(scattered.size(), 2u);
    EXPECT_EQ(sum_in(scattered), units);
    for (const auto& s : scattered) EXPECT_EQ(s.numel_out * world, s.numel_in);
    const auto gathered = of(e, CollectiveOp::kAllGatherIntoTensor);
    ASSERT_GE(gathered.size(), 2u);  // each unit for forward, and again for backward
    for (const auto& g : gathered) EXPECT_EQ(g.numel_in * world, g.numel_out);
    for (const auto& entry : e) {
      EXPECT_EQ(entry.state, EntryState::kCompleted)
          << "#" << entry.seq << " " << sgpu::contract::op_name(entry.op) << " of "
          << entry.numel_in << " " << entry.dtype;
    }
  }
}

TEST_P(Recorder, AZeroTwoStepScattersAndGathersThePaddedParametersOnce) {
  const int world = 3;
  const std::int64_t flat = padded(kParams, world);
  for (const auto& e : recorded(zero_step, world, GetParam())) {
    const auto scattered = of(e, CollectiveOp::kReduceScatterTensor);
    ASSERT_EQ(scattered.size(), 1u);
    EXPECT_EQ(scattered[0].numel_in, flat);
    EXPECT_EQ(scattered[0].numel_out, flat / world);
    const auto norm = of(e, CollectiveOp::kAllReduce);
    ASSERT_EQ(norm.size(), 1u);  // the global gradient norm
    EXPECT_EQ(norm[0].numel_in, 1);
    const auto gathered = of(e, CollectiveOp::kAllGatherIntoTensor);
    ASSERT_EQ(gathered.size(), 1u);
    EXPECT_EQ(gathered[0].numel_out, flat);
    EXPECT_LT(scattered[0].seq, norm[0].seq);
    EXPECT_LT(norm[0].seq, gathered[0].seq);
  }
}

INSTANTIATE_TEST_SUITE_P(Transports, Recorder, ::testing::Values("shm", "gloo"),
                         [](const auto& info) { return info.param; });

}  // namespace
