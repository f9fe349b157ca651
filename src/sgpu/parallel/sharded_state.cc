#include "sgpu/parallel/sharded_state.h"

namespace sgpu::parallel {

FlatShard whole_tensor(const std::string& name, const at::Tensor& tensor, bool replicated) {
  return {{{name, tensor.sizes().vec(), 0, tensor.numel()}}, 0, tensor, replicated};
}

void add_replicated_buffers(const torch::nn::Module& module, ShardedState& state) {
  for (const auto& item : module.named_buffers()) {
    state.model.push_back(whole_tensor(item.key(), item.value(), true));
  }
}

ShardedState replicated_state(const torch::nn::Module& module, torch::optim::Optimizer* optimizer,
                              std::string strategy) {
  ShardedState state;
  state.strategy = std::move(strategy);
  state.optimizer = optimizer;
  for (const auto& item : module.named_parameters()) {
    state.model.push_back(whole_tensor(item.key(), item.value(), true));
    if (optimizer != nullptr) state.optimized.push_back(state.model.back());
  }
  add_replicated_buffers(module, state);
  return state;
}

}  // namespace sgpu::parallel
