// The training strategies against one process: DDP, FSDP, ZeRO-1 and ZeRO-2 on 1 to 4
// ranks end with the parameters one process reaches on the concatenated batch (in double
// precision); FSDP and ZeRO hold 1/N of what DDP holds; no_sync accumulates; and the
// errors a user meets when ranks or configs disagree. The ranks run on the test backend
// (support/test_backend.h): simulated, or the GPUs with NCCL in the gpu-labelled
// instance, where a test that needs more ranks than there are GPUs is skipped.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>
#include <torch/nn/functional/loss.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/functional.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/utils/clip_grad.h>
#include <torch/optim/adam.h>
#include <torch/optim/sgd.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <stdexcept>
#include <string>
#include <vector>

#include "sgpu/parallel/ddp.h"
#include "sgpu/parallel/fsdp.h"
#include "sgpu/parallel/zero.h"
#include "sgpu/sgpu.h"
#include "testing/test_backend.h"

namespace {

namespace F = torch::nn::functional;
using sgpu::parallel::DistributedDataParallel;
using sgpu::parallel::FullyShardedDataParallel;
using sgpu::parallel::ZeroConfig;
using sgpu::parallel::ZeroOptimizer;

struct Case {
  int world = 1;
  int seed = 0;
  std::vector<int> widths;  // in, hidden..., out
  int batch = 1;            // rows per rank per micro-batch
  int steps = 1;
  int accumulation = 1;  // micro-batches per step
  bool adam = false;
  double clip = 0;  // max global gradient norm, 0: none
  template <class Archive>
  void serialize(Archive& ar) {
    ar(world, seed, widths, batch, steps, accumulation, adam, clip);
  }
};

torch::nn::Sequential make_model(const Case& c, const at::Device& device = at::kCPU) {
  torch::manual_seed(c.seed);
  torch::nn::Sequential model;
  for (size_t i = 0; i + 1 < c.widths.size(); ++i) {
    model->push_back(torch::nn::Linear(c.widths[i], c.widths[i + 1]));
    if (i + 2 < c.widths.size()) model->push_back(torch::nn::Tanh());
  }
  model->to(device, torch::kDouble);
  return model;
}

// Inputs and targets of every micro-batch of every step, all ranks' rows together (drawn
// on the CPU, so every device sees the same numbers).
std::pair<at::Tensor, at::Tensor> make_data(const Case& c, const at::Device& device = at::kCPU) {
  torch::manual_seed(c.seed + 7919);
  const int64_t rows = int64_t{c.steps} * c.accumulation * c.world * c.batch;
  auto options = torch::TensorOptions().dtype(torch::kDouble);
  return {torch::randn({rows, c.widths.front()}, options).to(device),
          torch::randn({rows, c.widths.back()}, options).to(device)};
}

// The rank's device: cuda:<local rank>, or the CPU of a simulated rank.
at::Device rank_device() { return at::Device(sgpu::device()); }

// Micro-batch m of step s: the rows of `rank`, or of every rank when rank < 0.
at::Tensor rows_of(const at::Tensor& all, const Case& c, int step, int micro, int rank) {
  const int64_t per_micro = int64_t{c.world} * c.batch;
  const int64_t start = (int64_t{step} * c.accumulation + micro) * per_micro;
  if (rank < 0) return all.narrow(0, start, per_micro);
  return all.narrow(0, start + int64_t{rank} * c.batch, c.batch);
}

// Adam's eps at the size of these gradients, so that Adam's step depends on the gradient's
// scale: with 1e-8 it hardly does, and a strategy that forgot to average the ranks'
// gradients (each W times too large) would end where one process does.
constexpr double kAdamEps = 0.1;

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const Case& c,
                                                        std::vector<at::Tensor> params) {
  if (c.adam) {
    return std::make_unique<torch::optim::Adam>(params,
                                                torch::optim::AdamOptions(0.01).eps(kAdamEps));
  }
  return std::make_unique<torch::optim::SGD>(params, torch::optim::SGDOptions(0.1).momentum(0.9));
}

