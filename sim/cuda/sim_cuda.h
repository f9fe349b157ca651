// NOTE [CUDA on sim]
// In a Python rank on sim, and in any Python process on a simulated node (one that started
// with SGPU_BACKEND=sim, as everything under `sgpu sim` does, or called sgpu.simulate()),
// unless SGPU_SIM_CUDA=off, torch's "cuda" device type is the simulated node's GPUs (those
// CUDA_VISIBLE_DEVICES leaves, renumbered as CUDA does), served by the CPU, so that code
// written for a GPU node runs as it is. A tensor on cuda:N is an ordinary CUDA tensor to
// torch: its device, its dispatch keys and its storage's device say cuda:N. Its memory is
// host memory, counted against device N (sim/memory/device_allocator.h, in device scopes).
// serve() installs, once per process:
// - the device guard (guard.cc): torch's DeviceGuardImplInterface for CUDA: the current
//   device per thread, streams and events (work is done when issued, so waits return at
//   once and an event's time is the wall clock's when it was recorded);
// - the CUDA hooks (hooks.cc): at::detail::getCUDAHooks() answers for a node with the
//   spec's GPUs: available, their count, a CPU generator per device, no cuDNN;
// - the kernels (redirect.cc): every operator's CUDA kernel becomes one that checks the
//   devices of its tensors as CUDA's kernels do ("Expected all tensors to be on the same
//   device, ..."), runs the operator's CPU kernel on CPU views of the same storage inside
//   the output device's DeviceScope, and hands back tensors on the cuda device; sparse
//   (COO) tensors' kernels likewise run the SparseCPU ones over CPU views of their indices
//   and values; operators with a CUDA kernel and no CPU one fail naming themselves
//   (refuse(): sgpu.errors.NotSimulatedError in Python);
// - the rest of torch's CUDA seams: a cuda allocator per device (storages made or grown
//   on cuda:N), the DDP reducer's CUDA timer, and scaled-dot-product attention's kernel
//   choice (always the math one, which runs on CPU kernels).
// The process groups of a simulated transport take cuda tensors (for_cuda_tensors): shared
// memory as they are, Gloo through CPU views; two ranks on one GPU fail as under NCCL.
// Python puts torch.cuda's module-level functions over these (python/sgpu/_sim_cuda.py).
// What differs from a node is in docs/simulation.md ("CUDA on sim").
#pragma once

#include <c10/util/intrusive_ptr.h>

#include <string>
#include <torch/csrc/distributed/c10d/Backend.hpp>

#include "backend/backend.h"

namespace sgpu::sim::cuda {

// In a rank: whether Python ranks on sim serve cuda from the CPU, as the launcher resolved
// it (SGPU_SIM_CUDA, on when unset; NOTE [The option table]).
inline constexpr const char* kSimCudaVar = "SGPU_SIM_CUDA";
bool enabled();

// Serves torch's cuda device type from the CPU in this process: the GPUs of `node`, with
// `device_index` the current device of the calling thread (as sgpu's cuda backend binds a
// rank to its GPU). Once per process; called again, it covers the operators registered
// since (a library loaded since), whose CUDA kernels would otherwise call the CUDA runtime.
void serve(const backend::Inventory& node, int device_index);

// What serve() does first that depends on no node: every operator's CUDA kernel runs its
// CPU kernel. A fork server whose ranks serve cuda does it once, so that its ranks inherit
// it rather than each paying for it after the fork (NOTE [CUDA on sim]).
void cover_operators_ahead();

// Whether serve() has run in this process.
bool served();

// How sim refuses what it cannot run on a simulated GPU (an operator with a CUDA kernel and
// no CPU one, a cuda tensor of a layout it does not serve): a refusal throws. The default
// throws c10::NotImplementedError; the Python module (python/native/module.cc), which is
// where CUDA on sim serves, sets one that raises sgpu.errors.NotSimulatedError, which
// torch's translation of C++ exceptions cannot give.
using Refusal = void (*)(const std::string& message);
void set_refusal(Refusal refusal);
[[noreturn]] void refuse(const std::string& message);

// The GPUs served; 0 before serve().
int device_count();

// The served device whose memory `storage` is (a cuda tensor's, or one made on cuda); -1
// for host memory. A storage's own device is the CPU's on sim (redirect.cc says why).
int device_of(const c10::Storage& storage);

// For torch.cuda's memory functions, each on served device `device`: its cached free
// memory released, its accumulated figures zeroed, its capacity limited to a fraction of
// the node's (std::invalid_argument outside [0, 1]). Nothing when memory is not counted.
void empty_cache(int device);
void reset_accumulated_memory_stats(int device);
void set_memory_fraction(int device, double fraction);

// `group` (a simulated transport's, its ranks meeting at `store`) for cuda tensors: at its
// first collective on cuda tensors its ranks compare GPUs, and two on one GPU of a node fail
// as NCCL fails them ("Duplicate GPU detected", DistBackendError); with `cpu_views` (a
// transport that takes CPU tensors only: Gloo) each collective runs on CPU views of its
// tensors, and its Work hands back the tensors it was given. With `as_nccl` (torch's "nccl"
// group) it refuses what torch's ProcessGroupNCCL refuses, in its words (a reduce op NCCL has
// not, a dtype NCCL has not, a tensor that is not contiguous), and runs what NCCL runs that
// the transport has not: PREMUL_SUM as a multiply and a sum, float8 reductions in float32.
// `meeting`: the ranks that compare GPUs at `store`: the group's own, or a folded world's
// group's running members (NOTE [A folded world]).
struct Meeting {
  int rank = 0;
  int size = 0;
};
c10::intrusive_ptr<c10d::Backend> for_cuda_tensors(c10::intrusive_ptr<c10d::Backend> group,
                                                   c10::intrusive_ptr<c10d::Store> store,
                                                   bool cpu_views, bool as_nccl,
                                                   const Meeting& meeting);

}  // namespace sgpu::sim::cuda
