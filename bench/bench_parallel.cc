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
//   comm_bytes_per_step, collectives_per_step
//                rank 0's collectives in one training step, from its ring's totals
//                (NOTE [Communication accounting]: message sizes in nccl-tests' terms)
//                before and after the timed steps, so neither the strategy's
//                construction, the warm-up steps' bucket rebuild nor the timing's
//                barriers are in them: exact, the same run after run, so
//                ci/bench-compare holds them to zero tolerance
//   theory_bytes_per_step, vs_theory
//                what the strategy must move a step: DDP all-reduces every gradient
//                once (4 B x parameters); FSDP all-gathers each unit's parameters twice
//                (forward and backward) and reduce-scatters its gradients once (3 x 4 B x
//                each unit padded to the world); ZeRO-2 reduce-scatters the flat
//                gradients and all-gathers the flat parameters (2 x 4 B x the padded
//                total, DeepSpeed's figure); and comm_bytes_per_step / that (ZeRO-2 adds
//                its 8 B gradient norm)
//   model_comm_ms_per_step
//                those collectives' time on the simulated node's platform (NOTE [The
//                collective model]: 8xH100 is h100-nvswitch), summed as if none overlapped
//   flops_per_step, model_compute_ms_per_step, model_step_ms
//                rank 0's kernels in one training step on the same platform's roofline
//                (NOTE [The compute model]): their FLOPs (exact, the same run after run),
//                their predicted time, and that time with model_comm_ms_per_step added
//
// With SGPU_BENCH_MEMORY=both each row runs twice, the simulated devices counting memory
// (the default) and not (SGPU_SIM_MEMORY=off), the two calls taking turns to go first, and
// adds step_uncounted_ms and vs_uncounted = step_ms / step_uncounted_ms: what counting
// costs a training step. SGPU_BENCH_BUCKET_BYTES sets the ddp rows' bucket cap (first
// bucket included; DDP's own 25 MiB and 1 MiB by default), to see what bucketing costs on
// the modelled node.
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
#include "contract/collective_ring.h"
#include "contract/rank_env.h"
#include "contract/run_folder.h"
#include "rank/accounting.h"
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
  // The rank's collectives per training step, from its own accounting.
  double comm_bytes = 0, collectives = 0, predicted_seconds = 0;
  // Its kernels per training step, on the roofline (rank/operator_timer.h).
  double flops = 0, compute_seconds = 0;
  template <class Archive>
  void serialize(Archive& ar) {
    ar(local_ms, step_ms, peak_bytes, comm_bytes, collectives, predicted_seconds, flops,
       compute_seconds);
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

// This rank's collectives so far (NOTE [Communication accounting]: the totals its ring
// keeps), the timing loop's barriers left out.
struct CommSoFar {
  double bytes = 0, count = 0, predicted_seconds = 0;
  double flops = 0, compute_seconds = 0;  // the rank's kernels, on the roofline
};
CommSoFar comm_so_far() {
  CommSoFar so_far;
  const sgpu::ComputeTotals compute = sgpu::rank::rank_compute_stats().total();
  so_far.flops = compute.flops;
  so_far.compute_seconds = compute.predicted_seconds;
  const auto env = sgpu::contract::read_rank_environment();
  const auto ring = sgpu::contract::read_collective_ring(
      sgpu::contract::RankFolder{env.rank_dir}.collective_ring());
  if (!ring) return so_far;
  for (const auto& group : ring->totals) {
    for (std::size_t op = 0; op < group.size(); ++op) {
      if (static_cast<sgpu::contract::CollectiveOp>(op) == sgpu::contract::CollectiveOp::kBarrier)
        continue;
      so_far.bytes += static_cast<double>(group[op].bytes);
      so_far.count += static_cast<double>(group[op].count);
      so_far.predicted_seconds += static_cast<double>(group[op].predicted_nanoseconds) / 1e9;
    }
  }
  return so_far;
}

// The median step and the collectives of one step (the timed steps' average, so neither the
// strategy's construction nor the warm-up steps' bucket rebuild is in it).
struct Steps {
  double median_ms = 0;
  CommSoFar per_step;
};

template <class Step>
Steps time_each(int steps, Step&& step) {
  auto group = sgpu::parallel::default_group();
  // Warm-up: the first step allocates the optimizer's state, the second's forward rebuilds
  // DDP's buckets (broadcasting their order).
  step();
  step();
  const CommSoFar before = comm_so_far();
  std::vector<double> ms;
  for (int i = 0; i < steps; ++i) {
    group->barrier()->wait();
    const auto start = std::chrono::steady_clock::now();
    step();
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - start)
                     .count());
  }
  const CommSoFar after = comm_so_far();
  std::sort(ms.begin(), ms.end());
  Steps out;
  out.median_ms = ms[ms.size() / 2];
  out.per_step.bytes = (after.bytes - before.bytes) / steps;
  out.per_step.count = (after.count - before.count) / steps;
  out.per_step.predicted_seconds = (after.predicted_seconds - before.predicted_seconds) / steps;
  out.per_step.flops = (after.flops - before.flops) / steps;
  out.per_step.compute_seconds = (after.compute_seconds - before.compute_seconds) / steps;
  return out;
}

