// The reference training job: a small MLP trained with Adam on random data, inside one
// distributed function on 8 H100s (simulated ones with SGPU_BACKEND=sim), with DDP, FSDP
// or ZeRO-2. Each rank logs its loss at every step to the call's MLflow run and prints its
// total per epoch; the caller prints every rank's result and where the run is shown.
//
//   SGPU_BACKEND=sim build/bin/mlp_train                      # 8 simulated H100s, DDP
//   build/bin/mlp_train --strategy fsdp --epochs 3 --batch-size 1
//   build/bin/mlp_train --gpus 4 --gpu-type A10               # on a node with 4 A10s
#include <sgpu/data/sampler.h>
#include <sgpu/parallel.h>
#include <sgpu/sgpu.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <iostream>
#include <string>
#include <vector>

namespace {

struct Job {
  std::string strategy = "ddp";  // ddp, fsdp or zero2
  int epochs = 3;
  int batch_size = 1;
  int samples = 5000;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(strategy, epochs, batch_size, samples);
  }
};

struct RankResult {
  int rank = 0;
  std::string device;
  std::int64_t steps = 0;
  std::vector<double> epoch_loss;  // the rank's total loss in each epoch
  template <class Archive>
  void serialize(Archive& ar) {
    ar(rank, device, steps, epoch_loss);
  }
};

torch::nn::Sequential make_model() {
  return torch::nn::Sequential(torch::nn::Linear(10, 64), torch::nn::ReLU(),
                               torch::nn::Dropout(0.2), torch::nn::Linear(64, 64),
                               torch::nn::ReLU(), torch::nn::Dropout(0.2),
                               torch::nn::Linear(64, 1));
}

// One training step's work, whatever the strategy: forward, loss, backward, update.
template <class Step>
RankResult train(const Job& job, Step&& step) {
  const torch::Device device(sgpu::device());
  torch::manual_seed(0);  // the same random dataset on every rank
  const at::Tensor features = torch::randn({job.samples, 10}).to(device);
  const at::Tensor targets = torch::randn({job.samples, 1}).to(device);
  auto sampler = sgpu::data::distributed_sampler(job.samples);
  RankResult result{sgpu::global_rank(), sgpu::device(), 0, {}};
  std::int64_t global_step = 0;
  for (int epoch = 0; epoch < job.epochs; ++epoch) {
    sampler.set_epoch(epoch);
    sampler.reset();
    double total = 0;
    std::int64_t steps = 0;
    while (auto indices = sampler.next(job.batch_size)) {
      const at::Tensor index =
          torch::tensor(std::vector<int64_t>(indices->begin(), indices->end())).to(device);
      const double loss = step(features.index_select(0, index), targets.index_select(0, index));
      sgpu::log_metric("rank_" + std::to_string(result.rank) + "/train_loss", loss, global_step++);
      total += loss;
      ++steps;
    }
    std::printf("rank %d epoch %d: total loss %.4f over %lld steps\n", result.rank, epoch, total,
                static_cast<long long>(steps));
    sgpu::log_metric("rank_" + std::to_string(result.rank) + "/epoch_loss", total, epoch);
    result.steps += steps;
    std::fflush(stdout);
    result.epoch_loss.push_back(total);
  }
  return result;
}

RankResult train_mlp(Job job) {
  namespace F = torch::nn::functional;
  auto model = make_model();
  model->to(torch::Device(sgpu::device()));
  model->train();
  if (job.strategy == "ddp" || job.strategy == "fsdp") {
    auto run = [&](auto& wrapped) {
      torch::optim::Adam optimizer(wrapped.parameters(), torch::optim::AdamOptions(0.001));
      return train(job, [&](const at::Tensor& x, const at::Tensor& y) {
        optimizer.zero_grad();
        at::Tensor loss = F::mse_loss(wrapped.forward(x), y);
        loss.backward();
        optimizer.step();
        return loss.item<double>();
      });
    };
    if (job.strategy == "ddp") {
      sgpu::parallel::DistributedDataParallel ddp(model);
      return run(ddp);
    }
    sgpu::parallel::FullyShardedDataParallel fsdp(model);
    return run(fsdp);
  }
  sgpu::parallel::ZeroOptimizer zero(
      model->parameters(),
      sgpu::parallel::ZeroConfig::parse(R"({"train_micro_batch_size_per_gpu": )" +
                                        std::to_string(job.batch_size) +
                                        R"(, "zero_optimization": {"stage": 2},
          "optimizer": {"type": "Adam", "params": {"lr": 0.001, "adam_w_mode": false}}})"));
  return train(job, [&](const at::Tensor& x, const at::Tensor& y) {
    at::Tensor loss = F::mse_loss(model->forward(x), y);
    zero.backward(loss);
    zero.step();
    return loss.item<double>();
  });
}

}  // namespace

int main(int argc, char** argv) {
  sgpu::init(argc, argv);  // in a rank process this runs the rank's function and exits
  Job job;
  sgpu::Options options{.gpus = 8, .gpu_type = "H100"};
  CLI::App app{"Trains the reference MLP on every GPU of the node (or simulated ones)."};
  app.add_option("--strategy", job.strategy, "ddp, fsdp or zero2")
      ->check(CLI::IsMember({"ddp", "fsdp", "zero2"}))
      ->capture_default_str();
  app.add_option("--epochs", job.epochs, "epochs")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--batch-size", job.batch_size, "samples per rank per step")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--samples", job.samples, "dataset size")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--gpus", options.gpus, "ranks, one per GPU")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app.add_option("--gpu-type", options.gpu_type, "GPU type the node must have")
      ->capture_default_str();
  app.add_option("--backend", options.backend, "auto, cuda or sim (SGPU_BACKEND overrides)")
      ->capture_default_str();
  CLI11_PARSE(app, argc, argv);
  options.name = "mlp_train";
  try {
    auto launch = sgpu::distributed(train_mlp, options).launch(job);
    const std::vector<RankResult> results = launch.wait();
    std::cout << "results (" << job.strategy << ", " << job.epochs << " epochs, batch size "
              << job.batch_size << "):\n";
    for (const RankResult& r : results) {
      std::cout << "  rank " << r.rank << " on " << r.device << ": " << r.steps
                << " steps, loss per epoch";
      for (double loss : r.epoch_loss) std::printf(" %.4f", loss);
      std::cout << "\n";
    }
    if (!launch.tracking_link().empty())
      std::cout << "MLflow run: " << launch.tracking_link() << "\n";
  } catch (const sgpu::Error& e) {
    std::cerr << e.what() << std::endl;
    return 1;
  }
}
