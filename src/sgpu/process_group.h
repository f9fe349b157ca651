// The rank's process group, for user code inside a distributed function.
//
//   std::vector<at::Tensor> grads{g};
//   sgpu::process_group().allreduce(grads)->wait();
//
// Created at first use, once per rank, from the call's rendezvous store: Gloo on CPU
// tensors on "sim", NCCL on "cuda". Its timeout is the call's (30 minutes without one).
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace sgpu {

// Throws sgpu::Error outside a rank.
c10d::Backend& process_group();

}  // namespace sgpu
