// The real backend on a GPU node (CTest label gpu; skipped without a GPU): the node's type
// is detected, a request for another type is a mismatch that names both, a one-rank NCCL
// all-reduce runs on the rank's device, and the collective recorder ends an NCCL entry when
// the GPU has done the collective, not when it was queued.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "backend/backend_table.h"
#include "backend/gpu_type.h"
#include "contract/collective_ring.h"
#include "contract/run_folder.h"
#include "sgpu/process_group.h"
#include "sgpu/sgpu.h"

namespace {

class Cuda : public ::testing::Test {
 protected:
  void SetUp() override {
    ::unsetenv("SGPU_BACKEND");
    inventory_ = sgpu::backend::find_backend("cuda").inventory(sgpu::Options{});
    if (inventory_.gpus.empty()) GTEST_SKIP() << "no GPU: " << inventory_.unavailable_reason;
  }
  sgpu::backend::Inventory inventory_;
};

int rank_of(int) { return sgpu::global_rank(); }

TEST_F(Cuda, DetectsTheNodesTypeAndRecordsIt) {
  const std::string& type = inventory_.gpus[0].type;
  std::cout << "detected: " << inventory_.summary() << " (" << inventory_.gpus[0].name << ", "
            << (inventory_.gpus[0].memory_bytes >> 30) << " GiB)" << std::endl;
  EXPECT_NE(sgpu::backend::find_gpu_model(type), nullptr) << "type not in the table: " << type;
  sgpu::Options options;
  options.backend = "auto";
  auto launch = sgpu::distributed(rank_of, options).launch(0);
  EXPECT_EQ(launch.wait(), (std::vector<int>{0}));
  EXPECT_EQ(launch.gpu_type(), type);
}

TEST_F(Cuda, AnotherTypeIsAMismatchNamingBoth) {
  const std::string& type = inventory_.gpus[0].type;
  const std::string other = type == "A10" ? "H100" : "A10";
  sgpu::Options options;
  options.backend = "cuda";
  options.gpu_type = other;
  try {
    sgpu::distributed(rank_of, options).distributed(0);
    FAIL() << "no mismatch";
  } catch (const sgpu::AcceleratorMismatchError& e) {
    std::cout << "mismatch: " << e.what() << std::endl;
    EXPECT_NE(std::string(e.what()).find("gpu_type \"" + other + "\" requested"),
              std::string::npos);
    EXPECT_NE(std::string(e.what()).find(type), std::string::npos);
  }
}

float one_rank_allreduce(int) {
  std::vector<at::Tensor> t{at::full({1024}, 2.0f, at::TensorOptions().device(sgpu::device()))};
  sgpu::process_group().allreduce(t)->wait();
  return t[0][7].item<float>();
}

TEST_F(Cuda, OneRankNcclAllReduce) {
  sgpu::Options options;
  options.backend = "cuda";
  EXPECT_EQ(sgpu::distributed(one_rank_allreduce, options).distributed(0),
            (std::vector<float>{2.0f}));
}

// One all-reduce (NCCL sets its communicator up on the first, waiting for the device), then
// about half a second of matrix products on the rank's GPU and a second all-reduce queued
// behind them: NCCL's stream waits for the products, so that collective is still to run
// when allreduce() returns. item() waits for all of it.
float allreduce_behind_gpu_work(int) {
  const auto on_gpu = at::TensorOptions().device(sgpu::device());
  std::vector<at::Tensor> t{at::full({1024}, 2.0f, on_gpu)};
  sgpu::process_group().allreduce(t)->wait();
  const at::Tensor a = at::full({8192, 8192}, 1.0f / 8192, on_gpu);
  at::Tensor b = a;
  for (int i = 0; i < 20; ++i) b = at::mm(b, a);
  sgpu::process_group().allreduce(t)->wait();
  return t[0][7].item<float>();
}

TEST_F(Cuda, AnNcclEntryEndsWhenTheGpuHasDoneTheCollective) {
  sgpu::Options options;
  options.backend = "cuda";
  options.keep_run_dir = true;
  options.tracking = false;
  auto launch = sgpu::distributed(allreduce_behind_gpu_work, options).launch(0);
  EXPECT_EQ(launch.wait(), (std::vector<float>{2.0f}));
  const auto ring = sgpu::contract::read_collective_ring(
      sgpu::contract::RankFolder{launch.run_dir() / "rank-0"}.collective_ring());
  ASSERT_TRUE(ring.has_value());
  const sgpu::contract::CollectiveEntry* entry = nullptr;  // the last all-reduce
  for (const auto& e : ring->entries) {
    if (e.op == sgpu::contract::CollectiveOp::kAllReduce) entry = &e;
  }
  ASSERT_NE(entry, nullptr) << ring->entries.size() << " entries, no all_reduce";
  EXPECT_EQ(entry->seq, 2u);
  // Ended by the recorder's poller once the GPU had run it, behind the products.
  EXPECT_EQ(entry->state, sgpu::contract::EntryState::kCompleted);
  const double waited_ms = static_cast<double>(entry->ended_ns - entry->entered_ns) / 1e6;
  std::cout << "the all_reduce's entry ended " << waited_ms << " ms after it was entered"
            << std::endl;
  EXPECT_GT(waited_ms, 50.0);
}

}  // namespace