ZeroConfig zero_config(const Case& c, int stage) {
  const std::string optimizer = c.adam
                                    ? R"({"type": "Adam", "params": {"lr": 0.01, "eps": )" +
                                          std::to_string(kAdamEps) + R"(, "adam_w_mode": false}})"
                                    : R"({"type": "SGD", "params": {"lr": 0.1, "momentum": 0.9}})";
  return ZeroConfig::parse(R"({"train_micro_batch_size_per_gpu": )" + std::to_string(c.batch) +
                           R"(, "gradient_accumulation_steps": )" + std::to_string(c.accumulation) +
                           R"(, "gradient_clipping": )" + std::to_string(c.clip) +
                           R"(, "zero_optimization": {"stage": )" + std::to_string(stage) +
                           R"(}, "optimizer": )" + optimizer + "}");
}

std::vector<double> flatten(const std::vector<at::Tensor>& tensors) {
  std::vector<double> out;
  for (const auto& t : tensors) {
    const at::Tensor c = t.detach().to(torch::kCPU, torch::kDouble).contiguous().reshape(-1);
    out.insert(out.end(), c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
  }
  return out;
}

// Clips the gradients of `params` as torch.nn.utils.clip_grad_norm_ does.
void clip(const Case& c, const std::vector<at::Tensor>& params) {
  if (c.clip > 0) torch::nn::utils::clip_grad_norm_(params, c.clip);
}

// One process, the concatenated batch: what every strategy must reach. `largest_norm`, when
// given, gets the largest global gradient norm of any step, before clipping.
std::vector<double> train_one_process(const Case& c, double* largest_norm = nullptr) {
  auto model = make_model(c);
  auto [x, y] = make_data(c);
  auto optimizer = make_optimizer(c, model->parameters());
  for (int s = 0; s < c.steps; ++s) {
    optimizer->zero_grad();
    for (int m = 0; m < c.accumulation; ++m) {
      auto loss = F::mse_loss(model->forward(rows_of(x, c, s, m, -1)), rows_of(y, c, s, m, -1));
      (loss / c.accumulation).backward();
    }
    if (largest_norm != nullptr) {
      double sq = 0;
      for (const auto& p : model->parameters()) sq += p.grad().pow(2).sum().item<double>();
      *largest_norm = std::max(*largest_norm, std::sqrt(sq));
    }
    clip(c, model->parameters());
    optimizer->step();
  }
  return flatten(model->parameters());
}

// In each rank: the final parameters under DDP, FSDP, ZeRO-1 and ZeRO-2, in that order.
std::vector<std::vector<double>> train_every_strategy(Case c) {
  const int rank = sgpu::global_rank();
  const at::Device device = rank_device();
  auto [x, y] = make_data(c, device);
  std::vector<std::vector<double>> out;
  {
    DistributedDataParallel ddp(make_model(c, device));
    auto optimizer = make_optimizer(c, ddp.parameters());
    for (int s = 0; s < c.steps; ++s) {
      optimizer->zero_grad();
      for (int m = 0; m < c.accumulation; ++m) {
        auto micro = [&] {
          auto loss =
              F::mse_loss(ddp.forward(rows_of(x, c, s, m, rank)), rows_of(y, c, s, m, rank));
          (loss / c.accumulation).backward();
        };
        if (m + 1 < c.accumulation) {
          auto guard = ddp.no_sync();
          micro();
        } else {
          micro();
        }
      }
      clip(c, ddp.parameters());
      optimizer->step();
    }
    out.push_back(flatten(ddp.parameters()));
  }
  {
    FullyShardedDataParallel fsdp(make_model(c, device));
    auto optimizer = make_optimizer(c, fsdp.parameters());
    for (int s = 0; s < c.steps; ++s) {
      optimizer->zero_grad();
      for (int m = 0; m < c.accumulation; ++m) {
        auto loss = F::mse_loss(fsdp.forward(rows_of(x, c, s, m, rank)), rows_of(y, c, s, m, rank));
        (loss / c.accumulation).backward();
      }
      if (c.clip > 0) {
        // The global norm over the shards: each element is in exactly one shard.
        at::Tensor sq = torch::zeros({1}, torch::TensorOptions(torch::kDouble).device(device));
        for (const auto& p : fsdp.parameters()) sq += p.grad().pow(2).sum();
        std::vector<at::Tensor> all{sq};
        sgpu::parallel::default_group()->allreduce(all)->wait();
        const double coefficient = c.clip / (std::sqrt(all[0].item<double>()) + 1e-6);
        if (coefficient < 1) {
          for (auto& p : fsdp.parameters()) p.mutable_grad().mul_(coefficient);
        }
      }
      optimizer->step();
    }
    auto state = fsdp.full_state_dict(/*rank0_only=*/false);
    std::vector<at::Tensor> ordered;
    for (const auto& item : make_model(c)->named_parameters())
      ordered.push_back(state.at(item.key()));
    out.push_back(flatten(ordered));
  }
  for (int stage : {1, 2}) {
    auto model = make_model(c, device);
    ZeroOptimizer zero(model->parameters(), zero_config(c, stage));
    for (int s = 0; s < c.steps; ++s) {
      for (int m = 0; m < c.accumulation; ++m) {
        zero.backward(
            F::mse_loss(model->forward(rows_of(x, c, s, m, rank)), rows_of(y, c, s, m, rank)));
        if (zero.step() != (m + 1 == c.accumulation)) {
          throw std::logic_error("ZeRO stepped off the accumulation boundary at micro-batch " +
                                 std::to_string(m));
        }
      }
    }
    out.push_back(flatten(model->parameters()));
  }
  return out;
}

using sgpu::testing::on_test_backend;

bool close(double a, double b) { return std::abs(a - b) <= 1e-5 * std::abs(b) + 1e-12; }

// Each rank's parameters under each strategy against one process's; "" when they match.
std::string mismatch(const Case& c) {
  const std::vector<double> expected = train_one_process(c);
  const auto results =
      sgpu::distributed(train_every_strategy, on_test_backend(c.world)).distributed(c);
  const char* names[] = {"DDP", "FSDP", "ZeRO-1", "ZeRO-2"};
  for (int rank = 0; rank < c.world; ++rank) {
    if (results[rank].size() != 4u) return "rank " + std::to_string(rank) + " ran no 4 strategies";
    for (int s = 0; s < 4; ++s) {
      const std::vector<double>& got = results[rank][s];
      if (got.size() != expected.size()) return std::string(names[s]) + ": another parameter count";
      for (size_t i = 0; i < got.size(); ++i) {
        if (!close(got[i], expected[i])) {
          return std::string(names[s]) + " on rank " + std::to_string(rank) + ": parameter " +
                 std::to_string(i) + " is " + std::to_string(got[i]) + ", one process has " +
                 std::to_string(expected[i]);
        }
      }
    }
  }
  return "";
}

// Every case is sensitive to the gradient's scale, so that a strategy that forgets to
// average the ranks' gradients fails it: at least two ranks where the backend holds them,
// Adam's eps at the gradients' size (kAdamEps), SGD as it is, and a clipping threshold the
// right gradients never reach but W-times-too-large ones do (1.5 x the largest global norm
// one process sees). Clipping that binds, which hides the scale, is checked on its own
// below.
void strategies_match_one_process() {
  Case c;
  const int most = std::min(4, sgpu::testing::test_backend_ranks());
  c.world = *rc::gen::inRange(std::min(2, most), most + 1);
  c.seed = *rc::gen::inRange(0, 1 << 20);
  const int layers = *rc::gen::inRange(1, 4);
  for (int i = 0; i <= layers; ++i) c.widths.push_back(*rc::gen::inRange(1, 9));
  c.batch = *rc::gen::inRange(1, 4);
  c.steps = *rc::gen::inRange(1, 4);
  c.accumulation = *rc::gen::inRange(1, 3);
  c.adam = *rc::gen::arbitrary<bool>();
  if (*rc::gen::arbitrary<bool>()) {
    double largest = 0;
    train_one_process(c, &largest);
    c.clip = 1.5 * largest + 1e-9;
  }
  RC_TAG(c.world, c.adam ? "adam" : "sgd", c.clip > 0 ? "clip" : "no clip");
  const std::string wrong = mismatch(c);
  if (!wrong.empty()) RC_FAIL(wrong);
}

// A property over world sizes the backend can hold; skipped where it has no GPU.
TEST(Strategies, EndWithTheParametersOfOneProcessOnTheConcatenatedBatch) {
  SGPU_REQUIRE_RANKS(1);
  EXPECT_TRUE(rc::check("every strategy ends where one process on the concatenated batch does",
                        strategies_match_one_process));
}

// Clipping that binds: each strategy clips the global norm as one process does.
TEST(Strategies, ClipTheGlobalNormAsOneProcessDoes) {
  SGPU_REQUIRE_RANKS(1);
  for (bool adam : {false, true}) {
    Case c;
    c.world = std::min(3, sgpu::testing::test_backend_ranks());
    c.seed = 17;
    c.widths = {5, 7, 3};
    c.batch = 2;
    c.steps = 3;
    c.accumulation = 2;
    c.adam = adam;
    double largest = 0;
    train_one_process(c, &largest);
    c.clip = 0.05;
    ASSERT_GT(largest, 2 * c.clip) << "the clipping would not bind";
    EXPECT_EQ(mismatch(c), "") << (adam ? "Adam" : "SGD");
  }
}

// Bytes of parameters, gradients and optimizer state a rank holds after a step.
struct Held {
  std::vector<double> bytes;    // DDP, FSDP, ZeRO-1, ZeRO-2: params, grads, state
  std::vector<double> between;  // DDP, FSDP: the module's parameters between forward and backward
  template <class Archive>
  void serialize(Archive& ar) {
    ar(bytes, between);
  }
};

// The memory behind the tensors: each storage once, whatever views it.
double bytes_of(const std::vector<at::Tensor>& tensors) {
  std::set<const void*> seen;
  double total = 0;
  for (const auto& t : tensors) {
    if (t.defined() && seen.insert(t.storage().unsafeGetStorageImpl()).second) {
      total += static_cast<double>(t.storage().nbytes());
    }
  }
  return total;
}

double grad_bytes(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> grads;
  for (const auto& p : params) grads.push_back(p.grad());
  return bytes_of(grads);
}

double state_bytes(torch::optim::Optimizer& optimizer) {
  double total = 0;
  for (const auto& [key, state] : optimizer.state()) {
    if (auto* adam = dynamic_cast<torch::optim::AdamParamState*>(state.get())) {
      total += bytes_of({adam->exp_avg(), adam->exp_avg_sq(), adam->max_exp_avg_sq()});
    }
  }
  return total;
}

Held memory_held(int seed) {
  Case c;
  c.world = sgpu::world_size();
  c.seed = seed;
  c.widths = {64, 128, 128, 64};
  c.adam = true;
  const at::Device device = rank_device();
  auto [x, y] = make_data(c, device);
  const int rank = sgpu::global_rank();
  Held held;
  auto step_on = [&](auto& model, std::vector<at::Tensor> optimized,
                     std::vector<at::Tensor> counted) {
    auto optimizer = make_optimizer(c, optimized);
    auto loss = F::mse_loss(model.forward(rows_of(x, c, 0, 0, rank)), rows_of(y, c, 0, 0, rank));
    // Between forward and backward: the module's parameters (FSDP frees each unit after
    // its forward and gathers it again for its backward).
    held.between.push_back(bytes_of(model.module()->parameters()));
    loss.backward();
    optimizer->step();
    held.bytes.push_back(bytes_of(counted));
    held.bytes.push_back(grad_bytes(counted));
    held.bytes.push_back(state_bytes(*optimizer));
  };
  DistributedDataParallel ddp(make_model(c, device));
  step_on(ddp, ddp.parameters(), ddp.parameters());
  FullyShardedDataParallel fsdp(make_model(c, device));
  // The module's own parameters (freed between steps) and the rank's shards.
  std::vector<at::Tensor> counted = fsdp.module()->parameters();
  for (const auto& shard : fsdp.parameters()) counted.push_back(shard);
  step_on(fsdp, fsdp.parameters(), counted);
  for (int stage : {1, 2}) {
    auto model = make_model(c, device);
    ZeroOptimizer zero(model->parameters(), zero_config(c, stage));
    zero.backward(
        F::mse_loss(model->forward(rows_of(x, c, 0, 0, rank)), rows_of(y, c, 0, 0, rank)));
    // Between the backward and the step: what stage 2 has freed and stage 1 has not.
    held.bytes.push_back(bytes_of(model->parameters()));
    held.bytes.push_back(grad_bytes(model->parameters()) + grad_bytes({zero.partition()}));
    zero.step();
    held.bytes.push_back(state_bytes(zero.optimizer()));
  }
  return held;
}

TEST(Strategies, ShardedStrategiesHoldOneNthOfWhatDdpHolds) {
  constexpr int kWorld = 4;
  SGPU_REQUIRE_RANKS(kWorld);
  const auto held = sgpu::distributed(memory_held, on_test_backend(kWorld)).distributed(3);
  for (int rank = 0; rank < kWorld; ++rank) {
    const auto& b = held[rank].bytes;
    ASSERT_EQ(b.size(), 12u);
    ASSERT_EQ(held[rank].between.size(), 2u);
    EXPECT_EQ(held[rank].between[0], b[0]) << "DDP holds its parameters throughout";
    EXPECT_EQ(held[rank].between[1], 0)
        << "rank " << rank << ": FSDP kept a unit gathered after its forward";
    const double ddp_params = b[0], ddp_grads = b[1], ddp_state = b[2];
    ASSERT_GT(ddp_params, 0);
    ASSERT_EQ(ddp_grads, ddp_params);
    ASSERT_EQ(ddp_state, 2 * ddp_params);  // Adam: two moments per parameter
    auto near_nth = [&](double got, double ddp) {
      return std::abs(got - ddp / kWorld) <= 0.1 * ddp / kWorld;
    };
    // FSDP: parameters, gradients and optimizer state all sharded.
    EXPECT_PRED2(near_nth, b[3], ddp_params) << "rank " << rank << " FSDP parameters";
    EXPECT_PRED2(near_nth, b[4], ddp_grads) << "rank " << rank << " FSDP gradients";
    EXPECT_PRED2(near_nth, b[5], ddp_state) << "rank " << rank << " FSDP optimizer state";
    // ZeRO-1: optimizer state sharded; parameters and gradients whole.
    EXPECT_EQ(b[6], ddp_params);
    EXPECT_EQ(b[7], ddp_grads);
    EXPECT_PRED2(near_nth, b[8], ddp_state) << "rank " << rank << " ZeRO-1 optimizer state";
    // ZeRO-2: gradients sharded as well.
    EXPECT_EQ(b[9], ddp_params);
    EXPECT_PRED2(near_nth, b[10], ddp_grads) << "rank " << rank << " ZeRO-2 gradients";
    EXPECT_PRED2(near_nth, b[11], ddp_state) << "rank " << rank << " ZeRO-2 optimizer state";
  }
}

// Bytes each Linear unit holds when backward reaches the first unit's output: the later
// units' gradients are accumulated by then, so they are reduce-scattered and released.
std::vector<double> held_when_backward_reaches_the_first_unit(int) {
  const at::Device device = rank_device();
  torch::manual_seed(3);
  std::vector<double> held;
  std::vector<torch::nn::Linear> linears{torch::nn::Linear(6, 8), torch::nn::Linear(8, 8),
                                         torch::nn::Linear(8, 4)};
  torch::nn::Sequential model(linears[0], torch::nn::Functional([&](at::Tensor x) {
                                x.register_hook([&](const at::Tensor&) {
                                  for (auto& linear : linears) {
                                    held.push_back(bytes_of(linear->parameters()));
                                  }
                                });
                                return x;
                              }),
                              torch::nn::Tanh(), linears[1], torch::nn::Tanh(), linears[2]);
  model->to(device, torch::kDouble);
  FullyShardedDataParallel fsdp(model);
  const auto options = torch::TensorOptions(torch::kDouble).device(device);
  fsdp.forward(torch::randn({5, 6}, options)).pow(2).sum().backward();
  return held;
}

TEST(Strategies, FsdpReleasesEachUnitOnceBackwardIsDoneWithIt) {
  SGPU_REQUIRE_RANKS(2);
  const auto held = sgpu::distributed(held_when_backward_reaches_the_first_unit, on_test_backend(2))
                        .distributed(0);
  for (const auto& rank : held) {
    ASSERT_EQ(rank.size(), 3u);
    EXPECT_GT(rank[0], 0) << "the first unit is gathered for its backward";
    EXPECT_EQ(rank[1], 0) << "the second unit stayed gathered after its gradients";
    EXPECT_EQ(rank[2], 0) << "the last unit stayed gathered after its gradients";
  }
}

// Evaluation through FSDP (units gathered and freed one at a time) gives the plain
// model's outputs; a full state dict reloads; a state that does not fit names the tensor.
std::vector<std::string> fsdp_state_round_trip(Case c) {
  const at::Device device = rank_device();
  FullyShardedDataParallel fsdp(make_model(c, device));
  auto [x, y] = make_data(c, device);
  at::Tensor out;
  {
    torch::NoGradGuard no_grad;
    out = fsdp.forward(x);
  }
  std::vector<std::string> report;
  const at::Tensor expected = make_model(c, device)->forward(x).detach();
  report.push_back(torch::allclose(out, expected) ? "eval ok" : "eval differs");
  for (const auto& p : fsdp.module()->parameters()) {
    if (p.storage().nbytes() != 0) report.push_back("a unit stayed gathered after evaluation");
  }
  auto state = fsdp.full_state_dict(/*rank0_only=*/false);
  for (auto& [name, tensor] : state) tensor.mul_(2);
  fsdp.load_full_state_dict(state);
  auto again = fsdp.full_state_dict(/*rank0_only=*/false);
  bool same = true;
  for (const auto& [name, tensor] : state) same = same && torch::equal(again.at(name), tensor);
  report.push_back(same ? "reload ok" : "reload differs");
  auto wrong = state;
  wrong["0.weight"] = torch::zeros({3, 3}, torch::kDouble);
  try {
    fsdp.load_full_state_dict(wrong);
  } catch (const sgpu::Error& e) {
    report.push_back(e.what());
  }
  wrong = state;
  wrong["extra.weight"] = torch::zeros({1});
  try {
    fsdp.load_full_state_dict(wrong);
  } catch (const sgpu::Error& e) {
    report.push_back(e.what());
  }
  // A failed load changes nothing.
  auto after = fsdp.full_state_dict(/*rank0_only=*/false);
  for (const auto& [name, tensor] : state) same = same && torch::equal(after.at(name), tensor);
  report.push_back(same ? "unchanged" : "changed by a failed load");
  return report;
}

TEST(Strategies, FsdpEvaluatesAndReloadsItsFullState) {
  Case c;
  c.world = std::min(3, sgpu::testing::test_backend_ranks());
  SGPU_REQUIRE_RANKS(1);
  c.widths = {5, 7, 3};
  const auto reports =
      sgpu::distributed(fsdp_state_round_trip, on_test_backend(c.world)).distributed(c);
  for (const auto& report : reports) {
    ASSERT_EQ(report.size(), 5u) << ::testing::PrintToString(report);
    EXPECT_EQ(report[0], "eval ok");
    EXPECT_EQ(report[1], "reload ok");
    EXPECT_NE(
        report[2].find("tensor '0.weight' to load has shape [3, 3] but the model's has [7, 5]"),
        std::string::npos)
        << report[2];
    EXPECT_NE(
        report[3].find("has a tensor 'extra.weight' that the model has no parameter or buffer for"),
        std::string::npos)
        << report[3];
    EXPECT_EQ(report[4], "unchanged");
  }
}

int different_models(int) {
  Case c;
  c.widths = {4, sgpu::global_rank() == 1 ? 5 : 6, 2};
  DistributedDataParallel ddp(make_model(c, rank_device()));
  return 0;
}

TEST(Strategies, DdpSaysWhenRanksBuiltDifferentModels) {
  SGPU_REQUIRE_RANKS(2);
  try {
    sgpu::distributed(different_models, on_test_backend(2)).distributed(0);
    FAIL() << "expected a DistributedError";
  } catch (const sgpu::DistributedError& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("the model differs between ranks"), std::string::npos) << what;
    EXPECT_NE(what.find("every rank must build the same model"), std::string::npos) << what;
  }
}

