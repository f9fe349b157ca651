// The real backend on a GPU node (CTest label gpu; skipped without a GPU): the node's type
// is detected, a request for another type is a mismatch that names both, and a one-rank
// NCCL all-reduce runs on the rank's device.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "backend/backend_table.h"
#include "backend/gpu_type.h"
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

}  // namespace
