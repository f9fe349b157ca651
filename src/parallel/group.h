// The rank's process group as a c10d::ProcessGroup, the type libtorch's distributed
// machinery (c10d::Reducer, broadcast_coalesced, verify_params_across_processes) takes.
//
//   auto group = sgpu::parallel::default_group();   // inside a distributed function
//
// It wraps the same backend sgpu::process_group() returns (Gloo on "sim", NCCL on
// "cuda"), for the device type of the rank's tensors.
#pragma once

#include <torch/csrc/distributed/c10d/ProcessGroup.hpp>

namespace sgpu::parallel {

// Created at first use, once per rank. Throws sgpu::Error outside a rank.
c10::intrusive_ptr<c10d::ProcessGroup> default_group();

// "rank 2 of 4": how the strategies name the rank in their errors.
std::string describe_rank(const c10d::ProcessGroup& group);

}  // namespace sgpu::parallel
