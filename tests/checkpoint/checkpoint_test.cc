// Distributed checkpoints: saved by 4 FSDP ranks (or ZeRO, DDP, one process), loaded into
// 2 and 3 FSDP ranks, one process, DDP and ZeRO with equal values, and training resumed
// from them reaches what uninterrupted training reaches (optimizer state included); a
// rank killed at any write point leaves the previous checkpoint loadable and the new one
// incomplete; buffers (BatchNorm's running statistics, a buffer a module registered) are
// saved and loaded by every strategy, and DDP gives every rank rank 0's buffers before each
// forward; every bad input is an error naming the file and the tensor; Python's
// safetensors reads the files. The ranks run on the test backend (support/test_backend.h):
// simulated, or the GPUs in the gpu-labelled instance, which saves from and loads into
// CUDA tensors and skips the tests that need more ranks than there are GPUs.
#include "sgpu/checkpoint/checkpoint.h"

#include <gtest/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/batchnorm.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "sgpu/parallel/ddp.h"
#include "sgpu/parallel/fsdp.h"
#include "sgpu/parallel/zero.h"
#include "sgpu/sgpu.h"
#include "testing/test_backend.h"

namespace {

namespace fs = std::filesystem;
namespace F = torch::nn::functional;
using namespace sgpu::checkpoint;
using Values = std::map<std::string, std::vector<double>>;

constexpr int kRows = 12;  // global batch: divisible by every world size used here

torch::nn::Sequential make_model(std::vector<int> widths = {5, 7, 3}) {
  torch::manual_seed(11);
  torch::nn::Sequential model;
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    model->push_back(torch::nn::Linear(widths[i], widths[i + 1]));
    if (i + 2 < widths.size()) model->push_back(torch::nn::Tanh());
  }
  model->to(torch::kDouble);
  return model;
}

// The model on the rank's device: cuda:<local rank>, or the CPU of a simulated rank.
torch::nn::Sequential make_rank_model() {
  auto model = make_model();
  model->to(at::Device(sgpu::device()));
  return model;
}

// The rank's rows of step s's global batch (drawn on the CPU, then moved to `device`).
std::pair<at::Tensor, at::Tensor> batch(int step, int rank, int world,
                                        const at::Device& device = at::kCPU) {
  torch::manual_seed(1000 + step);
  auto options = torch::TensorOptions().dtype(torch::kDouble);
  const at::Tensor x = torch::randn({kRows, 5}, options), y = torch::randn({kRows, 3}, options);
  const int per = kRows / world;
  return {x.narrow(0, rank * per, per).to(device), y.narrow(0, rank * per, per).to(device)};
}

std::vector<double> flat(const at::Tensor& t) {
  const at::Tensor c = t.detach().to(torch::kCPU, torch::kDouble).contiguous().reshape(-1);
  return {c.data_ptr<double>(), c.data_ptr<double>() + c.numel()};
}

// Each tensor of `named` (a module's named_parameters() or named_buffers()), flattened.
Values flat_all(const torch::OrderedDict<std::string, at::Tensor>& named) {
  Values out;
  for (const auto& item : named) out[item.key()] = flat(item.value());
  return out;
}

Values values_of(const torch::nn::Module& module) { return flat_all(module.named_parameters()); }

struct Job {
  std::string strategy;  // "fsdp", "ddp", "zero"
  std::string load_from;
  int first_step = 0;
  int steps_before_save = 0;
  std::string save_to;
  int steps_after_save = 0;
  int crash_rank = -1;
  std::string crash_point;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(strategy, load_from, first_step, steps_before_save, save_to, steps_after_save, crash_rank,
       crash_point);
  }
};

struct Outcome {
  Values saved;                     // rank 0: the full parameters when saved
  Values final_values;              // rank 0: the full parameters at the end
  std::vector<std::string> points;  // the write points this rank passed
  template <class Archive>
  void serialize(Archive& ar) {
    ar(saved, final_values, points);
  }
};

sgpu::parallel::ZeroConfig zero_config(int world) {
  return sgpu::parallel::ZeroConfig::parse(
      R"({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2},)"
      R"( "optimizer": {"type": "Adam", "params": {"lr": 0.01, "adam_w_mode": false}}})");
}

