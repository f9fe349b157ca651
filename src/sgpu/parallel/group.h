// The rank's process group as a c10d::ProcessGroup, the type libtorch's distributed
// machinery (c10d::Reducer, broadcast_coalesced, verify_params_across_processes) takes.
//
//   auto group = sgpu::parallel::default_group();   // inside a distributed function
//
// It wraps the same backend sgpu::process_group() returns (Gloo on "sim", NCCL on
// "cuda"), for the device type of the rank's tensors.
#pragma once

#include <cstdint>
#include <string>
#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>
#include <vector>

namespace sgpu::parallel {

// Created at first use, once per rank. Throws sgpu::Error outside a rank.
c10::intrusive_ptr<c10d::ProcessGroup> default_group();

// "rank 2 of 4": how the strategies name the rank in their errors.
std::string describe_rank(const c10d::ProcessGroup& group);

// Overwrites `tensors` on every rank with rank 0's, in buckets as PyTorch's DDP does.
// A no-op for no tensors.
void broadcast_from_rank0(const c10::intrusive_ptr<c10d::ProcessGroup>& group,
                          std::vector<at::Tensor> tensors);

// `numel` rounded up to a multiple of `world`, so that it splits into equal shards.
std::int64_t padded_to(std::int64_t numel, std::int64_t world);

// The tensors' elements in order, followed by zeros up to `padded_numel`; not tracked by
// autograd.
at::Tensor flatten_padded(const std::vector<at::Tensor>& tensors, std::int64_t padded_numel);

// The gradients of `params` laid end to end (a parameter without one gives zeros), then
// zeros up to `padded_numel`, in a new tensor like `options`; the parameters' gradients
// are released.
at::Tensor take_grads_flat(std::vector<at::Tensor>& params, std::int64_t padded_numel,
                           const at::TensorOptions& options);

// Adds `grad` to the leaf's gradient, or makes it the gradient when it has none.
void accumulate_grad(at::Tensor& leaf, const at::Tensor& grad);

}  // namespace sgpu::parallel
