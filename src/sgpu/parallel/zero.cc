#include "sgpu/parallel/zero.h"

#include <torch/csrc/autograd/grad_mode.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cmath>

#include "sgpu/errors.h"

namespace sgpu::parallel {

ZeroOptimizer::ZeroOptimizer(std::vector<at::Tensor> params, ZeroConfig config,
                             c10::intrusive_ptr<c10d::ProcessGroup> group)
    : params_(std::move(params)), config_(std::move(config)), group_(std::move(group)) {
  const std::int64_t world = group_->getSize();
  if (config_.train_batch_size &&
      *config_.train_batch_size !=
          config_.micro_batch_size * config_.gradient_accumulation_steps * world) {
    throw ConfigError(
        "sgpu ZeRO config: 'train_batch_size' is " + std::to_string(*config_.train_batch_size) +
        " but train_micro_batch_size_per_gpu (" + std::to_string(config_.micro_batch_size) +
        ") x gradient_accumulation_steps (" + std::to_string(config_.gradient_accumulation_steps) +
        ") x world size (" + std::to_string(world) + ") is " +
        std::to_string(config_.micro_batch_size * config_.gradient_accumulation_steps * world));
  }
  if (params_.empty()) throw Error("sgpu ZeroOptimizer: no parameters to optimise");
  std::int64_t flat_numel = 0;
  for (const auto& p : params_) {
    if (p.scalar_type() != params_[0].scalar_type() || p.device() != params_[0].device()) {
      throw Error("sgpu ZeroOptimizer: the parameters must share one dtype and device; found " +
                  std::string(c10::toString(params_[0].scalar_type())) + " on " +
                  params_[0].device().str() + " and " +
                  std::string(c10::toString(p.scalar_type())) + " on " + p.device().str());
    }
    flat_numel += p.numel();
  }
  broadcast_from_rank0(group_, params_);
  padded_numel_ = padded_to(flat_numel, world);
  const std::int64_t part = padded_numel_ / world;
  partition_offset_ = group_->getRank() * part;
  partition_ = flatten_padded(params_, padded_numel_).narrow(0, partition_offset_, part).clone();
  partition_.set_requires_grad(true);
  std::vector<at::Tensor> mine{partition_};
  const bool decoupled =
      config_.optimizer == "AdamW" || (config_.optimizer == "Adam" && config_.adam_w_mode);
  if (config_.optimizer == "SGD") {
    optimizer_ = std::make_unique<torch::optim::SGD>(mine, torch::optim::SGDOptions(config_.lr)
                                                               .momentum(config_.momentum)
                                                               .dampening(config_.dampening)
                                                               .weight_decay(config_.weight_decay)
                                                               .nesterov(config_.nesterov));
  } else if (decoupled) {
    optimizer_ =
        std::make_unique<torch::optim::AdamW>(mine, torch::optim::AdamWOptions(config_.lr)
                                                        .betas({config_.betas[0], config_.betas[1]})
                                                        .eps(config_.eps)
                                                        .weight_decay(config_.weight_decay));
  } else {
    optimizer_ =
        std::make_unique<torch::optim::Adam>(mine, torch::optim::AdamOptions(config_.lr)
                                                       .betas({config_.betas[0], config_.betas[1]})
                                                       .eps(config_.eps)
                                                       .weight_decay(config_.weight_decay));
  }
}

ZeroOptimizer::~ZeroOptimizer() = default;

ShardedState ZeroOptimizer::sharded_state(const torch::nn::Module& module) {
  ShardedState state;
  state.strategy = "zero";
  state.optimizer = optimizer_.get();
  FlatShard partition{{}, partition_offset_, partition_, false};
  std::size_t index = 0;
  std::int64_t offset = 0;
  for (const auto& item : module.named_parameters()) {
    const at::Tensor& param = item.value();
    if (index >= params_.size() || !param.is_same(params_[index])) {
      throw ConfigError("sgpu ZeroOptimizer: the module's parameter '" + item.key() + "' (number " +
                        std::to_string(index + 1) +
                        ") is not the one this optimizer was built from; pass the module "
                        "whose parameters() built it");
    }
    state.model.push_back(whole_tensor(item.key(), param, true));
    partition.layout.push_back({item.key(), param.sizes().vec(), offset, param.numel()});
    offset += param.numel();
    ++index;
  }
  if (index != params_.size()) {
    throw ConfigError("sgpu ZeroOptimizer: the module has " + std::to_string(index) +
                      " parameters but this optimizer was built from " +
                      std::to_string(params_.size()) +
                      "; pass the module whose parameters() built it");
  }
  add_replicated_buffers(module, state);
  state.optimized.push_back(std::move(partition));
  return state;
}

void ZeroOptimizer::reduce_scatter_into_partition() {
  at::Tensor flat = take_grads_flat(params_, padded_numel_, partition_.options());
  at::Tensor mine = at::empty({partition_.numel()}, flat.options());
  group_->_reduce_scatter_base(mine, flat)->wait();
  accumulate_grad(partition_, mine);
}

void ZeroOptimizer::backward(const at::Tensor& loss) {
  (loss / static_cast<double>(config_.gradient_accumulation_steps)).backward();
  ++micro_steps_;
  if (config_.stage == 2) reduce_scatter_into_partition();
}

bool ZeroOptimizer::step() {
  if (micro_steps_ == 0 || micro_steps_ % config_.gradient_accumulation_steps != 0) return false;
  const double world = static_cast<double>(group_->getSize());
  torch::NoGradGuard no_grad;
  if (config_.stage == 1) {
    std::vector<at::Tensor> flat{take_grads_flat(params_, padded_numel_, partition_.options())};
    group_->allreduce(flat)->wait();
    partition_.mutable_grad() = flat[0].narrow(0, partition_offset_, partition_.numel()).clone();
  } else if (!partition_.grad().defined()) {
    partition_.mutable_grad() = at::zeros_like(partition_);
  }
  partition_.mutable_grad().div_(world);
  // The global norm: every rank's partition is a disjoint part of the gradient.
  std::vector<at::Tensor> square{partition_.grad().pow(2).sum().reshape({1}).to(at::kDouble)};
  group_->allreduce(square)->wait();
  last_grad_norm_ = std::sqrt(square[0].item<double>());
  if (config_.gradient_clipping > 0) {
    const double coefficient = config_.gradient_clipping / (last_grad_norm_ + 1e-6);
    if (coefficient < 1) partition_.mutable_grad().mul_(coefficient);
  }
  optimizer_->step();
  partition_.mutable_grad().reset();
  at::Tensor flat = at::empty({padded_numel_}, partition_.options().requires_grad(false));
  at::Tensor mine = partition_.detach();
  group_->_allgather_base(flat, mine)->wait();
  std::int64_t offset = 0;
  for (auto& p : params_) {
    p.copy_(flat.narrow(0, offset, p.numel()).view(p.sizes()));
    offset += p.numel();
  }
  return true;
}

void ZeroOptimizer::zero_grad() {
  for (auto& p : params_) p.mutable_grad().reset();
  partition_.mutable_grad().reset();
}

}  // namespace sgpu::parallel