// In each rank: optionally load, train, optionally save, train on.
Outcome run_job(Job job) {
  const int rank = sgpu::global_rank(), world = sgpu::world_size();
  const at::Device device(sgpu::device());
  Outcome outcome;
  SaveOptions options;
  options.on_write_point = [&](const std::string& point) {
    outcome.points.push_back(point);
    if (rank == job.crash_rank && point == job.crash_point) ::_exit(17);
  };
  int step = job.first_step;
  auto phase = [&](auto&& train_step, auto&& full, auto&& save_now) {
    for (int i = 0; i < job.steps_before_save; ++i) train_step(step++);
    if (!job.save_to.empty()) {
      outcome.saved = full();
      save_now();
    }
    for (int i = 0; i < job.steps_after_save; ++i) train_step(step++);
    outcome.final_values = full();
  };
  if (job.strategy == "fsdp") {
    sgpu::parallel::FullyShardedDataParallel fsdp(make_rank_model());
    torch::optim::Adam optimizer(fsdp.parameters(), torch::optim::AdamOptions(0.01));
    if (!job.load_from.empty()) load(CheckpointReader(job.load_from), fsdp, &optimizer);
    auto full = [&] {
      Values out;
      for (const auto& [name, t] : fsdp.full_state_dict(true)) out[name] = flat(t);
      return out;
    };
    phase(
        [&](int s) {
          optimizer.zero_grad();
          auto [x, y] = batch(s, rank, world, device);
          F::mse_loss(fsdp.forward(x), y).backward();
          optimizer.step();
        },
        full, [&] { save(job.save_to, fsdp, &optimizer, options); });
  } else if (job.strategy == "ddp") {
    sgpu::parallel::DistributedDataParallel ddp(make_rank_model());
    torch::optim::Adam optimizer(ddp.parameters(), torch::optim::AdamOptions(0.01));
    if (!job.load_from.empty()) load(CheckpointReader(job.load_from), *ddp.module(), &optimizer);
    phase(
        [&](int s) {
          optimizer.zero_grad();
          auto [x, y] = batch(s, rank, world, device);
          F::mse_loss(ddp.forward(x), y).backward();
          optimizer.step();
        },
        [&] { return values_of(*ddp.module()); },
        [&] { save(job.save_to, *ddp.module(), &optimizer, options); });
  } else {
    auto model = make_rank_model();
    sgpu::parallel::ZeroOptimizer zero(model->parameters(), zero_config(world));
    if (!job.load_from.empty()) load(CheckpointReader(job.load_from), *model, zero);
    phase(
        [&](int s) {
          auto [x, y] = batch(s, rank, world, device);
          zero.backward(F::mse_loss(model->forward(x), y));
          zero.step();
        },
        [&] { return values_of(*model); }, [&] { save(job.save_to, *model, zero, options); });
  }
  if (rank != 0) outcome.saved.clear(), outcome.final_values.clear();
  return outcome;
}

using sgpu::testing::on_test_backend;

Outcome launch(const Job& job, int gpus) {
  return sgpu::distributed(run_job, on_test_backend(gpus)).distributed(job).front();
}

// In one process, steps [first, first + steps) on the whole batch; the parameters then.
Values train_steps(torch::nn::Sequential& model, torch::optim::Optimizer& optimizer, int first,
                   int steps) {
  for (int s = first; s < first + steps; ++s) {
    optimizer.zero_grad();
    auto [x, y] = batch(s, 0, 1);
    F::mse_loss(model->forward(x), y).backward();
    optimizer.step();
  }
  return values_of(*model);
}

// One process, no ranks: load, train `steps` from first_step on the whole batch.
Values train_one_process(const std::string& from, int first_step, int steps) {
  auto model = make_model();
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(0.01));
  if (!from.empty()) load(CheckpointReader(from), *model, &optimizer);
  return train_steps(model, optimizer, first_step, steps);
}

void expect_close(const Values& got, const Values& want, const std::string& what,
                  double tol = 1e-9) {
  ASSERT_EQ(got.size(), want.size()) << what;
  for (const auto& [name, w] : want) {
    ASSERT_TRUE(got.count(name)) << what << ": no " << name;
    const auto& g = got.at(name);
    ASSERT_EQ(g.size(), w.size()) << what << ": " << name;
    for (size_t i = 0; i < w.size(); ++i) {
      ASSERT_NEAR(g[i], w[i], tol * (1 + std::abs(w[i])))
          << what << ": " << name << "[" << i << "]";
    }
  }
}

