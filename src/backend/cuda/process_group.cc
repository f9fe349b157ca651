// The CUDA side that needs libtorch's CUDA part, built as its own module
// (libsgpu_cuda_runtime.so) and loaded by the cuda backend when a rank binds. Binaries
// that link sgpu load no CUDA library until a rank runs on "cuda".
#include <ATen/Context.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>

#include <cstdlib>
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include "backend/process_group_factory.h"

extern "C" {

// Makes `device` the rank's current CUDA device, and caps what the caching allocator may
// take of it at `fraction` (SGPU_CUDA_MEMORY_FRACTION, read by the caller: CudaBackend);
// 0: no cap.
void sgpu_cuda_bind(int device, double fraction) {
  // torch creates the caching allocator's per-device state when it first initialises CUDA
  // (its first CUDA tensor); before that, setMemoryFraction and getDeviceStats refuse the
  // device ("Allocator not initialized for device", "Invalid device argument").
  at::globalContext().lazyInitDevice(c10::DeviceType::CUDA);
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(device));
  if (fraction > 0) {
    c10::cuda::CUDACachingAllocator::setMemoryFraction(fraction,
                                                       static_cast<c10::DeviceIndex>(device));
  }
}

// The CUDA caching allocator's figures for `device`, stored into *out.
void sgpu_cuda_memory_stats(int device, c10::CachingDeviceAllocator::DeviceStats* out) {
  *out = c10::cuda::CUDACachingAllocator::getDeviceStats(static_cast<c10::DeviceIndex>(device));
}

// The CUDA caching allocator's peaks for `device` start again from their current values.
void sgpu_cuda_reset_peak_memory_stats(int device) {
  c10::cuda::CUDACachingAllocator::resetPeakStats(static_cast<c10::DeviceIndex>(device));
}

// An NCCL process group for the request, stored into *out.
void sgpu_cuda_make_process_group(const sgpu::backend::ProcessGroupRequest* request,
                                  c10::intrusive_ptr<c10d::Backend>* out) {
  auto options = c10d::ProcessGroupNCCL::Options::create();
  options->timeout = request->timeout;
  *out = c10::make_intrusive<c10d::ProcessGroupNCCL>(request->store, request->rank,
                                                     request->world_size, options);
}
}
