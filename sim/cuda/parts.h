// The pieces serve() installs (NOTE [CUDA on sim]), each in its own file.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <string>

namespace torch {
class Library;
}

namespace sgpu::sim::cuda {

// guard.cc: torch's device guard for CUDA, over `count` devices; the calling thread's
// current device becomes `current`.
void install_guard(int count, int current);
// The calling thread's current device (what cudaGetDevice() would say).
c10::DeviceIndex current_device();
// Throws CUDA's "invalid device ordinal" (torch.AcceleratorError) for an index that is not
// one of the served devices.
void check_ordinal(c10::DeviceIndex index);

// hooks.cc: at::detail::getCUDAHooks() answers for `count` simulated devices.
void install_hooks(int count);

// redirect.cc: a CPU tensor over a cuda tensor's storage, with its sizes, strides and
// offset: what a CPU kernel (or a CPU-only transport) is given for it.
at::Tensor cpu_view(const at::Tensor& cuda);

// redirect.cc: the CUDA kernel of every operator registered so far runs its CPU kernel;
// returns how many operators it covered this time.
int cover_operators();

// rnn_cells.cc: registers, into `aten` (CUDA's kernels), sim's own kernel for operator
// `name` if it is one of the fused LSTM and GRU cells (NOTE [RNN cells on sim]); returns
// whether it was.
bool cover_rnn_cell(torch::Library& aten, const std::string& name);

}  // namespace sgpu::sim::cuda