fs::path temp_dir(const std::string& name) {
  const fs::path dir =
      fs::temp_directory_path() / ("sgpu-checkpoint-test-" + std::to_string(::getpid())) / name;
  fs::remove_all(dir);
  fs::create_directories(dir.parent_path());
  return dir;
}

Values read_all(const fs::path& dir) {
  CheckpointReader reader(dir);
  Values out;
  for (const auto& [name, record] : reader.tensors()) {
    if (name.rfind("optimizer/", 0) != 0) out[name] = flat(reader.read(name));
  }
  return out;
}

TEST(Checkpoint, FsdpOnFourRanksLoadsAtAnyWorldSizeAndStrategyAndResumesTraining) {
  SGPU_REQUIRE_RANKS(4);
  const fs::path dir = temp_dir("fsdp4");
  Job job{
      .strategy = "fsdp", .steps_before_save = 3, .save_to = dir.string(), .steps_after_save = 3};
  const Outcome reference = launch(job, 4);
  ASSERT_TRUE(is_complete(dir));
  const CheckpointReader reader(dir);
  EXPECT_EQ(reader.world_size(), 4);
  EXPECT_EQ(reader.strategy(), "fsdp");
  // Exactly what was saved, in one process.
  EXPECT_EQ(read_all(dir), reference.saved);
  EXPECT_TRUE(reader.contains("optimizer/0.weight/exp_avg"));
  EXPECT_TRUE(reader.contains("optimizer/2.bias/step"));
  EXPECT_EQ(reader.read("optimizer/2.bias/step").item<std::int64_t>(), 3);

  // Resumed anywhere, three more steps reach what the uninterrupted run reached.
  const Job resume{
      .strategy = "fsdp", .load_from = dir.string(), .first_step = 3, .steps_before_save = 3};
  for (const int world : {2, 3}) {
    const Outcome got = launch(resume, world);
    expect_close(got.final_values, reference.final_values,
                 "FSDP on " + std::to_string(world) + " ranks");
  }
  Job ddp = resume;
  ddp.strategy = "ddp";
  expect_close(launch(ddp, 2).final_values, reference.final_values, "DDP on 2 ranks");
  Job zero = resume;
  zero.strategy = "zero";
  expect_close(launch(zero, 2).final_values, reference.final_values, "ZeRO-2 on 2 ranks");
  expect_close(train_one_process(dir, 3, 3), reference.final_values, "one process");
  // Loaded without training: the saved values exactly.
  EXPECT_EQ(train_one_process(dir, 0, 0), reference.saved);
}

// A strategy sgpu::checkpoint has never heard of: rank r keeps its share of the
// concatenated parameters as one flat tensor, and hands it over as sharded state.
bool save_and_reload_flat_shares(std::string dir) {
  const int rank = sgpu::global_rank(), world = sgpu::world_size();
  auto model = make_model();
  sgpu::parallel::FlatShard share;
  std::vector<at::Tensor> flats;
  std::int64_t total = 0;
  for (const auto& item : model->named_parameters()) {
    share.layout.push_back({item.key(), item.value().sizes().vec(), total, item.value().numel()});
    flats.push_back(item.value().detach().reshape(-1));
    total += item.value().numel();
  }
  const std::int64_t per = (total + world - 1) / world;
  share.offset = std::min<std::int64_t>(total, rank * per);
  share.data = at::cat(flats).narrow(0, share.offset, std::min(per, total - share.offset)).clone();
  const sgpu::parallel::ShardedState state{"flat-shares", {share}, nullptr, {}};
  save(dir, state);
  const at::Tensor saved = share.data.clone();
  share.data.fill_(-1);
  load(CheckpointReader(dir), state);
  return at::equal(share.data, saved);
}

TEST(Checkpoint, AStrategyCheckpointsDoNotKnowSavesAndLoadsThroughShardedState) {
  SGPU_REQUIRE_RANKS(2);
  const fs::path dir = temp_dir("flat-shares");
  EXPECT_EQ(sgpu::distributed(save_and_reload_flat_shares, sgpu::testing::on_test_backend(2))
                .distributed(dir.string()),
            (std::vector<bool>{true, true}));
  EXPECT_EQ(CheckpointReader(dir).strategy(), "flat-shares");
  EXPECT_EQ(read_all(dir), values_of(*make_model())) << "the shares make the whole model";
}

