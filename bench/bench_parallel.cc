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
//   peak_mib     the largest rank's peak of allocated device memory under the strategy
//                (NOTE [Simulated device memory]; the bare step's is left out): the
//                same run after run
//
// With SGPU_BENCH_MEMORY=both each row runs twice, the simulated devices counting memory
// (the default) and not (SGPU_SIM_MEMORY=off), the two calls taking turns to go first, and
// adds step_uncounted_ms and vs_uncounted = step_ms / step_uncounted_ms: what counting
// costs a training step.
//
//   SGPU_BACKEND=sim build/bin/bench_parallel
//   SGPU_BENCH_MEMORY=both build/bin/bench_parallel --benchmark_filter=ddp
#include <benchmark/benchmark.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/optim/adam.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
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
  std::int64_t peak_bytes = 0;  // allocated device memory; 0 when not counted
  template <class Archive>
  void serialize(Archive& ar) {
    ar(local_ms, step_ms, peak_bytes);
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
  sgpu::reset_peak_memory_stats();  // peak_mib: the strategy's, not the bare step's
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
  const sgpu::MemoryStats memory = sgpu::memory_stats();
  if (const auto peak = memory.find("allocated_bytes.all.peak"); peak != memory.end()) {
    timing.peak_bytes = peak->second;
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
    slowest.peak_bytes = std::max(slowest.peak_bytes, t.peak_bytes);
  }
  return slowest;
}

// The same with the simulated devices counting no memory.
Timing run_uncounted(bool wide, const std::string& strategy, int ranks) {
  ::setenv("SGPU_SIM_MEMORY", "off", 1);
  const Timing timing = run(wide, strategy, ranks);
  ::unsetenv("SGPU_SIM_MEMORY");
  return timing;
}

bool memory_both() {
  const char* value = std::getenv("SGPU_BENCH_MEMORY");
  return value != nullptr && std::string(value) == "both";
}

void BM_Step(benchmark::State& state, bool wide, std::string strategy) {
  const int ranks = static_cast<int>(state.range(0));
  static int row = 0;
  const bool uncounted_first = row++ % 2 == 1;
  Timing timing, uncounted;
  for (auto _ : state) {
    if (memory_both() && uncounted_first) uncounted = run_uncounted(wide, strategy, ranks);
    timing = run(wide, strategy, ranks);
    if (memory_both() && !uncounted_first) uncounted = run_uncounted(wide, strategy, ranks);
    state.SetIterationTime(timing.step_ms / 1e3);
  }
  state.counters["step_ms"] = timing.step_ms;
  state.counters["local_ms"] = timing.local_ms;
  state.counters["x_local"] = timing.step_ms / timing.local_ms;
  state.counters["peak_mib"] = static_cast<double>(timing.peak_bytes) / (1 << 20);
  if (memory_both()) {
    state.counters["step_uncounted_ms"] = uncounted.step_ms;
    state.counters["vs_uncounted"] = timing.step_ms / uncounted.step_ms;
  }
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
