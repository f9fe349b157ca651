// The optimizer state a checkpoint saves and restores, by name, for the optimizers it
// knows: Adam and AdamW (exp_avg, exp_avg_sq, max_exp_avg_sq with amsgrad, step) and SGD
// (momentum_buffer). Stored as "optimizer/<parameter>/<state>" in the parameter's
// unsharded layout (sgpu/checkpoint/checkpoint.h).
#pragma once

#include <torch/optim/optimizer.h>

#include <array>
#include <map>
#include <string>

namespace sgpu::checkpoint::detail {

// The tensor states a parameter may have; "step" is the one scalar beside them.
inline constexpr std::array<const char*, 4> kTensorStates = {"exp_avg", "exp_avg_sq",
                                                             "max_exp_avg_sq", "momentum_buffer"};

// "optimizer/<param>/<state>".
std::string state_name(const std::string& param, const std::string& state);

// What `optimizer` keeps for `param` (empty before its first step). CheckpointError for an
// optimizer of another kind.
std::map<std::string, at::Tensor> state_of(torch::optim::Optimizer& optimizer,
                                           const at::Tensor& param);

// Gives `param` that state (nothing when it is empty), on its device and in its dtype.
void set_state(torch::optim::Optimizer& optimizer, const at::Tensor& param,
               std::map<std::string, at::Tensor> state);

}  // namespace sgpu::checkpoint::detail