std::string save_zero_with_another_module(std::string dir) {
  auto model = make_rank_model();
  sgpu::parallel::ZeroOptimizer zero(model->parameters(), zero_config(1));
  try {
    save(dir, *make_rank_model(), zero);
  } catch (const sgpu::ConfigError& e) {
    return e.what();
  }
  return "saved";
}

TEST(Checkpoint, ZeroRefusesAModuleWhoseParametersItWasNotBuiltFrom) {
  SGPU_REQUIRE_RANKS(1);
  const std::string message =
      sgpu::distributed(save_zero_with_another_module, sgpu::testing::on_test_backend(1))
          .distributed(temp_dir("zero-other").string())
          .front();
  EXPECT_NE(message.find("'0.weight' (number 1) is not the one this optimizer was built from"),
            std::string::npos)
      << message;
}

TEST(Checkpoint, ZeroAndDdpCheckpointsLoadIntoFsdp) {
  SGPU_REQUIRE_RANKS(3);
  for (const std::string strategy : {"zero", "ddp"}) {
    const fs::path dir = temp_dir(strategy);
    const Outcome reference = launch({.strategy = strategy,
                                      .steps_before_save = 2,
                                      .save_to = dir.string(),
                                      .steps_after_save = 2},
                                     2);
    EXPECT_EQ(read_all(dir), reference.saved) << strategy;
    const Outcome got = launch(
        {.strategy = "fsdp", .load_from = dir.string(), .first_step = 2, .steps_before_save = 2},
        3);
    expect_close(got.final_values, reference.final_values, strategy + " into FSDP on 3 ranks");
  }
}

// What the ranks' devices held is what the files hold, read in one process on the CPU;
// loaded back into the ranks (their devices) or one CPU process, training resumes where
// it left off. On as many ranks as the backend has, up to 2.
TEST(Checkpoint, EveryStrategySavesFromTheRanksDevicesAndResumesThere) {
  SGPU_REQUIRE_RANKS(1);
  const int world = std::min(2, sgpu::testing::test_backend_ranks());
  for (const std::string strategy : {"fsdp", "ddp", "zero"}) {
    const fs::path dir = temp_dir("device-" + strategy);
    const Outcome reference = launch({.strategy = strategy,
                                      .steps_before_save = 2,
                                      .save_to = dir.string(),
                                      .steps_after_save = 2},
                                     world);
    EXPECT_EQ(read_all(dir), reference.saved) << strategy;
    const Outcome resumed = launch(
        {.strategy = strategy, .load_from = dir.string(), .first_step = 2, .steps_before_save = 2},
        world);
    expect_close(resumed.final_values, reference.final_values, strategy + " resumed on the ranks");
    expect_close(train_one_process(dir, 2, 2), reference.final_values,
                 strategy + " resumed in one process");
  }
}

TEST(Checkpoint, ACrashAtAnyWritePointLeavesThePreviousCheckpointAndAnIncompleteNewOne) {
  SGPU_REQUIRE_RANKS(2);
  const fs::path previous = temp_dir("previous"), next = temp_dir("next");
  const Outcome first =
      launch({.strategy = "fsdp", .steps_before_save = 1, .save_to = previous.string()}, 2);
  const Values saved = read_all(previous);
  // Every write point of a save on 2 ranks, by rank.
  const auto runs = sgpu::distributed(run_job, on_test_backend(2))
                        .distributed(Job{.strategy = "fsdp",
                                         .load_from = previous.string(),
                                         .save_to = temp_dir("probe").string()});
  int crashes = 0;
  for (int rank = 0; rank < 2; ++rank) {
    ASSERT_GE(runs[rank].points.size(), 3u);
    for (const std::string& point : runs[rank].points) {
      fs::remove_all(next);
      Job job{.strategy = "fsdp",
              .load_from = previous.string(),
              .save_to = next.string(),
              .crash_rank = rank,
              .crash_point = point};
      EXPECT_THROW(launch(job, 2), sgpu::DistributedError) << rank << " " << point;
      ++crashes;
      EXPECT_EQ(read_all(previous), saved) << "after rank " << rank << " died at " << point;
      const bool after_manifest = point == std::string("renamed:") + kManifestName;
      EXPECT_EQ(is_complete(next), after_manifest) << rank << " " << point;
      if (!after_manifest) {
        EXPECT_THROW(CheckpointReader{next}, IncompleteCheckpointError) << rank << " " << point;
      } else {
        EXPECT_EQ(read_all(next), saved);
      }
    }
  }
  EXPECT_GE(crashes, 10);
  // A complete checkpoint is never overwritten.
  EXPECT_THROW(launch({.strategy = "fsdp", .save_to = previous.string()}, 2),
               sgpu::DistributedError);
  EXPECT_EQ(read_all(previous), saved);
  (void)first;
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(int kind, std::vector<at::Tensor> params) {
  if (kind == 0)
    return std::make_unique<torch::optim::Adam>(params,
                                                torch::optim::AdamOptions(0.01).amsgrad(true));
  if (kind == 1)
    return std::make_unique<torch::optim::AdamW>(params, torch::optim::AdamWOptions(0.01));
  return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.05).momentum(0.9));
}

