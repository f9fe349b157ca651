#include "sgpu/parallel/zero.h"

#include <torch/csrc/autograd/grad_mode.h>
#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <set>

#include "sgpu/errors.h"

namespace sgpu::parallel {
namespace {

using nlohmann::json;

[[noreturn]] void bad(const std::string& key, const std::string& what) {
  throw ConfigError("sgpu ZeRO config: '" + key + "' " + what);
}

void only_keys(const json& object, const std::string& where, const std::set<std::string>& allowed) {
  for (const auto& [key, value] : object.items()) {
    if (!allowed.count(key)) {
      const std::string name = where.empty() ? key : where + "." + key;
      bad(
          name, "is not supported (understood here: " + [&] {
            std::string list;
            for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + a;
            return list;
          }() + ")");
    }
  }
}

template <class T>
T get(const json& object, const std::string& key, const std::string& name) {
  try {
    return object.at(key).get<T>();
  } catch (const json::exception&) {
    bad(name, "has the wrong type: " + object.at(key).dump());
  }
}

double positive(double value, const std::string& name, bool zero_ok) {
  if (!std::isfinite(value) || value < 0 || (!zero_ok && value == 0)) {
    bad(name, "must be a " + std::string(zero_ok ? "non-negative" : "positive") + " number, not " +
                  json(value).dump());
  }
  return value;
}

}  // namespace

ZeroConfig ZeroConfig::parse(const std::string& text) {
  json root;
  try {
    root = json::parse(text);
  } catch (const json::parse_error& e) {
    throw ConfigError(std::string("sgpu ZeRO config: not valid JSON: ") + e.what());
  }
  if (!root.is_object()) throw ConfigError("sgpu ZeRO config: the config must be a JSON object");
  only_keys(root, "",
            {"train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
             "gradient_clipping", "zero_optimization", "optimizer"});
  ZeroConfig config;
  if (root.contains("train_batch_size")) {
    config.train_batch_size = get<std::int64_t>(root, "train_batch_size", "train_batch_size");
    if (*config.train_batch_size <= 0) bad("train_batch_size", "must be positive");
  }
  if (root.contains("train_micro_batch_size_per_gpu")) {
    config.micro_batch_size =
        get<std::int64_t>(root, "train_micro_batch_size_per_gpu", "train_micro_batch_size_per_gpu");
    if (config.micro_batch_size <= 0) bad("train_micro_batch_size_per_gpu", "must be positive");
  }
  if (root.contains("gradient_accumulation_steps")) {
    config.gradient_accumulation_steps =
        get<std::int64_t>(root, "gradient_accumulation_steps", "gradient_accumulation_steps");
    if (config.gradient_accumulation_steps <= 0)
      bad("gradient_accumulation_steps", "must be positive");
  }
  if (root.contains("gradient_clipping")) {
    config.gradient_clipping = positive(get<double>(root, "gradient_clipping", "gradient_clipping"),
                                        "gradient_clipping", true);
  }
  if (root.contains("zero_optimization")) {
    const json& zero = root["zero_optimization"];
    if (!zero.is_object()) bad("zero_optimization", "must be an object");
    only_keys(zero, "zero_optimization", {"stage"});
    if (zero.contains("stage")) {
      config.stage = get<int>(zero, "stage", "zero_optimization.stage");
      if (config.stage != 1 && config.stage != 2) {
        bad("zero_optimization.stage", "is " + std::to_string(config.stage) +
                                           "; stages 1 and 2 are supported (stage 3 is "
                                           "sgpu::parallel::FullyShardedDataParallel)");
      }
    }
  }
  if (root.contains("optimizer")) {
    const json& opt = root["optimizer"];
    if (!opt.is_object()) bad("optimizer", "must be an object");
    only_keys(opt, "optimizer", {"type", "params"});
    if (opt.contains("type")) {
      config.optimizer = get<std::string>(opt, "type", "optimizer.type");
      if (config.optimizer != "Adam" && config.optimizer != "AdamW" && config.optimizer != "SGD") {
        bad("optimizer.type", "is \"" + config.optimizer + "\"; supported: Adam, AdamW, SGD");
      }
    }
    if (opt.contains("params")) {
      const json& p = opt["params"];
      if (!p.is_object()) bad("optimizer.params", "must be an object");
      const bool sgd = config.optimizer == "SGD";
      std::set<std::string> allowed{"lr", "weight_decay"};
      if (sgd) {
        allowed.insert({"momentum", "dampening", "nesterov"});
      } else {
        allowed.insert({"betas", "eps"});
        if (config.optimizer == "Adam") allowed.insert("adam_w_mode");
      }
      only_keys(p, "optimizer.params", allowed);
      if (p.contains("lr"))
        config.lr =
            positive(get<double>(p, "lr", "optimizer.params.lr"), "optimizer.params.lr", false);
      if (p.contains("weight_decay")) {
        config.weight_decay =
            positive(get<double>(p, "weight_decay", "optimizer.params.weight_decay"),
                     "optimizer.params.weight_decay", true);
      }
      if (p.contains("eps"))
        config.eps =
            positive(get<double>(p, "eps", "optimizer.params.eps"), "optimizer.params.eps", false);
      if (p.contains("betas")) {
        const auto betas = get<std::vector<double>>(p, "betas", "optimizer.params.betas");
        if (betas.size() != 2 || betas[0] < 0 || betas[0] >= 1 || betas[1] < 0 || betas[1] >= 1) {
          bad("optimizer.params.betas", "must be two numbers in [0, 1), not " + p["betas"].dump());
        }
        config.betas = {betas[0], betas[1]};
      }
      if (p.contains("adam_w_mode"))
        config.adam_w_mode = get<bool>(p, "adam_w_mode", "optimizer.params.adam_w_mode");
      if (p.contains("momentum")) {
        config.momentum = positive(get<double>(p, "momentum", "optimizer.params.momentum"),
                                   "optimizer.params.momentum", true);
      }
      if (p.contains("dampening")) {
        config.dampening = positive(get<double>(p, "dampening", "optimizer.params.dampening"),
                                    "optimizer.params.dampening", true);
      }
      if (p.contains("nesterov"))
        config.nesterov = get<bool>(p, "nesterov", "optimizer.params.nesterov");
    }
  }
  return config;
}

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