int zero_with_batch(int train_batch_size) {
  auto model = make_model(Case{1, 0, {2, 2}}, rank_device());
  ZeroOptimizer zero(
      model->parameters(),
      ZeroConfig::parse(
          R"({"train_batch_size": )" + std::to_string(train_batch_size) +
          R"(, "train_micro_batch_size_per_gpu": 4, "gradient_accumulation_steps": 2})"));
  return 0;
}

TEST(Strategies, ZeroChecksTheBatchSizeAgainstTheWorld) {
  SGPU_REQUIRE_RANKS(2);
  EXPECT_EQ(sgpu::distributed(zero_with_batch, on_test_backend(2)).distributed(16),
            (std::vector<int>{0, 0}));
  try {
    sgpu::distributed(zero_with_batch, on_test_backend(2)).distributed(32);
    FAIL() << "expected a DistributedError";
  } catch (const sgpu::DistributedError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "'train_batch_size' is 32 but train_micro_batch_size_per_gpu (4) x "
                  "gradient_accumulation_steps (2) x world size (2) is 16"),
              std::string::npos)
        << e.what();
  }
}

void expect_config_error(const std::string& json, const std::string& fragment) {
  try {
    ZeroConfig::parse(json);
    ADD_FAILURE() << "expected a ConfigError for " << json;
  } catch (const sgpu::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find(fragment), std::string::npos) << e.what();
  }
}