// A buffer a module registers itself: how many rows it has seen in training.
struct CountRowsImpl : torch::nn::Cloneable<CountRowsImpl> {
  CountRowsImpl() { reset(); }
  void reset() override { seen = register_buffer("seen", torch::zeros({1}, torch::kDouble)); }
  at::Tensor forward(const at::Tensor& x) {
    if (is_training()) seen.add_(x.size(0));
    return x;
  }
  at::Tensor seen;
};
TORCH_MODULE(CountRows);

// Buffers in submodules: BatchNorm's running mean, variance and batch count, and CountRows'.
torch::nn::Sequential make_buffered_model() {
  torch::manual_seed(11);
  torch::nn::Sequential model(torch::nn::Linear(5, 7), torch::nn::BatchNorm1d(7), CountRows(),
                              torch::nn::Tanh(), torch::nn::Linear(7, 3));
  model->to(torch::kDouble);
  return model;
}

Values buffers_of(const torch::nn::Module& module) { return flat_all(module.named_buffers()); }

struct BufferJob {
  std::string strategy;  // "fsdp", "ddp", "zero"
  std::string save_to;
  bool broadcast_buffers = true;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(strategy, save_to, broadcast_buffers);
  }
};

struct BufferOutcome {
  Values saved;      // this rank's buffers when the checkpoint was saved
  Values after_ddp;  // DDP: this rank's buffers after one more forward, in eval mode
  template <class Archive>
  void serialize(Archive& ar) {
    ar(saved, after_ddp);
  }
};

// Three training steps under `strategy` (each rank its own rows, so each rank's running
// statistics differ), then a save.
BufferOutcome run_buffer_job(BufferJob job) {
  const int rank = sgpu::global_rank(), world = sgpu::world_size();
  const at::Device device(sgpu::device());
  BufferOutcome outcome;
  auto model = make_buffered_model();
  model->to(device);
  if (job.strategy == "fsdp") {
    sgpu::parallel::FullyShardedDataParallel fsdp(model);
    torch::optim::Adam optimizer(fsdp.parameters(), torch::optim::AdamOptions(0.01));
    for (int s = 0; s < 3; ++s) {
      optimizer.zero_grad();
      auto [x, y] = batch(s, rank, world, device);
      F::mse_loss(fsdp.forward(x), y).backward();
      optimizer.step();
    }
    outcome.saved = buffers_of(*model);
    save(job.save_to, fsdp, &optimizer);
  } else if (job.strategy == "ddp") {
    sgpu::parallel::DdpOptions options;
    options.broadcast_buffers = job.broadcast_buffers;
    sgpu::parallel::DistributedDataParallel ddp(model, options);
    torch::optim::Adam optimizer(ddp.parameters(), torch::optim::AdamOptions(0.01));
    for (int s = 0; s < 3; ++s) {
      optimizer.zero_grad();
      auto [x, y] = batch(s, rank, world, device);
      F::mse_loss(ddp.forward(x), y).backward();
      optimizer.step();
    }
    outcome.saved = buffers_of(*model);
    save(job.save_to, *model, &optimizer);
    model->eval();
    torch::NoGradGuard no_grad;
    ddp.forward(batch(3, rank, world, device).first);
    outcome.after_ddp = buffers_of(*model);
  } else {
    sgpu::parallel::ZeroOptimizer zero(model->parameters(), zero_config(world));
    for (int s = 0; s < 3; ++s) {
      auto [x, y] = batch(s, rank, world, device);
      zero.backward(F::mse_loss(model->forward(x), y));
      zero.step();
    }
    outcome.saved = buffers_of(*model);
    save(job.save_to, *model, zero);
  }
  return outcome;
}

