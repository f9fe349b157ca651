// Simulated GPUs with memory (NOTE [Simulated device memory]): what a rank allocates counts
// against its device's capacity, past it CUDA's out-of-memory error is that rank's failure,
// and the peaks a call reports are the same run after run, so CI can gate on them. The
// strategies show it: a model whose DDP training does not fit a small device trains under
// FSDP, at about a quarter of DDP's model state on four ranks.
#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include <algorithm>
#include <cstdlib>

#include "sgpu/parallel/ddp.h"
#include "sgpu/parallel/fsdp.h"
#include "sgpu/sgpu.h"
#include "sim/memory/caching_model.h"
#include "testing/sim_options.h"
#include "testing/test_backend.h"

namespace {

namespace F = torch::nn::functional;

constexpr std::int64_t kMiB = std::int64_t{1} << 20;

sgpu::Options on(const std::string& node, int gpus) {
  sgpu::Options o = sgpu::testing::sim(gpus, true);
  o.sim.node = node;
  o.tracking = false;
  return o;
}

std::int64_t stat(const sgpu::MemoryStats& stats, const std::string& key) {
  const auto it = stats.find(key);
  return it == stats.end() ? -1 : it->second;
}

// Allocated, requested and reserved bytes, before and after a 4000-byte tensor, then with
// a 1 MiB tensor made inside sgpu::HostMemory.
std::vector<std::int64_t> counts_a_tensor(int) {
  auto figures = [] {
    const sgpu::MemoryStats s = sgpu::memory_stats();
    return std::vector<std::int64_t>{stat(s, "allocated_bytes.all.current"),
                                     stat(s, "requested_bytes.all.current"),
                                     stat(s, "reserved_bytes.all.current")};
  };
  std::vector<std::int64_t> out = figures();
  const at::Tensor device = at::empty({1000}, at::kFloat);
  for (std::int64_t v : figures()) out.push_back(v);
  {
    sgpu::HostMemory host;
    const at::Tensor batch = at::empty({kMiB}, at::kByte);
    for (std::int64_t v : figures()) out.push_back(v);
  }
  return out;
}

TEST(DeviceMemory, ATensorCountsAsTheCachingAllocatorWouldAndHostMemoryDoesNot) {
  const auto ranks = sgpu::distributed(counts_a_tensor, on("2xH100", 2)).distributed(0);
  for (const auto& f : ranks) {
    ASSERT_EQ(f.size(), 9u);
    EXPECT_EQ(f[3] - f[0], 4096) << "allocated: 4000 bytes round up to 4096";
    EXPECT_EQ(f[4] - f[1], 4000) << "requested";
    EXPECT_GE(f[5], 2 * kMiB) << "reserved: at least the small pool's 2 MiB segment";
    EXPECT_EQ(f[6], f[3]) << "a host tensor does not count";
    EXPECT_EQ(f[8], f[5]);
  }
}

// The peak allocated bytes after an 8 MiB tensor came and went, then after the peaks were
// reset and a 1 MiB tensor made.
std::vector<std::int64_t> phase_peaks(int) {
  { const at::Tensor big = at::empty({8 * kMiB}, at::kByte); }
  const std::int64_t before = stat(sgpu::memory_stats(), "allocated_bytes.all.peak");
  sgpu::reset_peak_memory_stats();
  const std::int64_t reset = stat(sgpu::memory_stats(), "allocated_bytes.all.peak");
  const at::Tensor small = at::empty({kMiB}, at::kByte);
  return {before, reset, stat(sgpu::memory_stats(), "allocated_bytes.all.peak"),
          stat(sgpu::memory_stats(), "allocated_bytes.all.current")};
}

TEST(DeviceMemory, ResettingThePeaksMeasuresOnePhase) {
  const auto peaks = sgpu::distributed(phase_peaks, on("1xH100", 1)).distributed(0).at(0);
  EXPECT_GE(peaks[0], 8 * kMiB);
  EXPECT_LT(peaks[1], kMiB) << "the peak starts again from what is allocated now";
  EXPECT_EQ(peaks[2], peaks[3]) << "the 1 MiB tensor is the new phase's peak";
  EXPECT_GE(peaks[2], kMiB);
}

// Rank `rank` allocates `bytes`; the others allocate nothing.
int allocate(int rank, std::int64_t bytes) {
  if (sgpu::global_rank() == rank) {
    const at::Tensor t = at::empty({bytes}, at::kByte);
    return static_cast<int>(t.numel() > 0);
  }
  return 0;
}

TEST(DeviceMemory, PastTheCapacityTheRankFailsWithCudasOutOfMemoryError) {
  auto launch = sgpu::distributed(allocate, on("2xH100:64MiB", 2)).launch(1, 80 * kMiB);
  try {
    launch.wait();
    FAIL() << "an 80 MiB tensor fit a 64 MiB device";
  } catch (const sgpu::DistributedError& e) {
    const auto rows = e.ranks();
    ASSERT_EQ(rows.size(), 2u);
    EXPECT_TRUE(rows[1].root_cause);
    EXPECT_EQ(rows[1].kind, sgpu::RankFailure::Kind::kException);
    EXPECT_EQ(rows[1].exception_type, "c10::OutOfMemoryError");
    EXPECT_EQ(rows[1].message.rfind("CUDA out of memory. Tried to allocate 80.00 MiB. GPU 1 has a "
                                    "total capacity of 64.00 MiB of which ",
                                    0),
              0u)
        << rows[1].message;
    EXPECT_NE(rows[1].message.find("is reserved by PyTorch but unallocated."), std::string::npos);
    EXPECT_NE(std::string(e.what()).find("CUDA out of memory"), std::string::npos) << e.what();
  }
  // The failed rank's figures still come back.
  ASSERT_EQ(launch.memory_stats().size(), 2u);
  EXPECT_EQ(stat(launch.memory_stats()[1], "num_ooms"), 1);
  EXPECT_EQ(stat(launch.memory_stats()[1], "num_alloc_retries"), 1);
  EXPECT_EQ(stat(launch.memory_stats()[0], "num_ooms"), 0);
}

TEST(DeviceMemory, TheCallReportsEachRanksFiguresAtItsEnd) {
  auto launch = sgpu::distributed(allocate, on("2xH200", 2)).launch(0, 50 * kMiB);
  launch.wait();
  const auto& memory = launch.memory_stats();
  ASSERT_EQ(memory.size(), 2u);
  EXPECT_GE(stat(memory[0], "allocated_bytes.all.peak"), 50 * kMiB);
  EXPECT_LT(stat(memory[1], "allocated_bytes.all.peak"), 50 * kMiB);
  EXPECT_EQ(stat(memory[0], "reserved_bytes.large_pool.peak"), 50 * kMiB);
  EXPECT_EQ(stat(memory[0], "num_ooms"), 0);
}

TEST(DeviceMemory, OffCountsNothing) {
  ::setenv("SGPU_SIM_MEMORY", "off", 1);
  auto launch = sgpu::distributed(allocate, on("1xH100:1MiB", 1)).launch(0, 8 * kMiB);
  launch.wait();
  ::unsetenv("SGPU_SIM_MEMORY");
  EXPECT_TRUE(launch.memory_stats().at(0).empty());
}

// --- On the test backend: sim here, cuda in the gpu instance -------------------------------

// Allocates `bytes` on the rank's device and returns the peak allocated bytes.
std::int64_t allocate_on_device(std::int64_t bytes) {
  const at::Tensor t = at::empty({bytes}, at::TensorOptions(at::kByte).device(sgpu::device()));
  return stat(sgpu::memory_stats(), "allocated_bytes.all.peak");
}

// A 64 MiB device: the node spec's size on sim, SGPU_CUDA_MEMORY_FRACTION on cuda.
sgpu::Options small_device() {
  sgpu::Options o = sgpu::testing::on_test_backend(1);
  o.tracking = false;
  if (o.backend == "cuda") {
    const auto gpus =
        sgpu::backend::find_backend("cuda").inventory(sgpu::Options{}).gpus;  // as detected
    const double fraction =
        static_cast<double>(64 * kMiB) / static_cast<double>(gpus.at(0).memory_bytes);
    ::setenv("SGPU_CUDA_MEMORY_FRACTION", std::to_string(fraction).c_str(), 1);
  } else {
    o.sim.node = "1xH100:64MiB";
  }
  return o;
}

TEST(OnTheTestBackend, PastTheCapacityTheRankFailsWithTheSameError) {
  const sgpu::Options o = small_device();
  auto fits = sgpu::distributed(allocate_on_device, o).launch(16 * kMiB);
  EXPECT_GE(fits.wait().at(0), 16 * kMiB);
  // The call hands back the rank's figures, on cuda as on sim.
  ASSERT_EQ(fits.memory_stats().size(), 1u);
  EXPECT_GE(stat(fits.memory_stats()[0], "allocated_bytes.all.peak"), 16 * kMiB);
  try {
    sgpu::distributed(allocate_on_device, o).distributed(256 * kMiB);
    ADD_FAILURE() << "256 MiB fit a 64 MiB device";
  } catch (const sgpu::DistributedError& e) {
    const sgpu::RankFailure& row = e.ranks().at(0);
    EXPECT_EQ(row.exception_type, "c10::OutOfMemoryError") << e.what();
    EXPECT_EQ(row.message.rfind("CUDA out of memory. Tried to allocate 256.00 MiB. GPU 0 has a "
                                "total capacity of ",
                                0),
              0u)
        << row.message;
  }
  ::unsetenv("SGPU_CUDA_MEMORY_FRACTION");
}

// --- The strategies -------------------------------------------------------------------

// Sixteen Linear(256, 256) with ReLU between: 16 x 65,792 float32 parameters, 4.0 MiB, in
// FSDP units of 257 KiB.
constexpr std::int64_t kLayers = 16;
constexpr std::int64_t kParams = kLayers * (256 * 256 + 256);

torch::nn::Sequential model() {
  torch::manual_seed(5);
  torch::nn::Sequential m;
  for (int i = 0; i < kLayers; ++i) {
    if (i > 0) m->push_back(torch::nn::ReLU());
    m->push_back(torch::nn::Linear(256, 256));
  }
  return m;
}

std::pair<at::Tensor, at::Tensor> batch() {
  torch::manual_seed(17 + sgpu::global_rank());
  return {torch::randn({8, 256}), torch::randn({8, 256})};
}

// Two Adam steps; returns the rank's peak allocated bytes.
template <class Wrapped>
std::int64_t train(Wrapped& wrapped, const std::vector<at::Tensor>& parameters, bool keep_copy) {
  torch::optim::Adam adam(parameters, 1e-3);
  std::vector<at::Tensor> kept;
  for (int step = 0; step < 2; ++step) {
    adam.zero_grad();
    auto [x, y] = batch();
    F::mse_loss(wrapped.forward(x), y).backward();
    if (keep_copy) {  // a change that keeps a copy of every gradient
      kept.clear();
      for (const at::Tensor& p : parameters) kept.push_back(p.grad().clone());
    }
    adam.step();
  }
  return stat(sgpu::memory_stats(), "allocated_bytes.all.peak");
}

std::int64_t ddp_training(bool keep_copy) {
  sgpu::parallel::DistributedDataParallel ddp(model());
  return train(ddp, ddp.parameters(), keep_copy);
}

// Without sync_module_states (PyTorch's FSDP default; every rank seeds the same model):
// rank 0's broadcast would hold a second copy of the whole model at the start.
std::int64_t fsdp_training(bool keep_copy) {
  sgpu::parallel::FullyShardedDataParallel fsdp(model(), {}, {.sync_module_states = false});
  return train(fsdp, fsdp.parameters(), keep_copy);
}

// The bytes a copy of every gradient takes, as the allocator rounds them.
std::int64_t gradient_copy_bytes(const std::vector<at::Tensor>& parameters) {
  std::int64_t bytes = 0;
  for (const at::Tensor& p : parameters) {
    bytes += static_cast<std::int64_t>(sgpu::sim::memory::round_size(p.numel() * p.element_size()));
  }
  return bytes;
}

std::vector<std::int64_t> ddp_copy_bytes(bool) {
  sgpu::parallel::DistributedDataParallel ddp(model());
  return {gradient_copy_bytes(ddp.parameters())};
}

// DDP holds parameters, gradients and Adam's two moments (16 bytes a parameter) and its
// buckets besides; FSDP on four ranks a quarter of the first four, and the whole model
// only while it is sharded.
TEST(DeviceMemory, AModelThatDdpCannotFitTrainsUnderFsdp) {
  const std::int64_t ddp_model_state = 16 * kParams;
  const std::string node = "4xH100:12MiB";
  try {
    sgpu::distributed(ddp_training, on(node, 4)).distributed(false);
    FAIL() << "DDP fit " << node;
  } catch (const sgpu::DistributedError& e) {
    const auto rows = e.ranks();
    const auto root = std::find_if(rows.begin(), rows.end(), [](auto& r) { return r.root_cause; });
    ASSERT_NE(root, rows.end()) << e.what();
    EXPECT_EQ(root->exception_type, "c10::OutOfMemoryError") << e.what();
    EXPECT_EQ(root->message.rfind("CUDA out of memory. Tried to allocate ", 0), 0u) << e.what();
    EXPECT_NE(root->message.find("has a total capacity of 12.00 MiB"), std::string::npos)
        << root->message;
  }
  const auto peaks = sgpu::distributed(fsdp_training, on(node, 4)).distributed(false);
  for (std::size_t rank = 0; rank < peaks.size(); ++rank) {
    EXPECT_GE(peaks[rank], ddp_model_state / 4) << "rank " << rank;
    EXPECT_LE(peaks[rank], ddp_model_state * 35 / 100) << "rank " << rank;
  }
}

// Every figure but inactive_split's: some batches of tensors are freed in an order that
// follows their host addresses, which differ between runs (with address randomisation off,
// `setarch -R`, every figure is equal). What is free after such a batch is the same; how
// many split blocks it passed through on the way is not.
TEST(DeviceMemory, PeaksAreTheSameRunAfterRun) {
  for (auto* fn : {ddp_training, fsdp_training}) {
    auto first = sgpu::distributed(fn, on("4xH100", 4)).launch(false);
    first.wait();
    auto second = sgpu::distributed(fn, on("4xH100", 4)).launch(false);
    second.wait();
    ASSERT_EQ(first.memory_stats().size(), 4u);
    for (std::size_t rank = 0; rank < 4; ++rank) {
      for (const auto& [key, value] : first.memory_stats()[rank]) {
        if (key.starts_with("inactive_split")) continue;
        EXPECT_EQ(value, stat(second.memory_stats()[rank], key)) << "rank " << rank << ": " << key;
      }
      EXPECT_EQ(first.memory_stats()[rank].size(), second.memory_stats()[rank].size());
      EXPECT_GT(stat(first.memory_stats()[rank], "allocated_bytes.all.peak"), 4 * kParams);
    }
  }
}

TEST(DeviceMemory, KeepingACopyOfTheGradientsRaisesThePeakByItsBytes) {
  const auto plain = sgpu::distributed(ddp_training, on("2xH100", 2)).distributed(false);
  const auto copied = sgpu::distributed(ddp_training, on("2xH100", 2)).distributed(true);
  const auto bytes = sgpu::distributed(ddp_copy_bytes, on("2xH100", 2)).distributed(false);
  for (std::size_t rank = 0; rank < 2; ++rank) {
    EXPECT_EQ(copied[rank] - plain[rank], bytes[rank][0]) << "rank " << rank;
  }
  EXPECT_EQ(bytes[0][0], kLayers * (256 * 256 * 4 + 1024));
}

}  // namespace