Timing time_steps(Config config) {
  const int64_t in = config.wide ? 1024 : 10, out = config.wide ? 1024 : 1, batch = 32;
  torch::manual_seed(1 + sgpu::global_rank());
  const at::Tensor x = torch::randn({batch, in}), y = torch::randn({batch, out});
  Timing timing;
  {
    auto model = make_model(config.wide);
    torch::optim::Adam optimizer(model->parameters(), 1e-3);
    timing.local_ms = time_each(config.steps, [&] {
                        optimizer.zero_grad();
                        F::mse_loss(model->forward(x), y).backward();
                        optimizer.step();
                      }).median_ms;
  }
  sgpu::reset_peak_memory_stats();  // peak_mib: the strategy's, not the bare step's
  auto model = make_model(config.wide);
  Steps strategy;
  if (config.strategy == "ddp" || config.strategy == "ddp_one_bucket") {
    sgpu::parallel::DdpOptions options;
    if (config.strategy == "ddp_one_bucket") {
      options.bucket_cap_bytes = options.first_bucket_cap_bytes =
          std::numeric_limits<int32_t>::max();
    } else if (const char* cap = std::getenv("SGPU_BENCH_BUCKET_BYTES"); cap != nullptr && *cap) {
      options.bucket_cap_bytes = options.first_bucket_cap_bytes = std::stoll(cap);
    }
    sgpu::parallel::DistributedDataParallel ddp(model, options);
    torch::optim::Adam optimizer(ddp.parameters(), 1e-3);
    strategy = time_each(config.steps, [&] {
      optimizer.zero_grad();
      F::mse_loss(ddp.forward(x), y).backward();
      optimizer.step();
    });
  } else if (config.strategy == "fsdp") {
    sgpu::parallel::FullyShardedDataParallel fsdp(model);
    torch::optim::Adam optimizer(fsdp.parameters(), 1e-3);
    strategy = time_each(config.steps, [&] {
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
    strategy = time_each(config.steps, [&] {
      zero.backward(F::mse_loss(model->forward(x), y));
      zero.step();
    });
  }
  timing.step_ms = strategy.median_ms;
  timing.comm_bytes = strategy.per_step.bytes;
  timing.collectives = strategy.per_step.count;
  timing.predicted_seconds = strategy.per_step.predicted_seconds;
  timing.flops = strategy.per_step.flops;
  timing.compute_seconds = strategy.per_step.compute_seconds;
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
  const std::vector<Timing> timings = sgpu::distributed(time_steps, options).distributed(config);
  Timing slowest;
  for (const Timing& t : timings) {
    slowest.local_ms = std::max(slowest.local_ms, t.local_ms);
    slowest.step_ms = std::max(slowest.step_ms, t.step_ms);
    slowest.peak_bytes = std::max(slowest.peak_bytes, t.peak_bytes);
  }
  const Timing& rank0 = timings.front();
  slowest.comm_bytes = rank0.comm_bytes;
  slowest.collectives = rank0.collectives;
  slowest.predicted_seconds = rank0.predicted_seconds;
  slowest.flops = rank0.flops;
  slowest.compute_seconds = rank0.compute_seconds;
  return slowest;
}

std::int64_t padded(std::int64_t n, int world) { return (n + world - 1) / world * world; }

// What the strategy must move in a training step, in nccl-tests' message sizes (see the
// counters above).
double theory_bytes(bool wide, const std::string& strategy, int ranks) {
  const std::vector<std::int64_t> units =
      wide ? std::vector<std::int64_t>{1024 * 4096 + 4096, 4096 * 4096 + 4096, 4096 * 1024 + 1024}
           : std::vector<std::int64_t>{10 * 64 + 64, 64 * 64 + 64, 64 * 1 + 1};
  std::int64_t params = 0, padded_units = 0;
  for (const std::int64_t unit : units) {
    params += unit;
    padded_units += padded(unit, ranks);
  }
  const double f = sizeof(float);
  if (strategy == "fsdp") return 3 * f * static_cast<double>(padded_units);
  if (strategy == "zero2") return 2 * f * static_cast<double>(padded(params, ranks));
  return f * static_cast<double>(params);
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
  state.counters["comm_bytes_per_step"] = timing.comm_bytes;
  state.counters["collectives_per_step"] = timing.collectives;
  const double theory = theory_bytes(wide, strategy, ranks);
  state.counters["theory_bytes_per_step"] = theory;
  state.counters["vs_theory"] = timing.comm_bytes / theory;
  state.counters["model_comm_ms_per_step"] = timing.predicted_seconds * 1e3;
  state.counters["flops_per_step"] = timing.flops;
  state.counters["model_compute_ms_per_step"] = timing.compute_seconds * 1e3;
  state.counters["model_step_ms"] = (timing.compute_seconds + timing.predicted_seconds) * 1e3;
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