TEST(Checkpoint, EveryStrategySavesAndLoadsTheBuffersOfSubmodules) {
  SGPU_REQUIRE_RANKS(2);
  for (const std::string strategy : {"ddp", "fsdp", "zero"}) {
    const fs::path dir = temp_dir("buffers-" + strategy);
    const auto outcomes = sgpu::distributed(run_buffer_job, on_test_backend(2))
                              .distributed(BufferJob{strategy, dir.string()});
    const Values& saved = outcomes[0].saved;  // replicated state: rank 0's is written
    ASSERT_EQ(saved.size(), 4u) << strategy;  // running mean, variance, batch count, seen
    EXPECT_EQ(saved.at("2.seen"), std::vector<double>{3.0 * kRows / 2}) << strategy;
    EXPECT_EQ(saved.at("1.num_batches_tracked"), std::vector<double>{3}) << strategy;
    auto loaded = make_buffered_model();
    load(CheckpointReader(dir), *loaded);
    expect_close(buffers_of(*loaded), saved, strategy + ", loaded into one process");
    EXPECT_NE(buffers_of(*make_buffered_model()).at("1.running_mean"), saved.at("1.running_mean"));
  }
}

TEST(Checkpoint, DdpGivesEveryRankRank0sBuffersBeforeEachForwardUnlessToldNot) {
  SGPU_REQUIRE_RANKS(2);
  for (const bool broadcast : {true, false}) {
    const fs::path dir = temp_dir(broadcast ? "ddp-broadcast" : "ddp-own-buffers");
    const auto outcomes = sgpu::distributed(run_buffer_job, on_test_backend(2))
                              .distributed(BufferJob{"ddp", dir.string(), broadcast});
    // Each rank's rows moved its running statistics its own way in training.
    ASSERT_NE(outcomes[0].saved.at("1.running_mean"), outcomes[1].saved.at("1.running_mean"));
    if (broadcast) {
      expect_close(outcomes[1].after_ddp, outcomes[0].saved, "rank 1 after a forward");
      expect_close(outcomes[0].after_ddp, outcomes[0].saved, "rank 0 after a forward");
    } else {
      expect_close(outcomes[1].after_ddp, outcomes[1].saved, "rank 1 kept its own");
    }
  }
}

TEST(Checkpoint, AdamAmsgradAdamWAndSgdMomentumResumeInOneProcess) {
  for (int kind = 0; kind < 3; ++kind) {
    const fs::path dir = temp_dir("optimizer-" + std::to_string(kind));
    auto model = make_model();
    auto optimizer = make_optimizer(kind, model->parameters());
    train_steps(model, *optimizer, 0, 2);
    save(dir, *model, optimizer.get());
    const Values uninterrupted = train_steps(model, *optimizer, 2, 3);
    auto resumed = make_model({5, 7, 3});
    auto fresh = make_optimizer(kind, resumed->parameters());
    load(CheckpointReader(dir), *resumed, fresh.get());
    expect_close(train_steps(resumed, *fresh, 2, 3), uninterrupted,
                 "optimizer " + std::to_string(kind), 1e-12);
  }
}

// One-process checkpoint to damage.
fs::path saved_small(const std::string& name) {
  const fs::path dir = temp_dir(name);
  auto model = make_model();
  torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(0.01));
  optimizer.zero_grad();
  auto [x, y] = batch(0, 0, 1);
  F::mse_loss(model->forward(x), y).backward();
  optimizer.step();
  save(dir, *model, &optimizer);
  return dir;
}

