#include "sgpu/checkpoint/internal/optimizer_state.h"

#include <torch/optim/adam.h>
#include <torch/optim/adamw.h>
#include <torch/optim/sgd.h>

#include "sgpu/checkpoint/safetensors.h"

namespace sgpu::checkpoint::detail {

std::string state_name(const std::string& param, const std::string& state) {
  return "optimizer/" + param + "/" + state;
}

std::map<std::string, at::Tensor> state_of(torch::optim::Optimizer& optimizer,
                                           const at::Tensor& param) {
  auto& states = optimizer.state();
  const auto it = states.find(param.unsafeGetTensorImpl());
  if (it == states.end()) return {};
  std::map<std::string, at::Tensor> out;
  auto adam_like = [&](auto& s) {
    out["exp_avg"] = s.exp_avg();
    out["exp_avg_sq"] = s.exp_avg_sq();
    if (s.max_exp_avg_sq().defined()) out["max_exp_avg_sq"] = s.max_exp_avg_sq();
    out["step"] = at::scalar_tensor(s.step(), at::kLong);
  };
  if (auto* s = dynamic_cast<torch::optim::AdamParamState*>(it->second.get())) {
    adam_like(*s);
  } else if (auto* w = dynamic_cast<torch::optim::AdamWParamState*>(it->second.get())) {
    adam_like(*w);
  } else if (auto* m = dynamic_cast<torch::optim::SGDParamState*>(it->second.get())) {
    if (m->momentum_buffer().defined()) out["momentum_buffer"] = m->momentum_buffer();
  } else {
    throw CheckpointError(
        "checkpoints save the state of Adam, AdamW and SGD only; this "
        "optimizer's state is of another kind");
  }
  return out;
}

void set_state(torch::optim::Optimizer& optimizer, const at::Tensor& param,
               std::map<std::string, at::Tensor> state) {
  if (state.empty()) return;
  auto take = [&](const char* key) {
    const auto it = state.find(key);
    return it == state.end() ? at::Tensor() : it->second.to(param.device());
  };
  auto adam_like = [&](auto made) {
    made->exp_avg(take("exp_avg").to(param.dtype()));
    made->exp_avg_sq(take("exp_avg_sq").to(param.dtype()));
    if (state.count("max_exp_avg_sq"))
      made->max_exp_avg_sq(take("max_exp_avg_sq").to(param.dtype()));
    made->step(state.at("step").item<std::int64_t>());
    optimizer.state()[param.unsafeGetTensorImpl()] = std::move(made);
  };
  if (dynamic_cast<torch::optim::Adam*>(&optimizer) != nullptr) {
    adam_like(std::make_unique<torch::optim::AdamParamState>());
  } else if (dynamic_cast<torch::optim::AdamW*>(&optimizer) != nullptr) {
    adam_like(std::make_unique<torch::optim::AdamWParamState>());
  } else if (dynamic_cast<torch::optim::SGD*>(&optimizer) != nullptr) {
    auto made = std::make_unique<torch::optim::SGDParamState>();
    if (state.count("momentum_buffer"))
      made->momentum_buffer(take("momentum_buffer").to(param.dtype()));
    optimizer.state()[param.unsafeGetTensorImpl()] = std::move(made);
  } else {
    throw CheckpointError("checkpoints restore the state of Adam, AdamW and SGD only");
  }
}

}  // namespace sgpu::checkpoint::detail
