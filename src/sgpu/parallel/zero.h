// ZeRO stages 1 and 2 (DeepSpeed's optimizer-state and gradient sharding), as an
// optimizer wrapper configured from a subset of DeepSpeed's JSON config.
//
//   auto config = sgpu::parallel::ZeroConfig::parse(R"({
//     "train_micro_batch_size_per_gpu": 8, "gradient_accumulation_steps": 2,
//     "gradient_clipping": 1.0, "zero_optimization": {"stage": 2},
//     "optimizer": {"type": "AdamW", "params": {"lr": 0.001, "weight_decay": 0.01}}})");
//   sgpu::parallel::ZeroOptimizer engine(model->parameters(), config);  // inside a rank
//   for (auto& batch : loader) {
//     engine.backward(torch::mse_loss(model->forward(batch.data), batch.target));
//     engine.step();   // steps at every gradient_accumulation_steps-th micro-batch
//   }
//
// The parameters, flattened in order and padded to a multiple of the world size, are
// split into one partition per rank. Each rank keeps the optimizer state of its partition
// only, and updates only that partition; the updated partitions are then all-gathered
// into every rank's parameters. Stage 1 averages full gradients with an all-reduce at the
// step. Stage 2 reduce-scatters the gradients after every backward into the rank's
// partition and frees the full ones, so a rank holds 1/N of the gradients between
// backward passes. Construction broadcasts rank 0's parameters.
//
// Config keys understood; any other key is a ConfigError naming it:
//   train_batch_size (checked: micro batch x accumulation steps x world size),
//   train_micro_batch_size_per_gpu, gradient_accumulation_steps, gradient_clipping
//   (global norm, 0 for none), zero_optimization.stage (1 or 2),
//   optimizer.type: "Adam" (DeepSpeed's: decoupled weight decay unless
//   params.adam_w_mode is false), "AdamW", "SGD";
//   optimizer.params: lr, betas, eps, weight_decay, adam_w_mode (Adam), momentum,
//   dampening, nesterov (SGD).
#pragma once

#include <ATen/ATen.h>
#include <torch/optim/optimizer.h>

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "sgpu/parallel/group.h"
#include "sgpu/parallel/sharded_state.h"
#include "sgpu/parallel/zero_config.h"

namespace sgpu::parallel {

class ZeroOptimizer {
 public:
  ZeroOptimizer(std::vector<at::Tensor> params, ZeroConfig config,
                c10::intrusive_ptr<c10d::ProcessGroup> group = default_group());
  ~ZeroOptimizer();
  ZeroOptimizer(const ZeroOptimizer&) = delete;
  ZeroOptimizer& operator=(const ZeroOptimizer&) = delete;

  // loss / gradient_accumulation_steps, backward; on stage 2 also the reduce-scatter.
  void backward(const at::Tensor& loss);
  // At an accumulation boundary: averages, clips, updates and gathers; returns true then.
  bool step();
  void zero_grad();

  // The rank's partition: [partition_offset(), + partition().numel()) of the flat
  // parameters; its gradient and optimizer state are what the rank holds.
  const at::Tensor& partition() const { return partition_; }
  std::int64_t partition_offset() const { return partition_offset_; }
  torch::optim::Optimizer& optimizer() { return *optimizer_; }
  // For checkpoints (NOTE [Sharded state]): `module`'s parameters (those this optimizer was
  // built from, in the same order) and buffers, replicated, and the rank's partition of
  // them with the inner optimizer's state. Throws ConfigError when `module`'s parameters
  // are not this optimizer's.
  ShardedState sharded_state(const torch::nn::Module& module);
  const ZeroConfig& config() const { return config_; }
  std::int64_t micro_steps() const { return micro_steps_; }
  // The global gradient norm before clipping at the last step.
  double last_grad_norm() const { return last_grad_norm_; }

 private:
  void reduce_scatter_into_partition();

  std::vector<at::Tensor> params_;
  ZeroConfig config_;
  c10::intrusive_ptr<c10d::ProcessGroup> group_;
  std::int64_t padded_numel_ = 0;
  std::int64_t partition_offset_ = 0;
  at::Tensor partition_;  // leaf; the inner optimizer's only parameter
  std::unique_ptr<torch::optim::Optimizer> optimizer_;
  std::int64_t micro_steps_ = 0;
  double last_grad_norm_ = 0;
};

}  // namespace sgpu::parallel