std::string load_error(const fs::path& dir, std::vector<int> widths = {5, 7, 3},
                       bool as_float = false) {
  try {
    auto model = make_model(widths);
    if (as_float) model->to(torch::kFloat);
    torch::optim::Adam optimizer(model->parameters(), torch::optim::AdamOptions(0.01));
    load(CheckpointReader(dir), *model, &optimizer);
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "(no CheckpointError)";
}

void patch(const fs::path& file, std::size_t at, const std::string& bytes) {
  std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
  f.seekp(static_cast<std::streamoff>(at));
  f.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

TEST(Checkpoint, BadInputNamesTheFileAndTheTensor) {
  const std::string model_file = "model-00001-of-00001.safetensors";
  {
    const fs::path dir = saved_small("good");
    EXPECT_EQ(load_error(dir), "(no CheckpointError)");
    // The one-process checkpoint is what Hugging Face's index describes.
    std::ifstream index(dir / kIndexName);
    const auto json = nlohmann::json::parse(index);
    EXPECT_EQ(json["weight_map"]["0.weight"], model_file);
  }
  struct Case {
    std::string what;
    std::function<void(const fs::path&)> damage;
    std::string file, tensor, says;
  };
  const std::vector<Case> cases = {
      {"missing file", [&](const fs::path& d) { fs::remove(d / model_file); }, model_file,
       "0.weight", "missing"},
      {"truncated",
       [&](const fs::path& d) {
         fs::resize_file(d / model_file, fs::file_size(d / model_file) - 20);
       },
       model_file, "2.bias", "truncated"},
      {"corrupted data",
       [&](const fs::path& d) {
         const auto size = fs::file_size(d / model_file);
         patch(d / model_file, size - 1, "\x7f");
       },
       model_file, "2.bias", "CRC-32"},
      {"header lies about a shape",
       [&](const fs::path& d) {
         std::ifstream in(d / model_file, std::ios::binary);
         std::string bytes((std::istreambuf_iterator<char>(in)), {});
         const auto at = bytes.find("\"shape\":[7,5]");
         ASSERT_NE(at, std::string::npos);
         patch(d / model_file, at, "\"shape\":[7,6]");
       },
       model_file, "0.weight", "bytes"},
      {"checksum in the manifest",
       [&](const fs::path& d) {
         std::ifstream in(d / kManifestName);
         auto json = nlohmann::json::parse(in);
         in.close();
         json["tensors"]["0.bias"]["pieces"][0]["crc32"] = 12345;
         std::ofstream(d / kManifestName) << json.dump();
       },
       model_file, "0.bias", "CRC-32"},
  };
  for (const auto& c : cases) {
    const fs::path dir = saved_small("bad");
    c.damage(dir);
    const std::string message = load_error(dir);
    EXPECT_NE(message.find(c.file), std::string::npos) << c.what << ": " << message;
    EXPECT_NE(message.find("'" + c.tensor + "'"), std::string::npos) << c.what << ": " << message;
    EXPECT_NE(message.find(c.says), std::string::npos) << c.what << ": " << message;
  }
  const fs::path dir = saved_small("fit");
  std::string message = load_error(dir, {5, 8, 3});
  EXPECT_NE(message.find(model_file), std::string::npos) << message;
  EXPECT_NE(message.find("'0.weight'"), std::string::npos) << message;
  EXPECT_NE(message.find("[8, 5]"), std::string::npos) << message;
  message = load_error(dir, {5, 7, 3}, /*as_float=*/true);
  EXPECT_NE(message.find("'0.weight'"), std::string::npos) << message;
  EXPECT_NE(message.find("F64"), std::string::npos) << message;
  fs::remove(dir / kManifestName);
  EXPECT_THROW(CheckpointReader{dir}, IncompleteCheckpointError);
}

TEST(Checkpoint, PythonSafetensorsReadsEveryRanksFiles) {
  SGPU_REQUIRE_RANKS(2);
  const fs::path dir = temp_dir("python");
  const Outcome reference =
      launch({.strategy = "fsdp", .steps_before_save = 1, .save_to = dir.string()}, 2);
  // Reassembled in Python from the index's weight map and the manifest's offsets.
  const std::string script = R"(
import json, sys, torch
from safetensors.torch import load_file
d = sys.argv[1]
index = json.load(open(d + "/model.safetensors.index.json"))
manifest = json.load(open(d + "/sgpu-checkpoint.json"))
files = {f: load_file(d + "/" + f) for f in set(index["weight_map"].values())}
out = {}
for name, t in manifest["tensors"].items():
    if name.startswith("optimizer/"):
        continue
    flat = torch.empty(int(torch.tensor(t["shape"]).prod()), dtype=torch.float64)
    for p in t["pieces"]:
        assert index["weight_map"][p["key"]] == p["file"]
        flat[p["offset"]:p["offset"] + p["numel"]] = files[p["file"]][p["key"]].reshape(-1)
    out[name] = flat.tolist()
json.dump(out, open(d + "/python.json", "w"))
)";
  std::ofstream(dir / "read.py") << script;
  ASSERT_EQ(std::system((std::string(SGPU_TEST_PYTHON) + " " + (dir / "read.py").string() + " " +
                         dir.string())
                            .c_str()),
            0);
  std::ifstream in(dir / "python.json");
  const Values python = nlohmann::json::parse(in).get<Values>();
  EXPECT_EQ(python, reference.saved);
}

}  // namespace