TEST(ZeroConfigParse, ReadsDeepSpeedKeys) {
  const ZeroConfig c = ZeroConfig::parse(R"({
    "train_batch_size": 64, "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2,
    "gradient_clipping": 1.5, "zero_optimization": {"stage": 2},
    "optimizer": {"type": "AdamW", "params": {"lr": 3e-4, "betas": [0.8, 0.95], "eps": 1e-6,
                                              "weight_decay": 0.1}}})");
  EXPECT_EQ(c.train_batch_size, 64);
  EXPECT_EQ(c.micro_batch_size, 8);
  EXPECT_EQ(c.gradient_accumulation_steps, 2);
  EXPECT_EQ(c.gradient_clipping, 1.5);
  EXPECT_EQ(c.stage, 2);
  EXPECT_EQ(c.optimizer, "AdamW");
  EXPECT_EQ(c.lr, 3e-4);
  EXPECT_EQ(c.betas[0], 0.8);
  EXPECT_EQ(c.betas[1], 0.95);
  EXPECT_EQ(c.eps, 1e-6);
  EXPECT_EQ(c.weight_decay, 0.1);
}

TEST(ZeroConfigParse, NamesTheKeyItDoesNotUnderstand) {
  expect_config_error(R"({"fp16": {"enabled": true}})", "'fp16' is not supported");
  expect_config_error(R"({"zero_optimization": {"stage": 2, "overlap_comm": true}})",
                      "'zero_optimization.overlap_comm' is not supported");
  expect_config_error(R"({"zero_optimization": {"stage": 3}})", "'zero_optimization.stage' is 3");
  expect_config_error(R"({"optimizer": {"type": "Lamb"}})", "'optimizer.type' is \"Lamb\"");
  expect_config_error(R"({"optimizer": {"type": "SGD", "params": {"betas": [0.9, 0.9]}}})",
                      "'optimizer.params.betas' is not supported");
  expect_config_error(R"({"optimizer": {"params": {"lr": "fast"}}})",
                      "'optimizer.params.lr' has the wrong type");
  expect_config_error(R"({"optimizer": {"params": {"lr": -1}}})",
                      "'optimizer.params.lr' must be a positive");
  expect_config_error(R"({"gradient_accumulation_steps": 0})",
                      "'gradient_accumulation_steps' must be positive");
  expect_config_error(R"([1, 2])", "must be a JSON object");
  expect_config_error(R"({"stage": )", "not valid JSON");
  // A number JSON cannot hold is not valid JSON either, not an escaped json exception
  // (found by the decoders' fuzz target).
  expect_config_error(R"({"optimizer": {"params": {"lr": 56e1228}}})", "not valid JSON");
}

}  // namespace
