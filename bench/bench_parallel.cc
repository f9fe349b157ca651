// Time per training step under DDP, FSDP and ZeRO-2 on 2, 4 and 8 simulated ranks, for
// the reference MLP (10-64-64-1) and a wide one (1024-4096-4096-1024, 25M parameters),
// against the same step with no communication: the bare model and optimizer, timed in the
// same ranks at the same time, so that both see the same share of the CPU.
//
// Counters:
//   step_ms      the strategy's step (the slowest rank's median)
//   local_ms     the bare step, no communication (the slowest rank's median)
//   x_local      step_ms / local_ms
//   overlap      DDP only: the share of gradient communication hidden behind backward,
//                1 - (step - local) / (step_one_bucket - local), where step_one_bucket
//                puts every gradient in one bucket, which cannot start before backward
//                ends.
//
//   SGPU_BACKEND=sim build/bin/bench_parallel
#include <benchmark/benchmark.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include <algorithm>
#include <chrono>
#include <limits>
#include <string>
#include <vector>

#include "bench_options.h"
#include "sgpu/parallel/ddp.h"
#include "sgpu/parallel/fsdp.h"
#include "sgpu/parallel/group.h"
#include "sgpu/parallel/zero.h"
#include "sgpu/sgpu.h"

namespace {

namespace F = torch::nn::functional;

struct Config {
  bool wide = false;
  std::string strategy;  // ddp, ddp_one_bucket, fsdp, zero2
  int steps = 5;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(wide, strategy, steps);
  }
};

struct Timing {
  double local_ms = 0;
  double step_ms = 0;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(local_ms, step_ms);
  }
};

torch::nn::Sequential make_model(bool wide) {
  torch::manual_seed(0);
  if (!wide) {
    return torch::nn::Sequential(torch::nn::Linear(10, 64), torch::nn::ReLU(),
                                 torch::nn::Linear(64, 64), torch::nn::ReLU(),
                                 torch::nn::Linear(64, 1));
  }
  return torch::nn::Sequential(torch::nn::Linear(1024, 4096), torch::nn::ReLU(),
                               torch::nn::Linear(4096, 4096), torch::nn::ReLU(),
                               torch::nn::Linear(4096, 1024));
}

template <class Step>
double median_ms(int steps, Step&& step) {
  auto group = sgpu::parallel::default_group();
  step();  // warm-up: buckets rebuilt, optimizer state allocated
  std::vector<double> ms;
  for (int i = 0; i < steps; ++i) {
    group->barrier()->wait();
    const auto start = std::chrono::steady_clock::now();
    step();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
  }
  std::sort(ms.begin(), ms.end());
  return ms[ms.size() / 2];
}

Timing time_steps(Config config) {
  const int64_t in = config.wide ? 1024 : 10, out = config.wide ? 1024 : 1, batch = 32;
  torch::manual_seed(1 + sgpu::global_rank());
  const at::Tensor x = torch::randn({batch, in}), y = torch::randn({batch, out});
  Timing timing;
  {
    auto model = make_model(config.wide);
    torch::optim::Adam optimizer(model->parameters(), 1e-3);
    timing.local_ms = median_ms(config.steps, [&] {
      optimizer.zero_grad();
      F::mse_loss(model->forward(x), y).backward();
      optimizer.step();
    });
  }
  auto model = make_model(config.wide);
  if (config.strategy == "ddp" || config.strategy == "ddp_one_bucket") {
    sgpu::parallel::DdpOptions options;
    if (config.strategy == "ddp_one_bucket") {
      options.bucket_cap_bytes = options.first_bucket_cap_bytes =
          std::numeric_limits<int32_t>::max();
    }
    sgpu::parallel::DistributedDataParallel ddp(model, options);
    torch::optim::Adam optimizer(ddp.parameters(), 1e-3);
    timing.step_ms = median_ms(config.steps, [&] {
      optimizer.zero_grad();
      F::mse_loss(ddp.forward(x), y).backward();
      optimizer.step();
    });
  } else if (config.strategy == "fsdp") {
    sgpu::parallel::FullyShardedDataParallel fsdp(model);
    torch::optim::Adam optimizer(fsdp.parameters(), 1e-3);
    timing.step_ms = median_ms(config.steps, [&] {
      optimizer.zero_grad();
      F::mse_loss(fsdp.forward(x), y).backward();
      optimizer.step();
    });
  } else {
    sgpu::parallel::ZeroOptimizer zero(
        model->parameters(),
        sgpu::parallel::ZeroConfig::parse(
            R"({"zero_optimization": {"stage": 2}, "optimizer": {"type": "Adam",
                                     "params": {"lr": 0.001, "adam_w_mode": false}}})"));
    timing.step_ms = median_ms(config.steps, [&] {
      zero.backward(F::mse_loss(model->forward(x), y));
      zero.step();
    });
  }
  return timing;
}

Timing run(bool wide, const std::string& strategy, int ranks) {
  sgpu::Options options = sgpu::bench::options();
  options.gpus = ranks;
  options.backend = "sim";
  options.console_ranks = std::vector<int>{};
  const Config config{wide, strategy, wide ? 3 : 20};
  Timing slowest;
  for (const Timing& t : sgpu::distributed(time_steps, options).distributed(config)) {
    slowest.local_ms = std::max(slowest.local_ms, t.local_ms);
    slowest.step_ms = std::max(slowest.step_ms, t.step_ms);
  }
  return slowest;
}

void BM_Step(benchmark::State& state, bool wide, std::string strategy) {
  const int ranks = static_cast<int>(state.range(0));
  Timing timing;
  for (auto _ : state) {
    timing = run(wide, strategy, ranks);
    state.SetIterationTime(timing.step_ms / 1e3);
  }
  state.counters["step_ms"] = timing.step_ms;
  state.counters["local_ms"] = timing.local_ms;
  state.counters["x_local"] = timing.step_ms / timing.local_ms;
  if (strategy == "ddp") {
    const Timing one = run(wide, "ddp_one_bucket", ranks);
    state.counters["step_one_bucket_ms"] = one.step_ms;
    const double hidden_from = one.step_ms - one.local_ms;
    if (hidden_from > 0) {
      state.counters["overlap"] =
          std::clamp(1 - (timing.step_ms - timing.local_ms) / hidden_from, 0.0, 1.0);
    }
  }
}

void ranks(benchmark::internal::Benchmark* b) {
  b->Arg(2)->Arg(4)->Arg(8)->Iterations(1)->UseManualTime()->Unit(benchmark::kMillisecond);
}

BENCHMARK_CAPTURE(BM_Step, mlp_ddp, false, "ddp")->Apply(ranks);
BENCHMARK_CAPTURE(BM_Step, mlp_fsdp, false, "fsdp")->Apply(ranks);
BENCHMARK_CAPTURE(BM_Step, mlp_zero2, false, "zero2")->Apply(ranks);
BENCHMARK_CAPTURE(BM_Step, wide_ddp, true, "ddp")->Apply(ranks);
BENCHMARK_CAPTURE(BM_Step, wide_fsdp, true, "fsdp")->Apply(ranks);
BENCHMARK_CAPTURE(BM_Step, wide_zero2, true, "zero2")->Apply(ranks);

}  // namespace
